package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// fakeConnector is a local-contract connector written in Go for the tests
// and the benchmark. Capabilities:
//
//	echo.say     {"message"} -> {"message"}
//	echo.stream  {"message","chunks","no_result"} -> chunks progress 0..n-1, then {"message","chunks"}
//	             (with no_result, the stream ends after the chunks, without a result line)
//	echo.slow    {"delay_ms","ignore_cancel"} waits; a cancel ends it as cancelled
//	echo.crash   the connection is closed without an answer
//	echo.status  {"status","body"} answers that HTTP status and raw body
//	             (or {"status","raw"}: the string raw as the body)
//	echo.publish {"body","times","token"} POSTs body to the sidecar's
//	             events route times times (default once) with the events
//	             token (or token when set, "-" for none) -> {"answers":[eventsReply]}
//
// The manifest declares the event channel fakeChannel.
type fakeConnector struct {
	token string
	// eventsURL and eventsToken are the sidecar's events route
	// (AIP_SIDECAR_EVENTS_URL, AIP_SIDECAR_EVENTS_TOKEN).
	eventsURL, eventsToken string
	manifest               atomic.Pointer[aip.Manifest]
	healthy                atomic.Bool

	mu        sync.Mutex
	actions   []localAction
	headers   []http.Header
	cancels   []localCancel
	reconcile []localReconcile
	running   map[string]chan string // action ID -> cancel reasons
	started   chan string            // action IDs as they start (buffered)
	// reconcileAnswer answers POST /aip/reconcile (nil: 404).
	reconcileAnswer func(r localReconcile) (int, any)
}

func newFakeConnector() *fakeConnector {
	f := &fakeConnector{running: map[string]chan string{}, started: make(chan string, 64)}
	f.healthy.Store(true)
	f.manifest.Store(fakeManifest(""))
	return f
}

// fakeChannel is the event channel the fake manifest declares.
const fakeChannel = "echo.changes"

// eventsReply is one answer of POST /sidecar/events as the child saw it.
type eventsReply struct {
	Status          int             `json:"status"`
	Body            json.RawMessage `json:"body"`
	RetryAfter      string          `json:"retry_after,omitempty"`
	WWWAuthenticate string          `json:"www_authenticate,omitempty"`
}

var sayInput = json.RawMessage(`{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]}`)

func fakeManifest(extra string) *aip.Manifest {
	cap := func(id string, streaming bool) aip.Capability {
		return aip.Capability{ID: id, Name: id + extra, Kind: aip.KindTool, InputSchema: json.RawMessage(`{"type":"object"}`),
			Contract: &aip.CapabilityContract{
				SideEffects: []aip.SideEffect{aip.EffectWrite},
				Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional, CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
				Execution: aip.ExecutionContract{SupportsSync: true, SupportsStreaming: streaming, SupportsCancel: true,
					ExpectedCompletion: aip.CompletionAny, RetrySafety: aip.RetrySafeWithIdempotencyKey},
				Data: aip.DataContract{Sensitivity: aip.SensitivityInternal},
			}}
	}
	say := cap("echo.say", false)
	say.InputSchema = sayInput
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: "agent:fake-local", Kind: aip.PrincipalAgent},
		Profiles:        []string{aip.NativeHTTPProfile},
		Capabilities: []aip.Capability{say, cap("echo.stream", true), cap("echo.slow", false),
			cap("echo.crash", false), cap("echo.status", false), cap("echo.publish", false)},
		Channels: []json.RawMessage{json.RawMessage(`{"id":"` + fakeChannel + `"}`)},
	}
}

func (f *fakeConnector) writeJSON(w http.ResponseWriter, status int, v any) {
	raw, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(raw)
}

