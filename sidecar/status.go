package sidecar

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// PathStatus is the sidecar's own status route, served on the host's
// listener next to /health and /ready.
const PathStatus = "/sidecar/status"

// Status is the JSON body of GET /sidecar/status.
type Status struct {
	// Mode is "local" or "mcp".
	Mode string `json:"mode"`
	// Target is where the connector is reached: a loopback URL,
	// "unix:<path>", "mcp+stdio:<program>" (its arguments left out) or an
	// MCP URL (its query left out).
	Target string `json:"target"`
	// Healthy is the last health check's result.
	Healthy bool `json:"healthy"`
	// Process is the supervised process (nil when the sidecar attaches to
	// a running local connector). In MCP mode it is the session with the
	// server: Running while connected, Starts counting connections, and
	// PID set for a stdio server.
	Process *ProcessStatus `json:"process"`
	// ManifestChange is the difference between the connector's current
	// manifest and the admitted one (nil when there is none).
	ManifestChange *ManifestChange `json:"manifest_change"`
}

// ProcessStatus describes a supervised connector process.
type ProcessStatus struct {
	Running bool `json:"running"`
	// PID of the running process (0 when not running).
	PID int `json:"pid"`
	// Starts counts every start; Restarts those after a crash.
	Starts   int       `json:"starts"`
	Restarts int       `json:"restarts"`
	Since    time.Time `json:"since"`
	LastExit string    `json:"last_exit,omitempty"`
}

// processSnapshot is what GET /sidecar/status needs from the process the
// sidecar runs (the supervised --exec child or the MCP server).
type processSnapshot interface {
	snapshot() ProcessStatus
}

// processView is what a local connector needs from the supervisor.
type processView interface {
	processSnapshot
	// check returns nil while the process runs, else a *ProcessError.
	check() error
	// generation increases with every start.
	generation() int
	// restartHung terminates the running process, which is then
	// restarted as after a crash; reason is logged.
	restartHung(reason string)
}

// statusSource collects what GET /sidecar/status reports.
type statusSource struct {
	mode   string
	target string
	drift  *drift

	mu      sync.Mutex
	healthy bool
	seen    bool // a health result was recorded
	proc    processSnapshot
}

// setHealthy records a health result and reports whether the connector
// just came back after an unhealthy result.
func (s *statusSource) setHealthy(ok bool) (recovered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	recovered = ok && s.seen && !s.healthy
	s.healthy, s.seen = ok, true
	return recovered
}

func (s *statusSource) setProcess(p processSnapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proc = p
}

func (s *statusSource) snapshot() Status {
	s.mu.Lock()
	st := Status{Mode: s.mode, Target: s.target, Healthy: s.healthy}
	proc := s.proc
	s.mu.Unlock()
	if proc != nil {
		p := proc.snapshot()
		st.Process = &p
	}
	st.ManifestChange = s.drift.current()
	return st
}

func (s *statusSource) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := json.Marshal(s.snapshot())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(raw)
	})
}
