package controlplane_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

const leaseTTL = registry.DefaultLeaseTTL

func TestHappyPath(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		e := newEnv(t, nb)
		h := e.provision("a1")
		e.clock.Advance(time.Second)
		r, _ := h.send(h.registration())
		l := r.wantLease(t, 1, e.clock.Now().Add(leaseTTL))
		if r.resp.SignerDID != controlKey.DID() || !r.resp.ExpiresAt.After(r.resp.IssuedAt.Time) {
			t.Fatalf("response envelope %+v", r.resp)
		}
		if rep := e.replica(h.rep.ID); rep.Status != aip.ReplicaReady || rep.HealthRevision != 1 {
			t.Fatalf("after register: %s at %d", rep.Status, rep.HealthRevision)
		}
		seq := l.Sequence
		for range 5 {
			e.clock.Advance(10 * time.Second)
			r, _ := h.send(h.heartbeat(seq, 2, true))
			l := r.wantLease(t, seq+1, e.clock.Now().Add(leaseTTL))
			seq = l.Sequence
		}
		e.clock.Advance(time.Second)
		r, _ = h.send(h.transition(aip.OpDrain, seq))
		seq = r.wantLease(t, seq+1, e.clock.Now().Add(leaseTTL)).Sequence
		if rep := e.replica(h.rep.ID); rep.Status != aip.ReplicaDraining || rep.HealthRevision != seq {
			t.Fatalf("after drain: %s at %d", rep.Status, rep.HealthRevision)
		}
		e.clock.Advance(time.Second)
		r, _ = h.send(h.transition(aip.OpOffline, seq))
		if r.status != http.StatusOK || r.outcome.Status != aip.OutcomeOffline {
			t.Fatalf("offline: HTTP %d %+v", r.status, r.outcome)
		}
		rep := e.replica(h.rep.ID)
		if rep.Status != aip.ReplicaOffline || rep.HealthRevision != seq+1 || rep.LeaseValid(e.clock.Now()) {
			t.Fatalf("after offline: %s at %d, lease %s", rep.Status, rep.HealthRevision, rep.LeaseExpiresAt)
		}
		if seq+1 != 1+5+1+1 {
			t.Fatalf("final sequence %d: every success must raise it by exactly one", seq+1)
		}
	})
}

