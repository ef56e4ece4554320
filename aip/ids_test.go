package aip

import (
	"errors"
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
