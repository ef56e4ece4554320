//go:build unix

package sqliteruntime

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// dirLock is an exclusive advisory lock (flock) on the state directory's
// lock file. flock locks belong to the open file description, so a second
// Open in the same process conflicts too, and the kernel releases the lock
// when the holder dies, even by SIGKILL.
type dirLock struct {
	f *os.File
}

func lockDir(dir string) (*dirLock, error) {
	path := lockPath(dir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqliteruntime: open lock file %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid := readHolder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &LockedError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("sqliteruntime: lock %s: %w", path, err)
	}
	// Record the holder for the error a second opener sees.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dirLock{f: f}, nil
}

func readHolder(f *os.File) int {
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

func (l *dirLock) release() error {
	// Closing the descriptor releases the flock. The file stays: removing it
	// would let a third opener lock a new inode while a second holds the old.
	return l.f.Close()
}
