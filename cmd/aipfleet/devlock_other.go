//go:build !unix

package main

import "os"

// lockStateDir creates the state directory; exclusive locking is not
// implemented on this system.
func lockStateDir(dir string) (release func(), err error) {
	return func() {}, os.MkdirAll(dir, 0o700)
}
