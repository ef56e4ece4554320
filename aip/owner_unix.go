//go:build unix

package aip

import (
	"os"
	"syscall"
)

// FileOwnerOK reports whether a file (or directory) is owned by this
// process's effective user or by root, the only users a process may trust
// with a file it keeps secrets or records in (its owner may write to it
// whatever its mode), and names the owner otherwise. On systems without
// Unix ownership it reports true.
func FileOwnerOK(info os.FileInfo) (owner uint32, ok bool) {
	st, isUnix := info.Sys().(*syscall.Stat_t)
	if !isUnix {
		return 0, true
	}
	return st.Uid, st.Uid == 0 || int(st.Uid) == os.Geteuid()
}
