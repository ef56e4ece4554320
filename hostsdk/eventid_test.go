package hostsdk_test

import (
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// A derived event ID is one Publish and the fleet's event log accept, the
// same for a redelivery, different for another delivery, and carries the
// provider's time when one is given.
func TestDeriveEventID(t *testing.T) {
	at := time.Date(2026, 11, 30, 22, 0, 0, 123e6, time.UTC)
	a := hostsdk.DeriveEventID(at, []byte("delivery-1"))
	if err := aip.ValidateID(aip.PrefixEvent, a); err != nil {
		t.Fatalf("DeriveEventID = %q: %v", a, err)
	}
	if again := hostsdk.DeriveEventID(at, []byte("delivery-1")); again != a {
		t.Fatalf("a redelivery maps to %q, the first delivery to %q", again, a)
	}
	if other := hostsdk.DeriveEventID(at, []byte("delivery-2")); other == a {
		t.Fatalf("two deliveries share the ID %q", a)
	}
	if split := hostsdk.DeriveEventID(at, []byte("deliv"), []byte("ery-1")); split == a {
		t.Fatalf("material split differently maps to the same ID %q", a)
	}
	if got, err := aip.IDTime(aip.PrefixEvent, a); err != nil || !got.Equal(at) {
		t.Fatalf("IDTime(%q) = %v, %v; want %v", a, got, err, at)
	}
	zero := hostsdk.DeriveEventID(time.Time{}, []byte("delivery-1"))
	if err := aip.ValidateID(aip.PrefixEvent, zero); err != nil || zero == a {
		t.Fatalf("DeriveEventID without a time = %q (%v)", zero, err)
	}
	if zero != hostsdk.DeriveEventID(time.Time{}, []byte("delivery-1")) {
		t.Fatal("DeriveEventID without a time is not deterministic")
	}
}
