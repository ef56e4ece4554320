//go:build unix

package aip

import (
	"os"
	"syscall"
)

// fileOwnerOK reports whether a secret file is owned by this process's
// effective user or by root, and names the owner otherwise.
func fileOwnerOK(info os.FileInfo) (owner uint32, ok bool) {
	st, isUnix := info.Sys().(*syscall.Stat_t)
	if !isUnix {
		return 0, true
	}
	return st.Uid, st.Uid == 0 || int(st.Uid) == os.Geteuid()
}
