package aip

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
)

func TestDIDKeyKnownVector(t *testing.T) {
	// The all-zero seed is a widely published did:key test vector.
	k, err := NewSigningKey(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	if want := "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp"; k.DID() != want {
		t.Fatalf("DID = %s, want %s", k.DID(), want)
	}
	pub, err := ParseDIDKey(k.DID())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pub, k.PublicKey()) {
		t.Fatal("ParseDIDKey did not return the key")
	}
}

func TestDIDKeyRoundTrip(t *testing.T) {
	for i := 0; i < 50; i++ {
		k, err := GenerateSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := ParseDIDKey(k.DID())
		if err != nil {
			t.Fatalf("ParseDIDKey(%s): %v", k.DID(), err)
		}
		if !bytes.Equal(pub, k.PublicKey()) {
			t.Fatalf("round trip of %s changed the key", k.DID())
		}
	}
	// A key with leading zero bytes keeps them through base58's '1's.
	zeroLed := make(ed25519.PublicKey, 32)
	zeroLed[31] = 7
	if pub, err := ParseDIDKey(DIDKey(zeroLed)); err != nil || !bytes.Equal(pub, zeroLed) {
		t.Fatalf("zero-led key: %v", err)
	}
}

func TestParseDIDKeyErrors(t *testing.T) {
	valid := "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp"
	// secp256k1-pub multicodec (0xe7 0x01) with a 33-byte key.
	secp := DIDKeyPrefix + base58Encode(append([]byte{0xe7, 0x01}, make([]byte, 33)...))
	short := DIDKeyPrefix + base58Encode(append([]byte{0xed, 0x01}, make([]byte, 31)...))
	long := DIDKeyPrefix + base58Encode(append([]byte{0xed, 0x01}, make([]byte, 33)...))
	tests := []struct {
		did  string
		want error
	}{
		{"did:web:example.com", ErrDIDMethod},
		{"", ErrDIDMethod},
		{"did:key", ErrDIDMethod},
		{"did:key:", ErrDIDMultibase},
		{"did:key:m" + valid[len(DIDKeyPrefix):], ErrDIDMultibase},
		{"did:key:z6Mk0OIl", ErrDIDBase58},
		{"did:key:z", ErrDIDBase58},
		{secp, ErrDIDMulticodec},
		{short, ErrDIDKeyLength},
		{long, ErrDIDKeyLength},
		{"did:key:z" + strings.Repeat("2", 200), ErrDIDKeyLength},
	}
	for _, tt := range tests {
		_, err := ParseDIDKey(tt.did)
		if !errors.Is(err, tt.want) {
			t.Errorf("ParseDIDKey(%q) = %v, want %v", tt.did, err, tt.want)
		}
	}
	// The errors are distinct from one another.
	all := []error{ErrDIDMethod, ErrDIDMultibase, ErrDIDBase58, ErrDIDMulticodec, ErrDIDKeyLength}
	for i := range all {
		for j := range all {
			if i != j && errors.Is(all[i], all[j]) {
				t.Errorf("%v matches %v", all[i], all[j])
			}
		}
	}
}
