package aip

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// Bounds of the files this package reads.
const (
	// MaxKeyFileBytes bounds a signing key file (a 64-hex seed, or a JWK).
	MaxKeyFileBytes = 4 << 10
	// MaxSecretFileBytes bounds other secret files, such as a database URL.
	MaxSecretFileBytes = 16 << 10
)

// ErrUnsafeFile is returned (wrapped) when a secret or trusted file is not
// a regular file, readable or writable by group or others (see the
// functions), owned by a user other than this process's or root, reached
// through a symlink or a directory another user could change, or too
// large.
var ErrUnsafeFile = errors.New("aip: unsafe file")

// ErrEmptyFile is returned (wrapped) when a file read with ReadSecretFile,
// ReadTrustFile or ReadPublicFile is empty or holds only whitespace.
var ErrEmptyFile = errors.New("aip: empty file")

// ErrInvalidKey is returned (wrapped) when key material cannot be parsed.
var ErrInvalidKey = errors.New("aip: invalid signing key")

// SigningKey is an Ed25519 private key with its did:key identity. It never
// prints its private part: String and LogValue show only the DID.
type SigningKey struct {
	priv ed25519.PrivateKey
	did  string
}

// NewSigningKey returns the key derived from a 32-byte Ed25519 seed.
func NewSigningKey(seed []byte) (*SigningKey, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, labelf(ErrInvalidKey, "seed is %d bytes, want %d", len(seed), ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	return &SigningKey{priv: priv, did: DIDKey(priv.Public().(ed25519.PublicKey))}, nil
}

// GenerateSigningKey returns a fresh random key.
func GenerateSigningKey() (*SigningKey, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, fmt.Errorf("aip: generate key: %w", err)
	}
	return NewSigningKey(seed)
}

// DID returns the key's did:key identifier.
func (k *SigningKey) DID() string { return k.did }

// PublicKey returns the Ed25519 public key.
func (k *SigningKey) PublicKey() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }

// Seed returns a copy of the 32-byte seed (for writing a key file).
func (k *SigningKey) Seed() []byte { return append([]byte(nil), k.priv.Seed()...) }

// Sign returns the Ed25519 signature of msg.
func (k *SigningKey) Sign(msg []byte) []byte { return ed25519.Sign(k.priv, msg) }

// String implements fmt.Stringer without revealing the private key.
func (k *SigningKey) String() string { return "SigningKey(" + k.did + ")" }

// LogValue implements slog.LogValuer: only the DID is logged.
func (k *SigningKey) LogValue() slog.Value { return slog.StringValue(k.did) }

// ParseSigningKey parses key material: either 64 hexadecimal characters (the
// AIP seed convention; surrounding whitespace ignored) or an Ed25519 private
// JWK (kty "OKP", crv "Ed25519", with "d").
func ParseSigningKey(data []byte) (*SigningKey, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, labelf(ErrInvalidKey, "empty")
	}
	if trimmed[0] == '{' {
		return parseJWK(trimmed)
	}
	if len(trimmed) != 2*ed25519.SeedSize {
		return nil, labelf(ErrInvalidKey, "want 64 hexadecimal characters (a 32-byte Ed25519 seed) or an Ed25519 JWK, got %d characters", len(trimmed))
	}
	seed := make([]byte, ed25519.SeedSize)
	if _, err := hex.Decode(seed, trimmed); err != nil {
		return nil, labelf(ErrInvalidKey, "seed is not hexadecimal: %v", err)
	}
	return NewSigningKey(seed)
}

func parseJWK(data []byte) (*SigningKey, error) {
	key, err := jwk.ParseKey(data)
	if err != nil {
		return nil, labelf(ErrInvalidKey, "JWK: %v", err)
	}
	if key.KeyType() != jwa.OKP {
		return nil, labelf(ErrInvalidKey, "JWK kty is %q, want \"OKP\" with crv \"Ed25519\"", key.KeyType())
	}
	okp, ok := key.(jwk.OKPPrivateKey)
	if !ok {
		return nil, labelf(ErrInvalidKey, "JWK has no private part \"d\"; a signing key file needs the private key")
	}
	if okp.Crv() != jwa.Ed25519 {
		return nil, labelf(ErrInvalidKey, "JWK crv is %q, want \"Ed25519\"", okp.Crv())
	}
	var priv ed25519.PrivateKey
	if err := key.Raw(&priv); err != nil {
		return nil, labelf(ErrInvalidKey, "JWK: %v", err)
	}
	return NewSigningKey(priv.Seed())
}

// LoadSigningKey reads a signing key from a secret file (see ReadSecretFile)
// holding a 64-hex seed or an Ed25519 JWK. Errors name the file and the fix.
func LoadSigningKey(path string) (*SigningKey, error) {
	data, err := ReadSecretFile(path, MaxKeyFileBytes)
	if err != nil {
		return nil, err
	}
	defer clear(data)
	k, err := ParseSigningKey(data)
	if err != nil {
		return nil, fmt.Errorf("signing key file %s: %w", path, err)
	}
	return k, nil
}

