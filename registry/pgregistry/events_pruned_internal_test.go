package pgregistry

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
)

// openWithSuperuser opens a registry on a new database and a connection
// to it as the test server's superuser, both closed when the test ends.
func openWithSuperuser(t *testing.T) (*Registry, *pgx.Conn) {
	t.Helper()
	dbURL := pgtest.NewDatabase(t)
	r, err := Open(t.Context(), Config{ControlURL: dbURL})
	must(t, err)
	t.Cleanup(r.Close)
	super, err := pgx.Connect(t.Context(), dbURL)
	must(t, err)
	t.Cleanup(func() { super.Close(context.Background()) })
	return r, super
}

// TestPrunedEventKeepsItsLatestReceipt: an event pruned while its ID is
// still remembered from an earlier prune (it was stored again by an
// AppendEvents that read before that prune committed) leaves the later
// receipt in pruned_events, as memregistry keeps it, so the ID is
// forgotten a retention after the last time it was received.
func TestPrunedEventKeepsItsLatestReceipt(t *testing.T) {
	ctx := t.Context()
	_, super := openWithSuperuser(t) // the registry installs the schema
	const insert = `INSERT INTO aip_registry.events (tenant_id, sequence, event_id, instance_id, replica_id, version_id, channel_id, event, received_at_ms)
		VALUES ('tenant-1', $1, 'evt_x', 'cinst_a', 'crepl_a', 'cver_a', 'chan', '{}', $2)`
	const prune = `DELETE FROM aip_registry.events WHERE tenant_id = 'tenant-1' AND event_id = 'evt_x'`
	for i, received := range []int64{1_000, 5_000} {
		_, err := super.Exec(ctx, insert, i+1, received)
		must(t, err)
		_, err = super.Exec(ctx, prune)
		must(t, err)
	}
	var got int64
	must(t, super.QueryRow(ctx, `SELECT received_at_ms FROM aip_registry.pruned_events WHERE tenant_id = 'tenant-1' AND event_id = 'evt_x'`).Scan(&got))
	if got != 5_000 {
		t.Fatalf("the pruned event's ID is remembered as received at %d, want its latest receipt 5000", got)
	}
}

// TestPrunedEventDigestNormalizes: the digest migration 0012's trigger
// keeps of a pruned event compares as registry.CheckRedelivery does with
// what older builds stored: occurred_at written with trailing zeros
// ("…:00.100Z", the layout before 6c93345) and numbers with zeros in
// their fraction (jsonb keeps 1.50 as written) are the same event as this
// build's form of it; another value is a conflict.
func TestPrunedEventDigestNormalizes(t *testing.T) {
	ctx := t.Context()
	r, super := openWithSuperuser(t)
	const doc = `{"id": "evt_x", "kind": "k", "occurred_at": "2030-01-01T00:00:00.100Z",
		"data": {"n": 1.50, "m": [100.0, {"z": 0.0}], "aip_connector": {"instance_id": "cinst_a", "replica_id": "crep_a", "version_id": "cver_a", "channel_id": "chan", "lease_sequence": 3}}}`
	_, err := super.Exec(ctx, `INSERT INTO aip_registry.events (tenant_id, sequence, event_id, instance_id, replica_id, version_id, channel_id, event, received_at_ms)
		VALUES ('tenant-1', 1, 'evt_x', 'cinst_a', 'crep_a', 'cver_a', 'chan', $1::jsonb, 1000)`, doc)
	must(t, err)
	_, err = super.Exec(ctx, `DELETE FROM aip_registry.events WHERE tenant_id = 'tenant-1'`)
	must(t, err)

	batch := func(data string) registry.EventBatch {
		return registry.EventBatch{TenantID: "tenant-1", InstanceID: "cinst_a", ReplicaID: "crep_b", VersionID: "cver_b", ChannelID: "chan", LeaseSequence: 9,
			Events: []aip.Event{{ID: "evt_x", Kind: "k", OccurredAt: aip.At(time.Date(2030, 1, 1, 0, 0, 0, 100e6, time.UTC)), Data: json.RawMessage(data)}}}
	}
	const stamp = `"aip_connector": {"instance_id": "cinst_a", "replica_id": "crep_b", "version_id": "cver_b", "channel_id": "chan", "lease_sequence": 9}`
	got, err := r.AppendEvents(ctx, batch(`{"n": 1.5, "m": [1e2, {"z": 0}], `+stamp+`}`))
	if err != nil || !got[0].Pruned {
		t.Fatalf("the pruned event in this build's form, from another replica: %+v, %v; want it pruned", got, err)
	}
	if _, err := r.AppendEvents(ctx, batch(`{"n": 1.51, "m": [100, {"z": 0}], `+stamp+`}`)); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("another number under the pruned ID: %v, want ErrConflict", err)
	}
}
