//go:build unix

package sqliteruntime

import (
	"fmt"
	"os"
	"syscall"
)

// checkDirOwner refuses a state directory owned by a user other than this
// process's effective user (or root, who may write anywhere anyway): its
// owner may write to it whatever its mode, so they could plant a link or a
// file under the journal's name — a directory another user made at the
// --state-dir path under /tmp before the host created it, for example.
func checkDirOwner(dir string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Geteuid(); int(st.Uid) != uid && st.Uid != 0 {
		return fmt.Errorf("sqliteruntime: state directory %s is owned by uid %d, not by this process's user (uid %d): that user could replace the journal; use a directory of the replica's own (the host creates a missing one 0700) or chown it to uid %d",
			dir, st.Uid, uid, uid)
	}
	return nil
}

// checkFileOwner refuses a journal file owned by a user other than this
// process's effective user or root: its owner may write to it whatever its
// mode.
func checkFileOwner(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Geteuid(); int(st.Uid) != uid && st.Uid != 0 {
		return fmt.Errorf("sqliteruntime: %s is owned by uid %d, not by this process's user (uid %d): that user could change the record of the actions this replica ran; chown it to uid %d",
			path, st.Uid, uid, uid)
	}
	return nil
}

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
