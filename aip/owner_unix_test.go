//go:build unix

package aip

import (
	"errors"
	"os"
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
