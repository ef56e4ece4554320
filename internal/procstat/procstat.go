// Package procstat reads figures about running processes from /proc, for
// benchmarks that report a process's memory.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// RSS returns the resident set size of process pid in KiB (VmRSS of
// /proc/<pid>/status). It works on Linux only.
func RSS(pid int) (int, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				return 0, fmt.Errorf("procstat: VmRSS of %d: %w", pid, err)
			}
			return kib, nil
		}
	}
	return 0, fmt.Errorf("procstat: no VmRSS in /proc/%d/status", pid)
}
