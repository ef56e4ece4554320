package aip

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
)

// DIDKeyPrefix starts every did:key identifier this package accepts: the
// did:key method with a base58btc ("z") multibase value.
const DIDKeyPrefix = "did:key:z"

// Errors of ParseDIDKey. Each is distinct so callers can tell a wrong method
// from a corrupt key.
var (
	ErrDIDMethod     = errors.New("aip: not a did:key identifier")
	ErrDIDMultibase  = errors.New("aip: did:key value is not base58btc multibase (must start with 'z')")
	ErrDIDBase58     = errors.New("aip: did:key value is not valid base58btc")
	ErrDIDMulticodec = errors.New("aip: did:key multicodec is not ed25519-pub (0xed01)")
	ErrDIDKeyLength  = errors.New("aip: did:key public key has the wrong length")
	// ErrWeakKey: the key is a non-canonical encoding, or a point of small
	// order. Such a key is never the public half of a real key pair, and a
	// small-order key "verifies" forged signatures over any message.
	ErrWeakKey = errors.New("aip: Ed25519 public key is a small-order point or not canonically encoded")
)

// multicodec varint of ed25519-pub (0xed).
var ed25519Multicodec = [2]byte{0xed, 0x01}

// DIDKey returns the did:key identifier of an Ed25519 public key:
// "did:key:z" + base58btc(0xED 0x01 ‖ key).
func DIDKey(pub ed25519.PublicKey) string {
	b := make([]byte, 0, 2+ed25519.PublicKeySize)
	b = append(b, ed25519Multicodec[:]...)
	b = append(b, pub...)
	return DIDKeyPrefix + base58Encode(b)
}

// ParseDIDKey decodes a did:key identifier into its Ed25519 public key. Other
// DID methods, other multibase encodings, other multicodecs, invalid base58
// and keys of the wrong length are refused with distinct errors.
func ParseDIDKey(did string) (ed25519.PublicKey, error) {
	const method = "did:key:"
	if !strings.HasPrefix(did, method) {
		return nil, reasonf(ErrDIDMethod, "%q is not a did:key identifier", truncateForError(did))
	}
	value := did[len(method):]
	if value == "" || value[0] != 'z' {
		return nil, reasonf(ErrDIDMultibase, "%q is not a did:key in base58btc multibase: did:key: must be followed by 'z'", truncateForError(did))
	}
	if len(value) > 128 {
		return nil, labelf(ErrDIDKeyLength, "%d characters is too long for an Ed25519 key", len(value))
	}
	raw, err := base58Decode(value[1:])
	if err != nil {
		return nil, labelf(ErrDIDBase58, "%v", err)
	}
	if len(raw) < 2 || raw[0] != ed25519Multicodec[0] || raw[1] != ed25519Multicodec[1] {
		return nil, reasonf(ErrDIDMulticodec, "%q is not the did:key of an Ed25519 key (multicodec ed25519-pub, 0xed01)", truncateForError(did))
	}
	if len(raw)-2 != ed25519.PublicKeySize {
		return nil, labelf(ErrDIDKeyLength, "%d bytes, want %d", len(raw)-2, ed25519.PublicKeySize)
	}
	pub := ed25519.PublicKey(raw[2:])
	if err := CheckPublicKey(pub); err != nil {
		return nil, labelf(err, "%q", truncateForError(did))
	}
	return pub, nil
}

// CheckPublicKey refuses an Ed25519 public key that no honest key pair has:
// one of the wrong length, a non-canonical encoding (y not below the field
// prime 2^255-19), or a point of small order. crypto/ed25519.Verify (like
// ed25519-dalek's verify) accepts a small-order key: with the identity point
// as the key, the signature R = identity, S = 0 verifies for every message,
// so whoever could get such a DID pinned or provisioned could sign anything
// as it.
func CheckPublicKey(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return labelf(ErrDIDKeyLength, "%d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	var y [32]byte
	copy(y[:], pub)
	y[31] &= 0x7f // the sign of x
	// y must be below p = 2^255 - 19: compare from the most significant byte.
	canonical := false
	for i := 31; i >= 0; i-- {
		if y[i] != fieldPrime[i] {
			canonical = y[i] < fieldPrime[i]
			break
		}
	}
	if !canonical {
		return ErrWeakKey
	}
	for _, w := range smallOrderY {
		if y == w {
			return ErrWeakKey
		}
	}
	return nil
}

// fieldPrime is p = 2^255 - 19, little-endian.
var fieldPrime = func() (p [32]byte) {
	for i := range p {
		p[i] = 0xff
	}
	p[0], p[31] = 0xed, 0x7f
	return p
}()

// smallOrderY are the canonical y coordinates (little-endian, sign bit
// clear) of the eight points of order dividing 8: y = 1 (the identity),
// y = p-1 (order 2), y = 0 (the two points of order 4) and the two y of the
// four points of order 8 (which add up to p). TestSmallOrderPoints checks
// each by multiplying by 8.
var smallOrderY = [...][32]byte{
	{0x01},
	func() (y [32]byte) { y = fieldPrime; y[0]--; return y }(),
	{},
	{0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98, 0xf0,
		0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53, 0xfc, 0x05},
	{0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67, 0x0f,
		0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac, 0x03, 0x7a},
}

func truncateForError(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

const base58Alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

var base58Index = func() (idx [256]int8) {
	for i := range idx {
		idx[i] = -1
	}
	for i := 0; i < len(base58Alphabet); i++ {
		idx[base58Alphabet[i]] = int8(i)
	}
	return idx
}()

// base58Encode encodes b with the Bitcoin alphabet; leading zero bytes become
// leading '1' characters.
func base58Encode(b []byte) string {
	zeros := 0
	for zeros < len(b) && b[zeros] == 0 {
		zeros++
	}
	// log(256)/log(58) ≈ 1.366
	digits := make([]byte, 0, len(b)*138/100+1)
	for _, v := range b[zeros:] {
		carry := int(v)
		for i := range digits {
			carry += int(digits[i]) << 8
			digits[i] = byte(carry % 58)
			carry /= 58
		}
		for carry > 0 {
			digits = append(digits, byte(carry%58))
			carry /= 58
		}
	}
	out := make([]byte, zeros+len(digits))
	for i := 0; i < zeros; i++ {
		out[i] = '1'
	}
	for i, d := range digits {
		out[len(out)-1-i] = base58Alphabet[d]
	}
	return string(out)
}

func base58Decode(s string) ([]byte, error) {
	if s == "" {
		return nil, errors.New("empty value")
	}
	zeros := 0
	for zeros < len(s) && s[zeros] == '1' {
		zeros++
	}
	// log(58)/log(256) ≈ 0.733
	bytesLE := make([]byte, 0, len(s)*733/1000+1)
	for i := zeros; i < len(s); i++ {
		d := base58Index[s[i]]
		if d < 0 {
			return nil, fmt.Errorf("character %q at position %d is not in the base58btc alphabet", s[i], i)
		}
		carry := int(d)
		for j := range bytesLE {
			carry += int(bytesLE[j]) * 58
			bytesLE[j] = byte(carry)
			carry >>= 8
		}
		for carry > 0 {
			bytesLE = append(bytesLE, byte(carry))
			carry >>= 8
		}
	}
	out := make([]byte, zeros+len(bytesLE))
	for i, v := range bytesLE {
		out[len(out)-1-i] = v
	}
	return out, nil
}