// WriteSeedFile writes the key's seed as 64 hex characters to a new file with
// mode 0600. It refuses to overwrite an existing file.
func WriteSeedFile(path string, k *SigningKey) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write key file: %w", err)
	}
	seed := k.Seed()
	defer clear(seed)
	if _, err := f.WriteString(hex.EncodeToString(seed) + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("write key file %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write key file %s: %w", path, err)
	}
	return f.Close()
}

// ReadSecretFile reads a secret file after checking that it is a regular
// file, is owned by the process's effective user or by root (a process
// running as root must not take a key that another user planted: mode 0600
// keeps nobody but root out), has no group or other permission bits — but
// for a file root owns read by a process that is not root, which may be
// readable by its group (0640, 0440), as PostgreSQL allows for its key
// files and as a Kubernetes secret volume with an fsGroup mounts them —
// and holds 1 to maxBytes bytes. A symlink is followed and what it points
// at checked, so a Kubernetes secret or ConfigMap volume (whose files are
// links through ..data) can be named directly. The path must not let
// another user choose the file: every symlink on it (at its end or in the
// middle, a link's owner chooses where it leads) must be owned by the
// process's user or root, and so must every directory it passes through,
// from / down to the file along the resolved path, none of them writable
// by group or others (whoever may write to a directory can rename the
// file in it and put another in its place) — except a directory root owns
// that has the sticky bit (/tmp, 1777) or is on a read-only mount (a
// Kubernetes ConfigMap volume's 0777 directory), and one writable only by
// its owner's private group (a group of that user alone in /etc/group and
// /etc/passwd, as umask 002 systems make them). The file opened must be
// the file checked (no swap between the check and the read). The content
// is returned with surrounding ASCII whitespace removed.
func ReadSecretFile(path string, maxBytes int64) ([]byte, error) {
	return readCheckedFile(path, maxBytes, fileSecret)
}

// ReadPublicFile reads a non-secret file (an action's input, a fleet file
// an operator applies) after checking that it is a regular file (a symlink
// is followed), not writable by group or others, and holds 1 to maxBytes
// bytes.
func ReadPublicFile(path string, maxBytes int64) ([]byte, error) {
	return readCheckedFile(path, maxBytes, filePublic)
}

// ReadTrustFile reads a non-secret file a long-running process trusts (a
// peer's DID, a CA certificate, a credential revision policy): the checks
// of ReadPublicFile, and, like a secret file, owned by the process's
// effective user or by root, as are the symlinks that lead to it, with the
// directories of its path checked as ReadSecretFile checks them. Whoever
// owns a file can rewrite it whatever its mode (and whoever owns a link
// can point it elsewhere), so a DID file another user owns lets that user
// name the key the process takes actions or lifecycle answers from.
func ReadTrustFile(path string, maxBytes int64) ([]byte, error) {
	return readCheckedFile(path, maxBytes, fileTrust)
}

// fileClass is what readCheckedFile requires of a file.
type fileClass int

const (
	filePublic fileClass = iota // not writable by group or others
	fileTrust                   // and owned by this user or root, its path too (resolvePath)
	fileSecret                  // owned by this user or root, its path too, no group or other bits (secretModeOK)
)

// secretModeOK reports whether a secret file's permission bits are tight
// enough: none for group or others, except that a file root owns, read by
// a process that is not root, may be readable by its group — the process
// reads it through the group, the way PostgreSQL accepts a root-owned
// 0640 key file and a Kubernetes secret volume with an fsGroup (0440)
// gives it.
func secretModeOK(perm os.FileMode, owner uint32, euid int) bool {
	if owner == 0 && euid != 0 {
		return perm&0o037 == 0
	}
	return perm&0o077 == 0
}

