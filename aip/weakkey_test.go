package aip

import (
	"crypto/ed25519"
	"errors"
	"math/big"
	"testing"
)

// edPoint is an affine point of edwards25519, -x² + y² = 1 + d·x²·y², in
// big integers: slow and plain, to check the small-order table by arithmetic.
type edPoint struct{ x, y *big.Int }

var (
	edP = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
	edD = func() *big.Int { // -121665 / 121666
		d := new(big.Int).ModInverse(big.NewInt(121666), edP)
		d.Mul(d, big.NewInt(-121665))
		return d.Mod(d, edP)
	}()
)

func edMod(v *big.Int) *big.Int { return v.Mod(v, edP) }

func edInv(v *big.Int) *big.Int { return new(big.Int).ModInverse(v, edP) }

func (a edPoint) add(b edPoint) edPoint {
	x1x2 := edMod(new(big.Int).Mul(a.x, b.x))
	y1y2 := edMod(new(big.Int).Mul(a.y, b.y))
	dxy := edMod(new(big.Int).Mul(edD, new(big.Int).Mul(x1x2, y1y2)))
	xn := edMod(new(big.Int).Add(new(big.Int).Mul(a.x, b.y), new(big.Int).Mul(a.y, b.x)))
	yn := edMod(new(big.Int).Add(y1y2, x1x2))
	x3 := edMod(xn.Mul(xn, edInv(new(big.Int).Add(big.NewInt(1), dxy))))
	y3 := edMod(yn.Mul(yn, edInv(edMod(new(big.Int).Sub(big.NewInt(1), dxy)))))
	return edPoint{x3, y3}
}

// edDecode decodes an RFC 8032 point encoding; ok is false off the curve.
func edDecode(enc []byte) (edPoint, bool) {
	le := append([]byte(nil), enc...)
	sign := le[31] >> 7
	le[31] &= 0x7f
	be := make([]byte, 32)
	for i := range le {
		be[31-i] = le[i]
	}
	y := new(big.Int).SetBytes(be)
	y2 := edMod(new(big.Int).Mul(y, y))
	num := edMod(new(big.Int).Sub(y2, big.NewInt(1)))
	den := edMod(new(big.Int).Add(new(big.Int).Mul(edD, y2), big.NewInt(1)))
	x := new(big.Int).ModSqrt(edMod(num.Mul(num, edInv(den))), edP)
	if x == nil {
		return edPoint{}, false
	}
	if x.Sign() == 0 && sign == 1 {
		return edPoint{}, false
	}
	if uint8(x.Bit(0)) != sign {
		x.Sub(edP, x)
	}
	return edPoint{x, edMod(y)}, true
}

// TestSmallOrderPoints checks the table CheckPublicKey refuses: every entry,
// with either sign, is a point P with 8·P = identity, and the table holds
// the five y coordinates the eight such points have.
func TestSmallOrderPoints(t *testing.T) {
	points := 0
	for _, y := range smallOrderY {
		for _, sign := range []byte{0, 0x80} {
			enc := y
			enc[31] |= sign
			p, ok := edDecode(enc[:])
			if !ok {
				continue // x = 0 has no negative form
			}
			points++
			q := p
			for range 3 {
				q = q.add(q)
			}
			if q.x.Sign() != 0 || q.y.Cmp(big.NewInt(1)) != 0 {
				t.Errorf("%x: 8·P is not the identity", enc)
			}
		}
	}
	if points != 8 {
		t.Fatalf("the table decodes to %d points, want the 8 of order dividing 8", points)
	}
	// An honest key is of large order.
	k, err := GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	p, ok := edDecode(k.PublicKey())
	if !ok {
		t.Fatal("a generated key does not decode")
	}
	q := p
	for range 3 {
		q = q.add(q)
	}
	if q.x.Sign() == 0 && q.y.Cmp(big.NewInt(1)) == 0 {
		t.Fatal("a generated key has small order")
	}
}

// TestWeakKeysAreRefused: a did:key naming a small-order point or a
// non-canonical encoding is refused, and so is a signature checked against
// such a key. With the identity point as the key, (R = identity, S = 0)
// verifies under crypto/ed25519 for every message: a forgery for free.
func TestWeakKeysAreRefused(t *testing.T) {
	identity := make(ed25519.PublicKey, 32)
	identity[0] = 1
	forged := make([]byte, 64)
	forged[0] = 1 // R = identity encoding, S = 0
	if !ed25519.Verify(identity, []byte("anything at all"), forged) {
		t.Fatal("premise: crypto/ed25519 accepts the identity key forgery")
	}
	if err := VerifySignature(identity, []byte("anything at all"), EncodeSignature(forged)); !errors.Is(err, ErrBadSignature) || !errors.Is(err, ErrWeakKey) {
		t.Fatalf("VerifySignature with the identity key = %v, want ErrBadSignature and ErrWeakKey", err)
	}

	var weak []ed25519.PublicKey
	for _, y := range smallOrderY {
		for _, sign := range []byte{0, 0x80} {
			k := make(ed25519.PublicKey, 32)
			copy(k, y[:])
			k[31] |= sign
			weak = append(weak, k)
		}
	}
	// Non-canonical encodings: y = p + n for n = 0..18 (y ≥ p), and 2^255-1.
	for n := 0; n <= 18; n++ {
		k := make(ed25519.PublicKey, 32)
		copy(k, fieldPrime[:])
		k[0] += byte(n)
		weak = append(weak, k)
	}
	allOnes := make(ed25519.PublicKey, 32)
	for i := range allOnes {
		allOnes[i] = 0xff
	}
	weak = append(weak, allOnes)
	for _, k := range weak {
		if _, err := ParseDIDKey(DIDKey(k)); !errors.Is(err, ErrWeakKey) {
			t.Errorf("ParseDIDKey(DIDKey(%x)) = %v, want ErrWeakKey", k, err)
		}
		if err := CheckPublicKey(k); !errors.Is(err, ErrWeakKey) {
			t.Errorf("CheckPublicKey(%x) = %v, want ErrWeakKey", k, err)
		}
	}

	// An envelope "signed" by the identity key does not verify.
	env := fixedActionEnvelope(t)
	env.Security = nil
	if err := env.SetSecurity(SecurityDID, DIDKey(identity)); err != nil {
		t.Fatal(err)
	}
	if err := env.SetSecurity(SecuritySignature, EncodeSignature(forged)); err != nil {
		t.Fatal(err)
	}
	raw, err := CanonicalJSON(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyEnvelope(raw, ""); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("VerifyEnvelope of an identity-key forgery = %v, want ErrBadSignature", err)
	}
}
