package sidecar

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPURLQueryNeverShows: the query of the MCP server's URL may carry
// its credentials (Target leaves it out), but net/http quotes the whole
// request URL in transport errors. Once the server drops its connections,
// neither the unauthenticated GET /ready and GET /sidecar/status on the
// replica's listener nor an action's answer may show it.
func TestMCPURLQueryNeverShows(t *testing.T) {
	ts := newTestMCPServer(t)
	var down atomic.Bool
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ts.server }, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			// A server going away: the connection drops.
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		for s := range ts.server.Sessions() {
			s.Close()
		}
		srv.CloseClientConnections()
		srv.Close()
	})
	const secret = "s3cret-api-key"
	r := startReplica(t, func(c *Config) {
		c.MCP = MCPConfig{URL: srv.URL + "/mcp?api_key=" + secret, RestartBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
		c.Host.HeartbeatInterval, c.Host.LeaseTTL = 100*time.Millisecond, time.Second
	})
	down.Store(true)
	srv.CloseClientConnections()

	res, err := r.d.Act(ctxT(t), r.target, act("mcp.lookup", `{"word":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if raw, _ := json.Marshal(res); strings.Contains(string(raw), secret) {
		t.Errorf("the action's answer shows the MCP URL's query: %s", raw)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, doc := r.ready(t)
		st := r.status(t)
		raw, _ := json.Marshal(map[string]any{"ready": doc, "status": st})
		if strings.Contains(string(raw), secret) {
			t.Fatalf("GET %s or %s shows the MCP URL's query: %s", "/ready", PathStatus, raw)
		}
		if !doc.Connector.Ready && strings.Contains(doc.Connector.Detail, "(query not shown)") {
			return // the failed ping is reported, redacted
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed health check reported: %s", raw)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
