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
		return nil, fmt.Errorf("%w: %q", ErrDIDMethod, truncateForError(did))
	}
	value := did[len(method):]
	if value == "" || value[0] != 'z' {
		return nil, fmt.Errorf("%w: %q", ErrDIDMultibase, truncateForError(did))
	}
	if len(value) > 128 {
		return nil, fmt.Errorf("%w: %d characters is too long for an Ed25519 key", ErrDIDKeyLength, len(value))
	}
	raw, err := base58Decode(value[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDIDBase58, err)
	}
	if len(raw) < 2 || raw[0] != ed25519Multicodec[0] || raw[1] != ed25519Multicodec[1] {
		return nil, fmt.Errorf("%w: %q", ErrDIDMulticodec, truncateForError(did))
	}
	if len(raw)-2 != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrDIDKeyLength, len(raw)-2, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(raw[2:]), nil
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
