package pythonconnector_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/sidecar"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest/realfleet"
)

func TestMain(m *testing.M) {
	code := m.Run()
	sidecartest.RemoveBuilds()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// python returns the python3 interpreter or fails the test.
func python(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the aip-sidecar binary and Python processes; skipped in -short mode")
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed; the Python example's tests need Python 3 (standard library only)")
	}
	return p
}

func connectorScript(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("notes_connector.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// notes is one notes replica: the sidecar running the Python service as
// its child over a unix socket, in a fleet (the real control plane and
// dispatcher when a test database is configured, else the fakes).
type notes struct {
	fleet   sidecartest.Fleet
	r       *sidecartest.Replica
	p       *sidecartest.Process
	sock    string
	token   string
	env     []string
	args    []string
	signals string // the child's signal log
}

// noBytecode keeps the Python child from writing __pycache__ into the
// source tree.
const noBytecode = "PYTHONDONTWRITEBYTECODE=1"

func startNotes(t *testing.T, opts sidecartest.ReplicaOptions, extraEnv ...string) *notes {
	t.Helper()
	n := &notes{fleet: realfleet.New(t), sock: sidecartest.SocketPath(t, "notes.sock"), token: "notes-test-token"}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(n.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Admit what the sidecar describes, as an operator would.
	m, _ := sidecartest.Describe(t, n.fleet.TrustDomain(), []string{"NOTES_STATE=" + filepath.Join(dir, "describe.json"), noBytecode},
		"--local-socket", sidecartest.SocketPath(t, "describe.sock"), "--exec", python(t), connectorScript(t))
	n.fleet.Admit(t, m)
	n.r = n.fleet.NewReplica(t, opts)
	n.signals = filepath.Join(n.r.Dir, "signals.jsonl")
	n.env = append(append([]string{}, n.r.Env...),
		"NOTES_STATE="+filepath.Join(n.r.Dir, "notes-journal.json"),
		"NOTES_SIGNAL_LOG="+n.signals,
		"AIP_SIDECAR_LOCAL_TOKEN_FILE="+tokenFile,
		"AIP_SIDECAR_RESTART_BACKOFF_MS=50",
		noBytecode)
	n.env = append(n.env, extraEnv...)
	n.args = []string{"--local-socket", n.sock, "--exec", python(t), connectorScript(t)}
	n.start(t)
	return n
}

func (n *notes) start(t *testing.T) {
	t.Helper()
	n.p = sidecartest.Start(t, sidecartest.Sidecar(t), n.env, n.args...)
	n.p.Await(t, "serving")
	n.r.AwaitReady(t)
}

func (n *notes) status(t *testing.T) sidecar.Status {
	t.Helper()
	var st sidecar.Status
	sidecartest.GetJSON(t, n.r.Base+sidecar.PathStatus, &st)
	return st
}

func (n *notes) act(t *testing.T, a *aip.Action) *sidecartest.Answer {
	t.Helper()
	ans := n.fleet.Act(t, n.r, a)
	if ans.Err != nil {
		t.Fatalf("%s: %v", a.CapabilityID, ans.Err)
	}
	return ans
}

func (n *notes) result(t *testing.T, a *aip.Action) *aip.ActionResult {
	t.Helper()
	ans := n.act(t, a)
	if ans.Result == nil {
		t.Fatalf("%s: HTTP %d without a result: %+v %s", a.CapabilityID, ans.HTTPStatus, ans.Error, ans.Raw)
	}
	return ans.Result
}

// actAsync sends an action in the background.
func (n *notes) actAsync(t *testing.T, a *aip.Action) <-chan *sidecartest.Answer {
	done := make(chan *sidecartest.Answer, 1)
	go func() { done <- n.fleet.Act(t, n.r, a) }()
	return done
}

type note struct {
	ID    string `json:"id"`
	Title string `json:"title"`
	Body  string `json:"body"`
}

func noteOf(t *testing.T, res *aip.ActionResult) note {
	t.Helper()
	var out struct{ Note note }
	if err := json.Unmarshal(res.Output, &out); err != nil || out.Note.ID == "" {
		t.Fatalf("output %s: %v", res.Output, err)
	}
	return out.Note
}

func (n *notes) list(t *testing.T) []note {
	t.Helper()
	res := n.result(t, action("notes.list", `{}`))
	var out struct{ Notes []note }
	if err := json.Unmarshal(res.Output, &out); err != nil {
		t.Fatal(err)
	}
	return out.Notes
}

// awaitRunning polls the replica's journal until the action runs.
func (n *notes) awaitRunning(t *testing.T, a *aip.Action) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for n.fleet.State(t, n.r, a.ID, a.CapabilityID) != aip.StateRunning {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not start running", a.ID)
		}
		time.Sleep(10 * time.Millisecond) // polling real processes for a state change
	}
}

func action(capability, input string) *aip.Action {
	return &aip.Action{ID: aip.NewActionID(), CapabilityID: capability, Input: json.RawMessage(input)}
}

// TestNotesActions: create (idempotent by key), get, list and a streaming
// export through the fleet.
func TestNotesActions(t *testing.T) {
	n := startNotes(t, sidecartest.ReplicaOptions{})
	a := action("notes.create", `{"title":"groceries","body":"milk"}`)
	a.IdempotencyKey = "create-groceries"
	res := n.result(t, a)
	if res.Status != aip.ResultCompleted || res.Receipt == nil || len(res.Message) != 1 {
		t.Fatalf("create: %+v", res)
	}
	first := noteOf(t, res)
	if first.Title != "groceries" || first.Body != "milk" {
		t.Errorf("note %+v", first)
	}
	// A new action with the same idempotency key: the original note.
	again := action("notes.create", `{"title":"groceries","body":"milk"}`)
	again.IdempotencyKey = "create-groceries"
	if got := noteOf(t, n.result(t, again)); got.ID != first.ID {
		t.Errorf("idempotent create made note %s, want %s", got.ID, first.ID)
	}
	n.result(t, action("notes.create", `{"title":"second"}`))

	if got := noteOf(t, n.result(t, action("notes.get", `{"id":"`+first.ID+`"}`))); got != first {
		t.Errorf("get %+v", got)
	}
	miss := n.result(t, action("notes.get", `{"id":"note_none"}`))
	if miss.Status != aip.ResultFailed || miss.Error.Code != "notes.not_found" {
		t.Errorf("get of a missing note: %+v", miss)
	}
	if l := n.list(t); len(l) != 2 || l[0].ID != first.ID || l[1].Title != "second" {
		t.Errorf("list %+v", l)
	}
	exp := action("notes.export", `{}`)
	exp.Mode = aip.ModeStreaming
	resp := n.act(t, exp)
	if len(resp.Chunks) != 2 || resp.Chunks[0].Kind != aip.ChunkData || !strings.Contains(string(resp.Chunks[0].Data), first.ID) {
		t.Fatalf("export chunks %+v", resp.Chunks)
	}
	if res := resp.Must(t, aip.ResultCompleted); string(res.Output) != `{"count":2}` {
		t.Errorf("export result %+v", res)
	}
	// Input the capability's schema refuses never reaches the service.
	resp = n.act(t, action("notes.create", `{"title":""}`))
	if resp.Result != nil || resp.Error == nil || !strings.Contains(resp.Error.Code, "input") {
		t.Errorf("invalid input: HTTP %d %s", resp.HTTPStatus, resp.Raw)
	}
	if l := n.list(t); len(l) != 2 {
		t.Errorf("notes %+v", l)
	}
	// Each created note was published as an event through the sidecar
	// (the idempotent repeat created nothing and published nothing).
	resp2, err := http.Get(n.r.Base + hostsdk.PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	var metrics bytes.Buffer
	metrics.ReadFrom(resp2.Body)
	if want := sidecar.MetricEventBatchesPublished + " 2\n"; !strings.Contains(metrics.String(), want) {
		t.Errorf("metrics do not show %q:\n%s", want, metrics.String())
	}
	// The replica's event outbox delivers them to the fleet's event log,
	// where the tenant reads them (the real dispatcher's GET
	// /aip/v1/events, or the fake fleet's ingress), once each.
	var events []aip.Event
	deadline := time.Now().Add(time.Minute)
	for {
		if events = n.fleet.Events(t); len(events) >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling the event log the outbox delivers to
	}
	var titles []string
	for _, e := range events {
		var data struct {
			NoteID string `json:"note_id"`
			Title  string `json:"title"`
		}
		if e.Kind != "note.created" || json.Unmarshal(e.Data, &data) != nil || data.NoteID == "" {
			t.Errorf("event %+v, want a note.created with the note", e)
		}
		titles = append(titles, data.Title)
	}
	if len(events) != 2 || titles[0] != "groceries" || titles[1] != "second" {
		t.Errorf("the event log holds %d events (titles %q), want the two notes' note.created", len(events), titles)
	}
}

// TestNotesSpeaksTheContract checks the service's answers against the
// contract's JSON Schemas, talking to its socket directly.
func TestNotesSpeaksTheContract(t *testing.T) {
	n := startNotes(t, sidecartest.ReplicaOptions{})
	v, err := sidecartest.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", n.sock)
		}}}
	do := func(method, path, body string) (int, string, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://notes"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+n.token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), b.Bytes()
	}
	check := func(schema string, raw []byte) {
		t.Helper()
		if err := v.Validate(schema, raw); err != nil {
			t.Errorf("%v\n%s", err, raw)
		}
	}
	_, _, raw := do("GET", sidecar.PathLocalManifest, "")
	check("manifest", raw)
	_, _, raw = do("GET", sidecar.PathLocalHealth, "")
	check("health-response", raw)
	req := `{"action_id":"act_0192a3b4c5d67e8f90a1b2c3d4e5f607","idempotency_key":"k","capability_id":"notes.create","input":{"title":"t"},"mode":"sync","message_id":"msg_0192a3b4c5d67e8f90a1b2c3d4e5f607","tenant":{"tenant_id":"x","connector_type_id":"c","version_id":"v","instance_id":"i","replica_id":"r","config_revision":1,"trust_domain":"d"}}`
	_, _, raw = do("POST", sidecar.PathLocalActions, req)
	check("action-result", raw)
	stream := strings.Replace(strings.Replace(req, "notes.create", "notes.export", 1), `"sync"`, `"streaming"`, 1)
	stream = strings.Replace(stream, `{"title":"t"}`, `{}`, 1)
	stream = strings.Replace(stream, "act_0192", "act_0193", 1)
	_, ct, raw := do("POST", sidecar.PathLocalActions, stream)
	if ct != hostsdk.ContentTypeNDJSON {
		t.Errorf("streaming answer Content-Type %q", ct)
	}
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		check("stream-line", line)
	}
	code, _, raw := do("POST", sidecar.PathLocalActions+"/act_0192a3b4c5d67e8f90a1b2c3d4e5f607/cancel", `{"action_id":"act_0192a3b4c5d67e8f90a1b2c3d4e5f607"}`)
	if code != http.StatusNotFound {
		t.Errorf("cancel of a finished action: %d", code)
	}
	check("cancel-response", raw)
	rec := `{"action_id":"act_0192a3b4c5d67e8f90a1b2c3d4e5f607","idempotency_key":"k","capability_id":"notes.create","input_digest":"sha256:00","received_at":"2026-01-01T00:00:00.000Z"}`
	_, _, raw = do("POST", sidecar.PathLocalReconcile, rec)
	check("reconcile-response", raw)
	_, _, raw = do("POST", sidecar.PathLocalReconcile, strings.Replace(rec, "act_0192", "act_0999", 1))
	check("reconcile-response", raw)
	if !bytes.Contains(raw, []byte(`"not_found"`)) {
		t.Errorf("reconcile of an unknown action: %s", raw)
	}
	code, _, raw = do("POST", sidecar.PathLocalActions, strings.Replace(req, "notes.create", "notes.nope", 1))
	if code != http.StatusNotFound {
		t.Errorf("unknown capability: %d", code)
	}
	check("error-response", raw)
	// Without the token the service refuses.
	req2, _ := http.NewRequest("GET", "http://notes"+sidecar.PathLocalHealth, nil)
	resp, err := client.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without the token: HTTP %d", resp.StatusCode)
	}
}

