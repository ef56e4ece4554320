//go:build !unix

package sqliteruntime

import (
	"fmt"
	"runtime"
)

type dirLock struct{}

func lockDir(dir string) (*dirLock, error) {
	return nil, fmt.Errorf("sqliteruntime: state directory %s: exclusive locking is not implemented on %s; run the host on Linux or macOS, or use pgruntime", dir, runtime.GOOS)
}

func (l *dirLock) release() error { return nil }
