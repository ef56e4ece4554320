package hostsdk_test

import (
	"fmt"
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
	// The derivation never changes: events a replica stored before an
	// upgrade must get the same IDs when the provider redelivers them after
	// it (these are the IDs the product adapters derived before
	// DeriveEventID was public).
	for _, v := range []struct {
		at   time.Time
		want string
	}{
		{time.UnixMilli(1_900_000_000_123), "evt_01ba60d3387b7f03b00fe17e017723a7"},
		{time.Time{}, "evt_50a650f68e7a7f03b00fe17e017723a7"},
	} {
		if got := hostsdk.DeriveEventID(v.at, []byte("chatwoot"), []byte("dlv-1")); got != v.want {
			t.Errorf("DeriveEventID(%v, chatwoot, dlv-1) = %s, want %s", v.at, got, v.want)
		}
	}
	// Without a time, every bit but version and variant comes from the
	// material, and the ID is still valid, for many inputs.
	for i := range 2000 {
		if err := aip.ValidateID(aip.PrefixEvent, hostsdk.DeriveEventID(time.Time{}, []byte(fmt.Sprint(i)))); err != nil {
			t.Fatalf("input %d: %v", i, err)
		}
	}
}
