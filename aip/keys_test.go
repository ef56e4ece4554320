package aip

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lestrrat-go/jwx/v2/jwk"
)

func writeFile(t *testing.T, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask-proof
		t.Fatal(err)
	}
	return p
}

const zeroSeedHex = "0000000000000000000000000000000000000000000000000000000000000000"

func TestLoadSigningKeySeedFile(t *testing.T) {
	p := writeFile(t, "seed", zeroSeedHex+"\n", 0o600)
	k, err := LoadSigningKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if k.DID() != "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp" {
		t.Fatalf("DID = %s", k.DID())
	}
	if s := k.String(); strings.Contains(s, zeroSeedHex) || !strings.Contains(s, k.DID()) {
		t.Fatalf("String() = %q must show the DID and never the seed", s)
	}
}

func TestLoadSigningKeyJWK(t *testing.T) {
	want, _ := GenerateSigningKey()
	raw, err := jwk.FromRaw(want.priv)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(raw)
	p := writeFile(t, "key.jwk", string(data), 0o600)
	got, err := LoadSigningKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.DID() != want.DID() {
		t.Fatalf("JWK loaded as %s, want %s", got.DID(), want.DID())
	}

	// A public JWK cannot sign.
	pub, _ := jwk.FromRaw(want.PublicKey())
	data, _ = json.Marshal(pub)
	p = writeFile(t, "pub.jwk", string(data), 0o600)
	if _, err := LoadSigningKey(p); !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), "private") {
		t.Fatalf("public JWK: err = %v, want ErrInvalidKey about the private part", err)
	}

	// An EC key is not Ed25519.
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecJWK, _ := jwk.FromRaw(ec)
	data, _ = json.Marshal(ecJWK)
	p = writeFile(t, "ec.jwk", string(data), 0o600)
	if _, err := LoadSigningKey(p); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("EC JWK: err = %v, want ErrInvalidKey", err)
	}
}

func TestLoadSigningKeyRejectsUnsafeFiles(t *testing.T) {
	dir := t.TempDir()
	loose := writeFile(t, "loose", zeroSeedHex, 0o644)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(loose, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, mention string
		want                error
	}{
		{"group readable", writeFile(t, "g", zeroSeedHex, 0o640), "chmod 600", ErrUnsafeFile},
		{"world readable", writeFile(t, "w", zeroSeedHex, 0o604), "chmod 600", ErrUnsafeFile},
		{"symlink to a world-readable file", link, "chmod 600", ErrUnsafeFile},
		{"directory", dir, "not a regular file", ErrUnsafeFile},
		{"empty", writeFile(t, "e", "", 0o600), "empty", ErrEmptyFile},
		{"whitespace", writeFile(t, "ws", " \n", 0o600), "whitespace", ErrEmptyFile},
		{"too large", writeFile(t, "big", strings.Repeat("a", MaxKeyFileBytes+1), 0o600), "more than", ErrUnsafeFile},
		{"not hex", writeFile(t, "nh", strings.Repeat("z", 64), 0o600), "hexadecimal", ErrInvalidKey},
		{"short seed", writeFile(t, "short", zeroSeedHex[:62], 0o600), "64 hexadecimal", ErrInvalidKey},
	}
	for _, tt := range tests {
		_, err := LoadSigningKey(tt.path)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
			continue
		}
		if !strings.Contains(err.Error(), tt.mention) || !strings.Contains(err.Error(), tt.path) {
			t.Errorf("%s: error %q should name the file and mention %q", tt.name, err, tt.mention)
		}
	}
	if _, err := LoadSigningKey(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want ErrNotExist", err)
	}
}

