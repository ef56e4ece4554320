package aip

import (
	"testing"
	"time"
)

// BenchmarkSignVerifyHeartbeat canonicalizes, signs and verifies a realistic
// heartbeat request: what a host does to send one and what the control plane
// does to accept it (open the wrapper, decode, verify with the replica's key).
func BenchmarkSignVerifyHeartbeat(b *testing.B) {
	host := hostKey(b)
	pub := host.PublicKey()
	replica := NewID(PrefixReplica)
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req := NewControlRequest(now, host.DID(), HeartbeatCommand(Heartbeat{
			ReplicaID: replica, PreviousSequence: uint64(i), InFlight: 7, ConnectorReady: true,
		}))
		body, err := Seal(host, SignedRequestField, req)
		if err != nil {
			b.Fatal(err)
		}
		got, err := OpenControlRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		if err := got.Signed.Verify(pub); err != nil {
			b.Fatal(err)
		}
	}
}
