//go:build unix

package hostsdktest

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// HangupDefault makes the processes the test starts begin with SIGHUP's
// default action even when the test process has it ignored, as it has
// when the suite runs under nohup (every process started from there
// inherits the ignored disposition, and hostsdk.NotifyStop then leaves
// SIGHUP alone, as it should for a host started so). A signal the
// process catches is reset to its default at exec, so a handler installed
// here for the test's duration is enough; this process ignores the
// SIGHUPs it catches meanwhile.
func HangupDefault(t testing.TB) {
	if !signal.Ignored(syscall.SIGHUP) {
		return
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(c) })
}
