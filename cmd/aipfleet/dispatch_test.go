package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

func TestDispatchFlagErrors(t *testing.T) {
	k, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "gw.key")
	if err := aip.WriteSeedFile(keyFile, k); err != nil {
		t.Fatal(err)
	}
	db := writeSecret(t, t.TempDir(), "db.url", "postgres://127.0.0.1:1/none")
	iss := "dev=" + k.DID()
	base := []string{"dispatch", "--database-url-file", db, "--signing-key-file", keyFile, "--issuer", iss}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"dispatch", "--signing-key-file", keyFile, "--issuer", iss}, "--database-url-file is required"},
		{[]string{"dispatch", "--database-url-file", db, "--issuer", iss}, "--signing-key-file is required"},
		{[]string{"dispatch", "--database-url-file", db, "--signing-key-file", keyFile}, "--issuer NAME=DID is required"},
		{[]string{"dispatch", "--database-url-file", db, "--signing-key-file", keyFile, "--issuer", iss + ",nonsense"}, "is not NAME=DID"},
		{[]string{"dispatch", "--database-url-file", db, "--signing-key-file", keyFile, "--issuer", iss + ",dev=did:key:zbad"}, "issuer dev"},
		{append(base, "--allow-insecure-loopback-http", "--bind", "0.0.0.0:8080"), "TLS is required"},
		{base, "--allow-insecure-loopback-http"},
		{append(base, "--allow-insecure-loopback-http", "--max-reroutes", "9"), "--max-reroutes"},
		{append(base, "--allow-insecure-loopback-http", "--action-timeout", "10m"), "--max-timeout"},
		// Not "--action-timeout 30s must be positive and at most
		// --max-timeout 0s", about a flag not given.
		{append(base, "--allow-insecure-loopback-http", "--max-timeout", "0s"), "dispatch: --max-timeout 0s must be positive"},
		// An empty audience was taken for the default.
		{append(base, "--allow-insecure-loopback-http", "--audience", ""), "dispatch: --audience is empty"},
		// A port out of range is refused before the database is opened.
		{append(base, "--allow-insecure-loopback-http", "--bind", "127.0.0.1:99999"), `dispatch: --bind 127.0.0.1:99999: "99999" is not a port: give 0 to 65535`},
		{append(base, "--allow-insecure-loopback-http", "--max-in-flight", "-1"), "--max-in-flight -1 must be at least 1"},
		// Zero was the library's default (1024, 30s, ...), silently.
		{append(base, "--allow-insecure-loopback-http", "--max-in-flight", "0"), "--max-in-flight 0 must be at least 1"},
		{append(base, "--allow-insecure-loopback-http", "--max-in-flight-per-tenant", "0"), "--max-in-flight-per-tenant 0"},
		{append(base, "--allow-insecure-loopback-http", "--max-queue-bytes", "0"), "--max-queue-bytes 0"},
		{append(base, "--allow-insecure-loopback-http", "--max-action-read-bytes", "1000"), "--max-action-read-bytes 1000 must be at least --max-body-bytes"},
		{append(base, "--allow-insecure-loopback-http", "--max-queue-age", "0s"), "--max-queue-age 0s must be positive"},
		{append(base, "--allow-insecure-loopback-http", "--max-queued", "-1"), "--max-queued -1 must be 0 (no queue) or more"},
		{append(base, "--allow-insecure-loopback-http", "--max-queued-per-tenant", "-2"), "--max-queued-per-tenant -2"},
		{append(base, "--allow-insecure-loopback-http", "--tls-cert-file", "x.pem"), "go together"},
		{append(base, "--allow-insecure-loopback-http", "extra"), "unexpected argument"},
		// The routing preference's errors name the flag, not its
		// topology.* field.
		{append(base, "--allow-insecure-loopback-http", "--region", "eu west"), `dispatch: --region "eu west" must be 1 to 128 letters`},
		{append(base, "--allow-insecure-loopback-http", "--zone", "a/b"), `dispatch: --zone "a/b" must be`},
		{append(base, "--allow-insecure-loopback-http", "--capacity-class", "x y"), `dispatch: --capacity-class "x y" must be`},
		{append(base, "--allow-insecure-loopback-http", "--forbid-cross-region"), "dispatch: --forbid-cross-region needs --region"},
	}
	for _, c := range cases {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", c.args[1:], err, c.want)
		}
	}
	// Flags come from AIP_DISPATCH_* variables too; a database that cannot
	// be reached is a plain error naming the data pool.
	env := map[string]string{"AIP_DISPATCH_DATABASE_URL_FILE": db, "AIP_DISPATCH_SIGNING_KEY_FILE": keyFile,
		"AIP_DISPATCH_ISSUER": iss, "AIP_DISPATCH_ALLOW_INSECURE_LOOPBACK_HTTP": "true", "AIP_DISPATCH_ACQUIRE_TIMEOUT": "200ms"}
	_, _, err := runCLI(t, env, "dispatch", "--bind", "127.0.0.1:0")
	var u *usageError
	if err == nil || errors.As(err, &u) || !strings.Contains(err.Error(), "data pool") {
		t.Fatalf("unreachable database: err = %v", err)
	}
	// A group-readable database URL file is refused.
	loose := filepath.Join(t.TempDir(), "loose.url")
	os.WriteFile(loose, []byte("postgres://x"), 0o644)
	if _, _, err := runCLI(t, nil, "dispatch", "--database-url-file", loose, "--signing-key-file", keyFile, "--issuer", iss, "--allow-insecure-loopback-http"); err == nil || !strings.Contains(err.Error(), "--database-url-file") {
		t.Fatalf("loose URL file: err = %v", err)
	}
}

// TestDispatchReadyDetail: the dispatcher's --ready-detail (shared with
// the control plane, whose test is TestControlPlaneReadyDetail) reaches
// dispatch.Config.HideLocalReadyDetail: local (loopback peers without a
// forwarding header) when left out, none hides the detail of /ready from
// every peer, from the flag or AIP_DISPATCH_READY_DETAIL, and any other
// value is refused naming the two. No test checked that the dispatcher
// passed it on.
func TestDispatchReadyDetail(t *testing.T) {
	k, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "gw.key")
	if err := aip.WriteSeedFile(keyFile, k); err != nil {
		t.Fatal(err)
	}
	db := writeSecret(t, t.TempDir(), "db.url", "postgres://127.0.0.1:1/none")
	for _, c := range []struct {
		args    []string
		env     string // AIP_DISPATCH_READY_DETAIL
		want    bool
		wantErr string
	}{
		{args: nil, want: false},
		{args: []string{"--ready-detail", "local"}, want: false},
		{args: []string{"--ready-detail", "none"}, want: true},
		{env: "none", want: true},
		{args: []string{"--ready-detail", "local"}, env: "none", want: false},
		{args: []string{"--ready-detail", "loopback"}, wantErr: `dispatch: --ready-detail "loopback" is neither local nor none`},
	} {
		e := &env{getenv: func(k string) string {
			if k == "AIP_DISPATCH_READY_DETAIL" {
				return c.env
			}
			return ""
		}, stdout: io.Discard, stderr: io.Discard}
		f, err := parseDispatchFlags(dispatchCommand(), e, append([]string{"--database-url-file", db, "--signing-key-file", keyFile,
			"--issuer", "dev=" + k.DID(), "--allow-insecure-loopback-http"}, c.args...))
		if c.wantErr != "" {
			var u *usageError
			if !errors.As(err, &u) || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%v: error %v, want a usage error %q", c.args, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := f.serviceConfig().HideLocalReadyDetail; got != c.want {
			t.Errorf("%v env %q: HideLocalReadyDetail %v, want %v", c.args, c.env, got, c.want)
		}
	}
}

