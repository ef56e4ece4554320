package sidecar

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"unsafe"
)

// childProcAttr puts the child in its own process group (a terminal's
// Ctrl-C reaches only the sidecar, which stops the child after its own
// drain) and asks the kernel to kill it if the sidecar dies. SIGKILL, not
// SIGTERM: the dead sidecar's in-flight actions are reconciled by the
// restarted sidecar with a new child, and an old child that went on
// finishing them after a SIGTERM (a graceful server does) could complete
// an action the new child already answered not_found for. An orderly stop
// is the sidecar's own (terminate), after its drain.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroupOf sends sig to the process group of the child cmd (a shell
// wrapper's children, a server's workers stop too). Use child.signal,
// which knows whether the pid is still the child's.
func signalGroupOf(cmd *exec.Cmd, sig syscall.Signal) error {
	return syscall.Kill(-cmd.Process.Pid, sig)
}

// stoppedCleanly reports an exit with status 0 or by SIGTERM.
func stoppedCleanly(ps *os.ProcessState) bool {
	if ps.Success() {
		return true
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}

// awaitExitUnreaped blocks until the child pid exits without reaping it
// (waitid with WNOWAIT): while it is an unreaped zombie its pid, which is
// also its process group's ID, cannot be reused, so the rest of the group
// can be signalled and looked for safely.
func awaitExitUnreaped(pid int) error {
	const pPID = 1
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		}
		return errno
	}
}

// groupRemains reports whether a process other than leader that has not
// exited is in process group pgid (read from /proc).
func groupRemains(pgid, leader int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == leader {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and ')'.
		i := bytes.LastIndexByte(raw, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(raw[i+1:])
		if len(f) < 3 || f[0][0] == 'Z' || f[0][0] == 'X' {
			continue
		}
		if g, err := strconv.Atoi(string(f[2])); err == nil && g == pgid {
			return true
		}
	}
	return false
}
