package hostsdk

import (
	"net/http"
	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"
)

// ServeReadyFrom answers GET /ready as the host does for a peer at
// remoteAddr ("ip:port") sending the header name/value pairs given: for
// tests of what a remote or proxied peer reads.
func (h *Host) ServeReadyFrom(remoteAddr string, header ...string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, PathReady, nil)
	req.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	h.handleReady().ServeHTTP(rec, req)
	return rec
}

// MetricsRegistry is the registry the host serves at /metrics.
func (h *Host) MetricsRegistry() *prometheus.Registry { return h.m.reg }

// StateDir is the embedded journal's directory the host uses (its
// Config.StateDir with the default applied).
func (h *Host) StateDir() string { return h.cfg.StateDir }

// SetBeforeAcquire makes f run in each action's request between its
// readiness check and taking its in-flight slot. Call it before the
// host receives its first action.
func (h *Host) SetBeforeAcquire(f func()) { h.beforeAcquire = f }