// TestDispatchQueueFlagsZeroQueuesNothing: --max-queued 0 and
// --max-queued-per-tenant 0 mean no queue (an action beyond the in-flight
// bounds is refused at once). They were passed on as 0, which the library
// takes as its defaults, 4096 and 512.
func TestDispatchQueueFlagsZeroQueuesNothing(t *testing.T) {
	k, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "gw.key")
	if err := aip.WriteSeedFile(keyFile, k); err != nil {
		t.Fatal(err)
	}
	db := writeSecret(t, t.TempDir(), "db.url", "postgres://127.0.0.1:1/none")
	for _, flag := range []string{"--max-queued", "--max-queued-per-tenant"} {
		e := &env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard}
		f, err := parseDispatchFlags(dispatchCommand(), e, []string{"--database-url-file", db, "--signing-key-file", keyFile,
			"--issuer", "dev=" + k.DID(), "--allow-insecure-loopback-http", "--max-in-flight", "1", flag, "0"})
		if err != nil {
			t.Fatal(err)
		}
		s, err := dispatch.NewScheduler(f.admission, nil)
		if err != nil {
			t.Fatal(err)
		}
		hold, err := s.Acquire(t.Context(), "acme", 1)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel() // a queued Acquire returns ctx's error; a refused one its own
		if _, err := s.Acquire(ctx, "acme", 1); !errors.Is(err, dispatch.ErrQueueFull) && !errors.Is(err, dispatch.ErrTenantQueueFull) {
			t.Errorf("%s 0: an action beyond --max-in-flight: %v, want a queue-full refusal", flag, err)
		}
		hold.Release()
	}
}

func TestParseIssuers(t *testing.T) {
	a, _ := aip.GenerateSigningKey()
	b, _ := aip.GenerateSigningKey()
	got, err := parseIssuers(" idp=" + a.DID() + ", other=" + b.DID() + ",idp=" + b.DID() + ",")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "idp" || len(got[0].DIDs) != 2 || got[1].Name != "other" {
		t.Fatalf("issuers = %+v", got)
	}
	if _, err := parseIssuers(" , "); err == nil {
		t.Fatal("an empty list was accepted")
	}
}

// fakeDispatcher answers the client's requests as the dispatcher would and
// records them.
func fakeDispatcher(t *testing.T, verify *tenanttoken.Verifier) (*httptest.Server, *[]*http.Request, *[][]byte) {
	t.Helper()
	var reqs []*http.Request
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		reqs, bodies = append(reqs, r), append(bodies, body)
		tok, _ := tenanttoken.FromAuthorization(r.Header.Get("Authorization"))
		claims, err := verify.Verify(tok)
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(dispatch.ErrorResponse{Error: aip.NewProtocolError(dispatch.CodeUnauthorized, aip.CategoryAuth, false, 0, err.Error())})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == dispatch.PathActions:
			var req dispatch.ActionRequest
			json.Unmarshal(body, &req)
			id := req.ActionID
			if id == "" {
				id = aip.NewActionID()
			}
			if req.CapabilityID == "fail.me" {
				w.WriteHeader(http.StatusBadGateway)
				json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: id, Settlement: "outcome_unknown",
					Error: aip.NewProtocolError(dispatch.CodeOutcomeUnknown, aip.CategoryTransport, true, 0, "lost")})
				return
			}
			json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: id, Settlement: "completed",
				Route:  &dispatch.RouteFacts{ReplicaID: "crepl_x", FenceToken: "route_y"},
				Result: &aip.ActionResult{ActionID: id, Status: aip.ResultCompleted, Output: json.RawMessage(`{"tenant":"` + claims.TenantID + `"}`)}})
		case r.Method == http.MethodGet:
			handedOut := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
			json.NewEncoder(w).Encode(dispatch.ActionStatusResponse{ActionID: strings.TrimPrefix(r.URL.Path, dispatch.PathActions+"/"),
				Route:       &dispatch.RouteFacts{ReplicaID: "crepl_x"},
				Reservation: dispatch.ReservationFacts{Reserved: true, HandedOutAt: &handedOut},
				Replica: dispatch.ReplicaFacts{Reachable: false,
					Error: aip.NewProtocolError(dispatch.CodeReplicaUnreachable, aip.CategoryTransport, true, 0, "down")}})
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &reqs, &bodies
}

