package twenty

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const workspace = "3f2b8c1e-9d4a-4b7e-8c21-5a6f7e8d9c0b"

// env is one test host serving a Twenty connector in front of a mock.
type env struct {
	*hostsdktest.Fixture
	mock    *mockTwenty
	conn    *Connector
	journal *sqliteruntime.Journal
	secret  string
}

func writeFile(t testing.TB, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// newEnv starts a host for a connector built from settings (as aip-host
// builds it) pointing at a fresh mock; edit may change the settings.
func newEnv(t *testing.T, edit func(v hostsdk.SettingValues)) *env {
	t.Helper()
	return newEnvWith(t, edit, nil)
}

// newEnvWith is newEnv with a change to the connector before the host
// starts.
func newEnvWith(t *testing.T, edit func(v hostsdk.SettingValues), editConn func(*Connector)) *env {
	t.Helper()
	return newEnvJournal(t, edit, editConn, nil)
}

// newEnvJournal is newEnvWith whose host uses wrap(journal) when wrap is
// set.
func newEnvJournal(t *testing.T, edit func(v hostsdk.SettingValues), editConn func(*Connector), wrap func(*sqliteruntime.Journal) journal.Journal) *env {
	t.Helper()
	return newEnvHost(t, edit, editConn, wrap, nil)
}

// newEnvHost is newEnvJournal with editHost applied to the host's config
// too, when set.
func newEnvHost(t *testing.T, edit func(v hostsdk.SettingValues), editConn func(*Connector), wrap func(*sqliteruntime.Journal) journal.Journal,
	editHost func(*hostsdk.Config)) *env {
	t.Helper()
	m := newMock(t)
	v := hostsdk.SettingValues{
		FlagBaseURL:          m.srv.URL,
		FlagWorkspaceID:      workspace,
		FlagAPITokenFile:     writeFile(t, "token", m.token+"\n", 0o600),
		FlagObjects:          "people,companies,invoices",
		FlagMaxResponseBytes: "1048576",
	}
	if edit != nil {
		edit(v)
	}
	c, err := newFromSettings(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{mock: m, conn: c.(*Connector)}
	if editConn != nil {
		editConn(e.conn)
	}
	if f := v[FlagWebhookSecretFile]; f != "" {
		b, _ := os.ReadFile(f)
		e.secret = strings.TrimSpace(string(b))
	}
	e.Fixture = hostsdktest.Start(t, e.conn, func(cfg *hostsdk.Config) {
		j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: cfg.StateDir})
		if err != nil {
			t.Fatal(err)
		}
		// Registered before the host starts, so it runs after the host stops.
		t.Cleanup(func() { j.Close() })
		e.journal = j
		cfg.Journal = j
		if wrap != nil {
			cfg.Journal = wrap(j)
		}
		if editHost != nil {
			editHost(cfg)
		}
	})
	return e
}

// action is an action for the Twenty operation op.
func action(op, input string) *aip.Action { return hostsdktest.NewAction(CapabilityID(op), input) }

// complete runs an action that must complete and decodes its output.
func (e *env) complete(t *testing.T, a *aip.Action, out any) {
	t.Helper()
	res := e.Result(t, a)
	if res.Status != aip.ResultCompleted {
		t.Fatalf("%s: %s %+v", a.CapabilityID, res.Status, res.Error)
	}
	if err := json.Unmarshal(res.Output, out); err != nil {
		t.Fatalf("output %s: %v", res.Output, err)
	}
}

func checkAuth(t *testing.T, r recorded, token string) {
	t.Helper()
	if got := r.Header.Get("Authorization"); got != "Bearer "+token {
		t.Errorf("%s %s: Authorization %q", r.Method, r.Path, got)
	}
}

func checkMutationHeaders(t *testing.T, r recorded, a *aip.Action) {
	t.Helper()
	// Without an explicit key the host uses the action ID as the key; it
	// goes scoped to the tenant and the capability.
	if got, want := r.Header.Get("Idempotency-Key"), provider.ScopedIdempotencyKey(hostsdktest.TenantID, a.CapabilityID, a.ID); got != want {
		t.Errorf("%s %s: Idempotency-Key %q, want %q", r.Method, r.Path, got, want)
	}
	if got := r.Header.Get("X-AIP-Action-ID"); got != a.ID {
		t.Errorf("%s %s: X-AIP-Action-ID %q, want %q", r.Method, r.Path, got, a.ID)
	}
}

