package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func TestDevFlagErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--replicas", "0"}, want: "--replicas 0 is outside 1..16"},
		{env: map[string]string{"AIP_DEV_REPLICAS": "17"}, want: "--replicas 17"},
		{args: []string{"--port-base", "80"}, want: "--port-base 80 is outside"},
		// A port base of 0 given is refused, not taken for the default
		// (the missing fleet file stops a dev that took it before any
		// port is bound).
		{args: []string{"--port-base", "0", "--fleet-file", filepath.Join(dir, "missing.yaml")}, want: "--port-base 0 is outside 1024..65508"},
		{args: []string{"--fleet-file", filepath.Join(dir, "missing.yaml")}, env: map[string]string{"AIP_DEV_PORT_BASE": "0"}, want: "--port-base 0 is outside 1024..65508"},
		{args: []string{"--log-format", "xml"}, want: "--log-format"},
		{args: []string{"--log-level", "loud"}, want: "--log-level"},
		{args: []string{"--connector", "chatwoot"}, want: `"chatwoot" is not a built-in connector; choose one of echo`},
		{args: []string{"--state-dir", ""}, want: "--state-dir is empty"},
		{args: []string{"now"}, want: "unexpected argument"},
	} {
		args := append([]string{"dev"}, c.args...)
		if !slices.Contains(c.args, "--state-dir") {
			args = append(args, "--state-dir", dir)
		}
		_, _, err := runCLI(t, c.env, args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("dev %v %v: err = %v, want a usage error containing %q", c.args, c.env, err, c.want)
		}
	}
	// --reset refuses a directory that is not a dev state directory.
	foreign := t.TempDir()
	os.WriteFile(filepath.Join(foreign, "thesis.tex"), []byte("x"), 0o644)
	_, _, err := runCLI(t, nil, "dev", "--state-dir", foreign, "--reset")
	var u *usageError
	if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: --reset: "+foreign+" does not look like an aipfleet dev state directory") {
		t.Fatalf("--reset on a foreign directory: %v, want a usage error", err)
	}
	if _, err := os.Stat(filepath.Join(foreign, "thesis.tex")); err != nil {
		t.Fatalf("--reset removed a foreign file: %v", err)
	}
}

