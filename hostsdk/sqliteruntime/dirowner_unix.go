//go:build unix

package sqliteruntime

import (
	"fmt"
	"os"
	"syscall"
)

// checkFileLinks refuses a journal file with more than one hard link:
// another name, in another state directory or a hard-link backup, reaches
// the same file, which this directory's lock does not cover.
func checkFileLinks(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Nlink <= 1 {
		return nil
	}
	return fmt.Errorf("sqliteruntime: %s has %d hard links: another name (in another state directory, or a hard-link backup) reaches the same file, which this directory's lock does not cover, so two hosts could open one journal; give each host its own state directory, and make this one a single file again (copy it to a new file and rename that over it while no host runs)",
		path, st.Nlink)
}
