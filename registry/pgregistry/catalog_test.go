package pgregistry_test

import (
	"context"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// TestCatalogViewBuildOutlivesItsCaller: readers of one uncached catalog
// view wait for a single build of it. When the reader whose build it is
// gives up (its context ends), the others, whose contexts are live, must
// still get the page, not that reader's cancellation as a storage error.
func TestCatalogViewBuildOutlivesItsCaller(t *testing.T) {
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	seedWorld(t, r, clock, registry.FleetPolicy("quota:f"), 1, 1, 1, 4)
	rc := registry.ForTenant(tenantName(0))
	ctx := t.Context()

	// Hold the bindings table so a view build (which reads it) waits,
	// while the revision read before it does not.
	admin := connect(t, dbURL)
	locker, err := admin.Begin(ctx)
	must(t, err)
	defer locker.Rollback(context.Background())
	if _, err := locker.Exec(ctx, `LOCK TABLE aip_registry.capability_bindings IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	watch := connect(t, dbURL)
	waitFor := func(what, query string, args ...any) {
		t.Helper()
		for {
			var n int
			must(t, watch.QueryRow(ctx, query, args...).Scan(&n))
			if n > 0 {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}

	// The first reader starts the build and waits on the lock.
	leaderCtx, cancelLeader := context.WithCancel(ctx)
	defer cancelLeader()
	leaderDone := make(chan error, 1)
	go func() {
		_, err := r.QueryCapabilities(leaderCtx, registry.CatalogQuery{}, rc)
		leaderDone <- err
	}()
	waitFor("the first reader's view build to wait on the lock", `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%capability_bindings%'`)

	// The second reader reads the revision, misses the cache and waits for
	// the first reader's build.
	var since time.Time
	must(t, watch.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since))
	followerDone := make(chan error, 1)
	go func() {
		page, err := r.QueryCapabilities(ctx, registry.CatalogQuery{}, rc)
		if err == nil && page.Total != 2 {
			t.Errorf("second reader's page: %d capabilities, want 2", page.Total)
		}
		followerDone <- err
	}()
	waitFor("the second reader's revision read", `SELECT count(*) FROM pg_stat_activity
		WHERE state = 'idle' AND state_change > $1 AND query LIKE '%catalog_revision%'`, since)
	time.Sleep(100 * time.Millisecond) // from its revision read into the wait for the build

	cancelLeader()
	if err := <-leaderDone; err == nil {
		t.Fatal("the cancelled reader got its page")
	}
	must(t, locker.Rollback(ctx))
	if err := <-followerDone; err != nil {
		t.Fatalf("second reader, whose context is live: %v", err)
	}
}
