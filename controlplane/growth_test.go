package controlplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/controlplane"
)

// backlogPruner is a store whose event log holds backlog events older than
// any retention, and ids IDs of pruned events older than any retention;
// PruneEvents deletes up to limit of the events (remembering their IDs,
// which are then old enough to forget), ForgetPrunedEvents up to limit of
// the IDs.
type backlogPruner struct {
	controlplane.Store
	backlog, ids int
}

func (p *backlogPruner) PruneEvents(_ context.Context, _ time.Time, limit int) (int, error) {
	n := min(limit, p.backlog)
	p.backlog -= n
	p.ids += n
	return n, nil
}

func (p *backlogPruner) ForgetPrunedEvents(_ context.Context, _ time.Time, limit int) (int, error) {
	n := min(limit, p.ids)
	p.ids -= n
	return n, nil
}

// TestEventPruningKeepsUpWithIngestion: a fleet that stores events faster
// than one pruning deletes (200 a second, 12000 a minute) does not see its
// event log grow without bound past the retention: a pruning that stopped
// at its batch bound with events left goes on at the next cycle rather
// than a minute later. Over ten minutes the backlog stays within a minute's
// events (what the once-a-minute pruning leaves by design).
func TestEventPruningKeepsUpWithIngestion(t *testing.T) {
	e := newEnv(t, newMemBackend)
	p := &backlogPruner{Store: e.b.Store}
	svc, err := controlplane.New(controlKey, p, controlplane.Config{Now: e.clock.Now, EventRetention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const perSecond = 200
	peak := 0
	for range 600 {
		e.clock.Advance(time.Second)
		p.backlog += perSecond
		peak = max(peak, p.backlog)
		if _, err := svc.Maintain(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if limit := 61 * perSecond; peak > limit || p.backlog > limit {
		t.Fatalf("the backlog of prunable events peaked at %d and ends at %d after 10 minutes; want at most a minute's %d", peak, p.backlog, limit)
	}
}

// TestForgettingKeepsUpWithPruning: a backlog of IDs past the
// pruned-event-ID retention (a fleet that turned the second horizon on
// after a long time) is worked off at the next cycles, not one pruning a
// minute, while events (fewer a minute than one pruning deletes) go on
// being pruned and leave their IDs behind: after ten minutes the IDs left
// are within a minute's events.
func TestForgettingKeepsUpWithPruning(t *testing.T) {
	e := newEnv(t, newMemBackend)
	p := &backlogPruner{Store: e.b.Store, ids: 100_000}
	svc, err := controlplane.New(controlKey, p, controlplane.Config{Now: e.clock.Now, EventRetention: time.Hour, PrunedEventIDsRetention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const perSecond = 100 // 6 000 a minute, below one pruning's 10 000
	for range 600 {
		e.clock.Advance(time.Second)
		p.backlog += perSecond
		if _, err := svc.Maintain(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if limit := 61 * perSecond; p.backlog > limit || p.ids > limit {
		t.Fatalf("after 10 minutes %d prunable events and %d forgettable IDs are left; want at most a minute's %d of each", p.backlog, p.ids, limit)
	}
}