// TestNotesCancel cancels a create during its delay: no note is written.
func TestNotesCancel(t *testing.T) {
	n := startNotes(t, sidecartest.ReplicaOptions{})
	a := action("notes.create", `{"title":"never","delay_ms":60000}`)
	done := n.actAsync(t, a)
	n.awaitRunning(t, a)
	n.fleet.Cancel(t, n.r, a.ID, a.CapabilityID, "no longer needed").Must(t, aip.ResultCancelled)
	(<-done).Must(t, aip.ResultCancelled)
	if l := n.list(t); len(l) != 0 {
		t.Errorf("a cancelled create wrote %+v", l)
	}
}

type signalRecord struct {
	Signal     string `json:"signal"`
	TimeUnixNS int64  `json:"time_unix_ns"`
	PID        int    `json:"pid"`
}

func readSignals(t *testing.T, path string) []signalRecord {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the child recorded no signal: %v", err)
	}
	var out []signalRecord
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		var r signalRecord
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("signal log line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// TestNotesSigtermOrder sends SIGTERM to the sidecar with an action in
// flight: the child serves it through the drain, and receives SIGTERM only
// after the control plane saw offline; the sidecar exits 0.
func TestNotesSigtermOrder(t *testing.T) {
	n := startNotes(t, sidecartest.ReplicaOptions{})
	pid := n.status(t).Process.PID
	a := action("notes.create", `{"title":"during the drain","delay_ms":1000}`)
	done := n.actAsync(t, a)
	n.awaitRunning(t, a)
	n.p.Signal(t, syscall.SIGTERM)
	if err := n.p.Wait(t); err != nil {
		t.Fatalf("the sidecar exited with %v after SIGTERM", err)
	}
	if ans := <-done; ans.Err != nil || ans.Result == nil || ans.Result.Status != aip.ResultCompleted {
		t.Fatalf("the in-flight create answered %+v; the child must serve it during the drain", ans)
	}
	tr := n.fleet.Transitions(t)
	last, okOff := sidecartest.LastTransition(tr, n.r.ID, aip.OpOffline)
	drain, okDrain := sidecartest.LastTransition(tr, n.r.ID, aip.OpDrain)
	if !okOff || !okDrain || tr[len(tr)-1].Op != aip.OpOffline {
		t.Fatalf("lifecycle transitions %+v", tr)
	}
	sigs := readSignals(t, n.signals)
	if len(sigs) != 1 || sigs[0].Signal != "SIGTERM" || sigs[0].PID != pid {
		t.Fatalf("child signals %+v (child pid %d)", sigs, pid)
	}
	at := time.Unix(0, sigs[0].TimeUnixNS)
	if !at.After(last.At) || !at.After(drain.At) {
		t.Errorf("the child got SIGTERM at %s; the control plane saw drain at %s and offline at %s",
			at.Format(time.RFC3339Nano), drain.At.Format(time.RFC3339Nano), last.At.Format(time.RFC3339Nano))
	}
	if !sidecartest.Exited(pid) {
		t.Errorf("the child %d outlived the sidecar", pid)
	}
}

// TestNotesChildCrash kills the Python child: its in-flight action becomes
// outcome_unknown, the replica reports unhealthy while the restarted child
// is not ready, then registers again and serves.
func TestNotesChildCrash(t *testing.T) {
	maint := filepath.Join(t.TempDir(), "maintenance")
	n := startNotes(t, sidecartest.ReplicaOptions{HeartbeatInterval: 200 * time.Millisecond, LeaseTTL: time.Second},
		"NOTES_MAINTENANCE_FILE="+maint)
	pid := n.status(t).Process.PID
	a := action("notes.create", `{"title":"lost","delay_ms":60000}`)
	done := n.actAsync(t, a)
	n.awaitRunning(t, a)
	// The restarted child comes up in maintenance (unhealthy) until the
	// file is removed, so the unhealthy window is certain.
	if err := os.WriteFile(maint, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before := len(n.fleet.Transitions(t))
	syscall.Kill(pid, syscall.SIGKILL)
	if ans := <-done; !ans.OutcomeUnknown {
		t.Fatalf("the in-flight action did not end outcome_unknown: %+v %s", ans, ans.Raw)
	}
	sidecartest.AwaitTransition(t, n.fleet, before, func(x sidecartest.Transition) bool {
		return x.ReplicaID == n.r.ID && x.Op == aip.OpHeartbeat && !x.ConnectorReady
	})
	if code, doc := n.r.Ready(t); code != http.StatusServiceUnavailable || doc.Connector.Ready {
		t.Errorf("/ready %d %+v", code, doc.Connector)
	}
	st := n.status(t)
	if st.Healthy || st.Process.Restarts != 1 || st.Process.PID == pid {
		t.Errorf("status %+v %+v", st, st.Process)
	}
	before = len(n.fleet.Transitions(t))
	os.Remove(maint)
	sidecartest.AwaitTransition(t, n.fleet, before, func(x sidecartest.Transition) bool {
		return x.ReplicaID == n.r.ID && x.Op == aip.OpRegister
	})
	n.r.AwaitReady(t)
	if res := n.result(t, action("notes.create", `{"title":"after the crash"}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("after the restart: %+v", res)
	}
	n.p.Signal(t, syscall.SIGTERM)
	if err := n.p.Wait(t); err != nil {
		t.Fatalf("exit: %v", err)
	}
}

// TestNotesSidecarKill9 kills the sidecar with two creates in flight, one
// before its write and one after; the restarted sidecar recovers its
// journal and reconciles both with the service before registering.
func TestNotesSidecarKill9(t *testing.T) {
	n := startNotes(t, sidecartest.ReplicaOptions{})
	childPID := n.status(t).Process.PID
	before := action("notes.create", `{"title":"before the write","delay_ms":60000}`)
	after := action("notes.create", `{"title":"after the write","hold_ms":60000}`)
	answers := []<-chan *sidecartest.Answer{n.actAsync(t, before), n.actAsync(t, after)}
	n.awaitRunning(t, before)
	var written note
	deadline := time.Now().Add(time.Minute)
	for written.ID == "" {
		for _, x := range n.list(t) {
			if x.Title == "after the write" {
				written = x
			}
		}
		if written.ID != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service did not write the note %q of %s within a minute", "after the write", after.ID)
		}
		time.Sleep(10 * time.Millisecond) // polling the service for the write
	}
	n.awaitRunning(t, after)

	n.p.Signal(t, syscall.SIGKILL)
	n.p.Wait(t)
	for _, ch := range answers {
		if ans := <-ch; ans.Err == nil && !ans.OutcomeUnknown {
			t.Errorf("an action in flight when the sidecar was killed answered %+v", ans)
		}
	}
	// The kernel tells the orphaned child (parent-death signal); wait for it
	// to go before the new sidecar starts a new one on the same socket.
	deadline = time.Now().Add(time.Minute)
	for !sidecartest.Exited(childPID) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphaned child (pid %d) did not exit within a minute of the sidecar's SIGKILL", childPID)
		}
		time.Sleep(10 * time.Millisecond) // waiting for a process to exit
	}
	n.fleet.AwaitRestartable(t, n.r)
	n.start(t)

	_, doc := n.r.Ready(t)
	if rec := doc.Runtime.Recovery; rec.Reconciled != 2 || rec.OutcomeUnknown != 0 || len(rec.Errors) != 0 {
		t.Fatalf("recovery %+v", rec)
	}
	for range 2 {
		res := n.result(t, before)
		if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != "notes.not_executed" {
			t.Errorf("the create killed before its write answered %+v", res)
		}
		res = n.result(t, after)
		var out struct {
			Note       note
			Reconciled bool
		}
		json.Unmarshal(res.Output, &out)
		if res.Status != aip.ResultCompleted || out.Note.ID != written.ID || !out.Reconciled {
			t.Errorf("the create killed after its write answered %+v %s", res, res.Output)
		}
	}
	if l := n.list(t); len(l) != 1 {
		t.Errorf("notes after recovery %+v; want only the written one", l)
	}
	n.p.Signal(t, syscall.SIGTERM)
	if err := n.p.Wait(t); err != nil {
		t.Fatalf("exit: %v", err)
	}
}
