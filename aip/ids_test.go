package aip

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"
)

func TestNewIDForm(t *testing.T) {
	prefixes := []string{PrefixMessage, PrefixSession, PrefixCorrelation, PrefixAction, PrefixEvent, PrefixReceipt,
		PrefixType, PrefixVersion, PrefixInstance, PrefixReplica, PrefixRoute}
	for _, p := range prefixes {
		id := NewID(p)
		if len(id) != len(p)+32 || !strings.HasPrefix(id, p) {
			t.Errorf("NewID(%q) = %q", p, id)
		}
		if err := ValidateID(p, id); err != nil {
			t.Errorf("ValidateID(%q, %q): %v", p, id, err)
		}
	}
}

func TestNewIDMonotonic(t *testing.T) {
	prev := NewID(PrefixMessage)
	for i := 0; i < 10000; i++ {
		id := NewID(PrefixMessage)
		if id <= prev {
			t.Fatalf("ids not increasing: %s then %s", prev, id)
		}
		prev = id
	}
}

// uuidRand74 returns the 74 random bits of a UUIDv7 (rand_a, then rand_b).
func uuidRand74(u [16]byte) *big.Int {
	b := u[6:16:16]
	c := append([]byte(nil), b...)
	c[0] &= 0x0F // the version
	c[2] &= 0x3F // the variant
	hi := new(big.Int).SetBytes(c[:2])
	lo := new(big.Int).SetBytes(c[2:])
	return hi.Lsh(hi, 62).Or(hi, lo)
}

// uuidMS returns a UUIDv7's Unix millisecond.
func uuidMS(u [16]byte) uint64 {
	var b [8]byte
	copy(b[2:], u[:6])
	return binary.BigEndian.Uint64(b[:])
}

// checkUUIDv7Form fails unless u carries version 7 and the RFC 9562 variant.
func checkUUIDv7Form(t *testing.T, u [16]byte) {
	t.Helper()
	if u[6]>>4 != 7 || u[8]>>6 != 0b10 {
		t.Fatalf("%x is not a version 7 UUID of the RFC 9562 variant", u)
	}
}

// TestNewUUIDv7IncrementIsNotOne: two identifiers of one millisecond
// differ by a random amount, not by 1 (the previous value plus 1 was the
// next: an action ID a tenant saw told the ones the dispatcher issued next,
// to other tenants, in that millisecond).
func TestNewUUIDv7IncrementIsNotOne(t *testing.T) {
	const wantPairs = 1000
	prev := NewUUIDv7()
	pairs, ones := 0, 0
	incs := map[string]bool{}
	for i := 0; pairs < wantPairs; i++ {
		if i == 1_000_000 {
			t.Fatalf("only %d of 1000000 consecutive identifiers were of one millisecond", pairs)
		}
		u := NewUUIDv7()
		checkUUIDv7Form(t, u)
		if bytes.Compare(u[:], prev[:]) <= 0 {
			t.Fatalf("not increasing: %x then %x", prev, u)
		}
		if uuidMS(u) == uuidMS(prev) {
			pairs++
			inc := new(big.Int).Sub(uuidRand74(u), uuidRand74(prev))
			if inc.Cmp(big.NewInt(1)) == 0 {
				ones++
			}
			incs[inc.String()] = true
		}
		prev = u
	}
	// An increment is 1 with probability 2^-32: two of 1000 are never.
	if ones > 1 {
		t.Errorf("%d of %d identifiers of one millisecond are the previous plus 1", ones, pairs)
	}
	if len(incs) < pairs-10 {
		t.Errorf("%d identifiers of one millisecond were incremented by only %d different amounts", pairs, len(incs))
	}
}

