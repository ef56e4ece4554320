//go:build !linux

package sidecar

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// childProcAttr: outside Linux the child stays in the sidecar's process
// group and is not signalled when the sidecar dies.
func childProcAttr() *syscall.SysProcAttr { return nil }

func signalGroupOf(cmd *exec.Cmd, sig syscall.Signal) error { return cmd.Process.Signal(sig) }

// stoppedCleanly reports an exit with status 0.
func stoppedCleanly(ps *os.ProcessState) bool { return ps.Success() }

func awaitExitUnreaped(int) error { return errors.ErrUnsupported }

func groupRemains(int, int) bool { return false }