func TestActionClient(t *testing.T) {
	issuerKey, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "issuer.key")
	if err := aip.WriteSeedFile(keyFile, issuerKey); err != nil {
		t.Fatal(err)
	}
	v, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "aipfleet-dev", DIDs: []string{issuerKey.DID()}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv, reqs, bodies := fakeDispatcher(t, v)
	env := map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_ISSUER_KEY": keyFile}

	// --tenant mints a token with the local issuer key.
	out, _, err := runCLI(t, env, "action", "send", "--tenant", "acme", "--capability", "echo.say", "--input", `{"message":"hi"}`)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "completed on replica crepl_x") || !strings.Contains(out, `"tenant":"acme"`) {
		t.Fatalf("summary:\n%s", out)
	}
	var sent dispatch.ActionRequest
	json.Unmarshal((*bodies)[0], &sent)
	if sent.CapabilityID != "echo.say" || string(sent.Input) != `{"message":"hi"}` || aip.ValidateID(aip.PrefixAction, sent.ActionID) != nil ||
		!strings.Contains(out, "action "+sent.ActionID+" completed") {
		t.Fatalf("sent %+v", sent)
	}
	// --json prints the dispatcher's answer; --action-id is sent.
	id := aip.NewActionID()
	out, _, err = runCLI(t, env, "action", "send", "--tenant", "acme", "--capability", "echo.say", "--input", `{}`, "--action-id", id, "--json", "--timeout-ms", "250")
	if err != nil {
		t.Fatal(err)
	}
	var ar dispatch.ActionResponse
	if err := json.Unmarshal([]byte(out), &ar); err != nil || ar.ActionID != id {
		t.Fatalf("--json printed %s", out)
	}
	json.Unmarshal((*bodies)[1], &sent)
	if sent.TimeoutMS == nil || *sent.TimeoutMS != 250 {
		t.Fatalf("timeout not sent: %+v", sent)
	}
	// A failed action exits with an error naming its code.
	out, _, err = runCLI(t, env, "action", "send", "--tenant", "acme", "--capability", "fail.me", "--input", `{}`)
	if err == nil || !strings.Contains(err.Error(), dispatch.CodeOutcomeUnknown) || !strings.Contains(out, "not completed") {
		t.Fatalf("failed action: %v\n%s", err, out)
	}
	// get says when the replica could not be asked, and since when the
	// route holds capacity.
	out, _, err = runCLI(t, env, "action", "get", id, "--tenant", "acme")
	if err == nil || !strings.Contains(out, "unreachable") || !strings.Contains(out, "nothing is assumed") ||
		!strings.Contains(out, "capacity: reserved since 2030-01-02T03:04:05Z") {
		t.Fatalf("get: %v\n%s", err, out)
	}
	// A bad token is the dispatcher's 401.
	if _, _, err := runCLI(t, map[string]string{"AIP_CLIENT_URL": srv.URL}, "action", "get", id, "--token", "nope"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("bad token: %v", err)
	}
	if len(*reqs) != 5 {
		t.Fatalf("%d requests", len(*reqs))
	}
	// A send or cancel refused before it became an action is the
	// dispatcher's HTTP error, not an action without an ID.
	for _, args := range [][]string{
		{"action", "send", "--token", "nope", "--capability", "echo.say", "--input", "{}"},
		{"action", "cancel", id, "--token", "nope"},
	} {
		out, _, err := runCLI(t, map[string]string{"AIP_CLIENT_URL": srv.URL}, args...)
		if err == nil || !strings.Contains(err.Error(), "HTTP 401: "+dispatch.CodeUnauthorized) || strings.Contains(out, "action  ") {
			t.Errorf("%v with a bad token: err = %v, output:\n%s", args[:2], err, out)
		}
	}
	// Usage errors.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"action"}, "name a subcommand"},
		{[]string{"action", "frob"}, "unknown subcommand"},
		// The subcommand is checked first: its --help would be no help
		// (it printed the command's and exited 0).
		{[]string{"action", "frob", "--help"}, `unknown subcommand "frob"`},
		{[]string{"action", "send", "--capability", "c", "--input", "{}"}, "a token is needed"},
		{[]string{"action", "send", "--tenant", "t", "--capability", "c", "--input", "{}"}, "--issuer-key"},
		{[]string{"action", "send", "--token", "x", "--tenant", "t", "--capability", "c", "--input", "{}"}, "not both"},
		{[]string{"action", "send", "--token", "x", "--input", "{}"}, "--capability is required"},
		{[]string{"action", "send", "--token", "x", "--capability", "c", "--input", "{nope"}, "not valid JSON"},
		{[]string{"action", "send", "--token", "x", "--capability", "c", "--input", "{}", "--mode", "async"}, "--mode"},
		{[]string{"action", "get", "--token", "x", "act_1"}, "act_1"},
		{[]string{"action", "get", "--token", "x"}, "exactly one action ID"},
		{[]string{"action", "get", "--url", "ftp://x", "--token", "x", id}, `--url "ftp://x" is not an http(s) URL such as http://127.0.0.1:8080`},
		{[]string{"action", "get", "--url", "httpx://x", "--token", "x", id}, `--url "httpx://x" is not an http(s) URL`},
		{[]string{"action", "get", "--url", "http://", "--token", "x", id}, `--url "http://" is not an http(s) URL`},
	} {
		_, _, err := runCLI(t, map[string]string{"AIP_CLIENT_URL": srv.URL}, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}

// TestDispatchClockSkewZeroToleratesNone: --clock-skew 0s (allowed, "0s to
// 5m") tolerates no skew; it was the verifier's 30s default, so a token
// expired 10s ago passed.
func TestDispatchClockSkewZeroToleratesNone(t *testing.T) {
	k, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "gw.key")
	if err := aip.WriteSeedFile(keyFile, k); err != nil {
		t.Fatal(err)
	}
	db := writeSecret(t, t.TempDir(), "db.url", "postgres://127.0.0.1:1/none")
	now := time.Now()
	expired, err := tenanttoken.Mint(k, tenanttoken.Claims{Issuer: "dev", Audience: tenanttoken.DefaultAudience, TenantID: "acme",
		IssuedAt: now.Add(-time.Hour), Expiry: now.Add(-10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		skew string
		ok   bool
	}{{"0s", false}, {"1m", true}} {
		e := &env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard}
		f, err := parseDispatchFlags(dispatchCommand(), e, []string{"--database-url-file", db, "--signing-key-file", keyFile,
			"--issuer", "dev=" + k.DID(), "--allow-insecure-loopback-http", "--clock-skew", c.skew})
		if err != nil {
			t.Fatal(err)
		}
		v, err := f.tokenVerifier()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(expired); (err == nil) != c.ok {
			t.Errorf("--clock-skew %s: a token expired 10s ago: err = %v", c.skew, err)
		}
	}
}

// TestActionOutputEscapesControlCharacters: an action's output and error
// text come from a connector and its provider (a customer's message, a
// provider's error) and must not send terminal escape sequences or forge
// lines of the summary, as in events list.
func TestActionOutputEscapesControlCharacters(t *testing.T) {
	const evilText = "evil\x1b]0;pwned\x07\nforged"
	evilOutput := json.RawMessage("{\"t\":\"a\u009b2J\u202eb\"}")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		id := aip.NewActionID()
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cancel"):
			json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: id, Settlement: "failed",
				Error: aip.NewProtocolError("connector.failed", aip.CategoryConnector, false, 0, evilText)})
		case r.Method == http.MethodPost:
			json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: id, Settlement: "completed",
				Route: &dispatch.RouteFacts{ReplicaID: "crepl_x", FenceToken: "route_y"},
				Result: &aip.ActionResult{ActionID: id, Status: aip.ResultFailed, Output: evilOutput,
					Error: aip.NewProtocolError("provider.error", aip.CategoryConnector, false, 0, evilText)}})
		default:
			json.NewEncoder(w).Encode(dispatch.ActionStatusResponse{ActionID: id, Route: &dispatch.RouteFacts{ReplicaID: "crepl_x"},
				Replica: dispatch.ReplicaFacts{Reachable: true, State: "completed",
					Result: &aip.ActionResult{ActionID: id, Status: aip.ResultCompleted, Output: evilOutput}}})
		}
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_TOKEN": "t"}
	id := aip.NewActionID()
	for _, args := range [][]string{
		{"action", "send", "--capability", "c", "--input", "{}"},
		{"action", "get", id},
		{"action", "cancel", id},
	} {
		out, _, err := runCLI(t, env, args...)
		text := out
		if err != nil {
			text += err.Error()
		}
		if strings.ContainsAny(text, "\x1b\x07\u009b\u202e") || strings.Contains(text, "\nforged") {
			t.Errorf("%v passes control characters through:\n%q", args, text)
		}
	}
}

