//go:build unix

package flock

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Lock is an acquired lock; Release gives it back.
type Lock struct {
	f *os.File
}

// Acquire locks the file at path (created with mode 0600 when missing)
// without waiting. A lock held elsewhere is a *HeldError.
func Acquire(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("flock: %w", err) // the *PathError names the file
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid := holder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: pid}
		}
		return nil, fmt.Errorf("flock: lock %s: %w", path, err)
	}
	// Record the holder for the error a second acquirer sees.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

func holder(f *os.File) int {
	b, err := io.ReadAll(io.LimitReader(f, 32))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Release gives the lock back (closing the descriptor releases the flock).
func (l *Lock) Release() error { return l.f.Close() }