// TestMissingFileSaysSo: a file that does not exist, or a directory on its
// path, is said not to exist, naming what is missing, for every kind of
// file; before, the error quoted the system call ("lstat /abs/x: no such
// file or directory"). An empty file is ErrEmptyFile, not ErrUnsafeFile
// (whose advice, to chmod or move the file, does not apply).
func TestMissingFileSaysSo(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for name, read := range map[string]func(string, int64) ([]byte, error){
		"secret file": ReadSecretFile, "trusted file": ReadTrustFile, "file": ReadPublicFile,
	} {
		for _, tc := range []struct{ path, want string }{
			{"missing", " missing does not exist"},
			{filepath.Join(dir, "nodir", "x"), " does not exist (there is no " + filepath.Join(dir, "nodir") + ")"},
		} {
			if name == "file" {
				tc.want = " does not exist" // os.Stat does not say which part is missing
			}
			_, err := read(tc.path, 100)
			if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "stat") {
				t.Errorf("%s %s: %v; want ErrNotExist saying %q, without the system call", name, tc.path, err, tc.want)
			}
		}
		empty := writeFile(t, "empty", "", 0o600)
		if _, err := read(empty, 100); !errors.Is(err, ErrEmptyFile) || errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), empty+" is empty") {
			t.Errorf("%s, empty: %v; want ErrEmptyFile naming it", name, err)
		}
	}
}