func TestRejections(t *testing.T) {
	type rejection struct {
		name   string
		status int
		want   string // substring of the message
		// send performs the rejected request against a replica registered
		// at sequence 1 (unless fresh is set) and returns the reply.
		send  func(e *env, h *host) reply
		fresh bool
		// moves is set when send changes the replica before the rejected
		// request (which must then leave revision moves).
		moves uint64
		// own is set for cases that change shared records (instance,
		// version): they get their own environment.
		own bool
	}
	sendReq := func(e *env, h *host, mod func(*aip.ControlRequest)) reply {
		req := h.request(h.heartbeat(1, 0, true))
		mod(req)
		return e.post(h.seal(req), req.RequestID)
	}
	cases := []rejection{
		{name: "expired", status: 403, want: "expired", send: func(e *env, h *host) reply {
			return sendReq(e, h, func(r *aip.ControlRequest) {
				r.IssuedAt = aip.At(e.clock.Now().Add(-40 * time.Second))
				r.ExpiresAt = aip.At(e.clock.Now().Add(-10 * time.Second))
			})
		}},
		{name: "future-dated", status: 403, want: "in the future", send: func(e *env, h *host) reply {
			return sendReq(e, h, func(r *aip.ControlRequest) {
				r.IssuedAt = aip.At(e.clock.Now().Add(6 * time.Second))
				r.ExpiresAt = aip.At(e.clock.Now().Add(20 * time.Second))
			})
		}},
		{name: "lifetime too long", status: 403, want: "lifetime", send: func(e *env, h *host) reply {
			return sendReq(e, h, func(r *aip.ControlRequest) { r.ExpiresAt = aip.At(r.IssuedAt.Add(31 * time.Second)) })
		}},
		{name: "body too large", status: 413, want: "exceeds 65536 bytes", send: func(e *env, h *host) reply {
			reg := h.e.w.Registration(&h.rep)
			reg.SecretProviderRef = strings.Repeat("x", aip.MaxControlBytes)
			req := h.request(aip.RegisterCommand(reg))
			// Sent without a Content-Length, so the limit applies while reading.
			return e.postChunked(h.seal(req), "")
		}},
		{name: "unknown replica", status: 403, want: "not pre-provisioned", send: func(e *env, h *host) reply {
			return sendReq(e, h, func(r *aip.ControlRequest) {
				r.Command = aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: "crepl_ghost", PreviousSequence: 1, ConnectorReady: true})
			})
		}},
		{name: "wrong signer", status: 403, want: "is not the DID pre-provisioned", send: func(e *env, h *host) reply {
			other := registrytest.Key("intruder")
			req := h.request(h.heartbeat(1, 0, true))
			req.SignerDID = other.DID()
			return e.post(sealWith(e.t, other, req), req.RequestID)
		}},
		{name: "bad signature", status: 403, want: "signature", send: func(e *env, h *host) reply {
			// Signed by another key while naming the replica's DID.
			req := h.request(h.heartbeat(1, 0, true))
			return e.post(sealWith(e.t, registrytest.Key("intruder"), req), req.RequestID)
		}},
		{name: "tampered payload", status: 403, want: "signature", send: func(e *env, h *host) reply {
			req := h.request(h.heartbeat(1, 0, true))
			body := bytes.Replace(h.seal(req), []byte(`"in_flight":0`), []byte(`"in_flight":1`), 1)
			return e.post(body, req.RequestID)
		}},
		{name: "stale previous_sequence", status: 403, want: "sequence", send: func(e *env, h *host) reply {
			r, _ := h.send(h.heartbeat(0, 0, true))
			return r
		}},
		{name: "replayed older request", status: 403, want: "already consumed", moves: 3, send: func(e *env, h *host) reply {
			req := h.request(h.heartbeat(1, 0, true))
			body := h.seal(req)
			e.post(body, req.RequestID).lease(e.t)
			h.send(h.heartbeat(2, 0, true))
			return e.post(body, req.RequestID)
		}},
		{name: "re-registration while the lease is live", status: 403, want: "lease_live", send: func(e *env, h *host) reply {
			r, _ := h.send(h.registration())
			return r
		}},
		{name: "capability-count mismatch", status: 403, want: "capability_count", fresh: true, send: func(e *env, h *host) reply {
			r, _ := h.send(h.registration(func(r *aip.Registration) { r.CapabilityCount = 7 }))
			return r
		}},
		{name: "manifest digest mismatch", status: 403, want: "manifest_digest", fresh: true, send: func(e *env, h *host) reply {
			r, _ := h.send(h.registration(func(r *aip.Registration) { r.ManifestDigest = registrytest.Digest("another manifest") }))
			return r
		}},
		{name: "artifact digest mismatch", status: 403, want: "artifact_digest", fresh: true, send: func(e *env, h *host) reply {
			r, _ := h.send(h.registration(func(r *aip.Registration) { r.ArtifactDigest = registrytest.Digest("another artifact") }))
			return r
		}},
		{name: "disabled instance", status: 403, want: "is disabled", fresh: true, own: true, send: func(e *env, h *host) reply {
			i := e.w.Instance
			i.Status, i.ConfigRevision = registry.InstanceDisabled, i.ConfigRevision+1
			if err := e.b.Admin.PutInstance(e.ctx, i); err != nil {
				e.t.Fatal(err)
			}
			r, _ := h.send(h.registration())
			return r
		}},
		{name: "revoked version", status: 403, want: "is revoked", fresh: true, own: true, send: func(e *env, h *host) reply {
			if err := e.b.Admin.SetVersionStatus(e.ctx, e.w.Version.ID, registry.VersionRevoked); err != nil {
				e.t.Fatal(err)
			}
			r, _ := h.send(h.registration())
			return r
		}},
		{name: "in_flight above capacity", status: 403, want: "in_flight 5 exceeds", send: func(e *env, h *host) reply {
			r, _ := h.send(h.heartbeat(1, 5, true))
			return r
		}},
		{name: "request ID with a NUL", status: 403, want: "without NUL characters", send: func(e *env, h *host) reply {
			// PostgreSQL cannot store it: it must be this request's
			// rejection, not a storage failure of its whole batch (503).
			return sendReq(e, h, func(r *aip.ControlRequest) { r.RequestID = "msg_\x00" + r.RequestID })
		}},
		{name: "malformed body", status: 403, want: "malformed", send: func(e *env, h *host) reply {
			return e.post([]byte(`{"request":{"request_id":"x"}}`), "")
		}},
		{name: "unknown operation", status: 403, want: "malformed", send: func(e *env, h *host) reply {
			body := bytes.Replace(h.seal(h.request(h.transition(aip.OpDrain, 1))), []byte(`"drain"`), []byte(`"reboot"`), 1)
			return e.post(body, "")
		}},
	}
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		// Cases share one service and registry, each with its own replica,
		// unless they change shared records.
		shared := newEnv(t, nb)
		for i, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				e := shared.with(t)
				if c.own {
					e = newEnv(t, nb)
				}
				h := e.provision(fmt.Sprintf("r%d", i))
				if !c.fresh {
					r, _ := h.send(h.registration())
					r.wantLease(t, 1, e.clock.Now().Add(leaseTTL))
				}
				before := e.replica(h.rep.ID)
				c.send(e, h).rejected(t, c.status, c.want)
				after := e.replica(h.rep.ID)
				if c.moves != 0 {
					before.HealthRevision = c.moves
				}
				if after.HealthRevision != before.HealthRevision || after.Status != before.Status {
					t.Fatalf("a rejection changed the replica: %s at %d -> %s at %d", before.Status, before.HealthRevision, after.Status, after.HealthRevision)
				}
			})
		}
	})
}

