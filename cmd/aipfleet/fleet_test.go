package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// fleetServer serves the fleet views of a control plane over a registry
// holding six replicas: crepl_r1 ready with one active assignment and an
// open circuit, crepl_r2 draining, crepl_r3 offline after an unhealthy
// heartbeat, crepl_r4
// ready with an expired lease, crepl_r5 retired (offline for two days),
// crepl_r6 pre-provisioned and never registered. The views need an operator token of issuer "ops", whose
// key is in the file it returns.
func fleetServer(t *testing.T) (url, opsKeyFile string) {
	t.Helper()
	ctx := context.Background()
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := registrytest.NewLifecycleWorld(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	pol := registry.ConservativePolicy("quota:strict")
	pol.CircuitFailureThreshold = 1
	noErr(t, reg.PutAdmissionPolicy(ctx, pol))
	b := w.Binding
	b.PolicyRevision, b.QuotaPolicyRef = 2, pol.PolicyRef
	noErr(t, reg.PutBinding(ctx, b))
	now := time.Now()
	for _, r := range []struct {
		id     string
		status aip.ReplicaStatus
		lease  time.Time
		health uint64
	}{
		{"crepl_r1", aip.ReplicaReady, now.Add(time.Hour), 1},
		{"crepl_r2", aip.ReplicaDraining, now.Add(time.Hour), 1},
		{"crepl_r3", aip.ReplicaOffline, now.Add(-time.Hour), 1},
		{"crepl_r4", aip.ReplicaReady, now.Add(-time.Minute), 1},
		{"crepl_r5", aip.ReplicaOffline, now.Add(-48 * time.Hour), 7},
		{"crepl_r6", aip.ReplicaOffline, time.Time{}, 0},
	} {
		rep := registrytest.Replica(r.id, w.Instance.ID, w.Version.ID, r.lease)
		rep.Status, rep.HealthRevision = r.status, r.health
		rep.PeerPrincipalID, rep.PeerPrincipalKind = w.Version.Manifest.Agent.ID, w.Version.Manifest.Agent.Kind
		noErr(t, reg.PutReplica(ctx, rep))
	}
	// crepl_r3 registers again and reports its connector failing.
	r3, err := reg.ConnectorReplica(ctx, "crepl_r3")
	noErr(t, err)
	for _, c := range []aip.ControlCommand{
		aip.RegisterCommand(w.Registration(&r3)),
		aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: r3.ID, PreviousSequence: 2, ConnectorReady: false}),
	} {
		res, err := reg.ApplyLifecycle(ctx, []registry.LifecycleCommand{registrytest.LifecycleCommand(time.Now(), c)})
		noErr(t, err)
		noErr(t, res[0].Err)
	}
	var routes []registry.RouteAssignment
	for range 2 {
		a, err := reg.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), CapabilityID: "alpha.read", TenantID: "tenant-1"})
		noErr(t, err)
		routes = append(routes, a)
	}
	noErr(t, reg.Settle(ctx, routes[0], registry.SettlementOutcomeUnknown))
	ops, err := aip.GenerateSigningKey()
	noErr(t, err)
	opsKeyFile = filepath.Join(t.TempDir(), "ops.key")
	noErr(t, os.WriteFile(opsKeyFile, []byte(hex.EncodeToString(ops.Seed())), 0o600))
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Operator: true, Issuers: []tenanttoken.Issuer{{Name: "ops", DIDs: []string{ops.DID()}}}})
	noErr(t, err)
	svc, err := controlplane.New(registrytest.Key("control"), reg, controlplane.Config{DisableMaintenance: true, OperatorAuth: operatorAuth(verifier)})
	noErr(t, err)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return srv.URL, opsKeyFile
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestFleetStatus(t *testing.T) {
	url, keyFile := fleetServer(t)
	out, _, err := runCLI(t, map[string]string{"AIP_FLEET_CONTROL_URL": url, "AIP_FLEET_ISSUER_KEY": keyFile, "AIP_FLEET_ISSUER": "ops"}, "fleet", "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^REPLICA\s+INSTANCE\s+STATE\s+LEASE\s+ACTIVE/CAP\s+CIRCUIT$`),
		regexp.MustCompile(`(?m)^crepl_r1\s+cinst_a\s+ready\s+(59m|1h0m)[0-9.]+s\s+1/4\s+open until \d\d:\d\d:\d\d \(1 unknown\)$`),
		regexp.MustCompile(`(?m)^crepl_r2\s+cinst_a\s+draining\s+(59m|1h0m)[0-9.]+s\s+0/4\s+closed$`),
		regexp.MustCompile(`(?m)^crepl_r3\s+cinst_a\s+offline \(unhealthy\)\s+-\s+0/4\s+closed$`),
		regexp.MustCompile(`(?m)^crepl_r4\s+cinst_a\s+expired\s+expired\s+0/4\s+closed$`),
		regexp.MustCompile(`(?m)^crepl_r6\s+cinst_a\s+offline\s+-\s+0/4\s+closed$`),
		regexp.MustCompile(`(?m)^\(1 retired replica not listed, offline for more than 24h; --all lists them\)$`),
		regexp.MustCompile(`(?m)^3 live replicas: 1 ready, 1 draining, 1 with an expired lease; ready capacity 4, 1 active assignment; 3 offline: 1 never registered, 1 offline within 24h, 1 retired$`),
		regexp.MustCompile(`(?m)^catalog revision \d+$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("output does not match %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "crepl_r5") {
		t.Errorf("the retired replica is listed without --all:\n%s", out)
	}
	all, _, err := runCLI(t, nil, "fleet", "status", "--control-url", url, "--all", "--issuer-key", keyFile, "--issuer", "ops")
	if err != nil || !regexp.MustCompile(`(?m)^crepl_r5\s+cinst_a\s+offline\s+-\s+0/4\s+closed$`).MatchString(all) || strings.Contains(all, "not listed") {
		t.Errorf("--all: %v\n%s", err, all)
	}
	token, _, err := runCLI(t, nil, "token", "--issuer-key", keyFile, "--issuer", "ops", "--operator")
	noErr(t, err)
	wide, _, err := runCLI(t, nil, "fleet", "status", "--control-url", url+"/", "--wide", "--token", strings.TrimSpace(token))
	if err != nil {
		t.Fatalf("--wide: %v\n%s", err, wide)
	}
	// The version column tells the replicas of an old release from a new
	// one's during an upgrade; the last one says when an offline replica
	// went offline.
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^REPLICA\s+INSTANCE\s+STATE\s+LEASE\s+ACTIVE/CAP\s+CIRCUIT\s+VERSION\s+ENDPOINT\s+REGION/ZONE/CLASS\s+HEALTH REV\s+OFFLINE SINCE$`),
		regexp.MustCompile(`(?m)^crepl_r2\s+cinst_a\s+draining\s+(59m|1h0m)[0-9.]+s\s+0/4\s+closed\s+cver_alpha1\s+https://crepl_r2\.replicas\.test:8443\s+global/default/standard\s+1\s+-$`),
		regexp.MustCompile(`(?m)^crepl_r3\s+cinst_a\s+offline \(unhealthy\)\s+-\s+0/4\s+closed\s+cver_alpha1\s+https://crepl_r3\.replicas\.test:8443\s+global/default/standard\s+3\s+[A-Z][a-z]{2} \d{1,2} \d\d:\d\d:\d\d$`),
		regexp.MustCompile(`(?m)^crepl_r6\s+cinst_a\s+offline\s+-\s+0/4\s+closed\s+cver_alpha1\s+\S+\s+global/default/standard\s+0\s+-$`),
	} {
		if !want.MatchString(wide) {
			t.Errorf("--wide output does not match %s:\n%s", want, wide)
		}
	}

	raw, _, err := runCLI(t, nil, "fleet", "status", "--control-url", url, "--json", "--issuer-key", keyFile, "--issuer", "ops")
	if err != nil {
		t.Fatal(err)
	}
	var v fleetView
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	if len(v.Replicas) != 5 || v.Status.Replicas != 6 || v.Status.LiveReplicas != 3 || v.Status.RetiredReplicas != 1 ||
		!v.Replicas[0].Circuit.Open || v.Replicas[3].LeaseValid || v.Replicas[4].ID != "crepl_r6" {
		t.Fatalf("JSON %+v", v)
	}
	if r3 := v.Replicas[2]; r3.OfflineReason != registry.OfflineUnhealthy || r3.OfflineAt == nil || time.Since(r3.OfflineAt.Time) > time.Hour ||
		v.Replicas[4].OfflineReason != "" || v.Replicas[4].OfflineAt != nil || !strings.Contains(raw, `"offline_reason": "unhealthy"`) {
		t.Fatalf("JSON offline reasons: crepl_r3 %+v, crepl_r6 %+v\n%s", r3, v.Replicas[4], raw)
	}
}

