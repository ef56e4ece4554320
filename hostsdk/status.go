package hostsdk

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/netutil"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error":"encode"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
	w.WriteHeader(status)
	w.Write(raw)
}

// handleHealth answers GET /health: the process and its AIP surface respond;
// nothing else is checked.
func (h *Host) handleHealth() http.Handler {
	body := map[string]string{"status": "ok", "protocol": "AIP", "version": aip.Version, "service": Component}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, body) })
}

// ReadyDocument is the JSON body of GET /ready.
type ReadyDocument struct {
	Status     string         `json:"status"` // "ready" or "not_ready"
	LeaseValid bool           `json:"lease_valid"`
	Draining   bool           `json:"draining"`
	Lease      *ReadyLease    `json:"lease,omitempty"`
	Runtime    ReadyRuntime   `json:"runtime"`
	Connector  ReadyComponent `json:"connector"`
	InFlight   int            `json:"in_flight"`
}

// ReadyLease is the last lease the control plane granted.
type ReadyLease struct {
	Sequence  uint64        `json:"sequence"`
	ExpiresAt aip.Timestamp `json:"expires_at"`
}

// ReadyRuntime reports the runtime journal.
type ReadyRuntime struct {
	Durability string        `json:"durability"`
	Ready      bool          `json:"ready"`
	Detail     string        `json:"detail"`
	Recovery   ReadyRecovery `json:"recovery"`
}

// ReadyRecovery summarizes the recovery that ran before registration.
type ReadyRecovery struct {
	RecoveredAt        aip.Timestamp `json:"recovered_at"`
	Reconciled         int           `json:"reconciled"`
	OutcomeUnknown     int           `json:"outcome_unknown"`
	ReadsInterrupted   int           `json:"reads_interrupted"`
	ReceivedNotStarted int           `json:"received_not_started"`
	PendingEvents      int           `json:"pending_events"`
	Errors             []string      `json:"errors"`
}

// ReadyComponent is one probed component.
type ReadyComponent struct {
	Ready  bool   `json:"ready"`
	Detail string `json:"detail"`
}

// handleReady answers GET /ready: 200 when the lease is valid, the host is
// not draining and the storage and connector probes (re-run on every call,
// bounded by the probe timeout) succeed — the storage probe, after a
// journal write failed for a storage reason, only by writing as much as that write
// (see storageRecheckMinBytes); 503 otherwise. The error texts of
// failing probes and of recovery (they name hosts, files, product URLs) go
// only to peers on this machine (a loopback address, in a request no proxy
// marked as forwarded: netutil.IsLocalUnproxied; to none with
// Config.HideLocalReadyDetail) and to the log (each heartbeat of an
// unhealthy replica); other peers read fixed texts.
func (h *Host) handleReady() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.probe(r.Context())
		now := h.cfg.Now()
		seq, exp := h.lease.get()
		rec := h.recovery
		local := !h.cfg.HideLocalReadyDetail && netutil.IsLocalUnproxied(r)
		errs := rec.Errors
		switch {
		case errs == nil:
			errs = []string{}
		case !local:
			errs = []string{fmt.Sprintf("%d recovery error(s); the detail is in the host's log", len(errs))}
		}
		doc := ReadyDocument{
			LeaseValid: h.lease.valid(now),
			Draining:   h.draining.Load(),
			Runtime: ReadyRuntime{
				Durability: string(h.journal.Durability()),
				Ready:      h.storageOK(),
				Detail:     h.storageDetail.Load().forPeer(local),
				Recovery: ReadyRecovery{
					RecoveredAt: aip.At(rec.RecoveredAt), Reconciled: rec.Reconciled,
					OutcomeUnknown: rec.OutcomeUnknown, ReadsInterrupted: rec.ReadsInterrupted, ReceivedNotStarted: rec.Received,
					PendingEvents: rec.PendingEvents, Errors: errs,
				},
			},
			Connector: ReadyComponent{Ready: h.connectorReady.Load(), Detail: h.connectorDetail.Load().forPeer(local)},
			InFlight:  h.inflight.count(),
		}
		if !exp.IsZero() {
			doc.Lease = &ReadyLease{Sequence: seq, ExpiresAt: aip.At(exp)}
		}
		status := http.StatusOK
		doc.Status = "ready"
		// Before the host serves (early.go), no action runs, whatever the
		// lease.
		if !h.ready() || !h.serving.Load() {
			status, doc.Status = http.StatusServiceUnavailable, "not_ready"
		}
		writeJSON(w, status, doc)
	})
}

// handleManifest answers GET /aip/v1/manifest with the bound manifest.
func (h *Host) handleManifest() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(h.manifestJSON)
	})
}

// handleJWKS publishes the replica's public key (kid = its did:key).
func (h *Host) handleJWKS() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Write(h.jwks)
	})
}
