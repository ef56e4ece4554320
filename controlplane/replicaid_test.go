package controlplane_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// lookupCounter counts the replica lookups of the control plane's key
// cache (a database query on the PostgreSQL backend).
type lookupCounter struct {
	controlplane.Store
	n atomic.Int64
}

func (s *lookupCounter) LifecycleReplica(ctx context.Context, id string) (registry.ConnectorReplica, error) {
	s.n.Add(1)
	return s.Store.LifecycleReplica(ctx, id)
}

// TestMalformedReplicaIDIsNotLookedUp: a signed request naming a replica
// ID no registry can hold (every replica record's ID is "crepl_" and up to
// 250 letters, digits, '.', '_' or '-') is refused as not pre-provisioned
// before any lookup: an unauthenticated caller could otherwise make each
// request cost a registry query carrying up to 64 KiB of ID, copied into
// the logs, the trace and the answer. The answer quotes the ID cut short.
func TestMalformedReplicaIDIsNotLookedUp(t *testing.T) {
	counter := &lookupCounter{}
	e := newWrappedEnv(t, newMemBackend, func(s controlplane.Store) controlplane.Store { counter.Store = s; return counter })
	h := e.provision("a1")
	for _, id := range []string{
		aip.PrefixReplica + strings.Repeat("x", 60_000),
		aip.PrefixReplica + strings.Repeat("x", aip.MaxRecordIDBytes),
		"cinst_not-a-replica",
		aip.PrefixReplica + "a/../b",
		aip.PrefixReplica,
	} {
		req := h.request(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, PreviousSequence: 1, ConnectorReady: true}))
		r := e.post(h.seal(req), req.RequestID)
		r.rejected(t, http.StatusForbidden, "is not a replica ID")
		if len(r.outcome.Message) > 1000 {
			t.Errorf("the answer to a %d-byte replica ID is %d bytes: %.200s...", len(id), len(r.outcome.Message), r.outcome.Message)
		}
	}
	if n := counter.n.Load(); n != 0 {
		t.Fatalf("%d replica lookups for IDs no replica can have", n)
	}
	// A well-formed ID is looked up (and this one is not provisioned).
	req := h.request(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: aip.PrefixReplica + "ghost", PreviousSequence: 1, ConnectorReady: true}))
	e.post(h.seal(req), req.RequestID).rejected(t, http.StatusForbidden, "not pre-provisioned")
	if n := counter.n.Load(); n != 1 {
		t.Fatalf("%d lookups for a well-formed unknown ID, want 1", n)
	}
}

// TestHugeReplicaIDIsCutShortWhateverRefusesIt: a request whose replica
// ID is no replica record ID is refused by the freshness window (step 2)
// as well as by the replica ID check (step 3): either way the log line
// and the span quote the ID cut short, not the up to 64 KiB an
// unauthenticated sender put there (before, a refusal by the window logged
// and traced it whole).
func TestHugeReplicaIDIsCutShortWhateverRefusesIt(t *testing.T) {
	logs := &syncBuffer{}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		c.TracerProvider = tp
	})
	h := e.provision("a1")
	huge := aip.PrefixReplica + strings.Repeat("x", 60_000)
	stale := h.request(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: huge, PreviousSequence: 1, ConnectorReady: true}))
	stale.IssuedAt = aip.At(e.clock.Now().Add(-40 * time.Second))
	stale.ExpiresAt = aip.At(e.clock.Now().Add(-10 * time.Second))
	e.post(h.seal(stale), stale.RequestID).rejected(t, http.StatusForbidden, "expired")
	fresh := h.request(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: huge, PreviousSequence: 1, ConnectorReady: true}))
	e.post(h.seal(fresh), fresh.RequestID).rejected(t, http.StatusForbidden, "is not a replica ID")

	logs.mu.Lock()
	text := logs.b.String()
	logs.mu.Unlock()
	if n := strings.Count(text, "lifecycle request rejected"); n != 2 {
		t.Fatalf("%d rejections logged, want 2:\n%.2000s", n, text)
	}
	if strings.Contains(text, strings.Repeat("x", 200)) {
		t.Errorf("the log quotes the replica ID whole (%d bytes of log)", len(text))
	}
	spans := 0
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "aip.replica_id" {
				spans++
				if len(kv.Value.AsString()) > 200 {
					t.Errorf("span %s quotes a %d-byte replica ID", s.Name(), len(kv.Value.AsString()))
				}
			}
		}
	}
	if spans != 2 {
		t.Errorf("%d spans with a replica ID, want 2", spans)
	}
}

// TestWrongSignerSaysWhatToDo: a request signed by another key than the
// replica's was refused with "signer_did X is not the DID pre-provisioned
// for replica R", which said neither where that DID comes from nor what to
// do, and the log held nothing more. The answer, which anyone may get,
// still does not show the DID the registry holds, but says where it comes
// from (the fleet file's peer_did) and how to fix either side; the log,
// which only the operator reads, shows both DIDs. A signer DID of a
// body's worth is quoted cut short.
func TestWrongSignerSaysWhatToDo(t *testing.T) {
	logs := &syncBuffer{}
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	h := e.provision("a1")
	other := registrytest.Key("intruder")
	req := h.request(aip.RegisterCommand(e.w.Registration(&h.rep)))
	req.SignerDID = other.DID()
	r := e.post(sealWith(t, other, req), req.RequestID)
	r.rejected(t, http.StatusForbidden, "signer_did "+other.DID()+" is not the DID pre-provisioned for replica "+h.rep.ID)
	for _, w := range []string{"peer_did", "fleet file", "aipfleet keygen --did-of FILE", "set that entry's peer_did to " + other.DID()} {
		if !strings.Contains(r.outcome.Message, w) {
			t.Errorf("answer %q does not say %q", r.outcome.Message, w)
		}
	}
	if strings.Contains(r.outcome.Message, h.key.DID()) {
		t.Errorf("answer %q shows the replica's DID to a sender that is not the replica", r.outcome.Message)
	}
	logs.mu.Lock()
	text := logs.b.String()
	logs.mu.Unlock()
	for _, w := range []string{`"reason":"signer"`, `"signer_did":"` + other.DID() + `"`, `"provisioned_did":"` + h.key.DID() + `"`} {
		if !strings.Contains(text, w) {
			t.Errorf("the log does not hold %s:\n%s", w, text)
		}
	}

	huge := h.request(aip.RegisterCommand(e.w.Registration(&h.rep)))
	huge.SignerDID = "did:key:z" + strings.Repeat("x", 30_000)
	r = e.post(sealWith(t, other, huge), huge.RequestID)
	r.rejected(t, http.StatusForbidden, "is not the DID pre-provisioned")
	if len(r.outcome.Message) > 1000 {
		t.Errorf("the answer to a %d-byte signer DID is %d bytes", len(huge.SignerDID), len(r.outcome.Message))
	}
}