// TestActionCancelExitStatus: action cancel succeeds once the action is
// cancelled, and fails when it completed or failed before the cancel
// reached it: a script's `aipfleet action cancel ID && ...` must not take
// a completed action for a cancelled one (it did, and a successful cancel
// exited 1).
func TestActionCancelExitStatus(t *testing.T) {
	id := aip.NewActionID()
	for _, c := range []struct {
		status  aip.ResultStatus
		wantErr string // "" for success
	}{
		{aip.ResultCancelled, ""},
		{aip.ResultCompleted, "action " + id + " was not cancelled: its result is completed"},
		{aip.ResultFailed, "action " + id + " was not cancelled: its result is failed"},
	} {
		t.Run(string(c.status), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != dispatch.PathActions+"/"+id+"/cancel" {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: id,
					Route:  &dispatch.RouteFacts{ReplicaID: "crepl_x", FenceToken: "route_y"},
					Result: &aip.ActionResult{ActionID: id, Status: c.status}})
			}))
			t.Cleanup(srv.Close)
			out, _, err := runCLI(t, map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_TOKEN": "t"}, "action", "cancel", id)
			if !strings.Contains(out, "action "+id+" "+string(c.status)+" on replica crepl_x") {
				t.Errorf("summary %q does not say the action is %s", out, c.status)
			}
			// A cancel that came after the action finished settled
			// nothing: the summary said "settlement none"; it says what
			// happened.
			if c.status != aip.ResultCancelled {
				want := "action " + id + " " + string(c.status) + " on replica crepl_x (fence route_y) before the cancel reached it: nothing was cancelled\n"
				if !strings.HasPrefix(out, want) || strings.Contains(out, "settlement") {
					t.Errorf("summary %q, want it to start %q and not name a settlement", out, want)
				}
			}
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("cancel of a %s action: %v, want success", c.status, err)
			case c.wantErr != "" && (err == nil || err.Error() != c.wantErr):
				t.Fatalf("cancel of a %s action: %v, want %q", c.status, err, c.wantErr)
			}
		})
	}
}

// TestActionInputFromStdinTooLarge: an input on stdin over the limit is
// reported as too large, not as invalid JSON (it was cut at the limit).
func TestActionInputFromStdinTooLarge(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(big, []byte(`{"message":"`+strings.Repeat("x", dispatch.DefaultMaxBodyBytes)+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(big)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stdin := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = stdin }()
	_, _, err = runCLI(t, nil, "action", "send", "--url", "http://127.0.0.1:1", "--token", "t", "--capability", "echo.say", "--input-file", "-")
	if err == nil || !strings.Contains(err.Error(), "more than the 4194304 bytes allowed") {
		t.Fatalf("err = %v, want the input called too large", err)
	}
}

// TestActionGetFromSomethingElse: a server that answers 200 with JSON that
// is not an action status (--url pointing elsewhere) is an error, not a
// crash.
func TestActionGetFromSomethingElse(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"ok"}`))
	}))
	t.Cleanup(srv.Close)
	_, _, err := runCLI(t, nil, "action", "get", aip.NewActionID(), "--url", srv.URL, "--token", "t")
	if err == nil || !strings.Contains(err.Error(), "not an action status") {
		t.Fatalf("err = %v", err)
	}
}

// TestExpiredDevTokenSaysToRestartDev: dev's token lasts a day; a client
// using it afterwards is told to restart dev, not handed a bare 401.
func TestExpiredDevTokenSaysToRestartDev(t *testing.T) {
	dir := t.TempDir()
	k, _ := aip.GenerateSigningKey()
	now := time.Now()
	for _, c := range []struct {
		expiry time.Time
		want   string
	}{{now.Add(-time.Minute), "restart aipfleet dev"}, {now.Add(time.Hour), "connection refused"}} {
		tok, err := tenanttoken.Mint(k, tenanttoken.Claims{Issuer: "aipfleet-dev", Audience: tenanttoken.DefaultAudience, TenantID: DevTenant,
			IssuedAt: now.Add(-25 * time.Hour), Expiry: c.expiry})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, devTokenFile), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err = runCLI(t, map[string]string{"AIP_CLIENT_URL": "http://127.0.0.1:1"}, "action", "get", "--dev-state-dir", dir, aip.NewActionID())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("token expiring %s: %v; want %q", c.expiry, err, c.want)
		}
	}
}

// TestActionSendWhoseAnswerIsLostNamesTheAction: without --action-id the
// dispatcher chose the ID, so a send whose answer was lost (a broken
// connection, Ctrl-C) left the user unable to ask about the action or
// retry it safely; a retry without the ID could run it twice. The client
// chooses the ID and names it in the error. A dispatcher that is not
// there is said so, with what to do, and no action is named.
func TestActionSendWhoseAnswerIsLostNamesTheAction(t *testing.T) {
	var bodies = make(chan []byte, 4)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		bodies <- body
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(broken.Close)
	sentID := func() string {
		var req dispatch.ActionRequest
		json.Unmarshal(<-bodies, &req)
		return req.ActionID
	}
	_, _, err := runCLI(t, nil, "action", "send", "--url", broken.URL, "--token", "t", "--capability", "echo.say", "--input", "{}")
	id := sentID()
	if aip.ValidateID(aip.PrefixAction, id) != nil || err == nil ||
		!strings.Contains(err.Error(), "action "+id+" may or may not have run") || !strings.Contains(err.Error(), "aipfleet action get "+id) ||
		!strings.Contains(err.Error(), "--action-id "+id) {
		t.Fatalf("broken connection: sent ID %q, err = %v", id, err)
	}

	// Ctrl-C while the dispatcher works on it.
	waiting := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		bodies <- body
		close(waiting)
		<-r.Context().Done()
	}))
	t.Cleanup(slow.Close)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-waiting; cancel() }()
	var out, errOut bytes.Buffer
	err = run(ctx, []string{"action", "send", "--url", slow.URL, "--token", "t", "--capability", "echo.say", "--input", "{}",
		"--action-id", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"}, func(string) string { return "" }, &out, &errOut)
	if id := sentID(); id != "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d" || err == nil || !strings.Contains(err.Error(), "stopped waiting") ||
		!strings.Contains(err.Error(), "action "+id+" may or may not have run") {
		t.Fatalf("interrupted: err = %v", err)
	}

	// Nothing listens: the action was never sent.
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	_, _, err = runCLI(t, nil, "action", "send", "--url", closed.URL, "--token", "t", "--capability", "echo.say", "--input", "{}")
	if err == nil || !strings.Contains(err.Error(), "no dispatcher answers at "+closed.URL) || !strings.Contains(err.Error(), "--url") ||
		strings.Contains(err.Error(), "may or may not") || strings.Count(err.Error(), closed.URL) != 1 {
		t.Fatalf("no dispatcher: err = %v", err)
	}
	// A malformed --action-id is refused before anything is sent.
	var u *usageError
	if _, _, err := runCLI(t, nil, "action", "send", "--url", closed.URL, "--token", "t", "--capability", "echo.say", "--input", "{}", "--action-id", "42"); !errors.As(err, &u) {
		t.Fatalf("--action-id 42: err = %v, want a usage error", err)
	}
}

// An --input that is not JSON says why and where before anything is sent.
func TestActionSendInvalidInputSaysWhere(t *testing.T) {
	_, _, err := runCLI(t, nil, "action", "send", "--token", "t", "--capability", "echo.say", "--input", `{"message":hello}`)
	var u *usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "the input from --input is not valid JSON: invalid character 'h' looking for beginning of value, at byte 12 (a shell may have eaten quotes") {
		t.Fatalf("err = %v", err)
	}
}

// A --url that names another server (here one answering 404 the way the
// control plane does) gets a hint that --url is not the dispatcher; a
// dispatcher's own 404 (no such action) does not.
func TestActionAgainstAServerThatIsNotTheDispatcher(t *testing.T) {
	notDispatcher := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":{"code":"not_found","message":"no such route: ` + r.URL.Path + `"}}`))
	}))
	defer notDispatcher.Close()
	const hint = "does not serve the dispatcher's API: is --url the dispatcher?"
	_, _, err := runCLI(t, nil, "action", "send", "--url", notDispatcher.URL, "--token", "t", "--capability", "echo.say", "--input", "{}")
	if err == nil || !strings.Contains(err.Error(), hint) {
		t.Errorf("send: err = %v, want the hint", err)
	}
	_, _, err = runCLI(t, nil, "action", "get", "--url", notDispatcher.URL, "--token", "t", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d")
	if err == nil || !strings.Contains(err.Error(), hint) {
		t.Errorf("get: err = %v, want the hint", err)
	}
	dispatcher := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":{"code":"dispatch.not_found","message":"no such action"}}`))
	}))
	defer dispatcher.Close()
	_, _, err = runCLI(t, nil, "action", "get", "--url", dispatcher.URL, "--token", "t", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d")
	if err == nil || strings.Contains(err.Error(), hint) || !strings.Contains(err.Error(), "no such action") {
		t.Errorf("get of an unknown action: err = %v, want the dispatcher's answer without the hint", err)
	}
}