func TestFleetStatusWatch(t *testing.T) {
	url, keyFile := fleetServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"fleet", "status", "--watch", "--interval", "100ms", "--control-url", url, "--issuer-key", keyFile, "--issuer", "ops"}, func(string) string { return "" }, &out, &out)
	}()
	deadline := time.Now().Add(time.Minute)
	for strings.Count(out.String(), "\x1b[H\x1b[2J") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("three redraws did not come:\n%q", out.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the command's output
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("--watch ended with %v after Ctrl-C", err)
	}
	if n := strings.Count(out.String(), "3 live replicas: 1 ready"); n < 3 {
		t.Fatalf("%d tables in three redraws", n)
	}
}

// TestFleetStatusNeedsAnOperatorToken: without a token, or with one the
// control plane does not take, fleet status fails with the control plane's
// reason and what to give it.
func TestFleetStatusNeedsAnOperatorToken(t *testing.T) {
	url, keyFile := fleetServer(t)
	_, _, err := runCLI(t, nil, "fleet", "status", "--control-url", url, "--dev-state-dir", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "HTTP 401") || !strings.Contains(err.Error(), "missing Authorization header") || !strings.Contains(err.Error(), "--token") {
		t.Errorf("without a token: %v", err)
	}
	// The control plane's own answer (what curl shows) names the operator
	// token, not the dispatcher's tenant token.
	resp, err := http.Get(url + "/aip/v1/fleet/status")
	noErr(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "aipfleet token --operator") {
		t.Errorf("without a token, the control plane answered %d %s", resp.StatusCode, body)
	}
	tenant, _, err := runCLI(t, nil, "token", "--issuer-key", keyFile, "--issuer", "ops", "--tenant", "acme", "--audience", tenanttoken.OperatorAudience)
	noErr(t, err)
	_, _, err = runCLI(t, nil, "fleet", "status", "--control-url", url, "--token", strings.TrimSpace(tenant))
	if err == nil || !strings.Contains(err.Error(), "not an operator token") || !strings.Contains(err.Error(), "--operator-issuer") {
		t.Errorf("with a tenant token: %v", err)
	}
	other, err := aip.GenerateSigningKey()
	noErr(t, err)
	otherFile := filepath.Join(t.TempDir(), "other.key")
	noErr(t, os.WriteFile(otherFile, []byte(hex.EncodeToString(other.Seed())), 0o600))
	_, _, err = runCLI(t, nil, "fleet", "status", "--control-url", url, "--issuer-key", otherFile, "--issuer", "ops")
	if err == nil || !strings.Contains(err.Error(), "not signed by a trusted issuer key") {
		t.Errorf("with an untrusted issuer key: %v", err)
	}
	// aipfleet dev's issuer key, found in the state directory, is not one
	// this control plane trusts: the error says so.
	devDir := t.TempDir()
	noErr(t, os.MkdirAll(filepath.Join(devDir, "keys"), 0o700))
	noErr(t, os.WriteFile(filepath.Join(devDir, "keys", "issuer.key"), []byte(hex.EncodeToString(other.Seed())), 0o600))
	_, _, err = runCLI(t, nil, "fleet", "status", "--control-url", url, "--dev-state-dir", devDir)
	if err == nil || !strings.Contains(err.Error(), "minted with aipfleet dev's issuer key") || !strings.Contains(err.Error(), "--token") {
		t.Errorf("with dev's issuer key: %v", err)
	}
	if _, _, err = runCLI(t, nil, "fleet", "status", "--control-url", url, "--issuer-key", keyFile, "--token", "x"); err == nil || !strings.Contains(err.Error(), "either --token or --issuer-key") {
		t.Errorf("--token and --issuer-key: %v", err)
	}
}

func TestFleetStatusErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	_, _, err = runCLI(t, nil, "fleet", "status", "--control-url", closed)
	if err == nil || !strings.Contains(err.Error(), "no control plane answers at "+closed) || !strings.Contains(err.Error(), "aipfleet dev") {
		t.Fatalf("no control plane: %v", err)
	}
	// A control plane that accepts the connection and never answers (a
	// stopped or hung process: the kernel still completes the handshake)
	// is named as such once --timeout has passed, not as a Go client error.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	hungURL := "http://" + hung.Addr().String()
	_, _, err = runCLI(t, nil, "fleet", "status", "--control-url", hungURL, "--timeout", "200ms")
	if err == nil || !strings.Contains(err.Error(), "the control plane at "+hungURL+" did not answer within 200ms (--timeout)") || !strings.Contains(err.Error(), "/ready") {
		t.Fatalf("hung control plane: %v", err)
	}
	// A bad CA file is reported under the flag the user gave.
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = runCLI(t, nil, "fleet", "status", "--control-url", closed, "--ca-file", notPEM)
	if err == nil || !strings.Contains(err.Error(), "--ca-file "+notPEM+" holds no PEM certificate") {
		t.Fatalf("bad --ca-file: %v", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fleet"}, "name a subcommand: status"},
		{[]string{"fleet", "--json"}, "name a subcommand: status"},
		{[]string{"fleet", "list"}, `unknown subcommand "list"`},
		{[]string{"fleet", "list", "--help"}, `unknown subcommand "list"`},
		{[]string{"fleet", "status", "--control-url", "ftp://x"}, "not an http(s) URL"},
		{[]string{"fleet", "status", "--interval", "1ms"}, "--interval 1ms"},
		// An --interval without --watch would be ignored.
		{[]string{"fleet", "status", "--interval", "5s"}, "fleet status: --interval is for --watch"},
		{[]string{"events", "list", "--interval", "5s"}, "events list: --interval is for --follow"},
		{[]string{"fleet", "status", "extra"}, "unexpected argument"},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}

// A --url or --control-url copied with an API path is refused with the
// base URL to give instead, not sent to …/aip/v1/actions/aip/v1/actions.
func TestClientURLWithAnAPIPathNamesTheBaseURL(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"action", "send", "--url", "http://127.0.0.1:8080/aip/v1/actions", "--capability", "echo.say", "--input", "{}"},
			`--url "http://127.0.0.1:8080/aip/v1/actions" names an API path; give the server's base URL only: http://127.0.0.1:8080`},
		{[]string{"events", "list", "--url", "https://gw.example.test/fleet/aip/v1/events?after=3"},
			`give the server's base URL only: https://gw.example.test/fleet`},
		{[]string{"fleet", "status", "--control-url", "http://127.0.0.1:8090/aip/v1/fleet/status"},
			`--control-url "http://127.0.0.1:8090/aip/v1/fleet/status" names an API path; give the server's base URL only: http://127.0.0.1:8090`},
		// The API's paths are appended to the URL: a query would precede them.
		{[]string{"fleet", "status", "--control-url", "http://127.0.0.1:8090/?x=1"},
			`--control-url "http://127.0.0.1:8090/?x=1" has a query or a fragment; give the server's base URL only: http://127.0.0.1:8090`},
		{[]string{"action", "get", "act_0192a8f0c1d27e3f8a4b5c6d7e8f9003", "--url", "http://127.0.0.1:8080#top"},
			`--url "http://127.0.0.1:8080#top" has a query or a fragment; give the server's base URL only: http://127.0.0.1:8080`},
	} {
		_, _, err := runCLI(t, nil, tc.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}
	// A path prefix before the API (a reverse proxy) is a base URL.
	if got, err := baseURL("--url", "https://gw.example.test/fleet/", DefaultDispatchURL); err != nil || got != "https://gw.example.test/fleet" {
		t.Errorf("baseURL with a prefix = %q, %v", got, err)
	}
}