// randBytes returns crypto/rand bytes for nextUUIDv7.
func randBytes(t *testing.T) [uuidRandBytes]byte {
	var r [uuidRandBytes]byte
	if _, err := rand.Read(r[:]); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestNextUUIDv7ManyInOneMillisecond: 100000 identifiers of one
// millisecond are strictly increasing, each by 1 to 2^32, and keep the
// millisecond (a fresh value leaves 2^61 of headroom).
func TestNextUUIDv7ManyInOneMillisecond(t *testing.T) {
	const ms = 1_700_000_000_000
	prev := nextUUIDv7([16]byte{}, ms, randBytes(t))
	maxInc := new(big.Int).Lsh(big.NewInt(1), 32)
	for range 100_000 {
		u := nextUUIDv7(prev, ms, randBytes(t))
		checkUUIDv7Form(t, u)
		if uuidMS(u) != ms {
			t.Fatalf("%x left millisecond %d", u, uint64(ms))
		}
		inc := new(big.Int).Sub(uuidRand74(u), uuidRand74(prev))
		if inc.Sign() <= 0 || inc.Cmp(maxInc) > 0 {
			t.Fatalf("%x then %x: incremented by %s, want 1 to 2^32", prev, u, inc)
		}
		prev = u
	}
}

// TestNextUUIDv7Overflow: random bits that overflow take the next
// millisecond (with fresh random bits), and the identifiers stay strictly
// increasing across it; a carry from rand_b into rand_a keeps the
// millisecond; a clock that went back keeps incrementing the last one's.
func TestNextUUIDv7Overflow(t *testing.T) {
	const ms = 1_700_000_000_000
	at := func(ms uint64, randA uint16, randB uint64) [16]byte {
		var u [16]byte
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], ms)
		copy(u[:6], b[2:])
		u[6], u[7] = 0x70|byte(randA>>8), byte(randA)
		binary.BigEndian.PutUint64(u[8:], randB|0b10<<62)
		return u
	}
	// r with increment 1 + inc and fresh bits 0xAB...
	withInc := func(inc uint32) [uuidRandBytes]byte {
		var r [uuidRandBytes]byte
		for i := range 10 {
			r[i] = 0xAB
		}
		binary.BigEndian.PutUint32(r[10:], inc)
		return r
	}
	fresh := at(ms+1, 0xBAB, 0xABABABABABABABAB&(1<<61-1))
	for name, c := range map[string]struct {
		last [16]byte
		now  uint64
		inc  uint32
		want [16]byte
	}{
		"overflow by 1":          {at(ms, 0xFFF, 1<<62-1), ms, 0, fresh},
		"overflow by 2^32":       {at(ms, 0xFFF, 1<<62-5), ms, 1<<32 - 1, fresh},
		"overflow, clock back":   {at(ms, 0xFFF, 1<<62-1), ms - 5, 0, fresh},
		"carry into rand_a":      {at(ms, 0xFFE, 1<<62-1), ms, 0, at(ms, 0xFFF, 0)},
		"carry with a remainder": {at(ms, 0x123, 1<<62-10), ms, 1<<32 - 1, at(ms, 0x124, 1<<32-10)},
		"clock back":             {at(ms, 0x123, 7), ms - 1000, 41, at(ms, 0x123, 49)},
		"next millisecond":       {at(ms, 0xFFF, 1<<62-1), ms + 1, 0, fresh},
	} {
		got := nextUUIDv7(c.last, c.now, withInc(c.inc))
		if got != c.want {
			t.Errorf("%s: got %x, want %x", name, got, c.want)
		}
		if bytes.Compare(got[:], c.last[:]) <= 0 {
			t.Errorf("%s: %x does not follow %x", name, got, c.last)
		}
	}

	// Many identifiers of one millisecond across the overflow.
	prev := at(ms, 0xFFF, 1<<62-1<<40)
	for range 10_000 {
		u := nextUUIDv7(prev, ms, randBytes(t))
		checkUUIDv7Form(t, u)
		if bytes.Compare(u[:], prev[:]) <= 0 {
			t.Fatalf("not increasing: %x then %x", prev, u)
		}
		prev = u
	}
	if uuidMS(prev) != ms+1 {
		t.Errorf("after 10000 identifiers from 2^40 below the overflow: millisecond %d, want %d", uuidMS(prev), uint64(ms+1))
	}
}

