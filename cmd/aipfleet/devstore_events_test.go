package main

import (
	"bytes"
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// devRegistryAt starts a dev registry on the snapshot file at path (its
// writer running) and returns it with the function that stops it; a new
// call after the stop is a restart.
func devRegistryAt(t *testing.T, path string, now func() time.Time) (*devRegistry, func()) {
	t.Helper()
	return devRegistryWith(t, path, memregistry.Config{Now: now})
}

// devRegistryWith is devRegistryAt with the memregistry configuration cfg.
func devRegistryWith(t *testing.T, path string, cfg memregistry.Config) (*devRegistry, func()) {
	t.Helper()
	mem, err := memregistry.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	store := newSnapshotStore(mem, path, slogFor(&devLog{w: &bytes.Buffer{}}, "dev", 0))
	if _, err := store.load(); err != nil {
		t.Fatal(err)
	}
	storeCtx, cancel := context.WithCancel(context.Background())
	done := goTask(func() error { return store.run(storeCtx) })
	return newDevRegistry(mem, store), func() {
		cancel()
		if err := done.wait("store"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDevRegistryPersistsEvents: appended events are on disk when
// AppendEvents returns (a host drops its batch once the dispatcher says
// they are stored), and a dev registry restored from the file holds the
// same log: a redelivery keeps its sequence and new events continue it.
func TestDevRegistryPersistsEvents(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "registry.json")
	clock := registrytest.NewClock(registrytest.Epoch)
	start := func() (*devRegistry, func()) { return devRegistryAt(t, path, clock.Now) }
	reg, stop := start()
	first, err := reg.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a", "evt_1", "evt_2"))
	if err != nil {
		t.Fatal(err)
	}
	// On disk before the store stops: a registry loaded from the file now
	// holds the events.
	onDisk, err := memregistry.New(memregistry.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := newSnapshotStore(onDisk, path, nil).load(); !ok || err != nil {
		t.Fatalf("load: %v %v", ok, err)
	}
	if p, err := onDisk.Events(ctx, "tenant-1", 0, 10); err != nil || len(p.Events) != 2 {
		t.Fatalf("events on disk after AppendEvents returned: %+v, %v", p, err)
	}
	stop()

	// After a restart.
	reg, stop = start()
	defer stop()
	again, err := reg.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "b", "evt_2", "evt_3"))
	if err != nil {
		t.Fatal(err)
	}
	if again[0].Sequence != first[1].Sequence || again[0].ReplicaID != first[1].ReplicaID || again[1].Sequence != 3 {
		t.Fatalf("after a restart a redelivery and a new event got %+v; want sequence %d as first stored, then 3", again, first[1].Sequence)
	}
	p, err := reg.Events(ctx, "tenant-1", 0, registry.MaxEventPage)
	if err != nil || len(p.Events) != 3 || p.More {
		t.Fatalf("the log after a restart: %+v, %v", p, err)
	}
}

// TestDevRegistryReadsOnlyDurableEvents: while an append waits for its
// snapshot, a read does not return its events before they are on disk (a
// crash then would give their sequences to other events, and a reader that
// had seen them would skip those).
func TestDevRegistryReadsOnlyDurableEvents(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "registry.json")
	mem, err := memregistry.New(memregistry.Config{Now: registrytest.NewClock(registrytest.Epoch).Now})
	if err != nil {
		t.Fatal(err)
	}
	store := newSnapshotStore(mem, path, slogFor(&devLog{w: &bytes.Buffer{}}, "dev", 0))
	reg := newDevRegistry(mem, store)
	// The store's writer is not running yet: the append waits for its
	// snapshot.
	appended := goTask(func() error {
		_, err := reg.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a", "evt_1"))
		return err
	})
	for reg.appending.Load() == 0 {
		runtime.Gosched()
	}
	for {
		if p, _ := mem.Events(ctx, "tenant-1", 0, 10); len(p.Events) == 1 {
			break // in memory, not on disk
		}
		runtime.Gosched()
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	p, err := reg.Events(short, "tenant-1", 0, 10)
	cancel()
	if err == nil {
		t.Fatalf("read an event not yet on disk: %+v", p)
	}
	// Once the writer runs, both the append and the read complete.
	storeCtx, stop := context.WithCancel(ctx)
	done := goTask(func() error { return store.run(storeCtx) })
	if err := appended.wait("append"); err != nil {
		t.Fatal(err)
	}
	if p, err := reg.Events(ctx, "tenant-1", 0, 10); err != nil || len(p.Events) != 1 {
		t.Fatalf("after the snapshot: %+v, %v", p, err)
	}
	stop()
	if err := done.wait("store"); err != nil {
		t.Fatal(err)
	}
}

// TestDevRegistryPersistsForgottenPrunedIDs: the IDs of pruned events the
// control plane's second horizon forgets stay forgotten after a restart
// (the forgetting is written like the pruning).
func TestDevRegistryPersistsForgottenPrunedIDs(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "registry.json")
	clock := registrytest.NewClock(registrytest.Epoch)
	start := func() (*devRegistry, func()) { return devRegistryAt(t, path, clock.Now) }
	reg, stop := start()
	if _, err := reg.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a", "evt_1", "evt_2")); err != nil {
		t.Fatal(err)
	}
	if n, err := reg.PruneEvents(ctx, registrytest.Epoch.Add(time.Hour), 10); err != nil || n != 2 {
		t.Fatalf("PruneEvents = %d, %v", n, err)
	}
	stop()
	reg, stop = start()
	if n, err := reg.ForgetPrunedEvents(ctx, registrytest.Epoch.Add(time.Hour), 10); err != nil || n != 2 {
		t.Fatalf("ForgetPrunedEvents = %d, %v", n, err)
	}
	stop()
	reg, stop = start()
	defer stop()
	got, err := reg.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a", "evt_1"))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Pruned || got[0].Sequence != 3 {
		t.Fatalf("after a restart, an event whose ID was forgotten delivered again: %+v, want it stored as sequence 3", got[0])
	}
}