// TestActionMultiLineErrorsAreIndented: a multi-line error message from a
// replica or the dispatcher prints as lines, each after the first
// indented (not as \u000a), while every other control character stays
// escaped.
func TestActionMultiLineErrorsAreIndented(t *testing.T) {
	const msg = "first line\nsecond line\r\nthird \x1b[31mred\n"
	const want = "first line\n    second line\n    third \\u001b[31mred"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		id := aip.NewActionID()
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cancel"):
			w.WriteHeader(http.StatusConflict)
			json.NewEncoder(w).Encode(dispatch.ErrorResponse{Error: aip.NewProtocolError("dispatch.conflict", aip.CategoryPermanent, false, 0, msg)})
		case r.Method == http.MethodPost:
			json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: id, Settlement: "completed",
				Route:  &dispatch.RouteFacts{ReplicaID: "crepl_x", FenceToken: "route_y"},
				Result: &aip.ActionResult{ActionID: id, Status: aip.ResultFailed, Error: aip.NewProtocolError("provider.error", aip.CategoryConnector, false, 0, msg)}})
		default:
			json.NewEncoder(w).Encode(dispatch.ActionStatusResponse{ActionID: id, Route: &dispatch.RouteFacts{ReplicaID: "crepl_x"},
				Replica: dispatch.ReplicaFacts{Reachable: false, Error: aip.NewProtocolError("replica.down", aip.CategoryConnector, true, 0, msg)}})
		}
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_TOKEN": "t"}
	id := aip.NewActionID()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"action", "send", "--capability", "c", "--input", "{}"}, "error: provider.error: " + want + "\n"},
		{[]string{"action", "get", id}, "replica: unreachable (replica.down: " + want + ")"},
		{[]string{"action", "cancel", id}, "HTTP 409: dispatch.conflict: " + want},
	} {
		out, _, err := runCLI(t, env, c.args...)
		text := out
		if err != nil {
			text += err.Error()
		}
		if !strings.Contains(text, c.want) {
			t.Errorf("%v printed\n%s\nwant it to contain\n%s", c.args, text, c.want)
		}
	}
}

// tlsFront serves backend over HTTPS with httptest's certificate, and
// returns its URL and a file holding that certificate (the CA a client
// needs).
func tlsFront(t *testing.T, backend string) (url, caFile string) {
	t.Helper()
	target, err := neturl.Parse(backend)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(target))
	t.Cleanup(srv.Close)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return srv.URL, caFile
}

// An https dispatcher whose certificate a private CA signed (the operator
// guide's aipfleet dispatch --tls-cert-file) is reached with --ca-file, by
// action and events alike; without it the certificate is refused.
func TestDispatcherClientsTrustTheCAFile(t *testing.T) {
	issuerKey, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "issuer.key")
	if err := aip.WriteSeedFile(keyFile, issuerKey); err != nil {
		t.Fatal(err)
	}
	v, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "aipfleet-dev", DIDs: []string{issuerKey.DID()}}}})
	if err != nil {
		t.Fatal(err)
	}
	plain, _, _ := fakeDispatcher(t, v)
	actions, actionsCA := tlsFront(t, plain.URL)
	env := map[string]string{"AIP_CLIENT_URL": actions, "AIP_CLIENT_ISSUER_KEY": keyFile}
	send := []string{"action", "send", "--tenant", "acme", "--capability", "echo.say", "--input", `{}`}

	// Without it the certificate is refused before anything is sent: the
	// error says so and names --ca-file, not "may or may not have run".
	_, _, err = runCLI(t, env, send...)
	if err == nil || !strings.Contains(err.Error(), "the dispatcher at "+actions+" presented a certificate this client does not trust, so nothing was sent") ||
		!strings.Contains(err.Error(), "--ca-file") || strings.Contains(err.Error(), "may or may not have run") {
		t.Fatalf("without --ca-file: %v", err)
	}
	out, _, err := runCLI(t, env, append(send, "--ca-file", actionsCA)...)
	if err != nil || !strings.Contains(out, "completed on replica crepl_x") {
		t.Fatalf("action send --ca-file: %q, %v", out, err)
	}
	env["AIP_CLIENT_CA_FILE"] = actionsCA
	// The fake's replica cannot be asked: get prints the route and exits 1.
	if out, _, err = runCLI(t, env, "action", "get", aip.NewActionID(), "--tenant", "acme"); err == nil || !strings.Contains(err.Error(), "could not be asked") || !strings.Contains(out, "crepl_x") {
		t.Fatalf("action get with $AIP_CLIENT_CA_FILE: %q, %v", out, err)
	}

	eventsURL, reg := eventsDispatcher(t, issuerKey)
	ids := appendEvents(t, reg, "acme", "a")
	events, eventsCA := tlsFront(t, eventsURL)
	env = map[string]string{"AIP_CLIENT_URL": events, "AIP_CLIENT_ISSUER_KEY": keyFile}
	// --follow ends at once: asking again would not make it trusted.
	if _, _, err := runCLI(t, env, "events", "list", "--tenant", "acme", "--follow"); err == nil || !strings.Contains(err.Error(), "give that CA with --ca-file") {
		t.Fatalf("events without --ca-file: %v", err)
	}
	if out, _, err = runCLI(t, env, "events", "list", "--tenant", "acme", "--ca-file", eventsCA); err != nil || !strings.Contains(out, ids[0]) {
		t.Fatalf("events list --ca-file: %q, %v", out, err)
	}

	notPEM := writeSecret(t, t.TempDir(), "not.pem", "hello")
	if _, _, err := runCLI(t, env, "events", "list", "--tenant", "acme", "--ca-file", notPEM); err == nil || !strings.Contains(err.Error(), "--ca-file "+notPEM+" holds no PEM certificate") {
		t.Fatalf("bad --ca-file: %v", err)
	}
}

