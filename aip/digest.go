package aip

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// DigestPrefix starts every digest.
const DigestPrefix = "sha256:"

// ErrInvalidDigest is returned (wrapped) for a string that is not
// "sha256:" followed by 64 lowercase hexadecimal digits.
var ErrInvalidDigest = errors.New("aip: invalid digest")

// Digest returns "sha256:" + the lowercase hex SHA-256 of v's canonical JSON.
func Digest(v any) (string, error) {
	c, err := CanonicalJSON(v)
	if err != nil {
		return "", err
	}
	return DigestBytes(c), nil
}

// DigestJSON returns the digest of a JSON text (canonicalized first).
func DigestJSON(data []byte) (string, error) {
	c, err := Canonicalize(data)
	if err != nil {
		return "", err
	}
	return DigestBytes(c), nil
}

// DigestBytes returns "sha256:" + the lowercase hex SHA-256 of b as is.
func DigestBytes(b []byte) string {
	sum := sha256.Sum256(b)
	var out [len(DigestPrefix) + 64]byte
	copy(out[:], DigestPrefix)
	hex.Encode(out[len(DigestPrefix):], sum[:])
	return string(out[:])
}

// ValidateDigest checks the "sha256:" + 64 lowercase hex form.
func ValidateDigest(d string) error {
	if !strings.HasPrefix(d, DigestPrefix) || len(d) != len(DigestPrefix)+64 {
		return reasonf(ErrInvalidDigest, "%q must be \"sha256:\" followed by 64 lowercase hex digits", truncateForError(d))
	}
	for _, ch := range d[len(DigestPrefix):] {
		if !(ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'f') {
			return reasonf(ErrInvalidDigest, "%q must be \"sha256:\" followed by 64 lowercase hex digits", truncateForError(d))
		}
	}
	return nil
}
