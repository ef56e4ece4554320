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