func jsonEqual(t *testing.T, what, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%s: %q is not JSON: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(w, g); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

type recordOut struct {
	Object string         `json:"object"`
	Record map[string]any `json:"record"`
}

type listOut struct {
	Object     string           `json:"object"`
	Records    []map[string]any `json:"records"`
	PageInfo   map[string]any   `json:"page_info"`
	TotalCount *int64           `json:"total_count"`
}

// TestRecordLifecycle runs every record capability through the host and
// checks the exact request the mock received for each.
func TestRecordLifecycle(t *testing.T) {
	e := newEnv(t, nil)

	// record.create: POST /rest/people with the record as the body.
	create := action(OpCreate, `{"object":"people","record":{"name":{"firstName":"Ada","lastName":"Lovelace"},"jobTitle":"Engineer"}}`)
	var created recordOut
	e.complete(t, create, &created)
	r := e.mock.last(t)
	if r.Method != "POST" || r.Path != "/rest/people" || len(r.Query) != 0 {
		t.Fatalf("create sent %s %s?%s", r.Method, r.Path, r.Query.Encode())
	}
	jsonEqual(t, "create body", r.Body, `{"name":{"firstName":"Ada","lastName":"Lovelace"},"jobTitle":"Engineer"}`)
	checkAuth(t, r, e.mock.token)
	checkMutationHeaders(t, r, create)
	id, _ := created.Record["id"].(string)
	if created.Object != "people" || id == "" || created.Record["jobTitle"] != "Engineer" {
		t.Fatalf("create output %+v", created)
	}

	// record.get: GET /rest/people/<id> with fields and depth.
	var got recordOut
	e.complete(t, action(OpGet, `{"object":"people","id":"`+id+`","fields":["name","jobTitle"],"depth":0}`), &got)
	r = e.mock.last(t)
	if r.Method != "GET" || r.Path != "/rest/people/"+id {
		t.Fatalf("get sent %s %s", r.Method, r.Path)
	}
	if d := cmp.Diff(url.Values{"fields": {"name,jobTitle"}, "depth": {"0"}}, r.Query); d != "" {
		t.Errorf("get query (-want +got):\n%s", d)
	}
	if r.Header.Get("Idempotency-Key") != "" || r.Body != "" {
		t.Errorf("a read sent Idempotency-Key %q and body %q", r.Header.Get("Idempotency-Key"), r.Body)
	}
	checkAuth(t, r, e.mock.token)
	if got.Record["id"] != id {
		t.Fatalf("get output %+v", got)
	}

	// record.update: PATCH /rest/people/<id> with the changed fields.
	update := action(OpUpdate, `{"object":"people","id":"`+id+`","record":{"jobTitle":"Analyst"}}`)
	var updated recordOut
	e.complete(t, update, &updated)
	r = e.mock.last(t)
	if r.Method != "PATCH" || r.Path != "/rest/people/"+id {
		t.Fatalf("update sent %s %s", r.Method, r.Path)
	}
	jsonEqual(t, "update body", r.Body, `{"jobTitle":"Analyst"}`)
	checkMutationHeaders(t, r, update)
	if updated.Record["jobTitle"] != "Analyst" {
		t.Fatalf("update output %+v", updated)
	}

	// record.create_many: POST /rest/batch/companies with the array.
	batch := action(OpCreateMany, `{"object":"companies","records":[{"name":"Acme"},{"name":"Globex"}]}`)
	var many listOut
	e.complete(t, batch, &many)
	r = e.mock.last(t)
	if r.Method != "POST" || r.Path != "/rest/batch/companies" {
		t.Fatalf("create_many sent %s %s", r.Method, r.Path)
	}
	jsonEqual(t, "create_many body", r.Body, `[{"name":"Acme"},{"name":"Globex"}]`)
	checkMutationHeaders(t, r, batch)
	if many.Object != "companies" || len(many.Records) != 2 || many.Records[1]["name"] != "Globex" || many.Records[1]["id"] == nil {
		t.Fatalf("create_many output %+v", many)
	}

	// record.list: GET /rest/companies with every query parameter.
	var list listOut
	e.complete(t, action(OpList, `{"object":"companies","filter":"name[ilike]:%E%","order_by":"createdAt[DescNullsLast]","limit":1,"starting_after":"c-prev","fields":["name"],"depth":1}`), &list)
	r = e.mock.last(t)
	if r.Method != "GET" || r.Path != "/rest/companies" {
		t.Fatalf("list sent %s %s", r.Method, r.Path)
	}
	want := url.Values{"filter": {"name[ilike]:%E%"}, "order_by": {"createdAt[DescNullsLast]"}, "limit": {"1"},
		"starting_after": {"c-prev"}, "fields": {"name"}, "depth": {"1"}}
	if d := cmp.Diff(want, r.Query); d != "" {
		t.Errorf("list query (-want +got):\n%s", d)
	}
	if len(list.Records) != 1 || list.Records[0]["name"] != "Acme" || list.TotalCount == nil || *list.TotalCount != 2 ||
		list.PageInfo["endCursor"] != "c-end" {
		t.Fatalf("list output %+v", list)
	}
	// ending_before alone.
	e.complete(t, action(OpList, `{"object":"companies","ending_before":"c-next"}`), &list)
	if d := cmp.Diff(url.Values{"ending_before": {"c-next"}}, e.mock.last(t).Query); d != "" {
		t.Errorf("list query (-want +got):\n%s", d)
	}

	// record.soft_delete: DELETE /rest/people/<id>?soft_delete=true, no
	// body (without soft_delete=true Twenty deletes permanently).
	del := action(OpSoftDelete, `{"object":"people","id":"`+id+`"}`)
	var deleted recordOut
	e.complete(t, del, &deleted)
	r = e.mock.last(t)
	if r.Method != "DELETE" || r.Path != "/rest/people/"+id || r.Body != "" || r.Query.Encode() != "soft_delete=true" {
		t.Fatalf("soft_delete sent %s %s?%s %q", r.Method, r.Path, r.Query.Encode(), r.Body)
	}
	checkMutationHeaders(t, r, del)
	if deleted.Record["id"] != id {
		t.Fatalf("soft_delete output %+v", deleted)
	}
	if rec := e.mock.record("people", id); rec == nil || rec["deletedAt"] == nil {
		t.Fatalf("after soft_delete the record is %v; want it kept with deletedAt set", rec)
	}
}

func TestMetadataList(t *testing.T) {
	e := newEnv(t, nil)
	var out struct {
		Objects    []map[string]any `json:"objects"`
		TotalCount int              `json:"total_count"`
	}
	e.complete(t, action(OpMetadataList, `{}`), &out)
	r := e.mock.last(t)
	if r.Method != "GET" || r.Path != "/rest/metadata/objects" || len(r.Query) != 0 {
		t.Fatalf("metadata.list sent %s %s?%s", r.Method, r.Path, r.Query.Encode())
	}
	checkAuth(t, r, e.mock.token)
	if len(out.Objects) != len(mockObjects) || out.TotalCount != len(mockObjects) {
		t.Fatalf("metadata.list output %+v", out)
	}
	e.complete(t, action(OpMetadataList, `{"limit":2,"starting_after":"m0"}`), &out)
	if d := cmp.Diff(url.Values{"limit": {"2"}, "starting_after": {"m0"}}, e.mock.last(t).Query); d != "" {
		t.Errorf("metadata.list query (-want +got):\n%s", d)
	}
	if len(out.Objects) != 2 {
		t.Fatalf("metadata.list with limit 2 returned %d objects", len(out.Objects))
	}
}

func failedCode(t *testing.T, res *aip.ActionResult) *aip.ProtocolError {
	t.Helper()
	if res.Status != aip.ResultFailed || res.Error == nil {
		t.Fatalf("result %s %+v, want failed", res.Status, res.Error)
	}
	return res.Error
}

func TestProviderErrors(t *testing.T) {
	e := newEnv(t, func(v hostsdk.SettingValues) { v[FlagObjects] = "people,companies,ghosts" })
	// An object the workspace does not have: Twenty answers 404.
	pe := failedCode(t, e.Result(t, action(OpList, `{"object":"ghosts"}`)))
	if pe.Code != provider.CodeNotFound || retryable(pe) {
		t.Errorf("unknown object: %+v", pe)
	}
	if r := e.mock.last(t); r.Path != "/rest/ghosts" {
		t.Errorf("unknown object sent %s", r.Path)
	}
	// A record that does not exist: 404.
	pe = failedCode(t, e.Result(t, action(OpGet, `{"object":"people","id":"11111111-1111-4111-8111-111111111111"}`)))
	if pe.Code != provider.CodeNotFound {
		t.Errorf("missing record: %+v", pe)
	}
	// A 400 on a mutation (Twenty refusing a field): failed, not unknown.
	e.mock.setFail(func(r *http.Request) (int, string, bool) {
		return 400, `{"statusCode":400,"error":"BadRequestException","messages":["Object people doesn't have any \"nope\" field."]}`, true
	})
	pe = failedCode(t, e.Result(t, action(OpCreate, `{"object":"people","record":{"nope":1}}`)))
	if pe.Code != provider.CodeInvalidRequest || retryable(pe) {
		t.Errorf("400 on create: %+v", pe)
	}
	// 429 is retryable.
	e.mock.setFail(func(r *http.Request) (int, string, bool) {
		return 429, `{"statusCode":429,"error":"TooManyRequestsException","messages":["Too many requests"]}`, true
	})
	if pe = failedCode(t, e.Result(t, action(OpList, `{"object":"people"}`))); pe.Code != provider.CodeRateLimited || !retryable(pe) {
		t.Errorf("429: %+v", pe)
	}
	// A read that gets a 5xx: failed, retryable.
	e.mock.setFail(func(r *http.Request) (int, string, bool) {
		return 503, `{"statusCode":503,"error":"ServiceUnavailableException","messages":["down"]}`, true
	})
	if pe = failedCode(t, e.Result(t, action(OpMetadataList, `{}`))); pe.Code != provider.CodeUnavailable || !retryable(pe) {
		t.Errorf("503 on a read: %+v", pe)
	}
	// A read whose 2xx answer is not Twenty's shape: bad response.
	e.mock.setFail(func(r *http.Request) (int, string, bool) { return 200, `{"people":[]}`, true })
	if pe = failedCode(t, e.Result(t, action(OpList, `{"object":"people"}`))); pe.Code != provider.CodeBadResponse {
		t.Errorf("wrong shape: %+v", pe)
	}
}

func TestUnauthorized(t *testing.T) {
	// The mock refuses a wrong key as Twenty does; CheckHealth reports it.
	m := newMock(t)
	u, _ := url.Parse(m.srv.URL)
	c, err := New(Config{BaseURL: u, WorkspaceID: workspace, Token: provider.NewSecret("wrong-key")})
	if err != nil {
		t.Fatal(err)
	}
	err = c.CheckHealth(hostsdktest.Context(t))
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.Status != http.StatusUnauthorized {
		t.Fatalf("CheckHealth with a wrong key: %v", err)
	}
	if reqs := m.requests(); len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer wrong-key" {
		t.Fatalf("requests %+v", reqs)
	}
	if strings.Contains(err.Error(), "wrong-key") {
		t.Errorf("the error carries the key: %v", err)
	}
	// Through a host (whose health probe keeps passing): a 401 answer is a
	// failed, non-retryable provider.unauthorized.
	e := newEnv(t, nil)
	e.mock.setFail(func(r *http.Request) (int, string, bool) {
		return 401, `{"statusCode":401,"error":"UnauthorizedException","messages":["Token invalid."]}`, true
	})
	perr := failedCode(t, e.Result(t, action(OpList, `{"object":"people"}`)))
	if perr.Code != provider.CodeUnauthorized || retryable(perr) {
		t.Errorf("401: %+v", perr)
	}
	if strings.Contains(perr.Message, e.mock.token) {
		t.Errorf("the error carries the API key: %s", perr.Message)
	}
}

