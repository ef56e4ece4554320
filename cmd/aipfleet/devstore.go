package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// devRegistry is the development fleet's registry: the in-memory backend,
// persisted to one snapshot file so that a restart of aipfleet dev keeps
// every route assignment (a retried action ID must reach the replica it is
// pinned to, never a new one), reservation, replica record, replay claim
// and every tenant's event log.
//
// A new or moved route (Resolve, Reroute) and appended events
// (AppendEvents) are durable before the call returns: the caller waits for
// the snapshot that contains them to be on disk, group-commit style, so the
// dispatcher never sends an action whose route a crash could forget, nor
// tells a host its events are stored before they are. Every other change
// (lifecycle, settlement, lease expiry, catalog writes) is written within
// flushInterval.
type devRegistry struct {
	devReads                       // reads pass through to mem
	mem      *memregistry.Registry // writes go through the persisting methods below
	store    *snapshotStore
	// appending counts the AppendEvents calls whose events may be in
	// memory but not yet on disk (see Events).
	appending atomic.Int64
}

// devReads are the registry methods that change nothing: the only ones
// devRegistry passes through to the in-memory registry without persisting.
// Every method that changes state is written out on devRegistry; none is
// promoted, so a contract that gains one fails the guards below until
// devRegistry persists it.
type devReads interface {
	registry.Reader
	registry.Catalog
	registry.ReplicaLister
	registry.Readiness
	Assignment(ctx context.Context, actionID string) (registry.RouteAssignment, error)
	Reservation(ctx context.Context, actionID string) (registry.RouteReservation, error)
	RouteHistory(ctx context.Context, actionID string) ([]registry.RouteAssignment, error)
	LifecycleReplica(ctx context.Context, replicaID string) (registry.ConnectorReplica, error)
	Status(ctx context.Context) (registry.FleetStatusSummary, error)
	Ledger(ctx context.Context) (registry.Ledger, error)
}

var _ devReads = (*memregistry.Registry)(nil)

func newDevRegistry(mem *memregistry.Registry, store *snapshotStore) *devRegistry {
	return &devRegistry{devReads: mem, mem: mem, store: store}
}

// Compile-time guards: the contracts the control plane, the dispatcher and
// Apply use are complete, their writes through the persisting methods.
var (
	_ registry.Administrator  = (*devRegistry)(nil)
	_ registry.Resolver       = (*devRegistry)(nil)
	_ registry.Rerouter       = (*devRegistry)(nil)
	_ registry.RoutePinner    = (*devRegistry)(nil)
	_ registry.Lifecycle      = (*devRegistry)(nil)
	_ registry.FleetStatus    = (*devRegistry)(nil)
	_ registry.ReplicaLister  = (*devRegistry)(nil)
	_ registry.Readiness      = (*devRegistry)(nil)
	_ registry.Catalog        = (*devRegistry)(nil)
	_ registry.OrphanSettler  = (*devRegistry)(nil)
	_ registry.EventLog       = (*devRegistry)(nil)
	_ registry.EventPruner    = (*devRegistry)(nil)
	_ registry.UnsentReleaser = (*devRegistry)(nil)
)

// AppendEvents implements registry.EventLog; the events are on disk when it
// returns (a host drops its batch once the dispatcher's answer says they
// are stored).
func (d *devRegistry) AppendEvents(ctx context.Context, b registry.EventBatch) ([]registry.StoredEvent, error) {
	d.appending.Add(1)
	defer d.appending.Add(-1)
	stored, err := d.mem.AppendEvents(ctx, b)
	if err != nil {
		return stored, err
	}
	if err := d.store.sync(ctx); err != nil {
		return nil, fmt.Errorf("%w: the events could not be persisted: %v", registry.ErrStorage, err)
	}
	return stored, nil
}

// PruneEvents implements registry.EventPruner (the control plane's event
// retention); written within flushInterval.
func (d *devRegistry) PruneEvents(ctx context.Context, receivedBefore time.Time, limit int) (int, error) {
	n, err := d.mem.PruneEvents(ctx, receivedBefore, limit)
	if n > 0 {
		d.store.changed()
	}
	return n, err
}

// ForgetPrunedEvents implements registry.EventPruner (the control plane's
// second horizon, on the IDs of pruned events); written within
// flushInterval.
func (d *devRegistry) ForgetPrunedEvents(ctx context.Context, receivedBefore time.Time, limit int) (int, error) {
	n, err := d.mem.ForgetPrunedEvents(ctx, receivedBefore, limit)
	if n > 0 {
		d.store.changed()
	}
	return n, err
}