func (f *fakeConnector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		f.writeJSON(w, http.StatusUnauthorized, map[string]any{"error": aip.NewProtocolError("fake.unauthorized", aip.CategoryAuth, false, 0, "bad token")})
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == PathLocalManifest:
		f.writeJSON(w, http.StatusOK, f.manifest.Load())
	case r.Method == http.MethodGet && r.URL.Path == PathLocalHealth:
		if f.healthy.Load() {
			f.writeJSON(w, http.StatusOK, localHealth{Status: "ok"})
		} else {
			f.writeJSON(w, http.StatusServiceUnavailable, localHealth{Status: "unavailable", Detail: "fake is unhealthy"})
		}
	case r.Method == http.MethodPost && r.URL.Path == PathLocalActions:
		f.action(w, r)
	case r.Method == http.MethodPost && r.URL.Path == PathLocalReconcile:
		var rc localReconcile
		if err := json.NewDecoder(r.Body).Decode(&rc); err != nil {
			f.writeJSON(w, http.StatusBadRequest, nil)
			return
		}
		f.mu.Lock()
		f.reconcile = append(f.reconcile, rc)
		answer := f.reconcileAnswer
		f.mu.Unlock()
		if answer == nil {
			http.NotFound(w, r)
			return
		}
		status, body := answer(rc)
		f.writeJSON(w, status, body)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, PathLocalActions+"/") && strings.HasSuffix(r.URL.Path, "/cancel"):
		var c localCancel
		json.NewDecoder(r.Body).Decode(&c)
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, PathLocalActions+"/"), "/cancel")
		f.mu.Lock()
		f.cancels = append(f.cancels, c)
		ch := f.running[id]
		f.mu.Unlock()
		if ch == nil {
			f.writeJSON(w, http.StatusNotFound, map[string]string{"status": "not_running"})
			return
		}
		select {
		case ch <- c.Reason:
		default:
		}
		f.writeJSON(w, http.StatusOK, map[string]string{"status": "cancelling"})
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeConnector) action(w http.ResponseWriter, r *http.Request) {
	var a localAction
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		f.writeJSON(w, http.StatusBadRequest, map[string]any{"error": aip.NewProtocolError("fake.bad_request", aip.CategoryPermanent, false, 0, err.Error())})
		return
	}
	cancelled := make(chan string, 4)
	f.mu.Lock()
	f.actions = append(f.actions, a)
	f.headers = append(f.headers, r.Header.Clone())
	f.running[a.ActionID] = cancelled
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.running, a.ActionID)
		f.mu.Unlock()
	}()
	select {
	case f.started <- a.ActionID:
	default:
	}
	var in struct {
		Message      string            `json:"message"`
		Chunks       int               `json:"chunks"`
		DelayMS      int64             `json:"delay_ms"`
		IgnoreCancel bool              `json:"ignore_cancel"`
		Status       int               `json:"status"`
		Header       map[string]string `json:"header"`
		Body         json.RawMessage   `json:"body"`
		Raw          string            `json:"raw"`
		Times        int               `json:"times"`
		Token        string            `json:"token"`
		BlankLines   int               `json:"blank_lines"`
		NoResult     bool              `json:"no_result"`
	}
	json.Unmarshal(a.Input, &in)
	switch a.CapabilityID {
	case "echo.say":
		out, _ := json.Marshal(map[string]string{"message": in.Message})
		f.writeJSON(w, http.StatusOK, localResult{Status: localCompleted, Output: out})
	case "echo.stream":
		if a.Mode != "streaming" {
			out, _ := json.Marshal(map[string]any{"message": in.Message, "chunks": 0})
			f.writeJSON(w, http.StatusOK, localResult{Status: localCompleted, Output: out})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		enc := json.NewEncoder(w)
		io.WriteString(w, strings.Repeat("\n", in.BlankLines))
		for i := range in.Chunks {
			data, _ := json.Marshal(map[string]int{"index": i})
			enc.Encode(localLine{Chunk: &localChunk{Kind: aip.ChunkProgress, Data: data}})
			http.NewResponseController(w).Flush()
		}
		if in.NoResult {
			return
		}
		out, _ := json.Marshal(map[string]any{"message": in.Message, "chunks": in.Chunks})
		enc.Encode(localLine{Result: &localResult{Status: localCompleted, Output: out}})
	case "echo.slow":
		t := time.NewTimer(time.Duration(in.DelayMS) * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f.writeJSON(w, http.StatusOK, localResult{Status: localCompleted, Output: json.RawMessage(`{"slept":true}`)})
				return
			case reason := <-cancelled:
				if in.IgnoreCancel {
					continue
				}
				out, _ := json.Marshal(map[string]string{"reason": reason})
				f.writeJSON(w, http.StatusOK, localResult{Status: localCancelled, Output: out})
				return
			case <-r.Context().Done():
				return
			}
		}
	case "echo.publish":
		answers, err := f.publish(r.Context(), in.Body, max(in.Times, 1), in.Token)
		if err != nil {
			f.writeJSON(w, http.StatusOK, localResult{Status: localFailed, Detail: err.Error()})
			return
		}
		out, _ := json.Marshal(map[string]any{"answers": answers})
		f.writeJSON(w, http.StatusOK, localResult{Status: localCompleted, Output: out})
	case "echo.crash":
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	case "echo.status":
		w.Header().Set("Content-Type", "application/json")
		for k, v := range in.Header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(in.Status)
		if in.Raw != "" {
			w.Write([]byte(in.Raw))
			return
		}
		w.Write(in.Body)
	default:
		f.writeJSON(w, http.StatusNotFound, map[string]any{"error": aip.NewProtocolError("fake.unknown", aip.CategoryPermanent, false, 0, a.CapabilityID)})
	}
}

