//go:build !linux

package sidecar

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// childProcAttr: outside Linux the child stays in the sidecar's process
// group and is not signalled when the sidecar dies.
func childProcAttr() *syscall.SysProcAttr { return nil }

func signalGroupOf(cmd *exec.Cmd, sig syscall.Signal) error { return cmd.Process.Signal(sig) }

// stoppedCleanly reports an exit with status 0.
func stoppedCleanly(ps *os.ProcessState) bool { return ps.Success() }

func awaitExitUnreaped(int) error { return errors.ErrUnsupported }

func groupRemains(int, int) bool { return false }

func reapGroupOrphans(int, int) {}

// stopOrphans does nothing outside Linux: there the sidecar's children
// are not killed when it dies, nor looked for when it starts again.
func stopOrphans(string, time.Duration, *slog.Logger) {}
