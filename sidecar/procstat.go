package sidecar

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// procStat returns the fields of /proc/<pid>/stat after the command name
// (state first, then the parent's pid), nil when it cannot be read (the
// process is gone, or the system has no /proc).
func procStat(pid int) []string {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(raw, ')') // the command name may hold anything
	if i < 0 {
		return nil
	}
	return strings.Fields(string(raw[i+1:]))
}

// running reports whether pid is a process that has not exited (neither
// gone nor a zombie).
func running(pid int) bool {
	f := procStat(pid)
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// parentPID returns pid's parent, 0 when it cannot be read.
func parentPID(pid int) int {
	f := procStat(pid)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