// TestMutationOutcomeUnknown: a mutation that gets a 5xx or no answer is
// outcome_unknown, and the same action sent again never reaches Twenty.
func TestMutationOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		a      *aip.Action
	}{
		{"500 on create", 500, action(OpCreate, `{"object":"people","record":{"jobTitle":"x"}}`)},
		{"dropped connection on batch", 0, action(OpCreateMany, `{"object":"people","records":[{"jobTitle":"x"}]}`)},
		{"502 on delete", 502, action(OpSoftDelete, `{"object":"people","id":"11111111-1111-4111-8111-111111111111"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.mock.setFail(func(r *http.Request) (int, string, bool) {
				return tc.status, `{"statusCode":500,"error":"InternalServerErrorException","messages":["boom"]}`, true
			})
			ctx := hostsdktest.Context(t)
			if _, err := e.Dispatcher.Act(ctx, e.Target, tc.a); err != nil {
				t.Fatal(err)
			}
			st, _, err := e.Dispatcher.Status(ctx, e.Target, tc.a.ID, tc.a.CapabilityID)
			if err != nil || st.State != aip.StateOutcomeUnknown {
				t.Fatalf("status %+v, %v; want outcome_unknown", st, err)
			}
			n := e.mock.count()
			if n != 1 {
				t.Fatalf("the mock got %d requests, want 1", n)
			}
			e.mock.setFail(nil)
			if _, err := e.Dispatcher.Act(ctx, e.Target, tc.a); err != nil {
				t.Fatal(err)
			}
			if got := e.mock.count(); got != n {
				t.Fatalf("the same action was sent to Twenty again (%d requests)", got)
			}
			if st, _, _ := e.Dispatcher.Status(ctx, e.Target, tc.a.ID, tc.a.CapabilityID); st.State != aip.StateOutcomeUnknown {
				t.Fatalf("status after the resend %+v", st)
			}
		})
	}
}

func TestInputRejected(t *testing.T) {
	e := newEnv(t, nil)
	id := `"11111111-1111-4111-8111-111111111111"`
	records := make([]string, 61)
	for i := range records {
		records[i] = `{"name":"x"}`
	}
	for name, a := range map[string]*aip.Action{
		"unconfigured object":     action(OpList, `{"object":"opportunities"}`),
		"unknown field":           action(OpList, `{"object":"people","page":2}`),
		"limit above 200":         action(OpList, `{"object":"people","limit":201}`),
		"limit 0":                 action(OpList, `{"object":"people","limit":0}`),
		"both cursors":            action(OpList, `{"object":"people","starting_after":"a","ending_before":"b"}`),
		"get without id":          action(OpGet, `{"object":"people"}`),
		"id not a uuid":           action(OpGet, `{"object":"people","id":"../metadata"}`),
		"record not an object":    action(OpCreate, `{"object":"people","record":[1]}`),
		"empty update":            action(OpUpdate, `{"object":"people","id":`+id+`,"record":{}}`),
		"61 records":              action(OpCreateMany, `{"object":"people","records":[`+strings.Join(records, ",")+`]}`),
		"no records":              action(OpCreateMany, `{"object":"people","records":[]}`),
		"metadata unknown field":  action(OpMetadataList, `{"object":"people"}`),
		"depth 2":                 action(OpGet, `{"object":"people","id":`+id+`,"depth":2}`),
		"field name with a comma": action(OpGet, `{"object":"people","id":`+id+`,"fields":["a,b"]}`),
	} {
		resp := e.Act(t, a)
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s: HTTP %d %s", name, resp.Status, resp.Raw)
		}
	}
	if n := e.mock.count(); n != 0 {
		t.Errorf("rejected inputs reached Twenty %d times", n)
	}
}

func TestRecordTooLarge(t *testing.T) {
	e := newEnv(t, nil)
	big := strings.Repeat("x", MaxRecordBytes)
	pe := failedCode(t, e.Result(t, action(OpCreate, `{"object":"people","record":{"note":"`+big+`"}}`)))
	if pe.Code != CodeRecordTooLarge {
		t.Errorf("large record: %+v", pe)
	}
	if n := e.mock.count(); n != 0 {
		t.Errorf("a record too large reached Twenty")
	}
}

func TestCheckHealth(t *testing.T) {
	e := newEnv(t, nil)
	if n := len(e.mock.requests()); n == 0 {
		t.Fatal("the host did not probe health while starting")
	}
	if err := e.conn.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	reqs := e.mock.requests()
	r := reqs[len(reqs)-1]
	if r.Method != "GET" || r.Path != "/rest/people" || r.Query.Encode() != "limit=1" {
		t.Fatalf("health probe sent %s %s?%s", r.Method, r.Path, r.Query.Encode())
	}
	checkAuth(t, r, e.mock.token)
}

func TestManifest(t *testing.T) {
	t.Run("default operations", func(t *testing.T) { testManifest(t, nil) })
	t.Run("every operation", func(t *testing.T) { testManifest(t, allOperationsFile(t)) })
}

func testManifest(t *testing.T, edit func(hostsdk.SettingValues)) {
	e := newEnv(t, edit)
	m, err := e.conn.Manifest(context.Background(), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
		t.Fatal(err)
	}
	if m.Agent.ID != "agent:twenty:"+workspace {
		t.Errorf("agent %s", m.Agent.ID)
	}
	var ids []string
	for _, c := range m.Capabilities {
		ids = append(ids, c.ID)
		if !strings.HasPrefix(c.ID, CapabilityPrefix) || c.Description == "" || c.Risk == "" {
			t.Errorf("capability %+v", c)
		}
		if c.RequiresHumanApproval == nil || *c.RequiresHumanApproval {
			t.Errorf("%s requires approval", c.ID)
		}
		// Reads are retry-safe; mutations write, need an idempotency key
		// and are never retried.
		op, _ := lookup(strings.TrimPrefix(c.ID, CapabilityPrefix))
		mutation := op.mutation
		if want := map[string]bool{OpCreate: true, OpUpdate: true, OpSoftDelete: true, OpCreateMany: true, OpUpdateMany: true,
			OpSoftDeleteMany: true, OpRestore: true, OpRestoreMany: true, OpMerge: true, OpDestroy: true, OpDestroyMany: true,
			OpIngest: true, OpIngestMany: true}[op.op]; want != mutation {
			t.Errorf("%s: mutation %v in the table, want %v", c.ID, mutation, want)
		}
		if k := c.Contract; k == nil || k.Validate() != nil {
			t.Errorf("%s: contract %+v is missing or invalid", c.ID, k)
		} else if writes := slices.Contains(k.SideEffects, aip.EffectWrite); writes != mutation || k.Execution.SupportsRetry == mutation ||
			(k.Idempotency.Requirement == aip.IdempotencyRequired) != mutation {
			t.Errorf("%s: contract %+v does not say it is a mutation (%v)", c.ID, k, mutation)
		} else if deletes := map[string]bool{OpSoftDelete: true, OpSoftDeleteMany: true, OpDestroy: true, OpDestroyMany: true,
			OpMerge: true}[op.op]; slices.Contains(k.SideEffects, aip.EffectDelete) != deletes {
			t.Errorf("%s: side effects %v, want delete %v", c.ID, k.SideEffects, deletes)
		}
		var s struct {
			Type       string         `json:"type"`
			Required   []string       `json:"required"`
			Additional *bool          `json:"additionalProperties"`
			Props      map[string]any `json:"properties"`
		}
		if err := json.Unmarshal(c.InputSchema, &s); err != nil || s.Type != "object" || s.Required == nil ||
			s.Additional == nil || *s.Additional {
			t.Errorf("%s input schema is not strict: %s", c.ID, c.InputSchema)
		}
		if obj, ok := s.Props["object"].(map[string]any); ok {
			enum := []any{"people", "companies", "invoices"}
			if op.ingest {
				enum = []any{"people"} // the ingest policy's objects
			}
			if d := cmp.Diff(enum, obj["enum"]); d != "" {
				t.Errorf("%s object enum (-want +got):\n%s", c.ID, d)
			}
		} else if !op.objectless {
			t.Errorf("%s has no object input", c.ID)
		}
		if op.objectless && s.Props["object"] != nil {
			t.Errorf("%s takes an object it does not use", c.ID)
		}
	}
	// Without --twenty-operations-file: every operation but the permanent
	// deletes, merge and the ingests; with all listed, the reference's 24 less
	// the three metadata writes (create, update, delete), plus
	// metadata.fields.
	want := []string{"cap:twenty:record.list", "cap:twenty:record.get", "cap:twenty:record.find_duplicates",
		"cap:twenty:record.group_by", "cap:twenty:record.create", "cap:twenty:record.create_many", "cap:twenty:record.update",
		"cap:twenty:record.update_many", "cap:twenty:record.soft_delete", "cap:twenty:record.soft_delete_many",
		"cap:twenty:record.restore", "cap:twenty:record.restore_many", "cap:twenty:metadata.list",
		"cap:twenty:metadata.get", "cap:twenty:metadata.fields", "cap:twenty:openapi.core", "cap:twenty:openapi.metadata"}
	if edit != nil {
		want = []string{"cap:twenty:record.list", "cap:twenty:record.get", "cap:twenty:record.find_duplicates",
			"cap:twenty:record.group_by", "cap:twenty:record.create", "cap:twenty:record.create_many", "cap:twenty:record.ingest",
			"cap:twenty:record.ingest_many", "cap:twenty:record.update", "cap:twenty:record.update_many", "cap:twenty:record.soft_delete",
			"cap:twenty:record.soft_delete_many", "cap:twenty:record.restore", "cap:twenty:record.restore_many",
			"cap:twenty:record.destroy", "cap:twenty:record.destroy_many", "cap:twenty:record.merge", "cap:twenty:metadata.list",
			"cap:twenty:metadata.get", "cap:twenty:metadata.fields", "cap:twenty:openapi.core", "cap:twenty:openapi.metadata"}
	}
	if d := cmp.Diff(want, ids); d != "" {
		t.Errorf("capabilities (-want +got):\n%s", d)
	}
	if len(m.Channels) != 0 {
		t.Errorf("channels without a webhook secret: %s", m.Channels)
	}
	raw, _ := json.Marshal(m)
	if strings.Contains(string(raw), e.mock.token) {
		t.Error("the manifest carries the API key")
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, "token", "key", 0o600)
	open := filepath.Join(dir, "open")
	os.WriteFile(open, []byte("key"), 0o644)
	os.Chmod(open, 0o644)
	base := func() hostsdk.SettingValues {
		return hostsdk.SettingValues{FlagBaseURL: "https://crm.example.com", FlagWorkspaceID: workspace, FlagAPITokenFile: good}
	}
	for _, tc := range []struct {
		name, want string
		edit       func(hostsdk.SettingValues)
	}{
		{"no base URL", "--twenty-base-url", func(v hostsdk.SettingValues) { delete(v, FlagBaseURL) }},
		{"http to a public host name", "use https", func(v hostsdk.SettingValues) { v[FlagBaseURL] = "http://crm.example.com" }},
		{"http to a public IP with the override", "public IP", func(v hostsdk.SettingValues) {
			v[FlagBaseURL] = "http://8.8.8.8:3000"
			v[FlagAllowInsecureHTTP] = "true"
		}},
		{"base URL with a query", "--twenty-base-url", func(v hostsdk.SettingValues) { v[FlagBaseURL] = "https://crm.example.com/?a=1" }},
		{"no workspace", "--twenty-workspace-id", func(v hostsdk.SettingValues) { delete(v, FlagWorkspaceID) }},
		{"workspace not a UUID", "--twenty-workspace-id", func(v hostsdk.SettingValues) { v[FlagWorkspaceID] = "workspace-1" }},
		{"workspace UUID v7", "--twenty-workspace-id", func(v hostsdk.SettingValues) {
			v[FlagWorkspaceID] = "01890a5d-ac96-774b-bcce-b302099a8057"
		}},
		{"no token file", "--twenty-api-token-file", func(v hostsdk.SettingValues) { delete(v, FlagAPITokenFile) }},
		{"missing token file", "--twenty-api-token-file", func(v hostsdk.SettingValues) { v[FlagAPITokenFile] = filepath.Join(dir, "nope") }},
		{"token file readable by others", "--twenty-api-token-file", func(v hostsdk.SettingValues) { v[FlagAPITokenFile] = open }},
		{"webhook secret readable by others", "--twenty-webhook-secret-file", func(v hostsdk.SettingValues) { v[FlagWebhookSecretFile] = open }},
		{"bad object name", "--twenty-objects", func(v hostsdk.SettingValues) { v[FlagObjects] = "people,Companies" }},
		{"object path segment", "--twenty-objects", func(v hostsdk.SettingValues) { v[FlagObjects] = "people/x" }},
		{"reserved object", "--twenty-objects", func(v hostsdk.SettingValues) { v[FlagObjects] = "batch" }},
		{"reserved object restore", "--twenty-objects", func(v hostsdk.SettingValues) { v[FlagObjects] = "people,restore" }},
		{"duplicate object", "--twenty-objects", func(v hostsdk.SettingValues) { v[FlagObjects] = "people,people" }},
		{"empty objects", "--twenty-objects", func(v hostsdk.SettingValues) { v[FlagObjects] = "" }},
	} {
		v := base()
		tc.edit(v)
		_, err := Product.New(v, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.want)
		}
		if err != nil && !errors.Is(err, hostsdk.ErrSetting) {
			t.Errorf("%s: error %q does not match hostsdk.ErrSetting (aip-host would exit 1, not 2)", tc.name, err)
		}
	}
	// Accepted: a private-network http server with the override, loopback
	// http without it, the default objects.
	for _, edit := range []func(hostsdk.SettingValues){
		func(v hostsdk.SettingValues) {
			v[FlagBaseURL] = "http://10.0.0.5:3000"
			v[FlagAllowInsecureHTTP] = "true"
		},
		func(v hostsdk.SettingValues) {
			v[FlagBaseURL] = "http://twenty.internal:3000"
			v[FlagAllowInsecureHTTP] = "true"
		},
		func(v hostsdk.SettingValues) { v[FlagBaseURL] = "http://127.0.0.1:3000" },
	} {
		v := base()
		edit(v)
		c, err := newFromSettings(v, nil)
		if err != nil {
			t.Errorf("%v: %v", v, err)
			continue
		}
		if got := c.(*Connector).cfg.Objects; len(got) != 5 || got[0] != "people" {
			t.Errorf("default objects %v", got)
		}
	}
	// The settings as aip-host reads them: names and variables.
	for _, s := range Product.Settings {
		if !strings.HasPrefix(s.Flag, "twenty-") || !strings.HasPrefix(s.Env, "AIP_TWENTY_") {
			t.Errorf("setting %s / %s", s.Flag, s.Env)
		}
	}
}

func retryable(pe *aip.ProtocolError) bool { return pe.Retryable != nil && *pe.Retryable }

// TestIdempotencyKeyScoped: a mutation's AIP idempotency key goes to
// Twenty scoped to the tenant and the capability, never as it is (a
// Twenty server and key shared by several tenants' hosts must not see two
// tenants' equal keys as one), and a key that is not a valid header value
// (a control character, which net/http refuses to send, leaving a
// mutation that was never sent outcome_unknown) still lets it run.
func TestIdempotencyKeyScoped(t *testing.T) {
	e := newEnv(t, nil)
	for _, key := range []string{"order-42", "line\nbreak"} {
		a := action(OpCreate, `{"object":"people","record":{"jobTitle":"Engineer"}}`)
		a.IdempotencyKey = key
		e.complete(t, a, &recordOut{})
		got := e.mock.last(t).Header.Get("Idempotency-Key")
		if want := provider.ScopedIdempotencyKey(hostsdktest.TenantID, a.CapabilityID, key); got != want {
			t.Errorf("key %q sent as %q, want %q", key, got, want)
		}
	}
}

// TestAnswersOfTheWrongShape: a 2xx answer whose records, duplicates,
// groups or metadata are not an array of objects (what the output
// schemas promise) is a bad answer: a read fails with
// provider.bad_response, and a mutation, which Twenty may have applied,
// is outcome_unknown and never sent again — never a failed result (the
// host refuses an output its schema does not describe as failed,
// inviting a resend of a mutation that was applied).
func TestAnswersOfTheWrongShape(t *testing.T) {
	id := "11111111-1111-4111-8111-111111111111"
	for _, tc := range []struct {
		name     string
		a        *aip.Action
		answer   string
		mutation bool
	}{
		{"create_many", action(OpCreateMany, `{"object":"people","records":[{"jobTitle":"x"}]}`),
			`{"data":{"createPeople":["` + id + `"]}}`, true},
		{"update_many", action(OpUpdateMany, `{"object":"people","filter":"city[eq]:Paris","record":{"city":"Lyon"}}`),
			`{"data":{"updatePeople":[null]}}`, true},
		{"soft_delete_many", action(OpSoftDeleteMany, `{"object":"people","filter":"city[eq]:Paris"}`),
			`{"data":{"deletePeople":["` + id + `"]}}`, true},
		{"restore_many", action(OpRestoreMany, `{"object":"people","filter":"city[eq]:Paris"}`),
			`{"data":{"restorePeople":[[]]}}`, true},
		{"list", action(OpList, `{"object":"people"}`),
			`{"data":{"people":[1,2]},"pageInfo":{},"totalCount":2}`, false},
		{"list page info", action(OpList, `{"object":"people"}`),
			`{"data":{"people":[]},"pageInfo":"next","totalCount":0}`, false},
		{"find_duplicates", action(OpFindDuplicates, `{"object":"people","ids":["`+id+`"]}`),
			`{"data":["x"]}`, false},
		{"group_by", action(OpGroupBy, `{"object":"people","group_by":[{"city":true}]}`),
			`{"data":{"peopleGroupBy":[true]}}`, false},
		{"metadata.list", action(OpMetadataList, `{}`),
			`{"data":{"objects":["people"]}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.mock.setFail(func(r *http.Request) (int, string, bool) {
				if r.Method == http.MethodGet && r.URL.Query().Get("limit") == "1" && strings.HasPrefix(r.URL.Query().Get("filter"), "and(") {
					return 0, "", false // the filter forms' count: the mock answers
				}
				return 200, tc.answer, true
			})
			if !tc.mutation {
				if pe := failedCode(t, e.Result(t, tc.a)); pe.Code != provider.CodeBadResponse {
					t.Errorf("%s answered %s: %+v, want %s", tc.name, tc.answer, pe, provider.CodeBadResponse)
				}
				return
			}
			ctx := hostsdktest.Context(t)
			if _, err := e.Dispatcher.Act(ctx, e.Target, tc.a); err != nil {
				t.Fatal(err)
			}
			st, _, err := e.Dispatcher.Status(ctx, e.Target, tc.a.ID, tc.a.CapabilityID)
			if err != nil || st.State != aip.StateOutcomeUnknown {
				t.Fatalf("%s answered %s: status %+v, %v; want outcome_unknown", tc.name, tc.answer, st, err)
			}
		})
	}
}