func TestIDTime(t *testing.T) {
	before := time.Now().Add(-time.Millisecond)
	id := NewActionID()
	at, err := IDTime(PrefixAction, id)
	if err != nil {
		t.Fatal(err)
	}
	if at.Before(before.Truncate(time.Millisecond)) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("IDTime(%s) = %v, want about now", id, at)
	}
}

func TestValidateIDRejects(t *testing.T) {
	good := NewID(PrefixReplica)
	hex := good[len(PrefixReplica):]
	tests := []string{
		"",
		"crepl_",
		"cinst_" + hex,                       // wrong prefix
		PrefixReplica + strings.ToUpper(hex), // uppercase
		PrefixReplica + hex[:31],             // short
		PrefixReplica + hex + "0",            // long
		PrefixReplica + hex[:12] + "4" + hex[13:], // version 4
		PrefixReplica + hex[:16] + "c" + hex[17:], // wrong variant
		PrefixReplica + hex[:5] + "-" + hex[6:],   // not hex
	}
	for _, id := range tests {
		if err := ValidateID(PrefixReplica, id); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ValidateID(%q) = %v, want ErrInvalidID", id, err)
		}
	}
}

// Errors quote a bad identifier, but only its start: a hostile message ID
// of megabytes must not become a megabyte error (answered and logged).
func TestValidateIDErrorIsBounded(t *testing.T) {
	for _, id := range []string{
		strings.Repeat("x", 1<<20),
		PrefixMessage + strings.Repeat("0", 1<<20),
		PrefixMessage + strings.Repeat("g", 32),
	} {
		err := ValidateID(PrefixMessage, id)
		if !errors.Is(err, ErrInvalidID) {
			t.Fatalf("ValidateID: %v, want ErrInvalidID", err)
		}
		if n := len(err.Error()); n > 300 {
			t.Errorf("error for a %d-byte id is %d bytes", len(id), n)
		}
	}
}

// TestValidateRecordID: a registry record's ID is its prefix followed by
// letters, digits, '.', '_' or '-' — NewID's and readable ones alike —
// within MaxRecordIDBytes.
func TestValidateRecordID(t *testing.T) {
	for _, id := range []string{NewID(PrefixReplica), "crepl_1", "crepl_notes-eu.1_b", "crepl_" + strings.Repeat("x", MaxRecordIDBytes-len("crepl_"))} {
		if err := ValidateRecordID(PrefixReplica, id); err != nil {
			t.Errorf("ValidateRecordID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range []string{"", "crepl_", "replica-1", "cinst_1", "crepl_a/b", "crepl_a b", "crepl_é", "crepl_a\x00",
		"crepl_" + strings.Repeat("x", MaxRecordIDBytes-len("crepl_")+1)} {
		if err := ValidateRecordID(PrefixReplica, id); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ValidateRecordID(%q) = %v, want ErrInvalidID", id, err)
		}
	}
}

// TestIdentifierCharFault: the one character rule of registry
// identifiers, channel IDs and manifest agent IDs names the first fault in
// its order (not UTF-8, white space at either end, control, formatting),
// with the character, its code point and byte offset.
func TestIdentifierCharFault(t *testing.T) {
	for in, want := range map[string]string{
		"service:alpha": "",
		"a b":           "",
		"a\xffb\u200b":  "holds the byte 0xFF at byte 1, which is not UTF-8",
		" a\u200b":      "starts with the white space ' ' (U+0020) at byte 0",
		"a\u00a0":       "ends with the white space '\\u00a0' (U+00A0) at byte 1",
		"a\u200bb\x01":  "holds the control character '\\x01' (U+0001) at byte 5",
		"svc\u200bx":    "holds the invisible formatting character '\\u200b' (U+200B) at byte 3",
		"ok\u202e":      "holds the invisible formatting character '\\u202e' (U+202E) at byte 2",
	} {
		if got := IdentifierCharFault(in); got != want {
			t.Errorf("IdentifierCharFault(%q) = %q; want %q", in, got, want)
		}
	}
}
