//go:build unix

package aip

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// nobody is the user the tests give directories and links to.
const nobody = 65534

// mkdirOwned creates dir with exactly mode (umask-proof; os.ModeSticky
// and os.ModeSetgid included) owned by uid.
func mkdirOwned(t *testing.T, dir string, mode os.FileMode, uid int) string {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if uid != os.Geteuid() {
		if err := os.Chown(dir, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// putFile writes a file of mode (umask-proof) in dir and returns its path.
func putFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another user")
	}
}

func readSecret(p string) error { _, err := LoadSigningKey(p); return err }
func readTrust(p string) error  { _, err := ReadTrustFile(p, 1024); return err }

// wantDirRefused checks that err refuses path because of dir and says
// what to run.
func wantDirRefused(t *testing.T, what string, err error, path, dir string, mention ...string) {
	t.Helper()
	if !errors.Is(err, ErrUnsafeFile) {
		t.Errorf("%s: err = %v, want ErrUnsafeFile", what, err)
		return
	}
	for _, s := range append([]string{path, "directory " + dir + " "}, mention...) {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: error %q should mention %q", what, err, s)
		}
	}
}

// TestDirectoryOwnedByAnotherUser: whoever owns a directory can rename
// the entries in it whatever their owner and mode, so a root-owned key in
// /srv/keys that user mallory owns is a key mallory can swap for her own
// (mv key away; put hers in its place). A secret or trusted file under a
// directory another user owns — its parent or any directory above it — is
// refused, naming the directory and the chown to run; a public file is
// not.
func TestDirectoryOwnedByAnotherUser(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	keys := mkdirOwned(t, filepath.Join(base, "keys"), 0o755, nobody)
	seed := putFile(t, keys, "seed", zeroSeedHex, 0o600)
	did := putFile(t, keys, "gateway.did", "did:key:z6Mkexample", 0o644)
	wantDirRefused(t, "a secret in another user's directory", readSecret(seed), seed, keys, "uid 65534", "chown root "+keys)
	wantDirRefused(t, "a trusted file in another user's directory", readTrust(did), did, keys, "uid 65534", "chown root "+keys)
	if _, err := ReadPublicFile(did, 1024); err != nil {
		t.Errorf("ReadPublicFile in another user's directory: %v", err)
	}

	// Two levels up: mallory can rename sub, with the key in it, away.
	mallory := mkdirOwned(t, filepath.Join(base, "mallory"), 0o755, nobody)
	sub := mkdirOwned(t, filepath.Join(mallory, "sub"), 0o755, 0)
	deep := putFile(t, sub, "seed", zeroSeedHex, 0o600)
	wantDirRefused(t, "a secret below another user's directory", readSecret(deep), deep, mallory, "uid 65534", "chown root "+mallory)

	// The same directory given back to root is fine.
	if err := os.Chown(keys, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := readSecret(seed); err != nil {
		t.Errorf("a secret in root's directory: %v", err)
	}
}

// TestWritableDirectory: a directory its group or others may write to
// lets them rename the file in it and put another in its place. Refused,
// naming the directory and the chmod.
func TestWritableDirectory(t *testing.T) {
	// The directories' group (this process's) is shared with another
	// user, so group-writable is refused (TestPrivateGroupDirectory).
	withUserDB(t, fmt.Sprintf("me:x:%d:%d::/:/bin/sh\n", os.Geteuid(), os.Getegid()),
		fmt.Sprintf("shared:x:%d:me,other\n", os.Getegid()))
	base := t.TempDir()
	for i, mode := range []os.FileMode{0o775, 0o757, 0o777, 0o770 | os.ModeSetgid} {
		dir := mkdirOwned(t, filepath.Join(base, fmt.Sprint("dir", i)), mode, os.Geteuid())
		seed := putFile(t, dir, "seed", zeroSeedHex, 0o600)
		did := putFile(t, dir, "gateway.did", "did:key:z6Mkexample", 0o644)
		wantDirRefused(t, "a secret in a directory of mode "+mode.String(), readSecret(seed), seed, dir, "chmod go-w "+dir)
		wantDirRefused(t, "a trusted file in a directory of mode "+mode.String(), readTrust(did), did, dir, "chmod go-w "+dir)
		if _, err := ReadPublicFile(did, 1024); err != nil {
			t.Errorf("ReadPublicFile in a directory of mode %v: %v", mode, err)
		}
	}
}

// TestStickyDirectory: in a directory with the sticky bit, such as /tmp,
// only an entry's owner, the directory's owner and root may rename or
// remove it: a root-owned 1777 directory is accepted (the file's own
// checks still apply), one another user owns is not, nor a 0777 one
// without the bit.
func TestStickyDirectory(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	shared := mkdirOwned(t, filepath.Join(base, "shared"), 0o777|os.ModeSticky, 0)
	if err := readSecret(putFile(t, shared, "seed", zeroSeedHex, 0o600)); err != nil {
		t.Errorf("a secret in a root-owned 1777 directory: %v", err)
	}
	if err := readTrust(putFile(t, shared, "gateway.did", "did:key:z6Mkexample", 0o644)); err != nil {
		t.Errorf("a trusted file in a root-owned 1777 directory: %v", err)
	}
	planted := putFile(t, shared, "planted", zeroSeedHex, 0o600)
	if err := os.Chown(planted, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := readSecret(planted); !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("another user's file in a root-owned 1777 directory: %v, want ErrUnsafeFile", err)
	}

	theirs := mkdirOwned(t, filepath.Join(base, "theirs"), 0o777|os.ModeSticky, nobody)
	seed := putFile(t, theirs, "seed", zeroSeedHex, 0o600)
	wantDirRefused(t, "a secret in another user's 1777 directory", readSecret(seed), seed, theirs, "uid 65534", "chown root "+theirs)

	open := mkdirOwned(t, filepath.Join(base, "open"), 0o777, 0)
	seed = putFile(t, open, "seed", zeroSeedHex, 0o600)
	wantDirRefused(t, "a secret in a root-owned 0777 directory", readSecret(seed), seed, open, "chmod go-w "+open, "1777")
}

// TestSymlinkedMiddleDirectory: every directory the path resolves
// through is checked, the ones a symlinked directory in the middle of the
// path leads to as well, and so is each link on the way (whoever owns a
// link chooses where it leads), not only the links that name the file.
func TestSymlinkedMiddleDirectory(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	etc := mkdirOwned(t, filepath.Join(base, "etc"), 0o755, 0)
	link := func(name, target string, uid int) string {
		p := filepath.Join(etc, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// root's link to a directory under one mallory owns
	mallory := mkdirOwned(t, filepath.Join(base, "mallory"), 0o755, nobody)
	keys := mkdirOwned(t, filepath.Join(mallory, "keys"), 0o755, 0)
	putFile(t, keys, "seed", zeroSeedHex, 0o600)
	putFile(t, keys, "gateway.did", "did:key:z6Mkexample", 0o644)
	link("aip", "../mallory/keys", 0)
	p := filepath.Join(etc, "aip", "seed")
	wantDirRefused(t, "a secret through a symlinked directory into another user's", readSecret(p), p, mallory, "uid 65534", "chown root "+mallory)
	p = filepath.Join(etc, "aip", "gateway.did")
	wantDirRefused(t, "a trusted file through a symlinked directory into another user's", readTrust(p), p, mallory, "uid 65534", "chown root "+mallory)

	// another user's link, in the middle of the path, to a safe directory
	safe := mkdirOwned(t, filepath.Join(base, "safe"), 0o755, 0)
	putFile(t, safe, "seed", zeroSeedHex, 0o600)
	link("theirs", safe, nobody)
	p = filepath.Join(etc, "theirs", "seed")
	if err := readSecret(p); !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "symlink "+filepath.Join(etc, "theirs")) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("a secret through another user's directory link: %v; want ErrUnsafeFile naming the link and its owner", err)
	}

	// root's link to the safe directory is followed
	link("ours", "../safe", 0)
	if err := readSecret(filepath.Join(etc, "ours", "seed")); err != nil {
		t.Errorf("a secret through root's directory link: %v", err)
	}
}

// TestPathResolvedAsTheKernelDoes: ".." after a symlinked directory is
// the parent of the directory the link leads to, as open(2) has it (not
// the lexical parent), a relative path starts at the working directory,
// and a trailing slash after a file is not a file.
func TestPathResolvedAsTheKernelDoes(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "real")
	keys := filepath.Join(real, "keys")
	if err := os.MkdirAll(keys, 0o755); err != nil {
		t.Fatal(err)
	}
	putFile(t, keys, "seed", zeroSeedHex, 0o600)
	putFile(t, real, "seed", strings.Repeat("1", 64), 0o600)
	if err := os.Symlink(keys, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	want, err := LoadSigningKey(filepath.Join(real, "seed"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := LoadSigningKey(filepath.Join(base, "link") + "/../seed")
	if err != nil || got.DID() != want.DID() {
		t.Errorf("link/../seed: %v, %v; want the key of real/seed", got, err)
	}
	t.Chdir(base)
	if got, err := LoadSigningKey("link/../seed"); err != nil || got.DID() != want.DID() {
		t.Errorf("relative link/../seed: %v, %v; want the key of real/seed", got, err)
	}
	if _, err := LoadSigningKey("real/seed/"); err == nil {
		t.Errorf("real/seed/ (a trailing slash) was read as a file")
	}
}

// TestDirModeOK: the rule checkDir applies to a directory's mode and
// owner (ownership itself is checked before it).
func TestDirModeOK(t *testing.T) {
	for _, c := range []struct {
		mode     os.FileMode
		owner    uint32
		readOnly bool
		ok       bool
	}{
		{0o755, 0, false, true},
		{0o700, 1000, false, true},
		{0o750 | os.ModeSetgid, 0, false, true}, // 2750: setgid alone is fine
		{0o775, 0, false, false},
		{0o757, 1000, false, false},
		{0o777 | os.ModeSticky, 0, false, true},     // /tmp
		{0o777 | os.ModeSticky, 1000, false, false}, // sticky, but its owner is not root
		{0o777 | os.ModeSticky | os.ModeSetgid, 0, false, true},
		{0o777, 0, true, true},                      // a Kubernetes ConfigMap volume: root's, read-only mount
		{0o777 | os.ModeSetgid, 0, true, true},      // the same with an fsGroup (2777)
		{0o777, 1000, true, false},                  // read-only, but not root's
		{0o775 | os.ModeSetgid, 1000, false, false}, // a volume's root with an fsGroup, writable
	} {
		ro := func() bool { return c.readOnly }
		if got := dirModeOK(c.mode, c.owner, ro); got != c.ok {
			t.Errorf("dirModeOK(%v, owner %d, read-only %v) = %v, want %v", c.mode, c.owner, c.readOnly, got, c.ok)
		}
	}
}
