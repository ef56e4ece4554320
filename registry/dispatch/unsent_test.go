package dispatch_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// lostCommit is the registry whose next lost Resolves commit and then fail
// with err, as when the connection to the database is reset after COMMIT
// was sent; its next failReleases calls of ReleaseUnsent fail with a
// storage error before doing anything (the database is still down); while
// hold is set and open, ReleaseUnsent waits for it to close.
type lostCommit struct {
	*memregistry.Registry
	mu           sync.Mutex
	lost         int
	err          error
	failReleases int
	releases     int
	claims       []string
	hold         chan struct{}
}

func (l *lostCommit) Resolve(ctx context.Context, req registry.RouteRequest) (registry.RouteAssignment, error) {
	a, err := l.Registry.Resolve(ctx, req)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.claims = append(l.claims, req.Claim)
	if err == nil && l.lost > 0 {
		l.lost--
		return registry.RouteAssignment{}, l.err
	}
	return a, err
}

func (l *lostCommit) ReleaseUnsent(ctx context.Context, actionID, claim string) (bool, error) {
	if l.hold != nil {
		select {
		case <-l.hold:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	l.mu.Lock()
	l.releases++
	if l.failReleases > 0 {
		l.failReleases--
		l.mu.Unlock()
		return false, errRegistryDown
	}
	l.mu.Unlock()
	return l.Registry.ReleaseUnsent(ctx, actionID, claim)
}

func (l *lostCommit) releaseCalls() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.releases
}

// unsentReleases reads aip_dispatch_unsent_releases_total{result}.
func unsentReleases(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "aip_dispatch_unsent_releases_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no aip_dispatch_unsent_releases_total{result=%q}", result)
	return 0
}

// TestLostResolveCommitIsReleased: a Resolve that committed a new route
// (or a retry's reservation again) but whose answer was lost — the
// client is answered 503 and the action is never sent — gives the
// reservation back at once, by the claim the dispatcher named the
// hand-out with, instead of holding the replica's slot and the admission
// counters until reconciliation; also when the registry is still down at
// the first attempts of the release. The route stays pinned: a retry of
// the action ID reserves it again and runs the action once.
func TestLostResolveCommitIsReleased(t *testing.T) {
	for _, c := range []struct {
		name         string
		err          error
		failReleases int
		retry        bool // the lost Resolve is a retry that reserved a settled route again
	}{
		{"storage failure", errRegistryDown, 0, false},
		{"deadline after commit", context.DeadlineExceeded, 0, false},
		{"registry still down at first", errRegistryDown, 2, false},
		{"retry reserving again", errRegistryDown, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var lc *lostCommit
			metrics := prometheus.NewRegistry()
			w := newWorld(t, worldOptions{cfg: func(cfg *dispatch.Config) { cfg.Metrics = metrics },
				resolver: func(r *memregistry.Registry) registry.Resolver {
					lc = &lostCommit{Registry: r, err: c.err, failReleases: c.failReleases}
					return lc
				}})
			w.startHost(8, 8)
			id := aip.NewActionID()
			req := dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", "")}
			if c.retry {
				if status, resp := w.act(req); status != http.StatusOK {
					t.Fatalf("the first delivery answered %d: %+v", status, resp)
				}
			}
			lc.mu.Lock()
			lc.lost = 1
			lc.mu.Unlock()
			status, resp := w.act(req)
			if status != http.StatusServiceUnavailable || resp.Error == nil || resp.Error.Code != dispatch.CodeRegistry || resp.Error.Retryable == nil || !*resp.Error.Retryable {
				t.Fatalf("a lost Resolve answered %d %+v, want 503 %s (retryable)", status, resp.Error, dispatch.CodeRegistry)
			}
			eventually(t, "the lost hand-out's reservation released", func() bool {
				res, err := w.reg.Reservation(w.ctx, id)
				return err == nil && !res.Reserved && res.LastSettlement == registry.SettlementCancelled
			})
			w.idle()
			if got := unsentReleases(t, metrics, "released"); got != 1 {
				t.Fatalf("aip_dispatch_unsent_releases_total{result=released} = %v, want 1", got)
			}
			if n := lc.releaseCalls(); n != 1+c.failReleases {
				t.Fatalf("%d ReleaseUnsent calls, want %d", n, 1+c.failReleases)
			}
			want := 0
			if c.retry {
				want = 1
			}
			if n := len(w.counter.runs(id)); n != want {
				t.Fatalf("the action ran %d times, want %d: the lost hand-out was sent", n, want)
			}

			// A retry of the action ID goes to the pinned route and runs.
			status, resp = w.act(req)
			if status != http.StatusOK || resp.Settlement != registry.SettlementCompleted {
				t.Fatalf("the retry after the release answered %d: %+v", status, resp)
			}
			w.idle()
			lc.mu.Lock()
			defer lc.mu.Unlock()
			seen := map[string]bool{}
			for _, cl := range lc.claims {
				if !registry.ValidClaim(cl) || seen[cl] {
					t.Fatalf("the dispatcher's claims %q are not fresh valid claims", lc.claims)
				}
				seen[cl] = true
			}
		})
	}
}

