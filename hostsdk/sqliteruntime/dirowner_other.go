//go:build !unix

package sqliteruntime

import "os"

// checkDirOwner: file ownership is not checked on this system.
func checkDirOwner(string, os.FileInfo) error { return nil }

// checkFileOwner: file ownership is not checked on this system.
func checkFileOwner(string, os.FileInfo) error { return nil }

// checkFileLinks: hard links are not checked on this system.
func checkFileLinks(string, os.FileInfo) error { return nil }
