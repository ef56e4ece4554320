//go:build !unix

package sqliteruntime

import "os"

// checkFileLinks: hard links are not checked on this system.
func checkFileLinks(string, os.FileInfo) error { return nil }