// TestActionGetShowsAFailedResultsError: action get printed a failed
// result as "result:  failed " and nothing more, while action send prints
// the error's code and message; the replica's journaled error is what says
// why the action failed (a reconciled not_executed, a provider refusal).
func TestActionGetShowsAFailedResultsError(t *testing.T) {
	id := aip.NewActionID()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != dispatch.PathActions+"/"+id {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(dispatch.ActionStatusResponse{ActionID: id, CapabilityID: "notes.create",
			Route:       &dispatch.RouteFacts{ReplicaID: "crepl_x", InstanceID: "cinst_notes_b", VersionID: "cver_notes_2", FenceToken: "route_y"},
			Reservation: dispatch.ReservationFacts{LastSettlement: "completed"},
			Replica: dispatch.ReplicaFacts{Reachable: true, State: aip.StateFailed,
				Result: &aip.ActionResult{ActionID: id, Status: aip.ResultFailed,
					Error: aip.NewProtocolError("notes.not_executed", aip.CategoryPermanent, false, 0, "the notes service stopped before this action's write")}}})
	}))
	t.Cleanup(srv.Close)
	out, _, err := runCLI(t, nil, "action", "get", id, "--url", srv.URL, "--token", "t")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "result:  failed") || !strings.Contains(out, "error:   notes.not_executed: the notes service stopped before this action's write") ||
		!strings.Contains(out, "route:   replica crepl_x (instance cinst_notes_b, version cver_notes_2), fence route_y") {
		t.Fatalf("get:\n%s", out)
	}
}

// An answer to a send that is not the dispatcher's JSON: a 404 (another
// server at --url) gets the hint that --url is not the dispatcher, also
// with an empty body; any other (a proxy's 504 page after its own timeout)
// cannot tell whether the action ran, so the error names the action and
// how to learn its outcome.
func TestActionSendAnsweredByAnotherServer(t *testing.T) {
	const id = "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"
	for _, tc := range []struct {
		status      int
		body        string
		want        []string
		maybeRan    bool
		notWantText string
	}{
		{http.StatusNotFound, "", []string{"HTTP 404 Not Found, with an empty body", "is --url the dispatcher?"}, false, "from the dispatcher: \n"},
		{http.StatusGatewayTimeout, "<html><body>504 Gateway Time-out</body></html>", []string{"HTTP 504: <html>"}, true, ""},
		{http.StatusOK, "<html>welcome</html>", []string{"HTTP 200: <html>welcome</html>"}, true, ""},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(tc.status)
			w.Write([]byte(tc.body))
		}))
		_, _, err := runCLI(t, nil, "action", "send", "--url", srv.URL, "--token", "t", "--action-id", id, "--capability", "echo.say", "--input", "{}")
		srv.Close()
		if err == nil {
			t.Errorf("HTTP %d: no error", tc.status)
			continue
		}
		msg := err.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("HTTP %d: err = %q, want it to contain %q", tc.status, msg, w)
			}
		}
		if ran := strings.Contains(msg, "action "+id+" may or may not have run") && strings.Contains(msg, "aipfleet action get "+id); ran != tc.maybeRan {
			t.Errorf("HTTP %d: err = %q; names the action and how to ask about it: %t, want %t", tc.status, msg, ran, tc.maybeRan)
		}
		if tc.notWantText != "" && strings.Contains(msg+"\n", tc.notWantText) {
			t.Errorf("HTTP %d: err = %q contains %q", tc.status, msg, tc.notWantText)
		}
	}
}

// A streaming send whose stream carries a line that is not JSON was
// admitted and may have run: the error names the action and how to learn
// its outcome, and the line's control characters are escaped.
func TestActionStreamWithALineThatIsNotJSONNamesTheAction(t *testing.T) {
	const id = "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", dispatch.ContentTypeNDJSON)
		w.Write([]byte("garbage \x1b[31m\n"))
	}))
	defer srv.Close()
	_, _, err := runCLI(t, nil, "action", "send", "--url", srv.URL, "--token", "t", "--action-id", id, "--mode", "streaming", "--capability", "echo.stream", "--input", "{}")
	if err == nil || !strings.Contains(err.Error(), "a line that is not JSON: garbage \\u001b[31m") ||
		!strings.Contains(err.Error(), "action "+id+" may or may not have run") {
		t.Fatalf("err = %v", err)
	}
}

// A flag of another action subcommand is refused, not ignored: an --input
// given to get, a --reason to send; so is a --request-timeout that is not
// positive. A variable (AIP_CLIENT_MODE) is a
// shared setting and does not trouble get.
func TestActionFlagOfAnotherSubcommandIsRefused(t *testing.T) {
	const id = "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(dispatch.ActionStatusResponse{ActionID: id, Route: &dispatch.RouteFacts{ReplicaID: "crepl_x"},
			Replica: dispatch.ReplicaFacts{Reachable: true, State: "completed"}})
	}))
	defer srv.Close()
	common := []string{"--url", srv.URL, "--token", "t"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"action", "get", id, "--input", `{"message":"x"}`}, "action get: --input is for action send"},
		{[]string{"action", "cancel", id, "--capability", "echo.say"}, "action cancel: --capability is for action send"},
		{[]string{"action", "get", id, "--timeout-ms", "5"}, "action get: --timeout-ms is for action send"},
		{[]string{"action", "send", "--capability", "echo.say", "--input", "{}", "--reason", "oops"}, "action send: --reason is for action cancel"},
		// Nor is a request given no time sent (and reported as one that
		// may have run).
		{[]string{"action", "send", "--capability", "echo.say", "--input", "{}", "--request-timeout", "0s"}, "action send: --request-timeout must be positive"},
		{[]string{"action", "get", id, "--request-timeout", "-1s"}, "action get: --request-timeout must be positive"},
	} {
		_, _, err := runCLI(t, nil, append(tc.args, common...)...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}
	if calls != 0 {
		t.Errorf("%d requests were sent for refused command lines", calls)
	}
	if _, _, err := runCLI(t, map[string]string{"AIP_CLIENT_MODE": "streaming", "AIP_CLIENT_TIMEOUT_MS": "5"}, append([]string{"action", "get", id}, common...)...); err != nil {
		t.Errorf("get with AIP_CLIENT_MODE and AIP_CLIENT_TIMEOUT_MS set: %v", err)
	}
}

