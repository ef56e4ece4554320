package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// catalogFixture is a real dispatcher on a memregistry whose catalog
// pages hold 2 capabilities: tenant acme has cap.00 to cap.04 bound
// (cap.05 is offered by the version, not bound), tenant other has
// other.cap.
type catalogFixture struct {
	reg *memregistry.Registry
	// url is the dispatcher's, behind before (when set), which runs
	// before each request reaches it.
	url     string
	env     map[string]string // AIP_CLIENT_URL and AIP_CLIENT_ISSUER_KEY
	acme    registry.ConnectorInstance
	other   registry.CapabilityBinding
	mu      sync.Mutex
	before  func(r *http.Request)
	queries []string
}

func newCatalogFixture(t *testing.T) *catalogFixture {
	t.Helper()
	ctx := context.Background()
	reg, err := memregistry.New(memregistry.Config{Limits: registry.Limits{MaxPageSize: 2}})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ct := registry.ConnectorType{ID: "ctype_cat", Name: "cat", Owner: "owner-cat", Enabled: true}
	must(reg.PutConnectorType(ctx, ct))
	var caps []aip.Capability
	for i := range 6 {
		caps = append(caps, registrytest.Capability(fmt.Sprintf("cap.%02d", i), "plain"))
	}
	caps[1].Description = "Books a calendar slot"
	caps[2].Contract.Execution.SupportsStreaming = true
	caps[2].Contract.SideEffects = []aip.SideEffect{aip.EffectWrite, aip.EffectSendMessage}
	caps[2].Risk, caps[2].Stability = aip.RiskHigh, aip.StabilityDeprecated
	caps = append(caps, registrytest.Capability("other.cap", "another tenant's"))
	v := registrytest.Version("cver_cat1", ct.ID, "1", ct.Owner, registry.VersionActive, registrytest.Manifest("service:cat", caps))
	must(reg.AdmitVersion(ctx, v))
	instance := func(name, tenant string) registry.ConnectorInstance {
		i := registry.ConnectorInstance{ID: "cinst_" + name, ConnectorTypeID: ct.ID, VersionID: v.ID, TenantID: tenant,
			ConfigRevision: 1, SecretProviderRef: "secret://" + name, Status: registry.InstanceEnabled}
		must(reg.PutInstance(ctx, i))
		return i
	}
	f := &catalogFixture{reg: reg, acme: instance("acme", "acme")}
	for i := 4; i >= 0; i-- {
		f.bind(t, f.acme, fmt.Sprintf("cap.%02d", i))
	}
	f.other = f.bind(t, instance("other", "other"), "other.cap")

	issuerKey, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "issuer.key")
	must(aip.WriteSeedFile(keyFile, issuerKey))
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "aipfleet-dev", DIDs: []string{issuerKey.DID()}}}})
	must(err)
	key, _ := aip.GenerateSigningKey()
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: DefaultGatewayPrincipal},
		dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: verifier, Events: reg, Records: reg})
	must(err)
	h := d.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.queries = append(f.queries, r.URL.RawQuery)
		before := f.before
		f.mu.Unlock()
		if before != nil {
			before(r)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { srv.Close(); d.Close() })
	f.url = srv.URL
	f.env = map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_ISSUER_KEY": keyFile}
	return f
}

func (f *catalogFixture) bind(t *testing.T, i registry.ConnectorInstance, capability string) registry.CapabilityBinding {
	t.Helper()
	b := registry.CapabilityBinding{TenantID: i.TenantID, CapabilityID: capability, InstanceID: i.ID,
		PolicyRevision: 1, CredentialRevisionRef: "cred-rev-1", Enabled: true}
	if err := f.reg.PutBinding(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return b
}

// requests returns the query of every request so far, and forgets them.
func (f *catalogFixture) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.queries
	f.queries = nil
	return q
}

func (f *catalogFixture) setBefore(fn func(r *http.Request)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before = fn
}

// tableIDs returns the capability IDs of a capability list table, after
// checking its header.
func tableIDs(t *testing.T, out string) []string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "CAPABILITY ") || !strings.Contains(lines[0], "MODES") {
		t.Fatalf("no table header:\n%s", out)
	}
	var ids []string
	for _, l := range lines[1:] {
		ids = append(ids, strings.Fields(l)[0])
	}
	return ids
}

