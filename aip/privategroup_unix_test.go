//go:build unix

package aip

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// withUserDB points the local user and group databases privateGroup reads
// at passwd and group for the test ("" leaves that file missing).
func withUserDB(t *testing.T, passwd, group string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if content != "" {
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	oldPasswd, oldGroup := passwdFile, groupFile
	passwdFile, groupFile = write("passwd", passwd), write("group", group)
	t.Cleanup(func() { passwdFile, groupFile = oldPasswd, oldGroup })
}

// TestPrivateGroupDirectory: a directory writable by its owner's private
// group — the group of that user alone, as Debian, Ubuntu, Fedora and RHEL
// give every user, whose umask 002 makes their directories 0775 — is
// accepted (before, a checkout cloned by such a user could not hold
// aipfleet dev's keys); one whose group has another member, is another
// user's primary group, is missing from /etc/group, or that others may
// write, is not.
func TestPrivateGroupDirectory(t *testing.T) {
	uid, gid := os.Geteuid(), os.Getegid()
	me := fmt.Sprintf("me:x:%d:%d::/:/bin/sh\n", uid, gid)
	other := fmt.Sprintf("other:x:%d:%d::/:/bin/sh\n", uid+1, gid)
	cases := []struct {
		name          string
		passwd, group string
		mode          os.FileMode
		ok            bool
	}{
		{"private group, 0775", me, fmt.Sprintf("me:x:%d:\n", gid), 0o775, true},
		{"private group, 2775", me, fmt.Sprintf("me:x:%d:me\n", gid), 0o775 | os.ModeSetgid, true},
		{"a member besides the owner", me, fmt.Sprintf("me:x:%d:me,other\n", gid), 0o775, false},
		{"another user's primary group too", me + other, fmt.Sprintf("me:x:%d:\n", gid), 0o775, false},
		{"group not in /etc/group", me, "another:x:4242:\n", 0o775, false},
		{"NIS users beyond /etc/passwd", me + "+::::::\n", fmt.Sprintf("me:x:%d:\n", gid), 0o775, false},
		{"owner not in /etc/passwd", fmt.Sprintf("other:x:%d:4242::/:/bin/sh\n", uid+1), fmt.Sprintf("me:x:%d:\n", gid), 0o775, false},
		{"no /etc/passwd", "", fmt.Sprintf("me:x:%d:\n", gid), 0o775, false},
		{"writable by others", me, fmt.Sprintf("me:x:%d:\n", gid), 0o777, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withUserDB(t, c.passwd, c.group)
			dir := mkdirOwned(t, filepath.Join(t.TempDir(), fmt.Sprint("dir", i)), c.mode, uid)
			seed := putFile(t, dir, "seed", zeroSeedHex, 0o600)
			err := readSecret(seed)
			if c.ok && err != nil {
				t.Fatalf("a secret in a %v directory of its owner's private group: %v", c.mode, err)
			}
			if !c.ok {
				wantDirRefused(t, c.name, err, seed, dir, "chmod go-w "+dir)
			}
		})
	}
}
