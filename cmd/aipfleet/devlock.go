package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/aipfleet/aipfleet/internal/flock"
)

// lockStateDir locks the state directory (creating it) until release, so a
// second aipfleet dev on the same directory, with or without --reset, stops
// before it changes anything of the running one; the kernel releases the
// lock when dev dies, even by SIGKILL (package flock). Where the system
// has no flock, dev runs unlocked.
func lockStateDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the state directory: %w", err)
	}
	lock, err := flock.Acquire(devLockPath(dir))
	var held *flock.HeldError
	switch {
	case errors.As(err, &held):
		by := ""
		if held.PID > 0 {
			by = fmt.Sprintf(" (pid %d)", held.PID)
		}
		return nil, fmt.Errorf("%s is in use by another aipfleet dev%s: stop it first (Ctrl-C), or use another --state-dir", dir, by)
	case errors.Is(err, flock.ErrUnsupported):
		return func() {}, nil
	case err != nil:
		return nil, err
	}
	return func() { lock.Release() }, nil
}