// TestFilesInAKubernetesVolume: a Kubernetes secret or ConfigMap volume
// mounts each key as a symlink through ..data to a timestamped directory
// the kubelet swaps on an update. Naming the key's path works for every
// kind of file: the link is followed, and what it points at is checked.
func TestFilesInAKubernetesVolume(t *testing.T) {
	vol := t.TempDir()
	stamp := filepath.Join(vol, "..2026_12_01_08_00_00.123456789")
	if err := os.Mkdir(stamp, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"signing-seed": 0o600, "gateway.did": 0o644} {
		p := filepath.Join(stamp, name)
		content := zeroSeedHex
		if name == "gateway.did" {
			content = "did:key:z6Mkexample"
		}
		if err := os.WriteFile(p, []byte(content+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(stamp), filepath.Join(vol, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"signing-seed", "gateway.did"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadSigningKey(filepath.Join(vol, "signing-seed")); err != nil {
		t.Errorf("secret in a Kubernetes volume: %v", err)
	}
	if got, err := ReadTrustFile(filepath.Join(vol, "gateway.did"), 1024); err != nil || string(got) != "did:key:z6Mkexample" {
		t.Errorf("ConfigMap file in a Kubernetes volume: %q, %v", got, err)
	}
	if got, err := ReadPublicFile(filepath.Join(vol, "gateway.did"), 1024); err != nil || string(got) != "did:key:z6Mkexample" {
		t.Errorf("ReadPublicFile through the links: %q, %v", got, err)
	}
}

// TestSecretModeOK: no group or other bits, except group read on a file
// root owns that a process other than root reads (PostgreSQL's rule for
// its key files; a Kubernetes secret volume with an fsGroup and
// defaultMode 0440).
func TestSecretModeOK(t *testing.T) {
	for _, c := range []struct {
		perm  os.FileMode
		owner uint32
		euid  int
		ok    bool
	}{
		{0o600, 1000, 1000, true},
		{0o400, 1000, 1000, true},
		{0o640, 1000, 1000, false}, // the process's own file: owner only
		{0o440, 0, 1000, true},     // root's, read through the group
		{0o640, 0, 1000, true},
		{0o660, 0, 1000, false}, // group-writable
		{0o644, 0, 1000, false}, // others may read
		{0o650, 0, 1000, false},
		{0o640, 0, 0, false}, // root reading its own file: owner only
		{0o600, 0, 0, true},
	} {
		if got := secretModeOK(c.perm, c.owner, c.euid); got != c.ok {
			t.Errorf("secretModeOK(%04o, owner %d, euid %d) = %v, want %v", c.perm, c.owner, c.euid, got, c.ok)
		}
	}
}

func TestReadPublicFile(t *testing.T) {
	p := writeFile(t, "ca.pem", "cert", 0o644)
	if got, err := ReadPublicFile(p, 1024); err != nil || string(got) != "cert" {
		t.Fatalf("ReadPublicFile = %q, %v", got, err)
	}
	p = writeFile(t, "ca2.pem", "cert", 0o666)
	if _, err := ReadPublicFile(p, 1024); !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "chmod go-w") {
		t.Fatalf("world-writable: err = %v", err)
	}
}

func TestWriteSeedFile(t *testing.T) {
	k, _ := GenerateSigningKey()
	p := filepath.Join(t.TempDir(), "seed")
	if err := WriteSeedFile(p, k); err != nil {
		t.Fatal(err)
	}
	info, _ := os.Stat(p)
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, want 0600", info.Mode().Perm())
	}
	back, err := LoadSigningKey(p)
	if err != nil || back.DID() != k.DID() {
		t.Fatalf("reload: %v", err)
	}
	if err := WriteSeedFile(p, k); err == nil {
		t.Fatal("WriteSeedFile overwrote an existing file")
	}
}

func TestJWKS(t *testing.T) {
	k, _ := GenerateSigningKey()
	data, err := JWKS(k.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Keys) != 1 {
		t.Fatalf("keys = %d", len(doc.Keys))
	}
	key := doc.Keys[0]
	for name, want := range map[string]string{"kty": "OKP", "crv": "Ed25519", "kid": k.DID(), "alg": "EdDSA", "use": "sig"} {
		if key[name] != want {
			t.Errorf("%s = %v, want %s", name, key[name], want)
		}
	}
	if _, ok := key["d"]; ok {
		t.Fatal("JWKS leaked the private key")
	}
	set, err := jwk.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 1 {
		t.Fatal("jwk.Parse: want one key")
	}
}

func TestVerifySignatureRejects(t *testing.T) {
	k, _ := GenerateSigningKey()
	msg := []byte("hello")
	sig := EncodeSignature(k.Sign(msg))
	if err := VerifySignature(k.PublicKey(), msg, sig); err != nil {
		t.Fatal(err)
	}
	other, _ := GenerateSigningKey()
	for name, tc := range map[string]struct {
		sig string
		msg []byte
		key []byte
	}{
		"other key":   {sig, msg, other.PublicKey()},
		"other msg":   {sig, []byte("hellO"), k.PublicKey()},
		"not base64":  {strings.Repeat("!", len(sig)), msg, k.PublicKey()},
		"short":       {sig[:40], msg, k.PublicKey()},
		"url base64":  {strings.NewReplacer("+", "-", "/", "_").Replace(sig) + "x", msg, k.PublicKey()},
		"empty":       {"", msg, k.PublicKey()},
		"bad key len": {sig, msg, k.PublicKey()[:31]},
	} {
		if err := VerifySignature(tc.key, tc.msg, tc.sig); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: err = %v, want ErrBadSignature", name, err)
		}
	}
}

// A signature has one spelling: standard base64 with zero padding bits, as
// Rust's base64 STANDARD engine requires; the other 15 spellings of the
// last character must not verify.
func TestVerifySignatureRejectsNonCanonicalBase64(t *testing.T) {
	k := hostKey(t)
	msg := []byte("hello")
	sig := EncodeSignature(k.Sign(msg))
	if !strings.HasSuffix(sig, "==") {
		t.Fatalf("a 64-byte signature ends in ==: %s", sig)
	}
	// The last data character carries 2 signature bits and 4 padding bits.
	last := strings.IndexByte(base64Alphabet, sig[85])
	variants := 0
	for pad := 1; pad < 16; pad++ {
		alt := sig[:85] + string(base64Alphabet[last|pad]) + "=="
		if alt == sig {
			continue
		}
		variants++
		if err := VerifySignature(k.PublicKey(), msg, alt); !errors.Is(err, ErrBadSignature) {
			t.Errorf("signature %s (non-zero padding bits) verifies: err = %v", alt, err)
		}
	}
	if variants != 15 {
		t.Fatalf("tried %d variants, want 15", variants)
	}

	// The same through a signed envelope: only security.signature changes.
	signed, err := SignEnvelope(k, fixedActionEnvelope(t))
	if err != nil {
		t.Fatal(err)
	}
	var env Envelope
	if err := json.Unmarshal(signed, &env); err != nil {
		t.Fatal(err)
	}
	var good string
	if _, err := env.SecurityValue(SecuritySignature, &good); err != nil {
		t.Fatal(err)
	}
	i := strings.IndexByte(base64Alphabet, good[85])
	bad := good[:85] + string(base64Alphabet[i^1]) + "=="
	body := []byte(strings.Replace(string(signed), good, bad, 1))
	if _, err := VerifyEnvelope(body, k.DID()); !errors.Is(err, ErrBadSignature) {
		t.Errorf("envelope with a respelled signature: err = %v, want ErrBadSignature", err)
	}
}

const base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