// TestCapabilityList: list reads every page (the dispatcher's pages hold
// 2 here) and prints one line per capability of the token's tenant, in ID
// order; --json is one document with every definition; --search and
// --profile reach the dispatcher's query.
func TestCapabilityList(t *testing.T) {
	f := newCatalogFixture(t)
	out, errOut, err := runCLI(t, f.env, "capability", "list", "--tenant", "acme")
	if err != nil {
		t.Fatalf("err = %v, stderr %q", err, errOut)
	}
	if got, want := strings.Join(tableIDs(t, out), " "), "cap.00 cap.01 cap.02 cap.03 cap.04"; got != want {
		t.Errorf("listed %s, want %s:\n%s", got, want, out)
	}
	if q := f.requests(); len(q) != 3 || q[0] != "" || !strings.HasPrefix(q[1], "cursor=") || !strings.HasPrefix(q[2], "cursor=") {
		t.Errorf("requests %q, want the first page then two by cursor", q)
	}
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "cap.02 ") {
			row = strings.Join(strings.Fields(l), " ")
		}
	}
	if want := "cap.02 sync,streaming write,send_message high deprecated Capability cap.02"; row != want {
		t.Errorf("cap.02's line = %q, want %q", row, want)
	}

	out, _, err = runCLI(t, f.env, "capability", "list", "--tenant", "acme", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		CatalogRevision uint64                          `json:"catalog_revision"`
		Capabilities    []registry.CapabilityDefinition `json:"capabilities"`
		Total           int                             `json:"total"`
		NextCursor      *string                         `json:"next_cursor"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if len(doc.Capabilities) != 5 || doc.Total != 5 || doc.CatalogRevision == 0 || doc.NextCursor != nil ||
		doc.Capabilities[4].Capability.ID != "cap.04" || doc.Capabilities[0].ContractDigest == "" {
		t.Errorf("--json: %d capabilities, total %d, revision %d, next_cursor %v", len(doc.Capabilities), doc.Total, doc.CatalogRevision, doc.NextCursor)
	}

	f.requests()
	out, _, err = runCLI(t, f.env, "capability", "list", "--tenant", "acme", "--search", "CALENDAR", "--profile", aip.NativeHTTPProfile)
	if err != nil || strings.Join(tableIDs(t, out), " ") != "cap.01" {
		t.Errorf("--search CALENDAR: %v\n%s", err, out)
	}
	if q := f.requests(); len(q) != 1 || !strings.Contains(q[0], "q=CALENDAR") || !strings.Contains(q[0], "profile=") {
		t.Errorf("--search and --profile sent %q", q)
	}

	out, errOut, err = runCLI(t, f.env, "capability", "list", "--tenant", "acme", "--search", "nothing like it")
	if err != nil || out != "" || errOut != "no capability of the token's tenant matches --search \"nothing like it\"\n" {
		t.Errorf("no match: %q, %q, %v", out, errOut, err)
	}
	out, errOut, err = runCLI(t, f.env, "capability", "list", "--tenant", "nobody")
	if err != nil || out != "" || !strings.Contains(errOut, "the token's tenant has no capabilities") || !strings.Contains(errOut, "docs/fleet-file.md") {
		t.Errorf("a tenant without capabilities: %q, %q, %v", out, errOut, err)
	}
}

// TestCapabilityListStartsAgainWhenTheCatalogChanges: a catalog that
// changes between two pages makes the next cursor stale (409
// dispatch.stale_cursor); list reads again from the first page and prints
// the catalog as it is now. One that keeps changing ends in an error that
// says so.
func TestCapabilityListStartsAgainWhenTheCatalogChanges(t *testing.T) {
	f := newCatalogFixture(t)
	var changed atomic.Bool
	f.setBefore(func(r *http.Request) {
		if r.URL.Query().Get("cursor") != "" && changed.CompareAndSwap(false, true) {
			f.bind(t, f.acme, "cap.05")
		}
	})
	out, errOut, err := runCLI(t, f.env, "capability", "list", "--tenant", "acme")
	if err != nil {
		t.Fatalf("err = %v, stderr %q", err, errOut)
	}
	if got, want := strings.Join(tableIDs(t, out), " "), "cap.00 cap.01 cap.02 cap.03 cap.04 cap.05"; got != want {
		t.Errorf("after the catalog changed: listed %s, want %s", got, want)
	}
	if q := f.requests(); len(q) != 5 || q[2] != "" {
		t.Errorf("requests %q, want page 1, a stale page 2, then pages 1 to 3 again", q)
	}

	// Another tenant's change counts too, and this one never stops.
	var revision atomic.Uint64
	revision.Store(f.other.PolicyRevision)
	f.setBefore(func(r *http.Request) {
		if r.URL.Query().Get("cursor") != "" {
			b := f.other
			b.PolicyRevision = revision.Add(1)
			if err := f.reg.PutBinding(context.Background(), b); err != nil {
				t.Error(err)
			}
		}
	})
	out, _, err = runCLI(t, f.env, "capability", "list", "--tenant", "acme")
	if err == nil || out != "" || !strings.Contains(err.Error(), "the catalog changed while it was read, 4 times") ||
		!strings.Contains(err.Error(), "dispatch.stale_cursor") || !strings.Contains(err.Error(), "run the command again") {
		t.Errorf("a catalog that keeps changing: out %q, err = %v", out, err)
	}
	if q := f.requests(); len(q) != 2*(catalogRestarts+1) {
		t.Errorf("%d requests, want %d: %q", len(q), 2*(catalogRestarts+1), q)
	}
}

// TestCapabilityGet: get prints one capability's contract and input
// schema (--json: its definition as sent); an ID the catalog lacks is an
// error that names the capabilities it may have meant.
func TestCapabilityGet(t *testing.T) {
	f := newCatalogFixture(t)
	out, errOut, err := runCLI(t, f.env, "capability", "get", "cap.02", "--tenant", "acme")
	if err != nil {
		t.Fatalf("err = %v, stderr %q", err, errOut)
	}
	for _, want := range []string{"capability cap.02: Capability cap.02\n", "modes:", "modes:                sync,streaming\n",
		"side effects:", "write,send_message", "idempotency:", "key optional", "input schema:\n  {\n    \"type\": \"object\",", "contract digest:  "} {
		if !strings.Contains(out, want) {
			t.Errorf("get cap.02 lacks %q:\n%s", want, out)
		}
	}
	// Flags may come first, and --json prints the definition.
	out, _, err = runCLI(t, f.env, "capability", "get", "--tenant", "acme", "--json", "cap.01")
	var def registry.CapabilityDefinition
	if err != nil || json.Unmarshal([]byte(out), &def) != nil || def.Capability.ID != "cap.01" || def.SchemaDigest == "" || !strings.HasSuffix(out, "}\n") {
		t.Errorf("get --json cap.01: %v\n%s", err, out)
	}
	for _, c := range []struct{ id, want string }{
		{"CAP.03", "capability CAP.03 is not in the catalog of the token's tenant (IDs are case-sensitive: did you mean cap.03?): `aipfleet capability list` lists those it can call"},
		{"00", "capability 00 is not in the catalog of the token's tenant (did you mean cap.00?)"},
		{"cap.05", "capability cap.05 is not in the catalog of the token's tenant: `aipfleet capability list`"},
		{"other.cap", "capability other.cap is not in the catalog of the token's tenant: "},
	} {
		out, _, err := runCLI(t, f.env, "capability", "get", c.id, "--tenant", "acme")
		var u *usageError
		if err == nil || errors.As(err, &u) || out != "" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("get %s: out %q, err = %v\nwant it to say %q", c.id, out, err, c.want)
		}
	}
	_, _, err = runCLI(t, f.env, "capability", "get", "cap.05", "--tenant", "acme", "--url", f.url, "--request-timeout", "5s")
	if err == nil || !strings.HasSuffix(err.Error(), "lists those it can call (with the same --url and --tenant)") {
		t.Errorf("get with --url: err = %v, want the hint to name --url", err)
	}
}

// TestActionSendToAnUnknownCapabilityNamesCapabilityList: the
// dispatcher's connector.binding_unavailable names its API path (GET
// /aip/v1/capabilities); the CLI's error also names the command that reads
// it, with the client flags the send was given.
func TestActionSendToAnUnknownCapabilityNamesCapabilityList(t *testing.T) {
	f := newCatalogFixture(t)
	for _, mode := range []string{"sync", "streaming"} {
		_, _, err := runCLI(t, f.env, "action", "send", "--tenant", "acme", "--capability", "nope.nope", "--input", "{}", "--mode", mode, "--url", f.url)
		if err == nil || !strings.Contains(err.Error(), "connector.binding_unavailable") ||
			!strings.Contains(err.Error(), "capability nope.nope is not available to the token's tenant") ||
			!strings.HasSuffix(err.Error(), "`aipfleet capability list` lists those it can call (with the same --url and --tenant)") {
			t.Errorf("--mode %s: err = %v", mode, err)
		}
	}
	// Answered without an action: the same hint.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(dispatch.ErrorResponse{Error: aip.NewProtocolError(dispatch.CodeBindingUnavailable, aip.CategoryPolicy, false, 0, "not available")})
	}))
	defer srv.Close()
	_, _, err := runCLI(t, nil, "action", "send", "--url", srv.URL, "--token", "t", "--capability", "nope.nope", "--input", "{}")
	if err == nil || !strings.Contains(err.Error(), "HTTP 404: connector.binding_unavailable: not available") ||
		!strings.HasSuffix(err.Error(), "lists those it can call (with the same --url and --token)") || strings.Contains(err.Error(), "is --url the dispatcher?") {
		t.Errorf("binding_unavailable without an action: err = %v", err)
	}
}

// TestCapabilityUsageErrors: a mistake on the command line is a usage
// error (exit status 2) that says what to fix, and sends nothing.
func TestCapabilityUsageErrors(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	env := map[string]string{"AIP_CLIENT_URL": srv.URL, "AIP_CLIENT_TOKEN": "t"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"capability"}, "capability: name a subcommand: list or get"},
		{[]string{"capability", "--json", "list"}, "capability: the subcommand comes first, then its flags: aipfleet capability list [flags]"},
		{[]string{"capability", "show", "echo.say"}, `capability: unknown subcommand "show"; use list or get`},
		{[]string{"capability", "list", "echo.say"}, `capability list: unexpected argument "echo.say"; to show one capability: aipfleet capability get echo.say`},
		{[]string{"capability", "get"}, "capability get: give exactly one capability ID"},
		{[]string{"capability", "get", "a.b", "c.d"}, "capability get: give exactly one capability ID"},
		{[]string{"capability", "get", " echo.say"}, `capability get: capability ID " echo.say" must be text without control characters or surrounding spaces`},
		{[]string{"capability", "get", "echo\x1bsay"}, `capability ID "echo\x1bsay" must be text`},
		{[]string{"capability", "get", strings.Repeat("x", 257)}, "the capability ID is longer than 256 bytes"},
		// An invisible formatting character, which no capability ID holds,
		// was sent and answered with an empty catalog.
		{[]string{"capability", "get", "echo.say\u200b"}, `capability get: capability ID "echo.say\u200b" holds the invisible formatting character U+200B, which no capability ID may hold (it would print like a capability ID it is not): remove it`},
		{[]string{"capability", "get", "echo\u202esay"}, `capability ID "echo\u202esay" holds the invisible formatting character U+202E`},
		{[]string{"capability", "get", "echo.say", "--search", "x"}, "capability get: --search is for capability list"},
		{[]string{"capability", "list", "--search", ""}, "capability list: --search is empty"},
		{[]string{"capability", "list", "--token", ""}, "capability list: --token is empty"},
		{[]string{"capability", "list", "--request-timeout", "0s"}, "capability list: --request-timeout must be positive"},
		{[]string{"capability", "list", "--bogus"}, "capability list: unknown flag --bogus (run `aipfleet capability --help`)"},
		{[]string{"capability", "list", "--url", "ftp://x"}, "capability list: --url"},
	} {
		_, _, err := runCLI(t, env, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want a usage error saying %q", c.args, err, c.want)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests were sent by command lines with a mistake", n)
	}
}

// TestCapabilityAgainstSomethingElse: an answer that is not the
// dispatcher's says which flag to check.
func TestCapabilityAgainstSomethingElse(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == dispatch.PathCapabilities {
			w.Write([]byte(`{"events":[]}`))
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	_, _, err := runCLI(t, nil, "capability", "list", "--url", srv.URL, "--token", "t")
	if err == nil || !strings.Contains(err.Error(), "is not a page of capabilities (is --url the dispatcher?)") {
		t.Errorf("a 200 that is not a page: err = %v", err)
	}
	_, _, err = runCLI(t, nil, "capability", "get", "echo.say", "--url", srv.URL+"/elsewhere", "--token", "t")
	if err == nil || !strings.Contains(err.Error(), "HTTP 404") || !strings.Contains(err.Error(), "does not serve the dispatcher's API: is --url the dispatcher?") {
		t.Errorf("a 404 of another server: err = %v", err)
	}
	// A next_cursor that does not move on would be followed for ever.
	loop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"catalog_revision":1,"capabilities":[{"capability":{"id":"a.b"}}],"next_cursor":"same","total":9}`))
	}))
	defer loop.Close()
	_, _, err = runCLI(t, nil, "capability", "list", "--url", loop.URL, "--token", "t")
	if err == nil || !strings.Contains(err.Error(), "answered a next_cursor that does not move on (2 capabilities read of 9)") {
		t.Errorf("a cursor that repeats: err = %v", err)
	}
}