// Events implements registry.EventLog. It returns only events on disk: an
// event appended in memory whose snapshot a crash could still lose would
// give its sequence to another event after the restart, and a reader that
// saw it would skip that one. When an append may be under way, the page
// read waits for a snapshot taken after the read (which holds every event
// the page does).
func (d *devRegistry) Events(ctx context.Context, tenantID string, after uint64, limit int) (registry.EventPage, error) {
	page, err := d.mem.Events(ctx, tenantID, after, limit)
	if err != nil || d.appending.Load() == 0 {
		return page, err
	}
	if err := d.store.sync(ctx); err != nil {
		return registry.EventPage{}, fmt.Errorf("%w: the events read could not be persisted: %v", registry.ErrStorage, err)
	}
	return page, nil
}

// Resolve implements registry.Resolver; the route is on disk when it
// returns.
func (d *devRegistry) Resolve(ctx context.Context, req registry.RouteRequest) (registry.RouteAssignment, error) {
	a, err := d.mem.Resolve(ctx, req)
	if err != nil {
		return a, err
	}
	if err := d.store.sync(ctx); err != nil {
		return registry.RouteAssignment{}, fmt.Errorf("%w: the route of action %s could not be persisted: %v", registry.ErrStorage, req.ActionID, err)
	}
	return a, nil
}

// Reroute implements registry.Rerouter; the new route is on disk when it
// returns.
func (d *devRegistry) Reroute(ctx context.Context, req registry.RerouteRequest) (registry.RouteAssignment, error) {
	a, err := d.mem.Reroute(ctx, req)
	if err != nil {
		return a, err
	}
	if err := d.store.sync(ctx); err != nil {
		return registry.RouteAssignment{}, fmt.Errorf("%w: the new route of action %s could not be persisted: %v", registry.ErrStorage, a.ActionID, err)
	}
	return a, nil
}

// PinRoute implements registry.RoutePinner; the pin is on disk when it
// returns, so no reroute after a restart moves an action a cancel was sent
// under.
func (d *devRegistry) PinRoute(ctx context.Context, a registry.RouteAssignment) error {
	if err := d.mem.PinRoute(ctx, a); err != nil {
		return err
	}
	if err := d.store.sync(ctx); err != nil {
		return fmt.Errorf("%w: the pin of action %s's route could not be persisted: %v", registry.ErrStorage, a.ActionID, err)
	}
	return nil
}

// Settle implements registry.Resolver.
func (d *devRegistry) Settle(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement) error {
	defer d.store.changed()
	return d.mem.Settle(ctx, a, outcome)
}

// SettleOrphan implements registry.OrphanSettler.
func (d *devRegistry) SettleOrphan(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement, handOut uint64) error {
	defer d.store.changed()
	return d.mem.SettleOrphan(ctx, a, outcome, handOut)
}

// ReleaseUnsent implements registry.UnsentReleaser: a Resolve or Reroute
// whose snapshot could not be written has its route in memory (and on disk
// at the next write), and the dispatcher that sent nothing releases it.
func (d *devRegistry) ReleaseUnsent(ctx context.Context, actionID, claim string) (bool, error) {
	defer d.store.changed()
	return d.mem.ReleaseUnsent(ctx, actionID, claim)
}

// ApplyLifecycle implements registry.Lifecycle.
func (d *devRegistry) ApplyLifecycle(ctx context.Context, cmds []registry.LifecycleCommand) ([]registry.LifecycleResult, error) {
	defer d.store.changed()
	return d.mem.ApplyLifecycle(ctx, cmds)
}

// ExpireStaleReplicas implements registry.FleetStatus.
func (d *devRegistry) ExpireStaleReplicas(ctx context.Context, limit int) (int, error) {
	n, err := d.mem.ExpireStaleReplicas(ctx, limit)
	if n > 0 {
		d.store.changed()
	}
	return n, err
}

// ReleaseStrandedReservations implements registry.FleetStatus.
func (d *devRegistry) ReleaseStrandedReservations(ctx context.Context, grace time.Duration, limit int) (registry.StrandedRelease, error) {
	rel, err := d.mem.ReleaseStrandedReservations(ctx, grace, limit)
	if rel.Reservations > 0 {
		d.store.changed()
	}
	return rel, err
}

// PutAdmissionPolicy implements registry.Administrator.
func (d *devRegistry) PutAdmissionPolicy(ctx context.Context, p registry.AdmissionPolicy) error {
	defer d.store.changed()
	return d.mem.PutAdmissionPolicy(ctx, p)
}

// PutConnectorType implements registry.Administrator.
func (d *devRegistry) PutConnectorType(ctx context.Context, t registry.ConnectorType) error {
	defer d.store.changed()
	return d.mem.PutConnectorType(ctx, t)
}

