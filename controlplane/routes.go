package controlplane

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/aipfleet/aipfleet/aip"
)

// Routes of the service. Every route it serves is listed in routes below.
const (
	PathControl       = aip.ControlPath
	PathHealth        = "/health"
	PathReady         = "/ready"
	PathMetrics       = "/metrics"
	PathJWKS          = "/.well-known/jwks.json"
	PathFleetStatus   = "/aip/v1/fleet/status"
	PathFleetReplicas = "/aip/v1/fleet/replicas"
)

func (s *Service) routes() http.Handler {
	r := chi.NewRouter()
	r.Method(http.MethodPost, PathControl, s.handleControl())
	r.Method(http.MethodGet, PathHealth, s.handleHealth())
	r.Method(http.MethodGet, PathReady, s.handleReady())
	r.Method(http.MethodGet, PathMetrics, s.m.handler())
	r.Method(http.MethodGet, PathJWKS, s.handleJWKS())
	r.Method(http.MethodGet, PathFleetStatus, s.operatorsOnly(s.handleFleetStatus()))
	r.Method(http.MethodGet, PathFleetReplicas, s.operatorsOnly(s.handleFleetReplicas()))
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such route: "+r.URL.Path)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path)
	})
	return r
}
