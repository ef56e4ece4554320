package hostsdk

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
)

// Host routes. Every route the host serves is listed in routes below.
const (
	PathHealth   = "/health"
	PathReady    = "/ready"
	PathMetrics  = "/metrics"
	PathManifest = "/aip/v1/manifest"
	PathMessages = aip.MessagesPath
	PathJWKS     = "/.well-known/jwks.json"
)

// routes builds the host's mux: its own routes, then the product routes.
func (h *Host) routes(product []Route) (*http.ServeMux, error) {
	mux := http.NewServeMux()
	mux.Handle("GET "+PathHealth, h.handleHealth())
	mux.Handle("GET "+PathReady, h.handleReady())
	mux.Handle("GET "+PathMetrics, h.m.handler())
	mux.Handle("GET "+PathManifest, h.handleManifest())
	mux.Handle("GET "+PathJWKS, h.handleJWKS())
	mux.Handle("POST "+PathMessages, h.handleMessages())
	for _, r := range product {
		if err := mountProductRoute(mux, r); err != nil {
			return nil, err
		}
	}
	return mux, nil
}

// mountProductRoute adds a product route, refusing patterns on the host's
// own paths (anything under /aip/ and the fixed host paths) and patterns
// that conflict with another route.
func mountProductRoute(mux *http.ServeMux, r Route) (err error) {
	if r.Handler == nil {
		return fmt.Errorf("product route %q has no handler", r.Pattern)
	}
	path := r.Pattern
	if i := strings.IndexByte(path, '/'); i >= 0 {
		path = path[i:]
	} else {
		return fmt.Errorf("product route %q has no path", r.Pattern)
	}
	if path == "/" || strings.HasPrefix(path, "/aip/") || path == "/aip" || strings.HasPrefix(path, "/.well-known/") {
		return fmt.Errorf("product route %q uses a path the host reserves (/, /aip/..., /.well-known/...)", r.Pattern)
	}
	for _, p := range []string{PathHealth, PathReady, PathMetrics} {
		if path == p || strings.HasPrefix(p, strings.TrimSuffix(path, "{$}")) && strings.HasSuffix(path, "/") {
			return fmt.Errorf("product route %q overlaps the host route %s", r.Pattern, p)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("product route %q: %v", r.Pattern, p)
		}
	}()
	mux.Handle(r.Pattern, r.Handler)
	return nil
}