// SetConnectorTypeEnabled implements registry.Administrator.
func (d *devRegistry) SetConnectorTypeEnabled(ctx context.Context, id string, enabled bool) error {
	defer d.store.changed()
	return d.mem.SetConnectorTypeEnabled(ctx, id, enabled)
}

// AdmitVersion implements registry.Administrator.
func (d *devRegistry) AdmitVersion(ctx context.Context, v registry.ConnectorVersion) error {
	defer d.store.changed()
	return d.mem.AdmitVersion(ctx, v)
}

// SetVersionStatus implements registry.Administrator.
func (d *devRegistry) SetVersionStatus(ctx context.Context, id string, status registry.VersionStatus) error {
	defer d.store.changed()
	return d.mem.SetVersionStatus(ctx, id, status)
}

// PutInstance implements registry.Administrator.
func (d *devRegistry) PutInstance(ctx context.Context, i registry.ConnectorInstance) error {
	defer d.store.changed()
	return d.mem.PutInstance(ctx, i)
}

// PutBinding implements registry.Administrator.
func (d *devRegistry) PutBinding(ctx context.Context, b registry.CapabilityBinding) error {
	defer d.store.changed()
	return d.mem.PutBinding(ctx, b)
}

// PutReplica implements registry.Administrator.
func (d *devRegistry) PutReplica(ctx context.Context, r registry.ConnectorReplica) error {
	defer d.store.changed()
	return d.mem.PutReplica(ctx, r)
}

// flushInterval bounds how long a change other than a route waits for its
// snapshot.
const flushInterval = time.Second

// snapshotStore writes a registry's snapshot to one file, atomically: a
// temporary file in the same directory, fsync, rename over the old file,
// fsync of the directory. Changes are counted in generations; a write
// covers every change counted before its snapshot was taken.
type snapshotStore struct {
	reg  *memregistry.Registry
	path string
	log  *slog.Logger

	kick chan struct{} // a sync waits: write now

	mu      sync.Mutex
	gen     uint64        // changes counted
	written uint64        // generation of the newest snapshot on disk
	tried   uint64        // generation of the newest write attempt
	lastErr error         // result of that attempt
	done    chan struct{} // closed after each write attempt, then replaced
}

func newSnapshotStore(reg *memregistry.Registry, path string, log *slog.Logger) *snapshotStore {
	return &snapshotStore{reg: reg, path: path, log: log, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// load restores the registry from the file when it exists. It reports
// whether it did.
func (s *snapshotStore) load() (bool, error) {
	f, err := os.Open(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := s.reg.Restore(bufio.NewReader(f)); err != nil {
		return false, fmt.Errorf("%s: %w (move the file away to start with an empty registry, or pass --reset to start the dev fleet from scratch)", s.path, err)
	}
	return true, nil
}

// changed counts a change; the next periodic write covers it.
func (s *snapshotStore) changed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	return s.gen
}

// sync counts a change and waits until a snapshot containing it is on
// disk (or its write failed, or ctx ended).
func (s *snapshotStore) sync(ctx context.Context) error {
	gen := s.changed()
	for {
		s.mu.Lock()
		switch {
		case s.written >= gen:
			s.mu.Unlock()
			return nil
		case s.tried >= gen:
			err := s.lastErr
			s.mu.Unlock()
			return err
		}
		done := s.done
		s.mu.Unlock()
		select {
		case s.kick <- struct{}{}:
		default:
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run writes a snapshot when a sync asks for one, and every flushInterval
// while changes are pending, until ctx ends; then it writes a last one if
// anything changed and returns that write's error.
func (s *snapshotStore) run(ctx context.Context) error {
	t := time.NewTicker(flushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return s.flush()
		case <-s.kick:
		case <-t.C:
		}
		if err := s.flush(); err != nil {
			s.log.Error("persist the dev registry", "file", s.path, "error", err)
		}
	}
}

// flush writes a snapshot if changes are pending.
func (s *snapshotStore) flush() error {
	s.mu.Lock()
	gen := s.gen
	pending := gen > s.written
	s.mu.Unlock()
	if !pending {
		return nil
	}
	err := s.write()
	s.mu.Lock()
	s.tried, s.lastErr = gen, err
	if err == nil {
		s.written = gen
	}
	close(s.done)
	s.done = make(chan struct{})
	s.mu.Unlock()
	return err
}

// write replaces the file with a snapshot of the registry now.
func (s *snapshotStore) write() error {
	return writeFileAtomic(s.path, 0o600, s.reg.Snapshot)
}