// postChunked posts body without a Content-Length.
func (e *env) postChunked(body []byte, requestID string) reply {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, e.srv.URL+controlplane.PathControl, struct{ *bytes.Reader }{bytes.NewReader(body)})
	if err != nil {
		e.t.Fatal(err)
	}
	req.ContentLength = -1
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw bytes.Buffer
	if _, err := raw.ReadFrom(resp.Body); err != nil {
		e.t.Fatal(err)
	}
	cr, err := aip.OpenControlResponse(raw.Bytes(), e.key.DID(), e.key.PublicKey(), requestID, e.clock.Now())
	if err != nil {
		e.t.Fatalf("%v: %s", err, raw.Bytes())
	}
	return reply{status: resp.StatusCode, outcome: cr.Outcome, resp: cr}
}

func TestBodyTooLargeByContentLength(t *testing.T) {
	e := newEnv(t, newMemBackend)
	body := bytes.Repeat([]byte("x"), aip.MaxControlBytes+1)
	e.post(body, "").rejected(t, http.StatusRequestEntityTooLarge, "is 65537 bytes")
}

func TestLostResponse(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		e := newEnv(t, nb)
		h := e.provision("a1")
		reg := h.request(h.registration())
		body := h.seal(reg)
		first := e.post(body, reg.RequestID).lease(t)
		// The answer was lost; the host resends the byte-identical request.
		e.clock.Advance(3 * time.Second)
		again := e.post(body, reg.RequestID)
		if l := again.lease(t); l != first {
			t.Fatalf("retry got lease %+v, want the identical %+v", l, first)
		}
		if rep := e.replica(h.rep.ID); rep.HealthRevision != 1 {
			t.Fatalf("the retry changed the health revision to %d", rep.HealthRevision)
		}
		// Same for a heartbeat.
		hb := h.request(h.heartbeat(1, 0, true))
		hbBody := h.seal(hb)
		l := e.post(hbBody, hb.RequestID).lease(t)
		e.clock.Advance(time.Second)
		if got := e.post(hbBody, hb.RequestID).lease(t); got != l {
			t.Fatalf("heartbeat retry %+v, want %+v", got, l)
		}
		if got := metricValue(t, e, controlplane.MetricReplays, `operation="heartbeat"`); got != 1 {
			t.Fatalf("replays{heartbeat} = %v, want 1", got)
		}
	})
}

func TestRetryAfterRetryableFailure(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		faulty := &faultyStore{}
		e := newWrappedEnv(t, nb, func(s controlplane.Store) controlplane.Store { faulty.Store = s; return faulty })
		h := e.provision("a1")
		reg := h.request(h.registration())
		body := h.seal(reg)
		faulty.failNext(1)
		e.post(body, reg.RequestID).rejected(t, http.StatusServiceUnavailable, "resend the same request")
		if rep := e.replica(h.rep.ID); rep.HealthRevision != 0 || rep.Status != aip.ReplicaOffline {
			t.Fatalf("a failed call changed the replica: %s at %d", rep.Status, rep.HealthRevision)
		}
		// The retryable failure consumed nothing: the same bytes succeed.
		e.post(body, reg.RequestID).wantLease(t, 1, e.clock.Now().Add(leaseTTL))
		// And the heartbeat path the same way.
		hb := h.request(h.heartbeat(1, 0, true))
		hbBody := h.seal(hb)
		faulty.failNext(1)
		e.post(hbBody, hb.RequestID).rejected(t, http.StatusServiceUnavailable, "resend")
		e.post(hbBody, hb.RequestID).wantLease(t, 2, e.clock.Now().Add(leaseTTL))
		if got := metricValue(t, e, controlplane.MetricRequests, `operation="heartbeat",outcome="unavailable"`); got != 1 {
			t.Fatalf("requests{heartbeat,unavailable} = %v, want 1", got)
		}
	})
}

func TestRestartKeepsReplaySemantics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		e := newEnv(t, nb)
		h := e.provision("a1")
		reg := h.request(h.registration())
		body := h.seal(reg)
		first := e.post(body, reg.RequestID).lease(t)
		// The control plane restarts between the request and the retry.
		e.restart()
		if got := e.post(body, reg.RequestID).lease(t); got != first {
			t.Fatalf("after restart the retry got %+v, want %+v", got, first)
		}
		r, _ := h.send(h.heartbeat(1, 0, true))
		r.wantLease(t, 2, e.clock.Now().Add(leaseTTL))
		e.restart()
		// The historical registration is consumed now.
		e.post(body, reg.RequestID).rejected(t, http.StatusForbidden, "already consumed")
		r, _ = h.send(h.transition(aip.OpOffline, 2))
		if r.outcome.Status != aip.OutcomeOffline {
			t.Fatalf("offline after restart: %+v", r.outcome)
		}
		// A clean offline may register again.
		r, _ = h.send(h.registration())
		r.wantLease(t, 4, e.clock.Now().Add(leaseTTL))
	})
}

func TestConcurrentHeartbeats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		e := newEnv(t, nb)
		h := e.provision("a1")
		r, _ := h.send(h.registration())
		r.lease(t)
		const n = 24
		bodies := make([][]byte, n)
		ids := make([]string, n)
		for i := range n {
			req := h.request(h.heartbeat(1, 0, true))
			bodies[i], ids[i] = h.seal(req), req.RequestID
		}
		replies := make([]reply, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				replies[i], errs[i] = e.tryPost(bodies[i], ids[i])
			})
		}
		close(start)
		wg.Wait()
		wins := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if replies[i].status == http.StatusOK {
				wins++
				replies[i].wantLease(t, 2, e.clock.Now().Add(leaseTTL))
				continue
			}
			if replies[i].status == http.StatusServiceUnavailable {
				// Beyond MaxRequestsPerReplica being decided: not decided.
				replies[i].rejected(t, http.StatusServiceUnavailable, "lifecycle requests being decided")
				continue
			}
			replies[i].rejected(t, http.StatusForbidden, "sequence")
		}
		if wins != 1 {
			t.Fatalf("%d of %d concurrent heartbeats with the same previous_sequence won, want exactly 1", wins, n)
		}
		if rep := e.replica(h.rep.ID); rep.HealthRevision != 2 {
			t.Fatalf("health revision %d, want 2", rep.HealthRevision)
		}
	})
}

func TestLeaseExpiryByMaintenance(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		e := newEnv(t, nb)
		h := e.provision("a1")
		r, _ := h.send(h.registration())
		r.lease(t)
		routeReq := registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"}
		a, err := e.b.Resolver.Resolve(e.ctx, routeReq)
		if err != nil {
			t.Fatal(err)
		}
		// Nothing expires while the lease is live.
		if n, err := e.svc.Maintain(e.ctx); err != nil || n != 0 {
			t.Fatalf("Maintain before expiry = %d, %v", n, err)
		}
		e.clock.Advance(leaseTTL + time.Second)
		if n, err := e.svc.Maintain(e.ctx); err != nil || n != 1 {
			t.Fatalf("Maintain after expiry = %d, %v; want 1 replica expired", n, err)
		}
		rep := e.replica(h.rep.ID)
		if rep.Status != aip.ReplicaOffline || rep.ActiveAssignments != 0 || rep.HealthRevision != 2 {
			t.Fatalf("expired replica: %s, %d active, revision %d", rep.Status, rep.ActiveAssignments, rep.HealthRevision)
		}
		res, err := e.b.Resolver.Reservation(e.ctx, a.ActionID)
		if err != nil || res.Reserved || res.LastSettlement != registry.SettlementLeaseExpired {
			t.Fatalf("reservation after expiry: %+v, %v", res, err)
		}
		l, err := e.b.Fleet.Ledger(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		registrytest.CheckLedger(t, l)
		if len(l.Reservations) != 0 {
			t.Fatalf("reservations left after expiry: %+v", l.Reservations)
		}
		// Out of routing: a retry of the pinned route fails, and so does a
		// new route.
		if _, err := e.b.Resolver.Resolve(e.ctx, routeReq); !errors.Is(err, registry.ErrReplicaUnavailable) {
			t.Fatalf("resolve of the pinned route after expiry: %v", err)
		}
		fresh := registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"}
		if _, err := e.b.Resolver.Resolve(e.ctx, fresh); !errors.Is(err, registry.ErrReplicaUnavailable) {
			t.Fatalf("resolve of a new route after expiry: %v", err)
		}
		// The host's heartbeat is refused; it registers again and routes.
		r, _ = h.send(h.heartbeat(1, 0, true))
		r.rejected(t, http.StatusForbidden, "offline; register again")
		r, _ = h.send(h.registration())
		r.wantLease(t, 3, e.clock.Now().Add(leaseTTL))
		if _, err := e.b.Resolver.Resolve(e.ctx, fresh); err != nil {
			t.Fatalf("resolve after re-registration: %v", err)
		}
		if got := metricValue(t, e, controlplane.MetricLeasesExpired, ""); got != 1 {
			t.Fatalf("leases expired metric %v, want 1", got)
		}
		if got := metricValue(t, e, controlplane.MetricReplicas, `state="offline"`); got != 1 {
			t.Fatalf("offline replicas gauge %v, want 1 (from the expiring cycle)", got)
		}
		// A replica offline for longer than the recent-offline window is
		// retired: counted apart, not with the offline ones.
		gone := e.provision("a2")
		r, _ = gone.send(gone.registration())
		r.lease(t)
		r, _ = gone.send(gone.transition(aip.OpOffline, 1))
		if r.status != http.StatusOK {
			t.Fatalf("offline: HTTP %d %+v", r.status, r.outcome)
		}
		e.clock.Advance(registry.RecentOfflineWindow + leaseTTL + time.Minute) // h's lease ends too
		if _, err := e.svc.Maintain(e.ctx); err != nil {
			t.Fatal(err)
		}
		if got := metricValue(t, e, controlplane.MetricReplicas, `state="retired"`); got != 2 {
			t.Fatalf("retired replicas gauge %v, want 2", got)
		}
		if got := metricValue(t, e, controlplane.MetricReplicas, `state="offline"`); got != 0 {
			t.Fatalf("offline replicas gauge %v, want 0 (both retired)", got)
		}
	})
}

// TestUnhealthyHeartbeat checks that connector_ready=false takes the
// replica offline with its lease ended, out of routing.
func TestUnhealthyHeartbeat(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		e := newEnv(t, nb)
		h := e.provision("a1")
		r, _ := h.send(h.registration())
		r.lease(t)
		e.clock.Advance(2 * time.Second)
		r, _ = h.send(h.heartbeat(1, 0, false))
		r.wantLease(t, 2, e.clock.Now())
		rep := e.replica(h.rep.ID)
		if rep.Status != aip.ReplicaOffline || rep.LeaseValid(e.clock.Now()) {
			t.Fatalf("after an unhealthy heartbeat: %s, lease %s", rep.Status, rep.LeaseExpiresAt)
		}
		if _, err := e.b.Resolver.Resolve(e.ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"}); !errors.Is(err, registry.ErrReplicaUnavailable) {
			t.Fatalf("resolve after an unhealthy heartbeat: %v", err)
		}
	})
}

func TestNotRunning(t *testing.T) {
	clock := registrytest.NewClock(registrytest.Epoch)
	b := newMemBackend(t, clock)
	svc, err := controlplane.New(controlKey, b.Store, controlplane.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	w, err := registrytest.NewLifecycleWorld(t.Context(), b.Admin)
	if err != nil {
		t.Fatal(err)
	}
	rep := w.ProvisionedReplica("crepl_a1", clock.Now())
	if err := b.Admin.PutReplica(t.Context(), rep); err != nil {
		t.Fatal(err)
	}
	key := registrytest.Key(rep.ID)
	req := aip.NewControlRequest(clock.Now(), key.DID(), aip.RegisterCommand(w.Registration(&rep)))
	body := sealWith(t, key, req)
	post := func() reply {
		rec := httptestRecorder(svc, body)
		cr, err := aip.OpenControlResponse(rec.Body.Bytes(), controlKey.DID(), controlKey.PublicKey(), req.RequestID, clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		return reply{status: rec.Code, outcome: cr.Outcome}
	}
	post().rejected(t, http.StatusServiceUnavailable, "not running")
	if doc := readyDoc(t, svc); doc.Status != "not_ready" || !contains(doc.Failing, "service") {
		t.Fatalf("ready before Run: %+v", doc)
	}
	stop := runService(t, svc)
	post().lease(t)
	stop()
	post().rejected(t, http.StatusServiceUnavailable, "not running")
	if err := svc.Run(t.Context()); err == nil {
		t.Fatal("a second Run succeeded")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func readyDoc(t *testing.T, svc *controlplane.Service) controlplane.ReadyDocument {
	t.Helper()
	rec := httptestGet(svc, controlplane.PathReady)
	var doc controlplane.ReadyDocument
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	want := http.StatusOK
	if doc.Status != "ready" {
		want = http.StatusServiceUnavailable
	}
	if rec.Code != want {
		t.Fatalf("/ready status %d with document status %q", rec.Code, doc.Status)
	}
	return doc
}