// An input that is empty, or not JSON, from a file or standard input is
// called that, naming where it came from, without the hint about the
// shell's quotes that only an --input on the command line needs.
func TestActionInputFromAFileOrStdinThatIsNotJSON(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		content string
		stdin   bool
		want    string
	}{
		{"", true, "the input from standard input (--input-file -) is empty"},
		{" \n", true, "the input from standard input (--input-file -) is empty"},
		{`{"message":"x"} {"a":1}`, true, "the input from standard input (--input-file -) is not valid JSON: invalid character '{' after top-level value, at byte 17"},
		{`{"message":}`, false, "input.json is not valid JSON: invalid character '}' looking for beginning of value, at byte 12"},
	} {
		file := filepath.Join(dir, "input.json")
		if err := os.WriteFile(file, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		arg := file
		if tc.stdin {
			f, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			stdin := os.Stdin
			os.Stdin = f
			defer func() { os.Stdin = stdin; f.Close() }()
			arg = "-"
		}
		_, _, err := runCLI(t, nil, "action", "send", "--url", "http://127.0.0.1:1", "--token", "t", "--capability", "echo.say", "--input-file", arg)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "shell") {
			t.Errorf("%q (stdin %t): err = %v, want a usage error containing %q and no word of the shell", tc.content, tc.stdin, err, tc.want)
		}
	}
}

// TestRefusedSendSaysNothingRan: a send the replica refused (an input
// that breaks the input schema) is answered with settlement cancelled,
// which only released its capacity reservation; the summary said
// "settlement cancelled", as if the action had been cancelled. It now
// says the action was refused and nothing ran; --json passes the answer on
// unchanged.
func TestRefusedSendSaysNothingRan(t *testing.T) {
	id := aip.NewActionID()
	for _, c := range []struct {
		name   string
		answer dispatch.ActionResponse
		want   string
	}{
		{"replica", dispatch.ActionResponse{ActionID: id, Settlement: registry.SettlementCancelled,
			Route: &dispatch.RouteFacts{ReplicaID: "crepl_x", FenceToken: "route_y"},
			Error: aip.NewProtocolError("connector_host.input_invalid", aip.CategoryPermanent, false, 0, "/message: required")},
			"action " + id + " refused on replica crepl_x (fence route_y): nothing ran for this request\nerror: connector_host.input_invalid: /message: required\n"},
		{"dispatcher", dispatch.ActionResponse{ActionID: id,
			Error: aip.NewProtocolError("dispatch.action_invalid", aip.CategoryPermanent, false, 0, "bad timeout_ms")},
			"action " + id + " refused before routing: nothing ran\nerror: dispatch.action_invalid: bad timeout_ms\n"},
	} {
		raw, err := json.Marshal(c.answer)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			w.Write(raw)
		}))
		env := map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_TOKEN": "t"}
		out, _, err := runCLI(t, env, "action", "send", "--capability", "c", "--input", "{}", "--action-id", id)
		if out != c.want || err == nil || strings.Contains(out, "settlement") {
			t.Errorf("%s refusal: out = %q, err = %v; want %q", c.name, out, err, c.want)
		}
		out, _, _ = runCLI(t, env, "action", "send", "--capability", "c", "--input", "{}", "--action-id", id, "--json")
		if out != string(raw) {
			t.Errorf("%s refusal --json: got %q, want the answer unchanged %q", c.name, out, raw)
		}
		srv.Close()
	}
}

// TestActionGetUnreachableSaysWhatToDo: an action get whose pinned replica
// could not be asked (it crashed, mid-action) printed only "replica:
// unreachable (...); its journal was not read, nothing is assumed", which
// left the one reading it at night to guess whether to resend the action
// under a new ID. It now says that the action stays pinned, how to see
// when the replica is back, and what to run then.
func TestActionGetUnreachableSaysWhatToDo(t *testing.T) {
	id := aip.NewActionID()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(dispatch.ActionStatusResponse{ActionID: id, CapabilityID: "echo.say",
			Route: &dispatch.RouteFacts{ReplicaID: "crepl_down", FenceToken: "route_y"},
			Replica: dispatch.ReplicaFacts{Reachable: false,
				Error: aip.NewProtocolError(dispatch.CodeReplicaUnreachable, aip.CategoryTransport, true, 0, "replica crepl_down did not answer the status query verifiably: connect: connection refused")}})
	}))
	t.Cleanup(srv.Close)
	out, _, err := runCLI(t, map[string]string{"AIP_CLIENT_TOKEN": "t"}, "action", "get", id, "--url", srv.URL)
	if err == nil {
		t.Fatalf("get of an action whose replica could not be asked: err = nil, want exit status 1\n%s", out)
	}
	for _, want := range []string{
		"replica: unreachable (dispatch.replica_unreachable: ",
		"the action stays pinned to crepl_down (it is not moved, and never runs twice)",
		"once that replica answers again (its host started again on its own journal; `aipfleet fleet status` lists a replica that crashed as ready until its lease runs out), run this get again",
		"send the action again with --action-id " + id + " (with the same --url)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("get printed\n%s\nwant it to contain %q", out, want)
		}
	}
}

// TestActionNotFoundSaysItMayNeverHaveRun: a send whose answer was lost
// says to ask with action get; when the dispatcher never routed the
// action (the send did not reach it), get answered that the action may be
// another tenant's or another fleet's, and nothing of what to do, and a
// cancel printed "action ... not completed, settlement none", as if the
// action existed. Both now say that nothing ran; get says that a send
// with the same ID runs it once, cancel that there is nothing to cancel.
func TestActionNotFoundSaysItMayNeverHaveRun(t *testing.T) {
	id := aip.NewActionID()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		pe := aip.NewProtocolError(dispatch.CodeNotFound, aip.CategoryPermanent, false, 0, "no such action")
		if r.Method == http.MethodPost {
			// The dispatcher answers a cancel with the action's ID.
			json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: id, Error: pe})
			return
		}
		json.NewEncoder(w).Encode(dispatch.ErrorResponse{Error: pe})
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_TOKEN": "t"}
	for _, c := range []struct {
		sub  string
		want string
	}{
		{"get", "nothing ran; send it again with --action-id " + id + ", which runs it at most once"},
		{"cancel", "nothing ran, and there is nothing to cancel"},
	} {
		out, _, err := runCLI(t, env, "action", c.sub, id)
		var u *usageError
		if err == nil || errors.As(err, &u) {
			t.Fatalf("%s: err = %v, want a run-time error", c.sub, err)
		}
		for _, want := range []string{"HTTP 404: dispatch.not_found: no such action", "has no action with this ID for the token's tenant", c.want, "another tenant's or another fleet's"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error\n%v\nwant it to contain %q", c.sub, err, want)
			}
		}
		if out != "" {
			t.Errorf("%s printed %q, want nothing on stdout (no summary of an action that does not exist)", c.sub, out)
		}
	}
}

