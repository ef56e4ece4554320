package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// syncBuffer is a log sink safe for the service's handlers and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// messages returns the level and message of every JSON log line.
func (s *syncBuffer) messages(t *testing.T) []string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for line := range strings.Lines(s.b.String()) {
		var rec struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, rec.Level+" "+rec.Msg)
	}
	return out
}

// TestRegistryOutageLoggedOnce: while the registry fails, every heartbeat
// is answered 503 (hosts resend), but the log says so once, when it
// starts, and once when a request is decided again, not once per
// request: a fleet of a thousand replicas heartbeats a thousand times a
// second.
func TestRegistryOutageLoggedOnce(t *testing.T) {
	e, faulty, logs := startFaultyLogged(t)
	h := e.provision("a1")
	r, _ := h.send(h.registration())
	r.wantLease(t, 1, e.clock.Now().Add(leaseTTL))

	const failing = 6
	faulty.failNext(failing)
	for range failing {
		r, _ := h.send(h.heartbeat(1, 0, true))
		r.rejected(t, http.StatusServiceUnavailable, "resend")
	}
	r, _ = h.send(h.heartbeat(1, 0, true))
	r.wantLease(t, 2, e.clock.Now().Add(leaseTTL))
	// A second outage is logged again.
	faulty.failNext(2)
	for range 2 {
		r, _ := h.send(h.heartbeat(2, 0, true))
		r.rejected(t, http.StatusServiceUnavailable, "resend")
	}

	if warns, recovered := outageLogs(t, logs); warns != 2 || recovered != 1 {
		t.Fatalf("two outages of %d and 2 failed heartbeats logged %d warnings and %d recoveries, want 2 and 1: %q", failing, warns, recovered, logs.messages(t))
	}
}

// TestRegistryRejectionEndsLoggedOutage: a request the registry decides is
// the end of an outage even when the decision is a rejection (a heartbeat
// with a stale sequence, one of a replica whose lease ran out while the
// database was away): the recovery is logged, and the next outage is
// logged again. Only renewals and transitions ended it, so a fleet whose
// requests were all rejected after an outage never logged its recovery
// nor the next outage.
func TestRegistryRejectionEndsLoggedOutage(t *testing.T) {
	e, faulty, logs := startFaultyLogged(t)
	h := e.provision("a1")
	r, _ := h.send(h.registration())
	r.wantLease(t, 1, e.clock.Now().Add(leaseTTL))

	for outage := range 2 {
		faulty.failNext(2)
		for range 2 {
			r, _ := h.send(h.heartbeat(1, 0, true))
			r.rejected(t, http.StatusServiceUnavailable, "resend")
		}
		// The registry answers again, with a rejection: the sequence is
		// not the lease's.
		r, _ := h.send(h.heartbeat(7+uint64(outage), 0, true))
		r.rejected(t, http.StatusForbidden, "sequence")
	}

	if warns, recovered := outageLogs(t, logs); warns != 2 || recovered != 2 {
		t.Fatalf("two outages, each ended by a rejection, logged %d warnings and %d recoveries, want 2 and 2: %q", warns, recovered, logs.messages(t))
	}
}

// startFaultyLogged starts a control plane on a memregistry whose store
// fails when asked (faultyStore), logging at info level into logs.
func startFaultyLogged(t *testing.T) (e *env, faulty *faultyStore, logs *syncBuffer) {
	t.Helper()
	clock := registrytest.NewClock(registrytest.Epoch)
	b := newMemBackend(t, clock)
	faulty = &faultyStore{Store: b.Store}
	b.Store = faulty
	e = &env{t: t, ctx: t.Context(), clock: clock, b: b, key: controlKey}
	w, err := registrytest.NewLifecycleWorld(e.ctx, b.Admin)
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
	logs = &syncBuffer{}
	e.start(faulty, func(c *controlplane.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	return e, faulty, logs
}

// outageLogs counts the warnings and the "decided again" lines logged.
func outageLogs(t *testing.T, logs *syncBuffer) (warns, recovered int) {
	t.Helper()
	for _, m := range logs.messages(t) {
		switch {
		case strings.HasPrefix(m, "WARN "):
			warns++
		case strings.Contains(m, "decided again"):
			recovered++
		}
	}
	return warns, recovered
}

// TestUnhealthyHeartbeatLogged: a heartbeat saying the connector is not
// ready takes the replica offline; the log's transition line says so at
// warn, with outcome=unhealthy and what to read, not as an ordinary
// transition at info with outcome=lease (the answer's lease ends at once).
// The message stays "lifecycle transition", which log searches look for.
func TestUnhealthyHeartbeatLogged(t *testing.T) {
	e, _, logs := startFaultyLogged(t)
	h := e.provision("a1")
	r, _ := h.send(h.registration())
	r.wantLease(t, 1, e.clock.Now().Add(leaseTTL))
	h.send(h.heartbeat(1, 0, false))
	logs.mu.Lock()
	all := logs.b.String()
	logs.mu.Unlock()
	found := false
	for line := range strings.Lines(all) {
		var rec struct{ Level, Msg, Operation, Outcome, Detail string }
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Operation != "heartbeat" {
			continue
		}
		found = true
		if rec.Level != "WARN" || rec.Msg != "lifecycle transition" || rec.Outcome != "unhealthy" || !strings.Contains(rec.Detail, "/ready") {
			t.Errorf("the unhealthy heartbeat logged %s", line)
		}
	}
	if !found {
		t.Fatalf("no heartbeat line: %s", all)
	}
}

// TestSenderGoneIsNotARegistryOutage: a host that closes its connection
// while its heartbeat waits for a slow registry batch cut the wait short
// itself: the answer nobody reads is counted as sender_gone and logged at
// debug, not as the registry failing (the warning that starts the outage
// log, which then held every later failure at debug).
func TestSenderGoneIsNotARegistryOutage(t *testing.T) {
	e, faulty, logs := startFaultyLogged(t)
	h := e.provision("a1")
	r, _ := h.send(h.registration())
	r.wantLease(t, 1, e.clock.Now().Add(leaseTTL))

	hold, entered := make(chan struct{}), make(chan struct{}, 1)
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release) // a failed test must not leave the batch, and the service's stop, waiting
	faulty.mu.Lock()
	faulty.hold, faulty.entered = hold, entered
	faulty.mu.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	req := h.request(h.heartbeat(1, 0, true))
	body := h.seal(req)
	post, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+controlplane.PathControl, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(post)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-entered
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the heartbeat was answered though its sender hung up")
	}
	// The handler notices the closed connection and answers; the batch is
	// still held.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := e.get(controlplane.PathMetrics)
		if strings.Contains(body, `aip_connector_control_rejections_total{reason="sender_gone"} 1`) {
			break
		}
		if strings.Contains(body, `aip_connector_control_rejections_total{reason="store"} 1`) || time.Now().After(deadline) {
			t.Fatalf("the hang-up was not counted as sender_gone:\n%s", body)
		}
		time.Sleep(10 * time.Millisecond) // polling the handler's answer to a closed connection
	}
	faulty.mu.Lock()
	faulty.hold, faulty.entered = nil, nil
	faulty.mu.Unlock()
	release()
	// The held batch applied the heartbeat: its resend is answered.
	e.post(body, req.RequestID).wantLease(t, 2, e.clock.Now().Add(leaseTTL))
	if warns, recovered := outageLogs(t, logs); warns != 0 || recovered != 0 {
		t.Fatalf("a sender's hang-up logged %d warnings and %d recoveries, want none: %q", warns, recovered, logs.messages(t))
	}
}
