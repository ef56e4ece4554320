// Package flock holds an exclusive advisory lock on a file, the way an
// aipfleet process claims a state directory: the SQLite journal of a
// connector host (hostsdk/sqliteruntime) and the state of aipfleet dev.
//
// The lock is flock(2) on the open file description, so a second Acquire,
// in the same process or another, fails at once, and the kernel releases
// the lock when the holder dies, even by SIGKILL. The holder writes its pid
// into the file so that the error a second acquirer gets can name it. The
// file is never removed: removing it would let a third acquirer lock a new
// file while a second holds the old one.
package flock

import (
	"errors"
	"fmt"
)

// ErrHeld is matched by the error of an Acquire whose lock another holder
// has.
var ErrHeld = errors.New("flock: held by another holder")

// ErrUnsupported is returned by Acquire on systems without flock.
var ErrUnsupported = errors.New("flock: exclusive file locks are not implemented on this system")

// HeldError says which lock file is held and, when known, by which process.
type HeldError struct {
	Path string
	PID  int // 0 when unknown
}

func (e *HeldError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("flock: %s is held by process %d", e.Path, e.PID)
	}
	return fmt.Sprintf("flock: %s is held by another process", e.Path)
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }
