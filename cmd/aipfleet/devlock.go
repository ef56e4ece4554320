package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/aipfleet/aipfleet/internal/flock"
)

// lockStateDir locks the state directory (creating it) until release, so a
// second aipfleet dev on the same directory, with or without --reset, stops
// before it changes anything of the running one; the kernel releases the
// lock when dev dies, even by SIGKILL (package flock). Where the system
// has no flock, dev runs unlocked.
func lockStateDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, stateDirError(dir, err)
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

// stateDirError is the error of creating the state directory dir: when a
// file stands where dir or one of its parents should be, it names that
// file, and when this user may not create it, says so: settings to fix
// (exit status 2), which exited 1 without the command. Otherwise (a full
// disk) it is the error, with dir, a failure at run time.
func stateDirError(dir string, err error) error {
	for p := dir; ; p = filepath.Dir(p) {
		if info, statErr := os.Stat(p); statErr == nil {
			if !info.IsDir() {
				return usagef("dev: --state-dir %s: %s is a file, not a directory: give --state-dir a directory (dev creates it when missing)", dir, p)
			}
			break
		}
		if filepath.Dir(p) == p {
			break
		}
	}
	if errors.Is(err, os.ErrPermission) {
		return flagFileError("dev", "--state-dir", fmt.Errorf("create the state directory %s: %w: give --state-dir a directory this user may create, or run aipfleet dev as the user who owns it", dir, err))
	}
	return fmt.Errorf("dev: create the state directory %s (--state-dir): %w", dir, err)
}
