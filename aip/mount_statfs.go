//go:build linux || darwin

package aip

import "syscall"

// mountFlagReadOnly is ST_RDONLY in statfs(2)'s f_flags on Linux (the
// flags of the mount the path is on, a read-only bind mount's included)
// and MNT_RDONLY on macOS: both 1.
const mountFlagReadOnly = 1

// mountReadOnly reports whether dir is on a read-only mount.
func mountReadOnly(dir string) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false
	}
	return int64(st.Flags)&mountFlagReadOnly != 0
}
