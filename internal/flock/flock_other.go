//go:build !unix

package flock

// Lock is an acquired lock; on this system Acquire never returns one.
type Lock struct{}

// Acquire returns ErrUnsupported: this system has no flock.
func Acquire(path string) (*Lock, error) { return nil, ErrUnsupported }

// Release does nothing.
func (l *Lock) Release() error { return nil }