// TestActionSendOutcomeOpenSaysWhatToRun: a send the dispatcher answered
// with an open outcome printed the dispatcher's advice in its API's terms
// ("GET /aip/v1/actions/ID") and ended on "aipfleet: action ...:
// dispatch.outcome_unknown". The error now names the commands: for an
// action that may have run, action get and a send with the same
// --action-id (as for an answer that was lost on the way); for one pinned
// to a replica that could not be reached, to send it again once that
// replica answers.
func TestActionSendOutcomeOpenSaysWhatToRun(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req dispatch.ActionRequest
		json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		route := &dispatch.RouteFacts{ReplicaID: "crepl_down", FenceToken: "route_y"}
		var pe *aip.ProtocolError
		switch req.CapabilityID {
		case "unknown":
			w.WriteHeader(http.StatusBadGateway)
			pe = aip.NewProtocolError(dispatch.CodeOutcomeUnknown, aip.CategoryTransport, true, 0, "the connection was reset")
		case "timeout":
			w.WriteHeader(http.StatusGatewayTimeout)
			pe = aip.NewProtocolError(dispatch.CodeTimeout, aip.CategoryTransport, true, 0, "no answer within 30s")
		case "unreachable":
			w.WriteHeader(http.StatusServiceUnavailable)
			pe = aip.NewProtocolError(dispatch.CodeReplicaUnreachable, aip.CategoryTransport, true, 1000, "no connection to replica crepl_down could be made")
		case "refused":
			// Nothing could be sent (settled cancelled): no hint.
			w.WriteHeader(http.StatusBadGateway)
			json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: req.ActionID, Route: route, Settlement: registry.SettlementCancelled,
				Error: aip.NewProtocolError(dispatch.CodeReplicaUnreachable, aip.CategoryTransport, false, 0, "another transport")})
			return
		}
		json.NewEncoder(w).Encode(dispatch.ActionResponse{ActionID: req.ActionID, Route: route, Settlement: "outcome_unknown", Error: pe})
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_TOKEN": "t"}
	id := aip.NewActionID()
	maybe := "action " + id + " may or may not have run: ask with `aipfleet action get " + id + "`, or send it again with --action-id " + id + " (it never runs twice)"
	for _, c := range []struct {
		capability string
		want       string
	}{
		{"unknown", maybe},
		{"timeout", maybe},
		{"unreachable", "action " + id + " stays pinned to replica crepl_down, which could not be reached: send it again with --action-id " + id + " once that replica answers again"},
		{"refused", ""},
	} {
		_, _, err := runCLI(t, env, "action", "send", "--action-id", id, "--capability", c.capability, "--input", "{}")
		if err == nil {
			t.Fatalf("%s: no error", c.capability)
		}
		if c.want == "" {
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: err = %q, want no hint (nothing ran)", c.capability, err)
			}
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err =\n%v\nwant it to contain\n%s", c.capability, err, c.want)
		}
	}
}

// TestActionGetExitsOneWhenTheReplicaCouldNotBeAsked: an action get whose
// pinned replica could not be asked printed the route and exited 0, so a
// script could not tell a journaled state from an unknown one. It now
// exits 1 (not 2: nothing is wrong with the command line), with --json
// too, the route still printed; a replica that answered still exits 0.
func TestActionGetExitsOneWhenTheReplicaCouldNotBeAsked(t *testing.T) {
	id := aip.NewActionID()
	var reachable bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		st := dispatch.ActionStatusResponse{ActionID: id, CapabilityID: "echo.say",
			Route:   &dispatch.RouteFacts{ReplicaID: "crepl_down", FenceToken: "route_y"},
			Replica: dispatch.ReplicaFacts{Reachable: false, Error: aip.NewProtocolError(dispatch.CodeReplicaUnreachable, aip.CategoryTransport, true, 0, "connection refused")}}
		if reachable {
			st.Replica = dispatch.ReplicaFacts{Reachable: true, State: "completed"}
		}
		json.NewEncoder(w).Encode(st)
	}))
	t.Cleanup(srv.Close)
	for _, jsonOut := range []bool{false, true} {
		args := []string{"action", "get", id, "--url", srv.URL, "--token", "t"}
		if jsonOut {
			args = append(args, "--json")
		}
		reachable = false
		out, _, err := runCLI(t, nil, args...)
		var u *usageError
		if err == nil || errors.As(err, &u) {
			t.Errorf("%v: err = %v, want an error that exits 1", args, err)
		} else if want := "its replica crepl_down could not be asked, so the action's journaled state is unknown"; !strings.Contains(err.Error(), want) {
			t.Errorf("%v: err = %v, want it to say %q", args, err, want)
		}
		if !strings.Contains(out, "crepl_down") {
			t.Errorf("%v: the route is not printed:\n%s", args, out)
		}
		reachable = true
		if out, _, err := runCLI(t, nil, args...); err != nil {
			t.Errorf("%v with the replica answering: %v\n%s", args, err, out)
		}
	}
}

// TestCancelledSendNamesNoSettlement: a send whose action a cancel
// stopped is answered with its cancelled result and settlement completed
// (a verified result came back; docs/dispatch-api.md), even when the
// cancel released the reservation first and `action cancel` and `action
// get` say cancelled. The summary printed "cancelled ..., settlement
// completed", which read as a contradiction; it now prints the result and
// no settlement. --json passes the answer on unchanged.
func TestCancelledSendNamesNoSettlement(t *testing.T) {
	id := aip.NewActionID()
	raw, err := json.Marshal(dispatch.ActionResponse{ActionID: id, Settlement: registry.SettlementCompleted,
		Route:  &dispatch.RouteFacts{ReplicaID: "crepl_x", FenceToken: "route_y"},
		Result: &aip.ActionResult{ActionID: id, Status: aip.ResultCancelled}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(raw)
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_TOKEN": "t"}
	out, _, err := runCLI(t, env, "action", "send", "--capability", "echo.say", "--input", `{"message":"x"}`, "--action-id", id)
	want := "action " + id + " cancelled on replica crepl_x (fence route_y)\n"
	if out != want {
		t.Errorf("summary %q, want %q", out, want)
	}
	if err == nil || err.Error() != "action "+id+": cancelled" {
		t.Errorf("err = %v, want the send to fail with the action's status", err)
	}
	out, _, _ = runCLI(t, env, "action", "send", "--capability", "echo.say", "--input", `{"message":"x"}`, "--action-id", id, "--json")
	if out != string(raw) {
		t.Errorf("--json: got %q, want the answer unchanged %q", out, raw)
	}
}
