package hostsdk

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// DeriveEventID returns an event ID for a provider event that the provider
// may deliver more than once (a webhook retried after a timeout, a change
// seen again by a poll): "evt_" and a UUIDv7-shaped value, as Publish and
// the fleet's event log require, derived from the material alone, so a
// redelivery maps to the same ID and the fleet stores it once.
//
// Pass what identifies the delivery for the provider (its delivery or
// event ID, or the raw body when it has none), and at, the time the
// provider says the change happened (the first 48 bits are its Unix
// milliseconds, so IDs sort roughly by it). Use a time that stays the
// same when the provider sends the delivery again, or the zero time, in
// which case those bits come from the digest too. The rest is SHA-256 of
// the material, each part length-prefixed (so ("ab","c") and ("a","bc")
// differ), with the UUID version and variant bits set.
func DeriveEventID(at time.Time, material ...[]byte) string {
	h := sha256.New()
	for _, m := range material {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(m)))
		h.Write(n[:])
		h.Write(m)
	}
	sum := h.Sum(nil)
	var u [16]byte
	copy(u[:], sum[:16])
	if !at.IsZero() {
		ms := uint64(max(at.UnixMilli(), 0))
		for i := range 6 {
			u[i] = byte(ms >> (40 - 8*i))
		}
	}
	u[6] = 0x70 | u[6]&0x0f
	u[8] = 0x80 | u[8]&0x3f
	return aip.PrefixEvent + hex.EncodeToString(u[:])
}
