package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/netutil"
	"github.com/aipfleet/aipfleet/registry"
)

// readyTimeout bounds the store checks of one /ready call.
const readyTimeout = 2 * time.Second

// HealthDocument is the body of GET /health.
type HealthDocument struct {
	Status    string `json:"status"`
	Component string `json:"component"`
	DID       string `json:"did"`
}

// ReadyDocument is the body of GET /ready.
type ReadyDocument struct {
	// Status is "ready" (HTTP 200) or "not_ready" (HTTP 503).
	Status    string `json:"status"`
	Component string `json:"component"`
	DID       string `json:"did"`
	// Backend, SchemaVersion, CatalogRevision and Pool come from the store.
	Backend         string              `json:"backend,omitempty"`
	SchemaVersion   int                 `json:"schema_version"`
	CatalogRevision uint64              `json:"catalog_revision"`
	Pool            *registry.PoolStats `json:"pool,omitempty"`
	// Checks are every check; Failing names the failed ones.
	Checks  []registry.ReadinessCheck `json:"checks"`
	Failing []string                  `json:"failing,omitempty"`
}

func (s *Service) handleHealth() http.Handler {
	body, _ := json.Marshal(HealthDocument{Status: "ok", Component: Component, DID: s.DID()})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		writeBody(w, body)
	})
}

// handleReady answers GET /ready: the service's workers run, the store's
// checks pass (schema version, catalog revision, pool state), and lease
// maintenance is not failing repeatedly.
//
// The messages of failing checks (storage errors name hosts, roles and
// databases) go to the log when they change, and into the answer only for
// an operator or a local peer (a loopback peer whose request carries no
// proxy forwarding header, unless Config.HideLocalReadyDetail); every
// other peer reads redactedCheckMessage in their place.
func (s *Service) handleReady() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		doc := s.readiness(r.Context())
		s.logReadiness(&doc)
		status := http.StatusOK
		if doc.Status != "ready" {
			status = http.StatusServiceUnavailable
			local := !s.cfg.HideLocalReadyDetail && netutil.IsLocalUnproxied(r)
			if !local && s.operatorError(r) != nil {
				for i := range doc.Checks {
					if !doc.Checks[i].OK {
						doc.Checks[i].Message = redactedCheckMessage
					}
				}
			}
		}
		writeJSON(w, status, doc)
	})
}

// redactedCheckMessage replaces a failing /ready check's message for a
// peer that is neither an operator nor on this machine.
const redactedCheckMessage = "failing; the detail is in the control plane's log, and in this answer for an operator (or a request made on this machine, not through a proxy)"

// logReadiness logs the failing checks of doc when they differ from the
// last ones logged, and a return to ready once.
func (s *Service) logReadiness(doc *ReadyDocument) {
	var b strings.Builder
	for _, c := range doc.Checks {
		if !c.OK {
			fmt.Fprintf(&b, "%s: %s; ", c.Name, c.Message)
		}
	}
	now := strings.TrimSuffix(b.String(), "; ")
	if !s.notReady.Changed(now) {
		return // unchanged, or another probe logged it at the same moment
	}
	if now == "" {
		s.log.Info("ready again", "component", Component)
		return
	}
	s.log.Warn("not ready", "component", Component, "failing", strings.Join(doc.Failing, ","), "detail", now)
}

// operatorError is nil when r is an operator's (Config.OperatorAuth), else
// why not.
func (s *Service) operatorError(r *http.Request) error {
	if s.cfg.OperatorAuth == nil {
		return errNoOperators
	}
	return s.cfg.OperatorAuth(r)
}

// errNoOperators is the reason of the fleet views' 401 when no operator is
// configured.
var errNoOperators = errors.New("the fleet views are for operators and this control plane trusts none: start it with --operator-issuer NAME=DID and send an operator token (aipfleet token --operator), or with --open-fleet-views on a trusted network")

// codeUnauthorized is the error code of a fleet view's 401.
const codeUnauthorized = "unauthorized"

