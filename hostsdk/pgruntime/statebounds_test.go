package pgruntime_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// randomText is n bytes of hex that does not compress: PostgreSQL
// compresses a long index entry, so a repeated letter would pass where a
// real key does not.
func randomText(n int) string {
	b := make([]byte, (n+1)/2)
	rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// TestStateBoundsFitTheIndex: hostsdk.State's namespace and key bounds are
// what PostgreSQL's state index takes, with a journal namespace as long as
// a replica ID may be (aip.MaxRecordIDBytes, which the host passes as the
// namespace: one of 256 bytes was refused, so no host with such an ID
// could open its journal), and with text that does not compress.
func TestStateBoundsFitTheIndex(t *testing.T) {
	replicaID := aip.PrefixReplica + randomText(aip.MaxRecordIDBytes-len(aip.PrefixReplica))
	j := open(t, pgruntime.Config{DatabaseURL: pgtest.NewDatabase(t), Namespace: replicaID})
	ns, key := randomText(hostsdk.MaxStateNamespaceBytes), randomText(hostsdk.MaxStateKeyBytes)
	ctx := context.Background()
	if _, err := j.PutState(ctx, ns, key, json.RawMessage(`1`), 0); err != nil {
		t.Fatalf("PutState at the bounds: %v", err)
	}
	if v, err := j.State(ctx, ns, key); err != nil || string(v.Value) != "1" {
		t.Fatalf("State at the bounds: %s, %v", v.Value, err)
	}
}