func prepared(t *testing.T, dir string, replicas, portBase int) *devFleet {
	t.Helper()
	f := &devFleet{dir: dir, replicas: replicas, connector: "echo", logLevel: "info"}
	if err := f.prepare(context.Background(), portBase); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestDevStateSurvivesARestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	f := prepared(t, dir, 2, 0)
	if f.state.PortBase != DefaultDevPortBase || len(f.state.ReplicaIDs) != 2 {
		t.Fatalf("state %+v", f.state)
	}
	for _, name := range []string{"control-plane.key", "dispatcher.key", "issuer.key", "replica-1.key", "replica-2.key"} {
		info, err := os.Stat(filepath.Join(dir, "keys", name))
		if err != nil || info.Mode().Perm() != 0o600 {
			t.Fatalf("key %s: %v %v", name, info, err)
		}
	}
	if info, _ := os.Stat(dir); info.Mode().Perm() != 0o700 {
		t.Fatalf("state directory mode %v", info.Mode().Perm())
	}

	// A restart with more replicas keeps every identity and adds one.
	g := prepared(t, dir, 3, 0)
	if g.state.TypeID != f.state.TypeID || g.state.VersionID != f.state.VersionID || g.state.InstanceID != f.state.InstanceID ||
		g.state.ReplicaIDs[1] != f.state.ReplicaIDs[1] || len(g.state.ReplicaIDs) != 3 {
		t.Fatalf("identities changed across a restart:\n%+v\n%+v", f.state, g.state)
	}
	if g.keys.control.DID() != f.keys.control.DID() || g.keys.replicaDIDs[0] != f.keys.replicaDIDs[0] || g.artifact != f.artifact {
		t.Fatal("keys or artifact changed across a restart")
	}
	// Fewer replicas run fewer processes; the others stay provisioned.
	if h := prepared(t, dir, 1, 0); len(h.state.ReplicaIDs) != 3 {
		t.Fatalf("replica IDs after --replicas 1: %v", h.state.ReplicaIDs)
	}

	// Once a fleet ran (its registry was written), another port base would
	// change the replicas' registered endpoints.
	os.WriteFile(filepath.Join(dir, "registry.json"), []byte("{}"), 0o600)
	// A state directory that does not fit the flags is a setting to fix
	// (exit status 2), starting with the command; it exited 1.
	var u *usageError
	err := (&devFleet{dir: dir, replicas: 1, connector: "echo"}).prepare(context.Background(), 9000)
	if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: "+dir+" was created with --port-base 8080") || !strings.Contains(err.Error(), "--reset") {
		t.Fatalf("port base change: %v, want a usage error", err)
	}
	// A changed manifest cannot reuse the admitted version.
	var st devState
	raw, _ := os.ReadFile(filepath.Join(dir, "dev.json"))
	json.Unmarshal(raw, &st)
	st.ManifestDigest = aip.DigestBytes([]byte("another manifest"))
	os.WriteFile(filepath.Join(dir, "dev.json"), mustJSON(st), 0o600)
	err = (&devFleet{dir: dir, replicas: 1, connector: "echo"}).prepare(context.Background(), 0)
	if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: the echo connector's manifest changed") || !strings.Contains(err.Error(), "--reset") {
		t.Fatalf("manifest change: %v, want a usage error", err)
	}
	// Another connector's state, and a dev.json of another build.
	st.Connector = "other"
	os.WriteFile(filepath.Join(dir, "dev.json"), mustJSON(st), 0o600)
	err = (&devFleet{dir: dir, replicas: 1, connector: "echo"}).prepare(context.Background(), 0)
	if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: "+dir+" was created for connector other, not echo; run with --connector other") {
		t.Fatalf("another connector's state: %v, want a usage error", err)
	}
	os.WriteFile(filepath.Join(dir, "dev.json"), []byte(`{"format":"aipfleet.dev/v0"}`), 0o600)
	err = (&devFleet{dir: dir, replicas: 1, connector: "echo"}).prepare(context.Background(), 0)
	if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: "+filepath.Join(dir, "dev.json")+" is not a dev state file of this build") || !strings.Contains(err.Error(), "--reset") {
		t.Fatalf("a dev.json of another build: %v, want a usage error", err)
	}
	// A loose key file is refused by name.
	other := filepath.Join(t.TempDir(), "state")
	prepared(t, other, 1, 0)
	os.Chmod(filepath.Join(other, "keys", "issuer.key"), 0o644)
	err = (&devFleet{dir: other, replicas: 1, connector: "echo"}).prepare(context.Background(), 0)
	if err == nil || !strings.Contains(err.Error(), "issuer.key") {
		t.Fatalf("group-readable key: %v", err)
	}
	// --reset empties a dev state directory, but for the lock file the
	// resetting dev holds.
	if _, _, err := runCLI(t, nil, "dev", "--state-dir", dir, "--reset", "--port-base", "0", "--replicas", "99"); err == nil {
		t.Fatal("bad flags after --reset were accepted")
	}
	// It keeps what is not dev's: a standalone host's journal in its
	// default directory .aipfleet/host-<replica ID>.
	os.WriteFile(devLockPath(dir), nil, 0o600)
	hostJournal := filepath.Join(dir, "host-crepl_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d")
	os.Mkdir(hostJournal, 0o700)
	os.WriteFile(filepath.Join(hostJournal, "journal.db"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(dir, "replica-1.pid"), []byte("1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".registry.json.123.tmp"), nil, 0o600)
	if err := resetStateDir(dir); err != nil {
		t.Fatal(err)
	}
	var left []string
	entries, err := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if err != nil || !slices.Equal(left, []string{devLockFile, filepath.Base(hostJournal)}) {
		t.Fatalf("after reset: %v %v", left, err)
	}
}

func TestDevFleetFileApplies(t *testing.T) {
	f := prepared(t, t.TempDir(), 3, 18000)
	file, err := f.fleet()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.fleetFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(raw, []byte("# The development fleet of aipfleet dev")) {
		t.Fatalf("no header:\n%s", raw)
	}
	// fleet.yaml describes exactly the records dev applies: parsed, it gives
	// them back (JSON schemas compared by their canonical form).
	parsed, err := registry.ParseFleetFile(raw)
	if err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	canonical := cmp.Transformer("canonical", func(m json.RawMessage) string {
		b, err := aip.CanonicalJSON(m)
		if err != nil {
			return "invalid JSON: " + err.Error()
		}
		return string(b)
	})
	if diff := cmp.Diff(file, parsed, canonical); diff != "" {
		t.Fatalf("fleet.yaml parses to other records (-applied +parsed):\n%s\n%s", diff, raw)
	}
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rep, err := registry.Apply(ctx, reg, file)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Count(registry.Created) != 8 { // type, version, instance, 2 bindings, 3 replicas
		t.Fatalf("report %+v", rep)
	}
	v, err := reg.ConnectorVersion(ctx, f.state.VersionID)
	if err != nil {
		t.Fatal(err)
	}
	// The admitted manifest is exactly the one the hosts serve.
	if v.ManifestDigest != f.state.ManifestDigest || v.Attestation.ArtifactDigest != f.artifact {
		t.Fatalf("version digests %s %s, want %s %s", v.ManifestDigest, v.Attestation.ArtifactDigest, f.state.ManifestDigest, f.artifact)
	}
	if got := v.ImplementationSupport["echo.stream"]; !got.Streaming || !got.Cancellation || !got.Reconciliation {
		t.Fatalf("echo.stream claims %+v", got)
	}
	for i, id := range f.state.ReplicaIDs {
		r, err := reg.ConnectorReplica(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Endpoint != "http://127.0.0.1:"+strconv.Itoa(18011+i)+"/aip/v1/messages" || r.PeerDID != f.keys.replicaDIDs[i] || r.Status != aip.ReplicaOffline {
			t.Fatalf("replica %d: %+v", i, r)
		}
	}
	page, err := reg.QueryCapabilities(ctx, registry.CatalogQuery{}, registry.ForTenant(DevTenant))
	if err != nil || page.Total != 2 || page.Capabilities[0].Capability.ID != "echo.say" {
		t.Fatalf("tenant catalog: %d capabilities, %v", page.Total, err)
	}
	// The same file again changes nothing.
	again, err := registry.Apply(ctx, reg, file)
	if err != nil || again.Changed() {
		t.Fatalf("re-apply: %+v, %v", again, err)
	}
}

func TestDevPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if port > 65535-firstReplicaOffset-maxDevReplicas {
		t.Skip("the free port is too high to be a port base")
	}
	dir := filepath.Join(t.TempDir(), "s")
	_, _, err = runCLI(t, nil, "dev", "--state-dir", dir, "--port-base", strconv.Itoa(port))
	if err == nil || !strings.Contains(err.Error(), "port "+strconv.Itoa(port)+" (dispatcher) is in use") || !strings.Contains(err.Error(), "--port-base") {
		t.Fatalf("err = %v", err)
	}
	// Following the advice works: no fleet ran on that state, so another
	// --port-base is taken.
	f := &devFleet{dir: dir, replicas: DefaultDevReplicas, connector: "echo"}
	if err := f.prepare(context.Background(), port+100); err != nil || f.state.PortBase != port+100 {
		t.Fatalf("another --port-base after the failed start: port base %d, err %v", f.state.PortBase, err)
	}
}

func TestDevRegistryPersistsRoutesBeforeReturning(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "registry.json")
	clock := registrytest.NewClock(registrytest.Epoch)
	mem, err := memregistry.New(memregistry.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	store := newSnapshotStore(mem, path, slogFor(&devLog{w: &bytes.Buffer{}}, "dev", 0))
	reg := newDevRegistry(mem, store)
	w, err := registrytest.NewLifecycleWorld(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	rep := registrytest.Replica("crepl_p1", w.Instance.ID, w.Version.ID, clock.Now().Add(time.Hour))
	rep.PeerPrincipalID, rep.PeerPrincipalKind = w.Version.Manifest.Agent.ID, w.Version.Manifest.Agent.Kind
	if err := reg.PutReplica(ctx, rep); err != nil {
		t.Fatal(err)
	}
	storeCtx, stop := context.WithCancel(ctx)
	done := goTask(func() error { return store.run(storeCtx) })

	a, err := reg.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), CapabilityID: "alpha.read", TenantID: "tenant-1"})
	if err != nil {
		t.Fatal(err)
	}
	// The route is on disk now: a registry restored from the file has it.
	back := func() *memregistry.Registry {
		t.Helper()
		r, err := memregistry.New(memregistry.Config{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := newSnapshotStore(r, path, nil).load(); !ok || err != nil {
			t.Fatalf("load: %v %v", ok, err)
		}
		return r
	}
	got, err := back().Assignment(ctx, a.ActionID)
	if err != nil || !got.Equal(&a) {
		t.Fatalf("restored route %+v, %v; want %+v", got, err, a)
	}
	// A settlement is written at the latest when the store stops.
	if err := reg.Settle(ctx, a, registry.SettlementCompleted); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := done.wait("store"); err != nil {
		t.Fatal(err)
	}
	res, err := back().Reservation(ctx, a.ActionID)
	if err != nil || res.Reserved || res.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("restored reservation %+v, %v", res, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("the directory holds %d entries (temporary files left?)", len(entries))
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot mode %v", info.Mode().Perm())
	}
	// A corrupt snapshot is refused with what to do.
	os.WriteFile(path, []byte(`{"format":"x"}`), 0o600)
	r, _ := memregistry.New(memregistry.Config{})
	if _, err := newSnapshotStore(r, path, nil).load(); err == nil || !strings.Contains(err.Error(), "--reset") {
		t.Fatalf("corrupt snapshot: %v", err)
	}
}

func TestDevLog(t *testing.T) {
	var b bytes.Buffer
	l := &devLog{w: &b}
	l.relay("replica-2", []byte(`{"time":"2030-01-01T10:00:00.5Z","level":"INFO","msg":"draining","component":"aipfleet-connector-host","replica_id":"crepl_x","in_flight":0,"note":"two words"}`+"\n"))
	l.relay("replica-2", []byte(`{"time":"2030-01-01T10:00:00.5Z","level":"INFO","msg":"bootstrap step","step":3}`))
	l.relay("replica-2", []byte("panic: not JSON"))
	slogFor(l, "control", 0).Warn("lease maintenance failed", "retry_in", "2s", "did", "did:key:z")
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	if !strings.Contains(lines[0], "replica-2  INFO  draining in_flight=0 note=\"two words\"") || strings.Contains(lines[0], "crepl_x") {
		t.Errorf("line 1: %s", lines[0])
	}
	if !strings.Contains(lines[1], "replica-2") || !strings.Contains(lines[1], "panic: not JSON") {
		t.Errorf("line 2: %s", lines[1])
	}
	if !strings.Contains(lines[2], "control    WARN  lease maintenance failed retry_in=2s") || strings.Contains(lines[2], "did:key") {
		t.Errorf("line 3: %s", lines[2])
	}

	// JSON form: each source's object with "process" added.
	b.Reset()
	l = &devLog{w: &b, json: true}
	l.relay("replica-1", []byte(`{"msg":"serving","addr":"127.0.0.1:8091"}`))
	l.relay("replica-1", []byte("plain text"))
	slogFor(l, "dev", 0).Info("started")
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["process"] == nil || m["msg"] == nil {
			t.Errorf("JSON line %q: %v", line, err)
		}
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := writeFileAtomic(path, 0o600, writeBytes([]byte("one\n"))); err != nil {
		t.Fatal(err)
	}
	// A writer that fails leaves the old file, and no temporary file.
	boom := errors.New("boom")
	err := writeFileAtomic(path, 0o600, func(w io.Writer) error {
		w.Write([]byte("half"))
		return boom
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), path) {
		t.Fatalf("failing writer: err = %v, want boom naming %s", err, path)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "one\n" {
		t.Fatalf("after a failed write: %q, %v; want the old content", got, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only state.json: %v", len(entries), entries)
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", info.Mode().Perm())
	}
}

func TestDevImplementationClaims(t *testing.T) {
	// A built-in connector whose contract promises approval, credentials,
	// compensation and transactions claims them all, so dev can admit it.
	c := registrytest.Capability("x.rich", "every promise")
	c.Contract.Execution.SupportsStreaming, c.Contract.Execution.SupportsRetry = true, true
	c.Contract.Approval = json.RawMessage(`{"mode":"human"}`)
	c.Contract.Credentials = &aip.CredentialsContract{Required: true}
	c.Contract.Compensation = &aip.CompensationContract{Mode: aip.CompensationSupported}
	c.Contract.Transaction = &aip.TransactionContract{SupportedModes: []aip.TransactionMode{aip.TxExecute, aip.TxCommit}}
	plain := registrytest.Capability("x.plain", "no contract")
	plain.Contract = nil
	for _, reconciles := range []bool{false, true} {
		m := registrytest.Manifest("service:x", []aip.Capability{c, plain})
		v := registrytest.Version("cver_x", "ctype_x", "1", "o", registry.VersionActive, m)
		for _, k := range m.Capabilities {
			got := implementationClaims(&k, reconciles)
			want := registry.RequiredSupport(&k)
			want.Reconciliation = reconciles
			if got != want {
				t.Errorf("%s (reconciler %v): claims %+v, want %+v", k.ID, reconciles, got, want)
			}
			v.ImplementationSupport[k.ID] = got
		}
		if _, err := registry.PrepareVersion(v, registry.Limits{}); err != nil {
			t.Errorf("reconciler %v: the registry refuses dev's claims: %v", reconciles, err)
		}
	}
	if got := implementationClaims(&c, false); !got.Approval || !got.Credentials || !got.Compensation || !got.Transaction || !got.Streaming || !got.Retry || !got.Cancellation || !got.Invocation {
		t.Errorf("x.rich claims %+v", got)
	}
}

// TestDevBannerCommandsRunAsPrinted: the commands the ready banner prints
// work when pasted into a shell, even with a state directory whose path
// has a space in it.
func TestDevBannerCommandsRunAsPrinted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my fleet", "state")
	f := prepared(t, dir, 2, 0)
	procs := []*replicaProcess{{name: "replica-1", pidFile: f.path("replica-1.pid")}, {name: "replica-2", pidFile: f.path("replica-2.pid")}}
	os.WriteFile(f.path("replica-2.pid"), []byte("4242\n"), 0o644)
	var b bytes.Buffer
	f.banner(&b, procs, "tok", time.Now())
	checked := 0
	for _, line := range strings.Split(b.String(), "\n") {
		line, _, _ = strings.Cut(strings.TrimSpace(line), "   #")
		var script string
		switch {
		case strings.HasPrefix(line, "kill -TERM "):
			// The pid the replica's file holds.
			script = "printf '%s\\n' " + strings.TrimPrefix(line, "kill -TERM ")
		case strings.Contains(line, " action send "), strings.Contains(line, " capability list "):
			// One argument per line.
			_, args, _ := strings.Cut(line, " action send ")
			if strings.Contains(line, " capability list ") {
				_, args, _ = strings.Cut(line, " capability list ")
			}
			script = "printf '%s\\n' " + args
		default:
			continue
		}
		out, err := exec.Command("sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		if !slices.Contains(strings.Split(string(out), "\n"), "4242") && !slices.Contains(strings.Split(string(out), "\n"), dir) {
			t.Errorf("the banner's %q does not run as printed: the shell gave\n%s", line, out)
		}
		checked++
	}
	if checked != 3 {
		t.Fatalf("found %d of the banner's commands in:\n%s", checked, b.String())
	}
}