// publish POSTs body to the sidecar's events route times times.
func (f *fakeConnector) publish(ctx context.Context, body json.RawMessage, times int, token string) ([]eventsReply, error) {
	if f.eventsURL == "" {
		return nil, errors.New("no " + EnvEventsURL + " in the environment")
	}
	switch token {
	case "":
		token = f.eventsToken
	case "-":
		token = ""
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var out []eventsReply
	for range times {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.eventsURL, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !json.Valid(raw) {
			raw, _ = json.Marshal(string(raw))
		}
		out = append(out, eventsReply{Status: resp.StatusCode, Body: raw, RetryAfter: resp.Header.Get("Retry-After"),
			WWWAuthenticate: resp.Header.Get("WWW-Authenticate")})
	}
	return out, nil
}

func (f *fakeConnector) received() []localAction {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]localAction(nil), f.actions...)
}

func (f *fakeConnector) receivedHeaders() []http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]http.Header(nil), f.headers...)
}

func (f *fakeConnector) cancelled() []localCancel {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]localCancel(nil), f.cancels...)
}

// socketPath returns a short unix socket path (sun_path is 108 bytes).
func socketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "c.sock")
}

// serveFake serves f on a unix socket until the test ends and returns the
// socket path and a function that stops serving (closing connections).
func serveFake(t testing.TB, f *fakeConnector) (string, func()) {
	t.Helper()
	path := socketPath(t)
	return path, serveAt(t, f, path)
}

// serveAt serves h on a unix socket until the returned stop (or the end of
// the test).
func serveAt(t testing.TB, h http.Handler, path string) func() {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("fake connector: %v", err)
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			srv.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("must: %v", err))
	}
	return v
}

// journalAction is an action a crash left running.
func journalAction(id string, started time.Time) journal.Action {
	return journal.Action{ActionID: id, CapabilityID: "echo.say", IdempotencyKey: "key-" + id, InputDigest: "sha256:00",
		Status: aip.StateRunning, ReceivedAt: started, StartedAt: started}
}

func journalActionFor(id, capability string) journal.Action {
	a := journalAction(id, time.Now())
	a.CapabilityID = capability
	return a
}

func jsonUnmarshal(raw []byte, v any) error { return json.Unmarshal(raw, v) }

// freeAddr returns a free loopback TCP address.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