// TestCountsArePluralisedProperly: one replica is "1 replica", not "1
// replicas", in fleet status, registry status, dev's banner and dev's
// stop line.
func TestCountsArePluralisedProperly(t *testing.T) {
	var b bytes.Buffer
	printFleet(&b, &fleetView{Status: registry.FleetStatusSummary{Replicas: 1, LiveReplicas: 1, ReadyReplicas: 1, ActiveAssignments: 1}}, time.Now(), false, 1)
	if !strings.Contains(b.String(), "\n1 live replica: 1 ready") || !strings.Contains(b.String(), ", 1 active assignment;") ||
		!strings.Contains(b.String(), "(1 retired replica not listed") {
		t.Errorf("fleet status with one replica and one assignment:\n%s", b.String())
	}
	b.Reset()
	printRegistryStatus(&b, registryStatusDoc{Fleet: registry.FleetStatusSummary{Replicas: 1, ActiveAssignments: 1}})
	if !strings.Contains(b.String(), "1 active assignment\n") {
		t.Errorf("registry status with one assignment:\n%s", b.String())
	}
	b.Reset()
	f := prepared(t, filepath.Join(t.TempDir(), "state"), 1, 0)
	f.banner(&b, []*replicaProcess{{name: "replica-1", pidFile: f.path("replica-1.pid")}}, "tok", time.Now())
	if !strings.Contains(b.String(), "ready: 1 echo replica serving") {
		t.Errorf("banner with one replica:\n%s", b.String())
	}
	for _, c := range []struct{ got, want string }{
		{plural(0, "replica"), "0 replicas"}, {plural(1, "replica"), "1 replica"}, {plural(uint64(2), "replica"), "2 replicas"},
		{countIs(1, "replica"), "the replica is"}, {countIs(2, "replica"), "both replicas are"}, {countIs(3, "replica"), "all 3 replicas are"},
		{times(1), "once"}, {times(2), "twice"}, {times(3), "3 times"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// A control plane whose certificate the client does not trust is named
// with --ca-file, the flag that fixes it; with the CA given, it is read.
func TestFleetStatusOfAnHTTPSControlPlane(t *testing.T) {
	plain, keyFile := fleetServer(t)
	url, caFile := tlsFront(t, plain)
	env := map[string]string{"AIP_FLEET_CONTROL_URL": url, "AIP_FLEET_ISSUER_KEY": keyFile, "AIP_FLEET_ISSUER": "ops"}
	_, _, err := runCLI(t, env, "fleet", "status")
	if err == nil || !strings.Contains(err.Error(), "the control plane at "+url+" presented a certificate this client does not trust") ||
		!strings.Contains(err.Error(), "give that CA with --ca-file") {
		t.Fatalf("untrusted certificate: %v", err)
	}
	if out, _, err := runCLI(t, env, "fleet", "status", "--ca-file", caFile); err != nil || !strings.Contains(out, "crepl_r1") {
		t.Fatalf("--ca-file: %q, %v", out, err)
	}
}

// TestRetiredByTheControlPlanesClock: which replicas the table leaves out
// as retired is judged at the summary's time, the control plane's, so it
// agrees with the summary's count when this machine's clock is off.
func TestRetiredByTheControlPlanesClock(t *testing.T) {
	cp := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	v := &fleetView{Status: registry.FleetStatusSummary{ObservedAt: cp, RetiredReplicas: 1}, Replicas: []controlplane.FleetReplica{
		{ID: "crepl_old", Status: aip.ReplicaOffline, HealthRevision: 3, LeaseExpiresAt: aip.At(cp.Add(-25 * time.Hour))},
		{ID: "crepl_recent", Status: aip.ReplicaOffline, HealthRevision: 3, LeaseExpiresAt: aip.At(cp.Add(-23 * time.Hour))},
	}}
	// This machine's clock runs two hours ahead of the control plane's.
	if n := dropRetired(v, cp.Add(2*time.Hour)); n != 1 || len(v.Replicas) != 1 || v.Replicas[0].ID != "crepl_recent" {
		t.Fatalf("dropped %d, left %+v; want crepl_old dropped, as the summary counts it", n, v.Replicas)
	}
}

// A --control-url or --url that names the wrong server (here answering 404
// as the other service does) gets a hint naming the flag, in fleet status
// and in events list as in action.
func TestFleetAndEventsAgainstTheWrongServerSayWhichFlag(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":{"code":"not_found","message":"no such route: ` + r.URL.Path + `"}}`))
	}))
	defer other.Close()
	dir := t.TempDir()
	_, _, err := runCLI(t, nil, "fleet", "status", "--control-url", other.URL, "--token", "t", "--dev-state-dir", dir)
	if err == nil || !strings.Contains(err.Error(), other.URL+" does not serve the control plane's fleet views: is --control-url the control plane?") {
		t.Errorf("fleet status: err = %v, want the --control-url hint", err)
	}
	_, _, err = runCLI(t, nil, "events", "list", "--url", other.URL, "--token", "t", "--dev-state-dir", dir)
	if err == nil || !strings.Contains(err.Error(), other.URL+" does not serve the dispatcher's API: is --url the dispatcher?") {
		t.Errorf("events list: err = %v, want the --url hint", err)
	}
}