func readCheckedFile(path string, maxBytes int64, class fileClass) ([]byte, error) {
	kind := "file"
	if class == fileSecret {
		kind = "secret file"
	}
	// A public file is opened by its path; a secret or trusted one by
	// its resolved path, once the links and directories leading to it
	// are checked (resolvePath).
	open := path
	var info os.FileInfo
	var err error
	if class == filePublic {
		info, err = os.Stat(path)
		if err != nil {
			return nil, fileError(kind, path, err)
		}
	} else if open, info, err = resolvePath(path, kind); err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, reasonf(ErrUnsafeFile, "%s %s is not a regular file", kind, path)
	}
	perm := info.Mode().Perm()
	owner, ownerOK := FileOwnerOK(info)
	if class != filePublic && !ownerOK {
		return nil, reasonf(ErrUnsafeFile, "%s %s is owned by uid %d, not by this process's user (uid %d) or root; chown it", kind, path, owner, os.Geteuid())
	}
	if class == fileSecret && !secretModeOK(perm, owner, os.Geteuid()) {
		return nil, reasonf(ErrUnsafeFile, "%s %s is accessible by group or others (mode %04o); chmod 600 it (a file root owns may be readable by its group, 0640 or 0440, when this process is not root and reads it through that group)", kind, path, perm)
	}
	if class != fileSecret && perm&0o022 != 0 {
		return nil, reasonf(ErrUnsafeFile, "%s %s is writable by group or others (mode %04o); chmod go-w it", kind, path, perm)
	}
	if info.Size() == 0 {
		return nil, reasonf(ErrEmptyFile, "%s %s is empty (0 bytes)", kind, path)
	}
	if info.Size() > maxBytes {
		return nil, reasonf(ErrUnsafeFile, "%s %s is %d bytes, more than the %d allowed", kind, path, info.Size(), maxBytes)
	}
	f, err := os.Open(open)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, path, err)
	}
	defer f.Close()
	opened, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, path, err)
	}
	if !os.SameFile(info, opened) {
		return nil, reasonf(ErrUnsafeFile, "%s %s changed while it was being opened; try again", kind, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, path, err)
	}
	if int64(len(data)) > maxBytes {
		clear(data)
		return nil, reasonf(ErrUnsafeFile, "%s %s grew beyond %d bytes while being read", kind, path, maxBytes)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, reasonf(ErrEmptyFile, "%s %s holds only whitespace", kind, path)
	}
	out := append([]byte(nil), trimmed...)
	clear(data)
	return out, nil
}

// fileError words err, met looking for a file named path: a file (or a
// directory on its path) that does not exist is said to, naming which,
// without the system call's name; other errors keep the system's words.
// The result wraps err.
func fileError(kind, path string, err error) error {
	var pe *fs.PathError
	if errors.Is(err, fs.ErrNotExist) && errors.As(err, &pe) {
		missing := pe.Path
		if missing == path || missing == "" {
			return &wordedError{msg: fmt.Sprintf("%s %s does not exist", kind, path), err: err}
		}
		return &wordedError{msg: fmt.Sprintf("%s %s does not exist (there is no %s)", kind, path, missing), err: err}
	}
	return fmt.Errorf("%s %s: %w", kind, path, err)
}

// wordedError is err said in other words.
type wordedError struct {
	msg string
	err error
}

func (e *wordedError) Error() string { return e.msg }
func (e *wordedError) Unwrap() error { return e.err }

// OctalMode is m's permission bits as ls and chmod write them in octal, for
// error messages: Go keeps the setuid, setgid and sticky bits outside
// os.ModePerm, so formatting m itself would name /tmp's 1777 as 4000777.
func OctalMode(m os.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// JWKS returns a JSON Web Key Set document publishing the Ed25519 public keys,
// each with kid = its did:key, alg EdDSA and use sig.
func JWKS(keys ...ed25519.PublicKey) ([]byte, error) {
	set := jwk.NewSet()
	for _, pub := range keys {
		k, err := jwk.FromRaw(pub)
		if err != nil {
			return nil, fmt.Errorf("aip: JWKS: %w", err)
		}
		for name, v := range map[string]any{jwk.KeyIDKey: DIDKey(pub), jwk.AlgorithmKey: jwa.EdDSA, jwk.KeyUsageKey: "sig"} {
			if err := k.Set(name, v); err != nil {
				return nil, fmt.Errorf("aip: JWKS: set %s: %w", name, err)
			}
		}
		if err := set.AddKey(k); err != nil {
			return nil, fmt.Errorf("aip: JWKS: %w", err)
		}
	}
	return json.Marshal(set)
}

// EncodeSignature encodes a signature as standard base64 with padding.
func EncodeSignature(sig []byte) string { return base64.StdEncoding.EncodeToString(sig) }

// ErrBadSignature is returned (wrapped) when a signature does not verify.
var ErrBadSignature = errors.New("aip: signature does not verify")

// VerifySignature checks a standard-base64 Ed25519 signature of msg. The
// base64 must be canonical: padded, with zero padding bits.
func VerifySignature(pub ed25519.PublicKey, msg []byte, sigB64 string) error {
	if len(sigB64) != base64.StdEncoding.EncodedLen(ed25519.SignatureSize) {
		return fmt.Errorf("%w: signature must be %d bytes in standard base64", ErrBadSignature, ed25519.SignatureSize)
	}
	var sig [ed25519.SignatureSize + 2]byte // DecodedLen of 88 characters
	// Strict: the padding bits must be zero, so a signature has exactly one
	// spelling (Rust's base64 STANDARD engine refuses the others too).
	n, err := base64.StdEncoding.Strict().Decode(sig[:], []byte(sigB64))
	if err != nil || n != ed25519.SignatureSize {
		return fmt.Errorf("%w: signature is not standard base64", ErrBadSignature)
	}
	if err := CheckPublicKey(pub); err != nil {
		return fmt.Errorf("%w: %w", ErrBadSignature, err)
	}
	if !ed25519.Verify(pub, msg, sig[:ed25519.SignatureSize]) {
		return ErrBadSignature
	}
	return nil
}

var base64Std = base64.StdEncoding

func base64Len(n int) int { return base64Std.EncodedLen(n) }
