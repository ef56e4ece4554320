//go:build unix

package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
)

// TestDevKeyNotCreatedOnAnUnsafePath: aip refuses a key whose path
// passes through a directory others may write to (or another user owns)
// before it looks for the file, so the refusal of a key that does not
// exist yet is not "no such file". dev must not take it for a first run
// and write a fresh key there: the replicas it starts read their keys
// with the same checks and would fail at every restart, dev running on
// with no replica ready. It fails at once, as a second run did, naming
// the directory and saying how to run dev instead.
func TestDevKeyNotCreatedOnAnUnsafePath(t *testing.T) {
	shared := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(shared, "replica-1.key")
	_, err := loadOrCreateKey(shared, key)
	if !errors.Is(err, aip.ErrUnsafeFile) {
		t.Fatalf("loadOrCreateKey under a 0777 directory: err = %v, want aip.ErrUnsafeFile", err)
	}
	for _, s := range []string{"directory " + shared + " ", "--state-dir"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q should mention %q", err, s)
		}
	}
	if _, statErr := os.Lstat(key); !errors.Is(statErr, fs.ErrNotExist) {
		t.Errorf("a key was written under the unsafe directory (lstat: %v)", statErr)
	}

	// Where the path is safe, a missing key is created as before.
	fresh := filepath.Join(t.TempDir(), "replica-1.key")
	k, err := loadOrCreateKey(filepath.Dir(fresh), fresh)
	if err != nil {
		t.Fatal(err)
	}
	again, err := loadOrCreateKey(filepath.Dir(fresh), fresh)
	if err != nil || again.DID() != k.DID() {
		t.Fatalf("second load: %v, %v; want the key created first (%s)", again, err, k.DID())
	}
}
