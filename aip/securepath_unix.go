//go:build unix

package aip

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// maxLinkHops bounds the symlinks resolvePath follows (Linux's own limit
// is 40).
const maxLinkHops = 40

// resolvePath resolves path component by component, as open(2) does, and
// returns the path with every symlink resolved and the Lstat of the file
// it names. On the way it checks what can change which file path names
// (OpenSSH's StrictModes, adapted):
//
//   - every symlink, in the middle of the path or at its end, must be
//     owned by this process's user or root (checkLinkOwner): a link's
//     owner chooses where it leads;
//   - every directory the path passes through, from / down to the file,
//     including the directories links lead to, must be owned by this
//     process's user or root and not writable by group or others
//     (checkDir): whoever may write to a directory may rename the entry
//     in it, the file or a directory above it, and put their own in its
//     place, whatever that entry's owner and mode.
//
// A directory that passes is one only root and this user can change, so
// the path resolves to the same file until one of them changes it; the
// caller opens the resolved path and checks that it opened the file
// returned here.
func resolvePath(path, kind string) (string, os.FileInfo, error) {
	if path == "" {
		_, err := os.Lstat(path)
		return "", nil, fileError(kind, path, err)
	}
	full := path
	if !filepath.IsAbs(path) {
		wd, err := os.Getwd()
		if err != nil {
			return "", nil, fileError(kind, path, err)
		}
		full = wd + "/" + path
	}
	type dir struct {
		path string
		info os.FileInfo
	}
	rootInfo, err := os.Lstat("/")
	if err != nil {
		return "", nil, fileError(kind, path, err)
	}
	if err := checkDir(path, kind, "/", rootInfo); err != nil {
		return "", nil, err
	}
	// dirs is the resolved path so far, / first: each a directory checked.
	dirs := []dir{{"/", rootInfo}}
	rest := strings.Split(full, "/")
	hops := 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			if len(dirs) > 1 {
				dirs = dirs[:len(dirs)-1]
			}
			continue
		}
		next := filepath.Join(dirs[len(dirs)-1].path, name)
		info, err := os.Lstat(next)
		if err != nil {
			return "", nil, fileError(kind, path, err)
		}
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			if err := checkLinkOwner(path, kind, next, info); err != nil {
				return "", nil, err
			}
			if hops++; hops > maxLinkHops {
				return "", nil, fmt.Errorf("%s %s: %w", kind, path, &os.PathError{Op: "open", Path: path, Err: syscall.ELOOP})
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", nil, fileError(kind, path, err)
			}
			if filepath.IsAbs(target) {
				dirs = dirs[:1]
			}
			rest = append(strings.Split(target, "/"), rest...)
		case info.IsDir():
			if err := checkDir(path, kind, next, info); err != nil {
				return "", nil, err
			}
			dirs = append(dirs, dir{next, info})
		default:
			// Anything after a file, even a trailing slash, makes the
			// path name a directory that this file is not.
			if len(rest) > 0 {
				return "", nil, fmt.Errorf("%s %s: %w", kind, path, &os.PathError{Op: "open", Path: path, Err: syscall.ENOTDIR})
			}
			return next, info, nil
		}
	}
	// The path names a directory (the caller refuses it).
	last := dirs[len(dirs)-1]
	return last.path, last.info, nil
}

// checkLinkOwner refuses a symlink owned by another user than this
// process's or root: whoever owns a link chooses the file it names, so
// the checks of the file it ends at would only say that some file of
// root's or this user's was picked, not that it is the one the setting
// meant.
func checkLinkOwner(path, kind, link string, info os.FileInfo) error {
	if owner, ok := FileOwnerOK(info); !ok {
		return reasonf(ErrUnsafeFile, "%s %s: the symlink %s is owned by uid %d, not by this process's user (uid %d) or root, so that user chooses the file it names; name the file itself or chown -h the link", kind, path, link, owner, os.Geteuid())
	}
	return nil
}

// checkDir refuses a directory on the path another user could change:
// one owned by a user other than this process's or root, or writable by
// its group or others (unless dirModeOK allows it: sticky and root's, as
// /tmp, or root's on a read-only mount; or privateGroupDir: writable by
// the owner's private group only).
func checkDir(path, kind, dir string, info os.FileInfo) error {
	owner, ok := FileOwnerOK(info)
	if !ok {
		return reasonf(ErrUnsafeFile, "%s %s: the directory %s is owned by uid %d, not by this process's user (uid %d) or root, so that user can rename the file (or a directory leading to it) and put another in its place; chown root %s (or to this process's user), or keep the file in a directory of root's or this user's", kind, path, dir, owner, os.Geteuid(), dir)
	}
	if !dirModeOK(info.Mode(), owner, func() bool { return mountReadOnly(dir) }) && !privateGroupDir(info) {
		return reasonf(ErrUnsafeFile, "%s %s: the directory %s is writable by group or others (mode %04o), so they can rename the file (or a directory leading to it) and put another in its place; chmod go-w %s (a shared directory such as /tmp is accepted when root owns it and it has the sticky bit, 1777; a directory writable by its owner's private group, a group of that user alone, is accepted)", kind, path, dir, OctalMode(info.Mode()), dir)
	}
	return nil
}

// dirModeOK reports whether a directory's mode keeps everyone but its
// owner (already root or this process's user) and root from renaming or
// removing its entries: not writable by group or others; or, writable,
// with the sticky bit and owned by root (/tmp: only an entry's owner, the
// directory's and root may rename it, and every entry on the path must be
// root's or this user's); or, writable, owned by root on a read-only
// mount (readOnly is asked only then), where nobody can change an entry
// through this path — a Kubernetes ConfigMap volume's directory is 0777
// (2777 with an fsGroup), and the kubelet mounts it read-only.
func dirModeOK(mode os.FileMode, owner uint32, readOnly func() bool) bool {
	if mode.Perm()&0o022 == 0 {
		return true
	}
	if owner != 0 {
		return false
	}
	return mode&os.ModeSticky != 0 || readOnly()
}
