package sidecar

import (
	"os"
	"os/exec"
	"syscall"
)

// childProcAttr puts the child in its own process group (a terminal's
// Ctrl-C reaches only the sidecar, which stops the child after its own
// drain) and asks the kernel to send it SIGTERM if the sidecar dies.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// signalTerm sends SIGTERM to the child's process group (a shell wrapper's
// children stop too).
func signalTerm(cmd *exec.Cmd) error {
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
}

// signalKill sends SIGKILL to the child's process group.
func signalKill(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// stoppedCleanly reports an exit with status 0 or by SIGTERM.
func stoppedCleanly(ps *os.ProcessState) bool {
	if ps.Success() {
		return true
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}