// TestFieldsCapped: api.mdx, "Selecting fields (REST)": without fields,
// a record of an object with more than 200 fields comes back with 200 of
// them and the answer carries X-Twenty-Fields-Capped: true and
// X-Twenty-Fields-Max: 200. The output says so (fields_capped,
// fields_max), so that a missing field is not taken for an empty one;
// with fields, nothing is capped.
func TestFieldsCapped(t *testing.T) {
	e := newEnv(t, nil)
	wide := map[string]any{"name": "Ada"}
	for i := range 250 {
		wide[fmt.Sprintf("custom%03d", i)] = i
	}
	id := e.mock.seed("people", wide)[0]
	type capped struct {
		Record       map[string]any   `json:"record"`
		Records      []map[string]any `json:"records"`
		FieldsCapped bool             `json:"fields_capped"`
		FieldsMax    int              `json:"fields_max"`
	}
	for _, a := range []*aip.Action{
		action(OpList, `{"object":"people"}`),
		action(OpGet, `{"object":"people","id":"`+id+`"}`),
	} {
		var out capped
		e.complete(t, a, &out)
		rec := out.Record
		if len(out.Records) == 1 {
			rec = out.Records[0]
		}
		if len(rec) != 200 || !out.FieldsCapped || out.FieldsMax != 200 {
			t.Errorf("%s: %d fields, fields_capped %v, fields_max %d; want 200, true, 200", a.CapabilityID, len(rec), out.FieldsCapped, out.FieldsMax)
		}
	}
	for _, a := range []*aip.Action{
		action(OpList, `{"object":"people","fields":["custom249"]}`),
		action(OpGet, `{"object":"people","id":"`+id+`","fields":["custom249"]}`),
	} {
		res := e.Result(t, a)
		var out capped
		if err := json.Unmarshal(res.Output, &out); err != nil {
			t.Fatal(err)
		}
		rec := out.Record
		if len(out.Records) == 1 {
			rec = out.Records[0]
		}
		if len(rec) != 2 || rec["custom249"] == nil || strings.Contains(string(res.Output), "fields_") {
			t.Errorf("%s with fields: %s", a.CapabilityID, res.Output)
		}
	}
}

// TestNewErrorsStartWithTheSetting: New's "twenty: no base URL" read
// "aip-host: twenty: twenty: ..." when aip-host printed it after the
// product's name; New's errors start with the setting, as the others do.
func TestNewErrorsStartWithTheSetting(t *testing.T) {
	_, err := New(Config{})
	if err == nil || err.Error() != "no base URL; set --"+FlagBaseURL {
		t.Errorf("New(Config{}): %v; want %q", err, "no base URL; set --"+FlagBaseURL)
	}
}
