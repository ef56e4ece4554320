package sidecar

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// compileSchemas compiles the contract's schemas (CompileSchemas, which
// sidecartest.Validator uses too).
func compileSchemas(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	schemas, err := CompileSchemas()
	if err != nil {
		t.Fatal(err)
	}
	return schemas
}

func validate(t *testing.T, schemas map[string]*jsonschema.Schema, name string, raw []byte) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: not JSON: %s", name, raw)
	}
	if err := schemas[name].Validate(doc); err != nil {
		t.Errorf("%s: %v\n%s", name, err, raw)
	}
}

// TestSchemasArePublished: docs/sidecar-protocol.md shows every schema
// verbatim.
func TestSchemasArePublished(t *testing.T) {
	doc, err := os.ReadFile("../docs/sidecar-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	names, _ := fs.Glob(Schemas(), "*.schema.json")
	for _, n := range names {
		raw, _ := fs.ReadFile(Schemas(), n)
		block := "### " + n + "\n\n```json\n" + strings.TrimRight(string(raw), "\n") + "\n```\n"
		if !bytes.Contains(doc, []byte(block)) {
			t.Errorf("docs/sidecar-protocol.md does not show %s verbatim (copy the file into its section)", n)
		}
	}
	compileSchemas(t)
}

// recorder keeps the raw bodies of the requests the sidecar sends.
type recorder struct {
	next http.Handler
	mu   sync.Mutex
	reqs map[string][][]byte // path kind -> bodies
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	kind := r.URL.Path
	if strings.HasSuffix(kind, "/cancel") {
		kind = "cancel"
	}
	rc.mu.Lock()
	rc.reqs[kind] = append(rc.reqs[kind], body)
	rc.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	rc.next.ServeHTTP(w, r)
}

// TestSidecarRequestsMatchSchemas checks what the sidecar sends, and the
// Go encodings of the answers it accepts, against the schemas.
func TestSidecarRequestsMatchSchemas(t *testing.T) {
	schemas := compileSchemas(t)
	f := newFakeConnector()
	f.reconcileAnswer = func(localReconcile) (int, any) { return 200, map[string]string{"status": "not_found"} }
	rec := &recorder{next: f, reqs: map[string][][]byte{}}
	sock := socketPath(t)
	serveAt(t, rec, sock)
	r := startReplica(t, func(c *Config) { c.Local = LocalConfig{Socket: sock} })
	ctx := ctxT(t)
	a := act("echo.say", `{"message":"schema"}`)
	ms := uint64(60000)
	a.TimeoutMS = &ms
	must(r.d.Act(ctx, r.target, a))
	s := act("echo.stream", `{"message":"s","chunks":2}`)
	s.Mode = aip.ModeStreaming
	must(r.d.Act(ctx, r.target, s))
	slow := act("echo.slow", `{"delay_ms":60000}`)
	done := make(chan struct{})
	go func() { must(r.d.Act(ctx, r.target, slow)); close(done) }()
	<-f.started
	<-f.started
	<-f.started
	must(r.d.Cancel(ctx, r.target, slow.ID, "echo.slow", "schema check"))
	<-done
	l := r.s.local
	l.Reconcile(ctx, &hostsdk.UncertainAction{Action: journalAction(aip.NewActionID(), time.Now())})

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for kind, schema := range map[string]string{PathLocalActions: "action-request", "cancel": "cancel-request", PathLocalReconcile: "reconcile-request"} {
		if len(rec.reqs[kind]) == 0 {
			t.Errorf("no %s request was recorded", kind)
		}
		for _, body := range rec.reqs[kind] {
			validate(t, schemas, schema, body)
		}
	}

	for name, v := range map[string]any{
		"action-result":      localResult{Status: localFailed, Error: aip.NewProtocolError("x.y", aip.CategoryPermanent, false, 0, "no"), Detail: "d"},
		"stream-line":        localLine{Chunk: &localChunk{Kind: aip.ChunkProgress, Data: json.RawMessage(`{"i":1}`)}},
		"reconcile-response": localResult{Status: localRunning},
		"health-response":    localHealth{Status: "ok"},
		"error-response":     localError{Error: aip.NewProtocolError("x.y", aip.CategoryPermanent, false, 0, "no")},
		"manifest":           fakeManifest(""),
	} {
		raw, _ := json.Marshal(v)
		validate(t, schemas, name, raw)
	}
	res, _ := json.Marshal(localLine{Result: &localResult{Status: localCompleted, Output: json.RawMessage(`{}`)}})
	validate(t, schemas, "stream-line", res)
}

// TestManifestSchemaRefusesWhatTheSidecarRefuses: a connector author who
// checks a manifest against manifest.schema.json must not learn only at
// start-up that the sidecar refuses it. Each case is a manifest the
// sidecar's strict decoding (or aip.Manifest.Validate) refuses; the schema must
// refuse it too.
func TestManifestSchemaRefusesWhatTheSidecarRefuses(t *testing.T) {
	schemas := compileSchemas(t)
	base, _ := json.Marshal(fakeManifest(""))
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		json.Unmarshal(base, &m)
		f(m)
		raw, _ := json.Marshal(m)
		return raw
	}
	contract := func(m map[string]any) map[string]any {
		return m["capabilities"].([]any)[0].(map[string]any)["contract"].(map[string]any)
	}
	for name, raw := range map[string][]byte{
		"external ref with an unknown member": edit(func(m map[string]any) {
			m["agent"].(map[string]any)["external_refs"] = []any{map[string]any{"system": "crm", "type": "account", "id": "1", "url": "https://x"}}
		}),
		"external ref that is not an object": edit(func(m map[string]any) { m["agent"].(map[string]any)["external_refs"] = []any{"crm:1"} }),
		"delegated authority with an unknown member": edit(func(m map[string]any) {
			m["agent"].(map[string]any)["delegated_authority"] = []any{map[string]any{"principal_id": "p", "scopes": []string{"a"}, "until": "x"}}
		}),
		"credentials with an unknown member": edit(func(m map[string]any) {
			contract(m)["credentials"] = map[string]any{"required": true, "accepted_issuers": []string{}, "required_scopes": []string{}, "allow_oauth_refresh": false, "vault": "x"}
		}),
		"sla with an unknown member": edit(func(m map[string]any) { contract(m)["sla"] = map[string]any{"async_expected": false, "p99_ms": 5} }),
		"sla timeout as a string": edit(func(m map[string]any) {
			contract(m)["sla"] = map[string]any{"async_expected": false, "timeout_ms": "5"}
		}),
		"transaction with an unknown mode": edit(func(m map[string]any) {
			contract(m)["transaction"] = map[string]any{"supported_modes": []string{"teleport"}, "requires_plan_before_commit": false, "dry_run_fidelity": ""}
		}),
		"compensation with an unknown member": edit(func(m map[string]any) {
			contract(m)["compensation"] = map[string]any{"mode": "supported", "requires_approval": false, "undo": "x"}
		}),
		"unknown manifest_version":         edit(func(m map[string]any) { m["manifest_version"] = "aip-manifest/v2" }),
		"channel that is a number":         edit(func(m map[string]any) { m["channels"] = []any{42} }),
		"channel object without an id":     edit(func(m map[string]any) { m["channels"] = []any{map[string]any{"description": "x"}} }),
		"channel with a trailing space":    edit(func(m map[string]any) { m["channels"] = []any{"notes.changes "} }),
		"channel with a control character": edit(func(m map[string]any) { m["channels"] = []any{"notes\tchanges"} }),
		"channel id with a formatting character": edit(func(m map[string]any) {
			m["channels"] = []any{map[string]any{"id": "notes\u200bchanges"}}
		}),
		"channel_id with a leading no-break space": edit(func(m map[string]any) {
			m["channels"] = []any{map[string]any{"channel_id": "\u00a0notes"}}
		}),
		"contract with no side effects": edit(func(m map[string]any) { contract(m)["side_effects"] = []any{} }),
		"capability without a contract": edit(func(m map[string]any) {
			delete(m["capabilities"].([]any)[0].(map[string]any), "contract")
		}),
	} {
		t.Run(name, func(t *testing.T) {
			var m aip.Manifest
			if err := aip.DecodeStrict(raw, &m); err == nil {
				if err := m.Validate(); err == nil {
					t.Fatalf("the sidecar accepts this manifest; the case is wrong:\n%s", raw)
				}
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if err := schemas["manifest"].Validate(doc); err == nil {
				t.Errorf("manifest.schema.json accepts a manifest the sidecar refuses:\n%s", raw)
			}
		})
	}
	// And the full contract the Go types describe stays valid.
	full := edit(func(m map[string]any) {
		m["agent"].(map[string]any)["external_refs"] = []any{map[string]any{"system": "crm", "type": "account", "id": "1"}}
		m["agent"].(map[string]any)["delegated_authority"] = []any{map[string]any{"principal_id": "p", "scopes": []string{"a"}, "expires_at": "2030-01-01T00:00:00Z", "reason": "r"}}
		c := contract(m)
		c["credentials"] = map[string]any{"required": true, "accepted_issuers": []string{"i"}, "required_scopes": []string{"s"}, "allow_oauth_refresh": true}
		c["sla"] = map[string]any{"expected_latency_ms": 5, "timeout_ms": 10, "async_expected": false, "max_queue_delay_ms": 1, "availability_target": 0.999}
		c["transaction"] = map[string]any{"supported_modes": []string{"execute", "dry_run"}, "requires_plan_before_commit": false, "dry_run_fidelity": "exact"}
		c["compensation"] = map[string]any{"mode": "supported", "compensation_capability_id": "echo.undo", "compensation_window_ms": 60000, "requires_approval": true}
		m["channels"] = append(m["channels"].([]any), "notes changes", map[string]any{"id": "Bücher.änderungen", "channel_id": "x"}, "n")
	})
	var m aip.Manifest
	if err := aip.DecodeStrict(full, &m); err != nil {
		t.Fatalf("the sidecar refuses the full manifest: %v", err)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("the full manifest is invalid: %v", err)
	}
	validate(t, schemas, "manifest", full)
}