// operatorsOnly wraps a fleet view: a request that is not an operator's is
// answered 401 with the reason.
func (s *Service) operatorsOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.operatorError(r); err != nil {
			s.m.fleetViewRefusals.Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="aipfleet-control"`)
			// The code says the request is unauthorized; the message says
			// why, without the "unauthorized: " of a token verifier's
			// error (a client printed "unauthorized: unauthorized:
			// missing Authorization header").
			msg := strings.TrimPrefix(err.Error(), codeUnauthorized+": ")
			writeError(w, http.StatusUnauthorized, codeUnauthorized, aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Service) readiness(ctx context.Context) ReadyDocument {
	doc := ReadyDocument{Component: Component, DID: s.DID()}
	add := func(name string, ok bool, message string) {
		doc.Checks = append(doc.Checks, registry.ReadinessCheck{Name: name, OK: ok, Message: message})
	}
	if s.running() {
		add("service", true, "batch workers running")
	} else {
		add("service", false, "the batch workers are not running (Run has not started or has stopped)")
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if s.probe != nil {
		rep, err := s.probe.Readiness(ctx)
		if err != nil {
			add("store", false, err.Error())
		} else {
			doc.Backend, doc.SchemaVersion, doc.CatalogRevision, doc.Pool = rep.Backend, rep.SchemaVersion, rep.CatalogRevision, rep.Pool
			for _, c := range rep.Checks {
				add("store."+c.Name, c.OK, c.Message)
			}
		}
	} else {
		st, err := s.store.Status(ctx)
		if err != nil {
			add("store", false, err.Error())
		} else {
			doc.CatalogRevision = st.CatalogRevision
			add("store", true, fmt.Sprintf("fleet status readable at catalog revision %d", st.CatalogRevision))
		}
	}
	if !s.cfg.DisableMaintenance {
		last, failures, err := s.maint.snapshot()
		switch {
		case failures >= maintenanceFailuresNotReady:
			add("maintenance", false, fmt.Sprintf("%d consecutive maintenance cycles failed: %v", failures, err))
		case last.IsZero():
			add("maintenance", true, "no cycle completed yet")
		default:
			add("maintenance", true, "last cycle at "+aip.At(last).String())
		}
	}
	doc.Status = "ready"
	for _, c := range doc.Checks {
		if !c.OK {
			doc.Failing = append(doc.Failing, c.Name)
			doc.Status = "not_ready"
		}
	}
	return doc
}

func (s *Service) handleJWKS() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		writeBody(w, s.jwks)
	})
}

// handleFleetStatus answers GET /aip/v1/fleet/status with the store's
// registry.FleetStatusSummary.
func (s *Service) handleFleetStatus() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := s.store.Status(r.Context())
		if err != nil {
			s.log.Warn("fleet status", "error", err)
			writeError(w, http.StatusServiceUnavailable, "fleet.unavailable", "the registry could not be read; retry")
			return
		}
		writeJSON(w, http.StatusOK, st)
	})
}

// FleetReplica is one replica of GET /aip/v1/fleet/replicas.
type FleetReplica struct {
	ID                string            `json:"id"`
	InstanceID        string            `json:"instance_id"`
	VersionID         string            `json:"version_id"`
	Endpoint          string            `json:"endpoint"`
	PeerDID           string            `json:"peer_did"`
	Topology          aip.Topology      `json:"topology"`
	Status            aip.ReplicaStatus `json:"status"`
	LeaseExpiresAt    aip.Timestamp     `json:"lease_expires_at"`
	LeaseValid        bool              `json:"lease_valid"`
	ActiveAssignments uint32            `json:"active_assignments"`
	Capacity          uint32            `json:"capacity"`
	HealthRevision    uint64            `json:"health_revision"`
	Circuit           FleetCircuit      `json:"circuit"`
	// OfflineReason says why an offline replica went offline (shutdown:
	// its own offline transition; unhealthy: a heartbeat with
	// connector_ready false; lease_expired: lease maintenance, its lease
	// having run out; administrator: an administrator's write) and
	// OfflineAt when. Both are absent for a replica that is not offline,
	// one pre-provisioned that never registered, and one that went offline
	// before the registry recorded reasons.
	OfflineReason registry.OfflineReason `json:"offline_reason,omitempty"`
	OfflineAt     *aip.Timestamp         `json:"offline_at,omitempty"`
}

// FleetCircuit is a replica's circuit breaker.
type FleetCircuit struct {
	Open                bool           `json:"open"`
	ConsecutiveFailures uint32         `json:"consecutive_failures"`
	OpenUntil           *aip.Timestamp `json:"open_until,omitempty"`
}

// FleetReplicaPage is the body of GET /aip/v1/fleet/replicas.
type FleetReplicaPage struct {
	Replicas []FleetReplica `json:"replicas"`
	// Next is the "after" value of the next page; empty on the last page.
	Next string `json:"next,omitempty"`
}

// DefaultReplicaPage is the page size of GET /aip/v1/fleet/replicas without
// a limit.
const DefaultReplicaPage = 100

// handleFleetReplicas answers GET /aip/v1/fleet/replicas?after=ID&limit=N:
// replicas in ID order, N per page (default 100, at most 1000).
func (s *Service) handleFleetReplicas() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.lister == nil {
			writeError(w, http.StatusNotImplemented, "fleet.unsupported", "this registry backend does not list replicas")
			return
		}
		q := r.URL.Query()
		limit := DefaultReplicaPage
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > registry.MaxReplicaPage {
				writeError(w, http.StatusBadRequest, "fleet.invalid", fmt.Sprintf("limit %q must be an integer from 1 to %d", v, registry.MaxReplicaPage))
				return
			}
			limit = n
		}
		reps, more, err := s.listReplicas(r.Context(), q.Get("after"), limit)
		if err != nil {
			if errors.Is(err, registry.ErrInvalid) {
				writeError(w, http.StatusBadRequest, "fleet.invalid", err.Error())
				return
			}
			s.log.Warn("list replicas", "error", err)
			writeError(w, http.StatusServiceUnavailable, "fleet.unavailable", "the registry could not be read; retry")
			return
		}
		page := FleetReplicaPage{Replicas: make([]FleetReplica, 0, len(reps))}
		if more {
			page.Next = reps[len(reps)-1].ID
		}
		now := s.cfg.Now()
		for i := range reps {
			page.Replicas = append(page.Replicas, fleetReplica(&reps[i], now))
		}
		writeJSON(w, http.StatusOK, page)
	})
}

// listReplicas returns up to limit (≤ registry.MaxReplicaPage) replicas
// after after, and whether more follow. It asks for one replica more than
// the page; a page of registry.MaxReplicaPage cannot (the lister clamps to
// it), so a full one is followed by a probe for one more replica.
func (s *Service) listReplicas(ctx context.Context, after string, limit int) ([]registry.ConnectorReplica, bool, error) {
	reps, err := s.lister.ListReplicas(ctx, after, limit+1)
	if err != nil {
		return nil, false, err
	}
	if len(reps) > limit {
		return reps[:limit], true, nil
	}
	if len(reps) < limit || limit+1 <= registry.MaxReplicaPage {
		return reps, false, nil
	}
	next, err := s.lister.ListReplicas(ctx, reps[len(reps)-1].ID, 1)
	if err != nil {
		return nil, false, err
	}
	return reps, len(next) > 0, nil
}

func fleetReplica(r *registry.ConnectorReplica, now time.Time) FleetReplica {
	fr := FleetReplica{
		ID: r.ID, InstanceID: r.InstanceID, VersionID: r.VersionID, Endpoint: r.Endpoint, PeerDID: r.PeerDID,
		Topology: r.Topology, Status: r.Status, LeaseExpiresAt: aip.At(r.LeaseExpiresAt), LeaseValid: r.LeaseValid(now),
		ActiveAssignments: r.ActiveAssignments, Capacity: r.Capacity, HealthRevision: r.HealthRevision,
		Circuit: FleetCircuit{Open: !r.Circuit.Closed(now), ConsecutiveFailures: r.Circuit.ConsecutiveFailures},
	}
	if !r.Circuit.OpenUntil.IsZero() {
		t := aip.At(r.Circuit.OpenUntil)
		fr.Circuit.OpenUntil = &t
	}
	if r.Status == aip.ReplicaOffline && r.OfflineReason != "" {
		t := aip.At(r.OfflineAt)
		fr.OfflineReason, fr.OfflineAt = r.OfflineReason, &t
	}
	return fr
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, errorBody(aip.NewProtocolError("internal", aip.CategoryPermanent, false, 0, err.Error()))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	writeBody(w, body)
}

// writeError writes an unsigned error answer: a 503 is temporary and
// retryable, a 401 an auth error, any other status permanent.
func writeError(w http.ResponseWriter, status int, code, message string) {
	category, retryable := aip.CategoryPermanent, false
	switch status {
	case http.StatusServiceUnavailable:
		category, retryable = aip.CategoryTemporary, true
	case http.StatusUnauthorized:
		category = aip.CategoryAuth
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	writeBody(w, errorBody(aip.NewProtocolError(code, category, retryable, 0, message)))
}

// errorBody is the unsigned error body {"error":{"code","message",
// "category","retryable"}}.
func errorBody(e *aip.ProtocolError) []byte {
	b, _ := json.Marshal(aip.ErrorBody{Error: *e})
	return b
}

// writeBody writes a response body; a failed write means the client went
// away, which nothing can repair.
func writeBody(w http.ResponseWriter, b []byte) { _, _ = w.Write(b) }
