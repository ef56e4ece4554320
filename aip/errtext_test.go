package aip

import (
	"errors"
	"testing"
)

// TestErrorsReadWithoutThePackagePrefix: the errors a person meets (a
// file that is not safe to read, a key that does not parse, a mistyped
// identifier or DID) read as a sentence about the thing, without the
// sentinels' "aip: " prefix, and still match their sentinels.
func TestErrorsReadWithoutThePackagePrefix(t *testing.T) {
	dir := t.TempDir()
	open := writeFile(t, "k1", zeroSeedHex, 0o644)
	bad := writeFile(t, "bad.key", "xx", 0o600)
	cases := []struct {
		name     string
		err      error
		sentinel error
		want     string
	}{
		{"directory", func() error { _, err := ReadPublicFile(dir, 1024); return err }(), ErrUnsafeFile,
			"file " + dir + " is not a regular file"},
		{"secret readable by others", func() error { _, err := ReadSecretFile(open, 1024); return err }(), ErrUnsafeFile,
			"secret file " + open + " is accessible by group or others (mode 0644); chmod 600 it (a file root owns may be readable by its group, 0640 or 0440, when this process is not root and reads it through that group)"},
		{"not a key", func() error { _, err := LoadSigningKey(bad); return err }(), ErrInvalidKey,
			"signing key file " + bad + ": invalid signing key: want 64 hexadecimal characters (a 32-byte Ed25519 seed) or an Ed25519 JWK, got 2 characters"},
		{"identifier", ValidateID(PrefixAction, "foo"), ErrInvalidID, `"foo" must start with "act_"`},
		{"digest", ValidateDigest("sha256:x"), ErrInvalidDigest, `"sha256:x" must be "sha256:" followed by 64 lowercase hex digits`},
		{"not a did:key", func() error { _, err := ParseDIDKey("bar"); return err }(), ErrDIDMethod, `"bar" is not a did:key identifier`},
		{"did:key of the wrong length", func() error { _, err := ParseDIDKey(DIDKey(make([]byte, 31))); return err }(), ErrDIDKeyLength,
			"did:key public key has the wrong length: 31 bytes, want 32"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !errors.Is(c.err, c.sentinel) {
				t.Fatalf("err = %v, want one matching %v", c.err, c.sentinel)
			}
			if got := c.err.Error(); got != c.want {
				t.Fatalf("error:\n got %s\nwant %s", got, c.want)
			}
		})
	}
}
