//go:build unix

package aip

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileOwnedByAnotherUser: mode 0600 keeps everyone but the owner
// and root out, so for a process running as root a 0600 file owned by
// another user is a file that user could have planted (a key they know, a
// database URL of theirs). It is refused; the process's own files and
// root's are read.
func TestFileOwnedByAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	planted := writeFile(t, "planted", zeroSeedHex, 0o600)
	if err := os.Chown(planted, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	_, err := LoadSigningKey(planted)
	if !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "uid 4242") || !strings.Contains(err.Error(), "chown") {
		t.Fatalf("LoadSigningKey of a file owned by uid 4242 = %v, want ErrUnsafeFile naming the owner", err)
	}
	if _, err := ReadSecretFile(planted, MaxSecretFileBytes); !errors.Is(err, ErrUnsafeFile) {
		t.Fatalf("ReadSecretFile of a file owned by uid 4242 = %v, want ErrUnsafeFile", err)
	}
	// A public file (an action's input) may belong to anyone; a file the
	// process trusts (a DID, a CA certificate) may not: its owner can
	// rewrite it whatever its mode.
	public := writeFile(t, "ca", "certificate", 0o644)
	if err := os.Chown(public, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPublicFile(public, 1024); err != nil {
		t.Fatalf("ReadPublicFile of another user's file: %v", err)
	}
	if _, err := ReadTrustFile(public, 1024); !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "uid 4242") || !strings.Contains(err.Error(), "chown") {
		t.Fatalf("ReadTrustFile of a file owned by uid 4242 = %v, want ErrUnsafeFile naming the owner", err)
	}
	if err := os.Chown(public, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTrustFile(public, 1024); err != nil {
		t.Fatalf("ReadTrustFile of root's file: %v", err)
	}
	own := writeFile(t, "own", zeroSeedHex, 0o600)
	if _, err := LoadSigningKey(own); err != nil {
		t.Fatalf("own file: %v", err)
	}
}

// TestSymlinkOwnedByAnotherUser: a symlink is followed and the file it
// names checked, but whoever owns a link chooses that file: a link another
// user owns could name any file of root's or this process's user (another
// key, a secret whose start a DID file's parse error would quote). A
// secret or trusted file reached through such a link, at any step of the
// chain, is refused; root's links (a Kubernetes volume's) and the
// process's own are followed.
func TestSymlinkOwnedByAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a link to another user")
	}
	seed := writeFile(t, "seed", zeroSeedHex, 0o600)
	did := writeFile(t, "gateway.did", "did:key:z6Mkexample", 0o644)
	dir := t.TempDir()
	link := func(name, target string, uid int) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name, path string
		read       func(string) error
	}{
		{"a secret", link("seed-link", seed, 4242), func(p string) error { _, err := LoadSigningKey(p); return err }},
		{"a trusted file", link("did-link", did, 4242), func(p string) error { _, err := ReadTrustFile(p, 1024); return err }},
		// root's link naming another user's link naming the file
		{"a secret at the second link", link("outer", link("inner", seed, 4242), 0), func(p string) error { _, err := LoadSigningKey(p); return err }},
	} {
		err := c.read(c.path)
		if !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "uid 4242") || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("%s through a link uid 4242 owns: %v; want ErrUnsafeFile naming the link's owner", c.name, err)
		}
	}
	if _, err := ReadPublicFile(filepath.Join(dir, "did-link"), 1024); err != nil {
		t.Errorf("ReadPublicFile through another user's link: %v", err)
	}
	if _, err := LoadSigningKey(link("root-link", link("root-inner", seed, 0), 0)); err != nil {
		t.Errorf("a secret through root's links: %v", err)
	}
}