// TestDevRegistryReleasesUnsent: dev's registry takes the dispatcher's
// release of a hand-out it never sent (a Resolve whose snapshot could not
// be written answered a storage error, though the route is in memory), and
// the release is on disk after a restart.
func TestDevRegistryReleasesUnsent(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "registry.json")
	start := func() (*devRegistry, func()) { return devRegistryAt(t, path, nil) }
	reg, stop := start()
	w, err := registrytest.NewLifecycleWorld(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	rep := registrytest.Replica("crepl_r1", w.Instance.ID, w.Version.ID, time.Now().Add(time.Hour))
	rep.PeerPrincipalID, rep.PeerPrincipalKind = w.Version.Manifest.Agent.ID, w.Version.Manifest.Agent.Kind
	if err := reg.PutReplica(ctx, rep); err != nil {
		t.Fatal(err)
	}
	a, err := reg.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), CapabilityID: "alpha.read", TenantID: "tenant-1", Claim: "claim-1"})
	if err != nil {
		t.Fatal(err)
	}
	if released, err := reg.ReleaseUnsent(ctx, a.ActionID, "claim-1"); err != nil || !released {
		t.Fatalf("ReleaseUnsent = %t, %v; want released", released, err)
	}
	stop()
	reg, stop = start()
	defer stop()
	if res, err := reg.Reservation(ctx, a.ActionID); err != nil || res.Reserved {
		t.Fatalf("after a restart the released route reads %+v, %v; want it not reserved", res, err)
	}
}

// TestDevRegistryPersistsOfflineReasons: why and when replicas went
// offline (an unhealthy heartbeat, lease expiry) survive a restart of the
// dev registry, so aipfleet fleet status still tells them apart.
func TestDevRegistryPersistsOfflineReasons(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "registry.json")
	clock := registrytest.NewClock(registrytest.Epoch)
	start := func() (*devRegistry, func()) { return devRegistryAt(t, path, clock.Now) }
	reg, stop := start()
	w, err := registrytest.NewLifecycleWorld(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(c aip.ControlCommand) {
		t.Helper()
		res, err := reg.ApplyLifecycle(ctx, []registry.LifecycleCommand{registrytest.LifecycleCommand(clock.Now(), c)})
		if err != nil || res[0].Err != nil {
			t.Fatalf("%s: %v %v", c.Operation, err, res[0].Err)
		}
	}
	for _, id := range []string{"crepl_sick", "crepl_lost"} {
		rep := w.ProvisionedReplica(id, clock.Now())
		if err := reg.PutReplica(ctx, rep); err != nil {
			t.Fatal(err)
		}
		apply(aip.RegisterCommand(w.Registration(&rep)))
	}
	clock.Advance(time.Second)
	apply(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: "crepl_sick", PreviousSequence: 1, ConnectorReady: false}))
	sickAt := clock.Now()
	clock.Advance(registrytest.LeaseTTL)
	if n, err := reg.ExpireStaleReplicas(ctx, 10); err != nil || n != 1 {
		t.Fatalf("ExpireStaleReplicas = %d, %v; want crepl_lost expired", n, err)
	}
	stop()

	reg, stop = start()
	defer stop()
	for id, want := range map[string]struct {
		reason registry.OfflineReason
		at     time.Time
	}{"crepl_sick": {registry.OfflineUnhealthy, sickAt}, "crepl_lost": {registry.OfflineLeaseExpired, clock.Now()}} {
		got, err := reg.ConnectorReplica(ctx, id)
		if err != nil || got.OfflineReason != want.reason || !got.OfflineAt.Equal(want.at) {
			t.Errorf("after a restart %s went offline for %q at %s (%v), want %q at %s", id, got.OfflineReason, aip.At(got.OfflineAt), err, want.reason, aip.At(want.at))
		}
	}
}
