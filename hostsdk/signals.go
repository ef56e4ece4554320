package hostsdk

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// NotifyStop returns a copy of parent that is cancelled when the process
// is asked to stop: SIGINT (Ctrl-C), SIGTERM (a supervisor, kill), or
// SIGHUP (the terminal or SSH session that started it closed). Run drains
// and goes offline when its context ends, so each of these stops the
// replica cleanly; without a handler, SIGHUP would end the process at once,
// leaving its actions to crash recovery and its lease to expire.
//
// SIGHUP is left alone when the process started with it ignored (nohup, a
// supervisor that ignores it for its children): catching it then would
// undo what the operator asked for. The cause of the cancellation names
// the signal ("hangup signal received"). Call stop when Run has returned, as
// with signal.NotifyContext: until then a second signal is taken by the
// same handler, not the default action, so it does not cut a drain short.
func NotifyStop(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(parent, StopSignals()...)
}

// StopSignals are the signals NotifyStop stops on: SIGINT and SIGTERM, and
// SIGHUP unless the process started with it ignored. For a main that
// handles signals itself.
func StopSignals() []os.Signal {
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	return sigs
}