// TestDefiniteResolveRefusalReleasesNothing: a Resolve the registry
// refused (no replica can take the action: nothing committed) is not
// followed by a release.
func TestDefiniteResolveRefusalReleasesNothing(t *testing.T) {
	var lc *lostCommit
	metrics := prometheus.NewRegistry()
	w := newWorld(t, worldOptions{cfg: func(cfg *dispatch.Config) { cfg.Metrics = metrics },
		resolver: func(r *memregistry.Registry) registry.Resolver {
			lc = &lostCommit{Registry: r}
			return lc
		}})
	// No replica is registered.
	status, resp := w.act(dispatch.ActionRequest{ActionID: aip.NewActionID(), CapabilityID: capSay, Input: say("hello", "")})
	if status != http.StatusServiceUnavailable || resp.Error == nil || resp.Error.Code != dispatch.CodeReplicaUnavailable {
		t.Fatalf("answer %d %+v, want 503 %s", status, resp.Error, dispatch.CodeReplicaUnavailable)
	}
	w.d.Close() // waits for anything started in the background
	if n := lc.releaseCalls(); n != 0 {
		t.Fatalf("%d ReleaseUnsent calls after a definite refusal, want 0", n)
	}
	for _, r := range []string{"released", "unchanged", "gave_up"} {
		if got := unsentReleases(t, metrics, r); got != 0 {
			t.Fatalf("aip_dispatch_unsent_releases_total{result=%s} = %v, want 0", r, got)
		}
	}
}

// TestUnsentReleaseGivesUp: a release the registry keeps failing is given
// up after its bound and left to reconciliation, counted as gave_up.
func TestUnsentReleaseGivesUp(t *testing.T) {
	var lc *lostCommit
	metrics := prometheus.NewRegistry()
	w := newWorld(t, worldOptions{cfg: func(cfg *dispatch.Config) {
		cfg.Metrics = metrics
		cfg.SettleRetryTimeout = -1 // one attempt
	}, resolver: func(r *memregistry.Registry) registry.Resolver {
		lc = &lostCommit{Registry: r, lost: 1, err: errRegistryDown, failReleases: 100}
		return lc
	}})
	w.startHost(8, 8)
	id := aip.NewActionID()
	status, _ := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", "")})
	if status != http.StatusServiceUnavailable {
		t.Fatalf("a lost Resolve answered %d, want 503", status)
	}
	eventually(t, "the release given up", func() bool { return unsentReleases(t, metrics, "gave_up") == 1 })
	if n := lc.releaseCalls(); n != 1 {
		t.Fatalf("%d ReleaseUnsent calls with retries disabled, want 1", n)
	}
	if res, err := w.reg.Reservation(w.ctx, id); err != nil || !res.Reserved {
		t.Fatalf("the reservation after the release gave up: %+v, %v; want it held for reconciliation", res, err)
	}
}

// TestPendingUnsentReleasesAreBounded: while the registry keeps failing,
// every failed Resolve may have committed, and clients retry
// registry_unavailable; the releases pending in the background are
// bounded, and one beyond the bound is given up at once (left to
// reconciliation) instead of starting one more goroutine that retries
// against the registry for SettleRetryTimeout and then joins the rush
// when it is back.
func TestPendingUnsentReleasesAreBounded(t *testing.T) {
	var lc *lostCommit
	metrics := prometheus.NewRegistry()
	hold := make(chan struct{})
	var logs hostsdktest.LogBuffer
	w := newWorld(t, worldOptions{cfg: func(cfg *dispatch.Config) {
		cfg.Metrics = metrics
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	},
		resolver: func(r *memregistry.Registry) registry.Resolver {
			lc = &lostCommit{Registry: r, lost: 3, err: errRegistryDown, hold: hold}
			return lc
		}})
	dispatch.SetMaxPendingUnsentReleases(w.d, 1)
	w.startHost(8, 8)
	first, second, third := aip.NewActionID(), aip.NewActionID(), aip.NewActionID()
	for _, id := range []string{first, second, third} {
		if status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", "")}); status != http.StatusServiceUnavailable {
			t.Fatalf("a lost Resolve answered %d: %+v, want 503", status, resp.Error)
		}
	}
	// The first release is pending (the registry holds it); the second and
	// third are beyond the bound, and logged once.
	if got := unsentReleases(t, metrics, "gave_up"); got != 2 {
		t.Fatalf("aip_dispatch_unsent_releases_total{result=gave_up} = %v with one release pending and a bound of 1, want 2", got)
	}
	if n := strings.Count(logs.String(), "releases are pending already"); n != 1 {
		t.Fatalf("the releases given up beyond the bound were logged %d times, want once:\n%s", n, logs.String())
	}
	close(hold)
	eventually(t, "the pending release done", func() bool { return unsentReleases(t, metrics, "released") == 1 })
	if n := lc.releaseCalls(); n != 1 {
		t.Fatalf("%d ReleaseUnsent calls, want 1: the release beyond the bound was tried", n)
	}
	if res, err := w.reg.Reservation(w.ctx, first); err != nil || res.Reserved {
		t.Fatalf("the first lost hand-out: %+v, %v; want it released", res, err)
	}
	if res, err := w.reg.Reservation(w.ctx, second); err != nil || !res.Reserved {
		t.Fatalf("the second lost hand-out: %+v, %v; want it left to reconciliation", res, err)
	}
}
