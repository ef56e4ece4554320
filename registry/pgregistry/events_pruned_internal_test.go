package pgregistry

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// TestPrunedEventKeepsItsLatestReceipt: an event pruned while its ID is
// still remembered from an earlier prune (it was stored again by an
// AppendEvents that read before that prune committed) leaves the later
// receipt in pruned_events, as memregistry keeps it, so the ID is
// forgotten a retention after the last time it was received.
func TestPrunedEventKeepsItsLatestReceipt(t *testing.T) {
	ctx := t.Context()
	dbURL := pgtest.NewDatabase(t)
	r, err := Open(ctx, Config{ControlURL: dbURL})
	must(t, err)
	t.Cleanup(r.Close)
	super, err := pgx.Connect(ctx, dbURL)
	must(t, err)
	defer super.Close(context.Background())
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
