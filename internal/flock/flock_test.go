//go:build unix

package flock_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/internal/flock"
)

// A held lock refuses a second acquirer (naming this process) until it is
// released; the file stays.
func TestAcquire(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	l, err := flock.Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = flock.Acquire(path)
	var held *flock.HeldError
	if !errors.As(err, &held) || !errors.Is(err, flock.ErrHeld) || held.PID != os.Getpid() || held.Path != path {
		t.Fatalf("second Acquire: %v, want a HeldError naming pid %d", err, os.Getpid())
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := flock.Acquire(path)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	l2.Release()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the lock file is gone: %v", err)
	}
}

// A lock file that cannot be opened (a read-only or missing directory) is
// reported with its path once: the error read "flock: open P: open P: ...".
func TestAcquireOpenErrorNamesThePathOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "x.lock")
	_, err := flock.Acquire(path)
	if !errors.Is(err, os.ErrNotExist) || strings.Count(err.Error(), path) != 1 {
		t.Fatalf("Acquire in a missing directory: %v; want ErrNotExist naming %s once", err, path)
	}
}
