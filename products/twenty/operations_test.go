package twenty

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// testIngestPolicy lets record.ingest[_many] write people's name, city
// and jobTitle, at most 2 records a batch.
const testIngestPolicy = `{"version":"aip.twenty.idempotent-ingest-policy/v1",
	"objects":{"people":{"fields":["name","city","jobTitle"],"maxBatchRecords":2}}}`

// allOperationsFile admits every operation, the permanent deletes and the
// ingests (with testIngestPolicy) included.
func allOperationsFile(t *testing.T) func(v hostsdk.SettingValues) {
	return func(v hostsdk.SettingValues) {
		raw, _ := json.Marshal(allOperations())
		v[FlagOperationsFile] = writeFile(t, "operations.json", string(raw), 0o600)
		v[FlagIngestPolicyFile] = writeFile(t, "ingest.json", testIngestPolicy, 0o600)
	}
}

// seed creates records through the mock's own store and returns their IDs.
func (m *mockTwenty) seed(plural string, recs ...map[string]any) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for _, r := range recs {
		m.create(plural, r)
		ids = append(ids, r["id"].(string))
	}
	return ids
}

// allRecords is the condition the filter forms add to the caller's
// filter: every record, soft-deleted ones included.
const allRecords = "or(deletedAt[is]:NULL,deletedAt[is]:NOT_NULL)"

// TestBatchAndRestoreOperations runs the filter-form batches, restore,
// the permanent deletes and merge through a host and checks each request
// Twenty received and each output.
func TestBatchAndRestoreOperations(t *testing.T) {
	e := newEnv(t, allOperationsFile(t))
	ids := e.mock.seed("people",
		map[string]any{"name": "Ada", "city": "London"},
		map[string]any{"name": "Grace", "city": "London"},
		map[string]any{"name": "Alan", "city": "Manchester"},
		map[string]any{"name": "Ada", "jobTitle": "Engineer"},
	)

	type check struct {
		method, path string
		query        url.Values
		body         string // JSON; "" for none
	}
	for _, tc := range []struct {
		name, op, input string
		want            check
		out             func(t *testing.T, raw json.RawMessage)
	}{
		{"update_many", OpUpdateMany, `{"object":"people","filter":"city[eq]:\"London\"","record":{"jobTitle":"Analyst"}}`,
			// The filter forms send their count's filter, soft-deleted
			// matches included.
			check{"PATCH", "/rest/people", url.Values{"filter": {`and(city[eq]:"London",` + allRecords + `)`}}, `{"jobTitle":"Analyst"}`},
			func(t *testing.T, raw json.RawMessage) {
				var out listOut
				json.Unmarshal(raw, &out)
				if out.Object != "people" || len(out.Records) != 2 || out.Records[0]["jobTitle"] != "Analyst" || out.Records[1]["name"] != "Grace" {
					t.Errorf("update_many output %s", raw)
				}
				if e.mock.record("people", ids[2])["jobTitle"] != nil {
					t.Error("update_many changed a record outside the filter")
				}
			}},
		{"soft_delete_many", OpSoftDeleteMany, `{"object":"people","filter":"id[in]:[` + ids[0] + `,` + ids[1] + `]"}`,
			check{"DELETE", "/rest/people", url.Values{"filter": {"and(id[in]:[" + ids[0] + "," + ids[1] + "]," + allRecords + ")"}, "soft_delete": {"true"}}, ""},
			func(t *testing.T, raw json.RawMessage) {
				jsonEqual(t, "soft_delete_many output", string(raw), `{"object":"people","records":[{"id":"`+ids[0]+`"},{"id":"`+ids[1]+`"}]}`)
				if r := e.mock.record("people", ids[1]); r == nil || r["deletedAt"] == nil {
					t.Errorf("after soft_delete_many %v; want it kept with deletedAt", r)
				}
			}},
		{"restore", OpRestore, `{"object":"people","id":"` + ids[0] + `"}`,
			check{"PATCH", "/rest/restore/people/" + ids[0], url.Values{}, ""},
			func(t *testing.T, raw json.RawMessage) {
				var out recordOut
				json.Unmarshal(raw, &out)
				if out.Object != "people" || out.Record["id"] != ids[0] || out.Record["deletedAt"] != nil {
					t.Errorf("restore output %s", raw)
				}
				if e.mock.record("people", ids[0])["deletedAt"] != nil {
					t.Error("restore left the record deleted")
				}
			}},
		{"restore_many", OpRestoreMany, `{"object":"people","filter":"city[eq]:London"}`,
			check{"PATCH", "/rest/restore/people", url.Values{"filter": {"and(city[eq]:London," + allRecords + ")"}}, ""},
			func(t *testing.T, raw json.RawMessage) {
				var out listOut
				json.Unmarshal(raw, &out)
				// Only Grace was still deleted, but Twenty restores (and
				// answers) every match: Ada too.
				if out.Object != "people" || len(out.Records) != 2 || out.Records[0]["id"] != ids[0] || out.Records[1]["id"] != ids[1] {
					t.Errorf("restore_many output %s", raw)
				}
			}},
		{"merge dry run", OpMerge, `{"object":"people","ids":["` + ids[3] + `","` + ids[0] + `"],"conflict_priority_index":1,"dry_run":true,"depth":0}`,
			check{"PATCH", "/rest/people/merge", url.Values{"depth": {"0"}}, `{"ids":["` + ids[3] + `","` + ids[0] + `"],"conflictPriorityIndex":1,"dryRun":true}`},
			func(t *testing.T, raw json.RawMessage) {
				var out recordOut
				json.Unmarshal(raw, &out)
				if id, _ := out.Record["id"].(string); id == "" || slices.Contains(ids, id) || out.Record["deletedAt"] == nil ||
					out.Record["jobTitle"] != "Analyst" || out.Record["city"] != "London" {
					t.Errorf("merge preview %s", raw)
				}
				if e.mock.record("people", ids[3])["deletedAt"] != nil {
					t.Error("a dry run merged")
				}
			}},
		{"merge", OpMerge, `{"object":"people","ids":["` + ids[3] + `","` + ids[0] + `"],"conflict_priority_index":0}`,
			check{"PATCH", "/rest/people/merge", url.Values{}, `{"ids":["` + ids[3] + `","` + ids[0] + `"],"conflictPriorityIndex":0,"dryRun":false}`},
			func(t *testing.T, raw json.RawMessage) {
				var out recordOut
				json.Unmarshal(raw, &out)
				if out.Object != "people" || out.Record["id"] != ids[3] || out.Record["jobTitle"] != "Engineer" || out.Record["city"] != "London" {
					t.Errorf("merge output %s", raw)
				}
				if e.mock.record("people", ids[0])["deletedAt"] == nil {
					t.Error("merge kept the other record")
				}
			}},
		{"destroy", OpDestroy, `{"object":"people","id":"` + ids[2] + `"}`,
			check{"DELETE", "/rest/people/" + ids[2], url.Values{"soft_delete": {"false"}}, ""},
			func(t *testing.T, raw json.RawMessage) {
				jsonEqual(t, "destroy output", string(raw), `{"object":"people","record":{"id":"`+ids[2]+`"}}`)
				if e.mock.record("people", ids[2]) != nil {
					t.Error("destroy left the record")
				}
			}},
		{"destroy_many", OpDestroyMany, `{"object":"people","filter":"name[eq]:Grace"}`,
			check{"DELETE", "/rest/people", url.Values{"filter": {"and(name[eq]:Grace," + allRecords + ")"}, "soft_delete": {"false"}}, ""},
			func(t *testing.T, raw json.RawMessage) {
				jsonEqual(t, "destroy_many output", string(raw), `{"object":"people","records":[{"id":"`+ids[1]+`"}]}`)
				if e.mock.record("people", ids[1]) != nil {
					t.Error("destroy_many left the record")
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := action(tc.op, tc.input)
			res := e.Result(t, a)
			if res.Status != aip.ResultCompleted {
				t.Fatalf("%s %+v", res.Status, res.Error)
			}
			r := e.mock.last(t)
			if r.Method != tc.want.method || r.Path != tc.want.path {
				t.Fatalf("sent %s %s, want %s %s", r.Method, r.Path, tc.want.method, tc.want.path)
			}
			if d := cmp.Diff(tc.want.query, r.Query); d != "" {
				t.Errorf("query (-want +got):\n%s", d)
			}
			if tc.want.body == "" {
				if r.Body != "" {
					t.Errorf("body %q, want none", r.Body)
				}
			} else {
				jsonEqual(t, "body", r.Body, tc.want.body)
				if ct := r.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
			}
			checkAuth(t, r, e.mock.token)
			checkMutationHeaders(t, r, a)
			tc.out(t, res.Output)
		})
	}
}

// TestReadOperations runs the new reads (duplicates, group by, metadata
// get and fields, the OpenAPI documents) through a host.
func TestReadOperations(t *testing.T) {
	e := newEnv(t, nil)
	ids := e.mock.seed("companies",
		map[string]any{"name": "Acme", "city": "Paris"},
		map[string]any{"name": "Acme", "city": "Lyon"},
		map[string]any{"name": "Globex", "city": "Paris"},
	)
	objectID := "00000000-0000-4000-a000-000000000001"
	fieldID := "00000000-0000-4000-b000-000000000002"
	type check struct {
		method, path string
		query        url.Values
		body         string
	}
	for _, tc := range []struct {
		name, op, input string
		want            check
		out             string // the output, as JSON
	}{
		{"find_duplicates by ids", OpFindDuplicates, `{"object":"companies","ids":["` + ids[0] + `"],"depth":0}`,
			check{"POST", "/rest/companies/duplicates", url.Values{"depth": {"0"}}, `{"ids":["` + ids[0] + `"]}`},
			`{"object":"companies","duplicates":[{"totalCount":1,"pageInfo":{"hasNextPage":false},
				"companyDuplicates":[{"id":"` + ids[1] + `","name":"Acme","city":"Lyon","createdAt":"2026-11-30T10:00:00.000Z"}]}]}`},
		{"find_duplicates by records", OpFindDuplicates, `{"object":"companies","records":[{"name":"Globex"},{"name":"Initech"}]}`,
			check{"POST", "/rest/companies/duplicates", url.Values{}, `{"data":[{"name":"Globex"},{"name":"Initech"}]}`},
			`{"object":"companies","duplicates":[
				{"totalCount":1,"pageInfo":{"hasNextPage":false},"companyDuplicates":[{"id":"` + ids[2] + `","name":"Globex","city":"Paris","createdAt":"2026-11-30T10:00:00.000Z"}]},
				{"totalCount":0,"pageInfo":{"hasNextPage":false},"companyDuplicates":[]}]}`},
		{"group_by", OpGroupBy, `{"object":"companies","group_by":[ {"city": true} ],"filter":"name[eq]:Acme","limit":10}`,
			check{"GET", "/rest/companies/groupBy", url.Values{"group_by": {`[{"city":true}]`}, "filter": {"name[eq]:Acme"}, "limit": {"10"}}, ""},
			`{"object":"companies","groups":[{"groupByDimensionValues":["Lyon"],"totalCount":1},{"groupByDimensionValues":["Paris"],"totalCount":1}]}`},
		{"metadata.get object", OpMetadataGet, `{"resource":"objects","id":"` + objectID + `"}`,
			check{"GET", "/rest/metadata/objects/" + objectID, url.Values{}, ""},
			`{"resource":"objects","item":{"id":"` + objectID + `","namePlural":"companies","nameSingular":"company","isActive":true}}`},
		{"metadata.get field", OpMetadataGet, `{"resource":"fields","id":"` + fieldID + `"}`,
			check{"GET", "/rest/metadata/fields/" + fieldID, url.Values{}, ""},
			`{"resource":"fields","item":{"id":"` + fieldID + `","name":"name","type":"TEXT","objectMetadataId":"00000000-0000-4000-a000-000000000002"}}`},
		{"metadata.fields", OpMetadataFields, `{"limit":1,"starting_after":"m0"}`,
			check{"GET", "/rest/metadata/fields", url.Values{"limit": {"1"}, "starting_after": {"m0"}}, ""},
			`{"fields":[{"id":"00000000-0000-4000-b000-000000000001","name":"name","type":"TEXT","objectMetadataId":"00000000-0000-4000-a000-000000000001"}],
				"page_info":{"hasNextPage":false,"startCursor":"m0","endCursor":"m1"},"total_count":1}`},
		{"openapi.core", OpOpenAPICore, `{}`, check{"GET", "/rest/open-api/core", url.Values{}, ""},
			`{"document":{"openapi":"3.1.1","info":{"title":"Twenty Api","version":"core"},"servers":[{"url":"` + e.mock.srv.URL + `/rest"}],"paths":{"/people":{}}}}`},
		{"openapi.metadata", OpOpenAPIMeta, `{}`, check{"GET", "/rest/open-api/metadata", url.Values{}, ""},
			`{"document":{"openapi":"3.1.1","info":{"title":"Twenty Api","version":"metadata"},"servers":[{"url":"` + e.mock.srv.URL + `/rest"}],"paths":{"/people":{}}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.Result(t, action(tc.op, tc.input))
			if res.Status != aip.ResultCompleted {
				t.Fatalf("%s %+v", res.Status, res.Error)
			}
			r := e.mock.last(t)
			if r.Method != tc.want.method || r.Path != tc.want.path {
				t.Fatalf("sent %s %s, want %s %s", r.Method, r.Path, tc.want.method, tc.want.path)
			}
			if d := cmp.Diff(tc.want.query, r.Query); d != "" {
				t.Errorf("query (-want +got):\n%s", d)
			}
			if tc.want.body == "" {
				if r.Body != "" {
					t.Errorf("body %q, want none", r.Body)
				}
			} else {
				jsonEqual(t, "body", r.Body, tc.want.body)
			}
			checkAuth(t, r, e.mock.token)
			// Reads carry no idempotency headers, the POST of duplicates
			// included.
			if r.Header.Get("Idempotency-Key") != "" || r.Header.Get("X-AIP-Action-ID") != "" {
				t.Errorf("a read sent mutation headers")
			}
			jsonEqual(t, "output", string(res.Output), tc.out)
		})
	}
}

// TestNewOperationErrors: a read sent as a POST is retryable on a 5xx
// (not outcome_unknown); a document that is not OpenAPI is a bad
// response; an unknown metadata ID is not found; filter-form mutations,
// restore, merge and destroy that get a 5xx or no answer are
// outcome_unknown and never sent again.
func TestNewOperationErrors(t *testing.T) {
	e := newEnv(t, allOperationsFile(t))
	e.mock.setFail(func(r *http.Request) (int, string, bool) {
		return 503, `{"statusCode":503,"error":"ServiceUnavailableException","messages":["down"]}`, true
	})
	pe := failedCode(t, e.Result(t, action(OpFindDuplicates, `{"object":"people","ids":["11111111-1111-4111-8111-111111111111"]}`)))
	if pe.Code != provider.CodeUnavailable || !retryable(pe) {
		t.Errorf("503 on find_duplicates: %+v", pe)
	}
	e.mock.setFail(func(r *http.Request) (int, string, bool) { return 200, `<html>Twenty</html>`, true })
	if pe = failedCode(t, e.Result(t, action(OpOpenAPICore, `{}`))); pe.Code != provider.CodeBadResponse {
		t.Errorf("HTML for the OpenAPI document: %+v", pe)
	}
	e.mock.setFail(func(r *http.Request) (int, string, bool) { return 200, `{"data":{}}`, true })
	if pe = failedCode(t, e.Result(t, action(OpOpenAPIMeta, `{}`))); pe.Code != provider.CodeBadResponse {
		t.Errorf("a data envelope for the OpenAPI document: %+v", pe)
	}
	if pe = failedCode(t, e.Result(t, action(OpGroupBy, `{"object":"people","group_by":[{"city":true}]}`))); pe.Code != provider.CodeBadResponse {
		t.Errorf("group_by answer without groups: %+v", pe)
	}
	e.mock.setFail(nil)
	if pe = failedCode(t, e.Result(t, action(OpMetadataGet, `{"resource":"objects","id":"11111111-1111-4111-8111-111111111111"}`))); pe.Code != provider.CodeNotFound {
		t.Errorf("unknown object metadata: %+v", pe)
	}
	// Twenty refusing a filter: 400 on its count is a failed read, 400 on
	// the mutation is failed, not unknown.
	if pe = failedCode(t, e.Result(t, action(OpSoftDeleteMany, `{"object":"people","filter":"a[zz]:1"}`))); pe.Code != provider.CodeInvalidRequest || retryable(pe) {
		t.Errorf("400 on soft_delete_many's count: %+v", pe)
	}
	e.mock.setFail(func(r *http.Request) (int, string, bool) {
		if r.Method == http.MethodGet {
			return 0, "", false
		}
		return 400, `{"statusCode":400,"error":"BadRequestException","messages":["'filter' invalid"]}`, true
	})
	if pe = failedCode(t, e.Result(t, action(OpSoftDeleteMany, `{"object":"people","filter":"a[eq]:1"}`))); pe.Code != provider.CodeInvalidRequest || retryable(pe) {
		t.Errorf("400 on soft_delete_many: %+v", pe)
	}
	e.mock.setFail(nil)

	for _, tc := range []struct {
		name   string
		status int
		a      *aip.Action
	}{
		{"500 on update_many", 500, action(OpUpdateMany, `{"object":"people","filter":"city[eq]:x","record":{"jobTitle":"x"}}`)},
		{"dropped connection on restore", 0, action(OpRestore, `{"object":"people","id":"11111111-1111-4111-8111-111111111111"}`)},
		{"502 on merge", 502, action(OpMerge, `{"object":"people","ids":["11111111-1111-4111-8111-111111111111","22222222-2222-4222-8222-222222222222"],"conflict_priority_index":0}`)},
		{"500 on destroy_many", 500, action(OpDestroyMany, `{"object":"people","filter":"city[eq]:x"}`)},
		{"500 on ingest", 500, action(OpIngest, `{"object":"people","record":{"id":"11111111-1111-4111-8111-111111111111","city":"x"}}`)},
		{"2xx of the wrong shape on restore_many", 200, action(OpRestoreMany, `{"object":"people","filter":"city[eq]:x"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, allOperationsFile(t))
			e.mock.setFail(func(r *http.Request) (int, string, bool) {
				if r.Method == http.MethodGet {
					return 0, "", false // the filter forms' count
				}
				if tc.status == 200 {
					return 200, `{"data":{"restorePeople":{"id":"x"}}}`, true
				}
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
			if n := e.mock.writes(); n != 1 {
				t.Fatalf("the mock got %d mutations, want 1", n)
			}
			e.mock.setFail(nil)
			if _, err := e.Dispatcher.Act(ctx, e.Target, tc.a); err != nil {
				t.Fatal(err)
			}
			if n := e.mock.writes(); n != 1 {
				t.Fatalf("the same action was sent to Twenty again (%d requests)", n)
			}
		})
	}
}

// TestFilterMatchesBounded: update_many, soft_delete_many, restore_many
// and destroy_many count their filter's matches first and refuse more than
// MaxFilterMatches without changing anything; at the bound they run; a
// failed count is a failed read and nothing is sent.
func TestFilterMatchesBounded(t *testing.T) {
	e := newEnv(t, allOperationsFile(t))
	var paris []map[string]any
	for range MaxFilterMatches + 1 {
		paris = append(paris, map[string]any{"city": "Paris"})
	}
	e.mock.seed("people", paris...)
	e.mock.seed("people", map[string]any{"city": "Lyon"})
	for _, a := range []*aip.Action{
		action(OpUpdateMany, `{"object":"people","filter":"city[eq]:Paris","record":{"jobTitle":"x"}}`),
		action(OpSoftDeleteMany, `{"object":"people","filter":"city[eq]:Paris"}`),
		action(OpRestoreMany, `{"object":"people","filter":"city[eq]:Paris"}`),
		action(OpDestroyMany, `{"object":"people","filter":"city[eq]:Paris"}`),
	} {
		pe := failedCode(t, e.Result(t, a))
		if pe.Code != CodeTooManyMatches || retryable(pe) || !strings.Contains(pe.Message, "matches 61 people") {
			t.Errorf("%s over the bound: %+v", a.CapabilityID, pe)
		}
		r := e.mock.last(t)
		want := "and(city[eq]:Paris," + allRecords + ")"
		if r.Method != http.MethodGet || r.Query.Get("filter") != want || r.Query.Get("limit") != "1" {
			t.Errorf("%s: last request %s %s %v, want the count", a.CapabilityID, r.Method, r.Path, r.Query)
		}
	}
	if n := e.mock.writes(); n != 0 {
		t.Fatalf("%d mutations reached Twenty", n)
	}

	// At the bound: the action runs.
	e2 := newEnv(t, allOperationsFile(t))
	ids := e2.mock.seed("people", paris[:MaxFilterMatches]...)
	var out struct {
		Records []map[string]any `json:"records"`
	}
	e2.complete(t, action(OpSoftDeleteMany, `{"object":"people","filter":"city[eq]:Paris"}`), &out)
	if len(out.Records) != len(ids) {
		t.Errorf("soft_delete_many at the bound deleted %d records, want %d", len(out.Records), len(ids))
	}

	// A count that fails: a failed read, nothing sent.
	e2.mock.setFail(func(r *http.Request) (int, string, bool) {
		return 503, `{"statusCode":503,"error":"ServiceUnavailableException","messages":["down"]}`, true
	})
	before := e2.mock.writes()
	pe := failedCode(t, e2.Result(t, action(OpDestroyMany, `{"object":"people","filter":"city[eq]:Lyon"}`)))
	if pe.Code != provider.CodeUnavailable || !retryable(pe) {
		t.Errorf("count 503: %+v", pe)
	}
	if n := e2.mock.writes() - before; n != 0 {
		t.Errorf("%d mutations after a failed count", n)
	}
}

// TestOperationsAllowlist: the permanent deletes are offered only when
// --twenty-operations-file lists them, and a listed subset is all that is
// offered.
func TestOperationsAllowlist(t *testing.T) {
	id := "11111111-1111-4111-8111-111111111111"
	ids := func(c *Connector) []string {
		m, err := c.Manifest(context.Background(), hostsdk.TenantContext{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range m.Capabilities {
			out = append(out, strings.TrimPrefix(c.ID, CapabilityPrefix))
			if op, _ := lookup(strings.TrimPrefix(c.ID, CapabilityPrefix)); op.destructive && c.Risk != aip.RiskCritical {
				t.Errorf("%s: risk %s, want critical", c.ID, c.Risk)
			}
		}
		return out
	}

	// Default: no destroy, no merge (it deletes the merged-away records),
	// and the host refuses them without calling Twenty.
	e := newEnv(t, nil)
	if got := ids(e.conn); slices.Contains(got, OpDestroy) || slices.Contains(got, OpDestroyMany) || slices.Contains(got, OpMerge) || len(got) != len(operations)-5 ||
		slices.Contains(got, OpIngest) || slices.Contains(got, OpIngestMany) {
		t.Errorf("default operations %v", got)
	}
	for _, a := range []*aip.Action{
		action(OpDestroy, `{"object":"people","id":"`+id+`"}`),
		action(OpDestroyMany, `{"object":"people","filter":"city[eq]:x"}`),
		action(OpMerge, `{"object":"companies","ids":["`+id+`","22222222-2222-4222-8222-222222222222"],"conflict_priority_index":0}`),
	} {
		resp := e.Act(t, a)
		if res, err := resp.Result(); err == nil && res.Status == aip.ResultCompleted {
			t.Errorf("%s ran without being listed: %s", a.CapabilityID, resp.Raw)
		}
	}
	// The connector itself refuses an operation it does not offer.
	if _, err := e.conn.Handle(context.Background(), &hostsdk.Call{Action: action(OpDestroy, `{"object":"people","id":"`+id+`"}`)}); err == nil ||
		!strings.Contains(err.Error(), CodeUnknownCapability) {
		t.Errorf("Handle of an operation not offered: %v", err)
	}
	if n := e.mock.count(); n != 0 {
		t.Errorf("operations not offered reached Twenty %d times", n)
	}

	// A listed subset: exactly those, in manifest order.
	e = newEnv(t, func(v hostsdk.SettingValues) {
		v[FlagOperationsFile] = writeFile(t, "ops.json", `["record.destroy","record.list"]`, 0o644)
	})
	if d := cmp.Diff([]string{OpList, OpDestroy}, ids(e.conn)); d != "" {
		t.Errorf("listed operations (-want +got):\n%s", d)
	}
	resp := e.Act(t, action(OpGet, `{"object":"people","id":"`+id+`"}`))
	if res, err := resp.Result(); err == nil && res.Status == aip.ResultCompleted {
		t.Errorf("record.get ran without being listed")
	}

	// Errors name the setting.
	base := func() hostsdk.SettingValues {
		return hostsdk.SettingValues{FlagBaseURL: "https://crm.example.com", FlagWorkspaceID: workspace,
			FlagAPITokenFile: writeFile(t, "token", "key", 0o600)}
	}
	for name, content := range map[string]string{
		"unknown operation": `["record.list","record.purge"]`,
		"listed twice":      `["record.list","record.list"]`,
		"empty":             `[]`,
		"not an array":      `{"record.list":true}`,
		"trailing data":     `["record.list"] []`,
		"not strings":       `[1]`,
	} {
		v := base()
		v[FlagOperationsFile] = writeFile(t, "ops.json", content, 0o600)
		if _, err := newFromSettings(v, nil); err == nil || !strings.Contains(err.Error(), "--twenty-operations-file") {
			t.Errorf("%s: %v, want an error naming --twenty-operations-file", name, err)
		}
	}
	v := base()
	v[FlagOperationsFile] = writeFile(t, "ops.json", `["record.list"]`, 0o666)
	if _, err := newFromSettings(v, nil); err == nil || !strings.Contains(err.Error(), "--twenty-operations-file") {
		t.Errorf("operations file writable by others: %v", err)
	}
	if _, err := New(Config{BaseURL: &url.URL{Scheme: "https", Host: "crm.example.com"}, WorkspaceID: workspace,
		Token: provider.NewSecret("k"), Operations: []string{"record.nope"}}); err == nil || !strings.Contains(err.Error(), "record.nope") {
		t.Errorf("Config.Operations with an unknown operation: %v", err)
	}
}

func TestNewOperationInputsRejected(t *testing.T) {
	e := newEnv(t, allOperationsFile(t))
	id, id2 := `"11111111-1111-4111-8111-111111111111"`, `"22222222-2222-4222-8222-222222222222"`
	for name, a := range map[string]*aip.Action{
		"update_many without filter":    action(OpUpdateMany, `{"object":"people","record":{"a":1}}`),
		"update_many without fields":    action(OpUpdateMany, `{"object":"people","filter":"a[eq]:1","record":{}}`),
		"soft_delete_many empty filter": action(OpSoftDeleteMany, `{"object":"people","filter":""}`),
		"destroy_many without filter":   action(OpDestroyMany, `{"object":"people"}`),
		"restore_many without filter":   action(OpRestoreMany, `{"object":"people"}`),
		"restore id not a uuid":         action(OpRestore, `{"object":"people","id":"x/../y"}`),
		"destroy without id":            action(OpDestroy, `{"object":"people"}`),
		"duplicates ids and records":    action(OpFindDuplicates, `{"object":"people","ids":[`+id+`],"records":[{"a":1}]}`),
		"duplicates neither":            action(OpFindDuplicates, `{"object":"people"}`),
		"duplicates empty record":       action(OpFindDuplicates, `{"object":"people","records":[{}]}`),
		"merge one id":                  action(OpMerge, `{"object":"people","ids":[`+id+`],"conflict_priority_index":0}`),
		"merge same id twice":           action(OpMerge, `{"object":"people","ids":[`+id+`,`+id+`],"conflict_priority_index":0}`),
		"merge without index":           action(OpMerge, `{"object":"people","ids":[`+id+`,`+id2+`]}`),
		"group_by empty":                action(OpGroupBy, `{"object":"people","group_by":[]}`),
		"group_by two fields in one":    action(OpGroupBy, `{"object":"people","group_by":[{"a":true,"b":true}]}`),
		"metadata.get views":            action(OpMetadataGet, `{"resource":"views","id":`+id+`}`),
		"metadata.get with object":      action(OpMetadataGet, `{"resource":"objects","id":`+id+`,"object":"people"}`),
		"openapi.core with input":       action(OpOpenAPICore, `{"object":"people"}`),
		"metadata.fields limit 0":       action(OpMetadataFields, `{"limit":0}`),
	} {
		resp := e.Act(t, a)
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s: HTTP %d %s", name, resp.Status, resp.Raw)
		}
	}
	// What the schema cannot say, the connector checks: a failed result
	// with input_invalid.
	for name, a := range map[string]*aip.Action{
		"merge index past ids": action(OpMerge, `{"object":"people","ids":[`+id+`,`+id2+`],"conflict_priority_index":2}`),
		"group_by too large":   action(OpGroupBy, `{"object":"people","group_by":[{"a":{"x":"`+strings.Repeat("y", MaxGroupByBytes)+`"}}]}`),
	} {
		if pe := failedCode(t, e.Result(t, a)); pe.Code != hostsdk.CodeInputInvalid || retryable(pe) {
			t.Errorf("%s: %+v", name, pe)
		}
	}
	if n := e.mock.count(); n != 0 {
		t.Errorf("rejected inputs reached Twenty %d times", n)
	}
}

// TestIngest: record.ingest and record.ingest_many upsert by id with the
// fields the policy allows; sending the same record again leaves one
// record; inputs outside the policy never reach Twenty.
func TestIngest(t *testing.T) {
	e := newEnv(t, allOperationsFile(t))
	id1, id2 := "aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002"

	for i, city := range []string{"Paris", "Lyon"} {
		a := action(OpIngest, `{"object":"people","record":{"id":"`+id1+`","name":{"firstName":"Ada"},"city":"`+city+`"}}`)
		var out recordOut
		e.complete(t, a, &out)
		r := e.mock.last(t)
		if r.Method != "POST" || r.Path != "/rest/people" || r.Query.Encode() != "upsert=true" {
			t.Fatalf("ingest %d sent %s %s?%s", i, r.Method, r.Path, r.Query.Encode())
		}
		jsonEqual(t, "ingest body", r.Body, `{"id":"`+id1+`","name":{"firstName":"Ada"},"city":"`+city+`"}`)
		checkAuth(t, r, e.mock.token)
		checkMutationHeaders(t, r, a)
		if out.Object != "people" || out.Record["id"] != id1 || out.Record["city"] != city {
			t.Fatalf("ingest %d output %+v", i, out)
		}
	}
	var list listOut
	e.complete(t, action(OpList, `{"object":"people"}`), &list)
	if len(list.Records) != 1 || list.Records[0]["city"] != "Lyon" {
		t.Fatalf("after two ingests of one id: %+v", list.Records)
	}

	batch := action(OpIngestMany, `{"object":"people","records":[{"id":"`+id1+`","jobTitle":"CTO"},{"id":"`+id2+`","city":"Nice"}]}`)
	var many listOut
	e.complete(t, batch, &many)
	r := e.mock.last(t)
	if r.Method != "POST" || r.Path != "/rest/batch/people" || r.Query.Encode() != "upsert=true" {
		t.Fatalf("ingest_many sent %s %s?%s", r.Method, r.Path, r.Query.Encode())
	}
	jsonEqual(t, "ingest_many body", r.Body, `[{"id":"`+id1+`","jobTitle":"CTO"},{"id":"`+id2+`","city":"Nice"}]`)
	checkMutationHeaders(t, r, batch)
	if len(many.Records) != 2 || many.Records[0]["city"] != "Lyon" || many.Records[0]["jobTitle"] != "CTO" || many.Records[1]["id"] != id2 {
		t.Fatalf("ingest_many output %+v", many)
	}

	n := e.mock.count()
	for name, in := range map[string]string{
		"field not in the policy":     `{"object":"people","record":{"id":"` + id1 + `","emails":{}}}`,
		"no id":                       `{"object":"people","record":{"city":"x"}}`,
		"id alone":                    `{"object":"people","record":{"id":"` + id1 + `"}}`,
		"id not a uuid":               `{"object":"people","record":{"id":"p-1","city":"x"}}`,
		"object not in the policy":    `{"object":"companies","record":{"id":"` + id1 + `","name":"x"}}`,
		"many: above maxBatchRecords": `{"object":"people","records":[{"id":"` + id1 + `","city":"x"},{"id":"` + id2 + `","city":"x"},{"id":"aaaaaaaa-0000-4000-8000-000000000003","city":"x"}]}`,
		"many: field not allowed":     `{"object":"people","records":[{"id":"` + id1 + `","phones":"x"}]}`,
	} {
		op := OpIngest
		if strings.HasPrefix(name, "many") {
			op = OpIngestMany
		}
		resp := e.Act(t, action(op, in))
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s: HTTP %d %s", name, resp.Status, resp.Raw)
		}
	}
	// The same id twice in one batch: the connector refuses it.
	if pe := failedCode(t, e.Result(t, action(OpIngestMany, `{"object":"people","records":[{"id":"`+id1+`","city":"x"},{"id":"`+strings.ToUpper(id1)+`","city":"y"}]}`))); pe.Code != hostsdk.CodeInputInvalid {
		t.Errorf("repeated id: %+v", pe)
	}
	// Called without a host, the connector enforces the policy itself.
	if _, err := e.conn.Handle(context.Background(), &hostsdk.Call{Action: action(OpIngest, `{"object":"people","record":{"id":"`+id1+`","emails":{}}}`)}); err == nil ||
		!strings.Contains(err.Error(), `field "emails"`) {
		t.Errorf("Handle with a field outside the policy: %v", err)
	}
	// A caller's value the connector refuses is quoted cut to
	// provider.MaxExcerptBytes, not whole.
	long := strings.Repeat("x", 10000)
	for what, in := range map[string]string{
		"field":  `{"object":"people","record":{"id":"` + id1 + `","` + long + `":1}}`,
		"object": `{"object":"` + long + `","record":{"id":"` + id1 + `","city":"x"}}`,
	} {
		_, err := e.conn.Handle(context.Background(), &hostsdk.Call{Action: action(OpIngest, in)})
		if err == nil || !strings.Contains(err.Error(), what+` "`+long[:provider.MaxExcerptBytes]+`…"`) || len(err.Error()) > 300 {
			t.Errorf("Handle with the %s name %d bytes long: %.300v; want it quoted cut to %d bytes", what, len(long), err, provider.MaxExcerptBytes)
		}
	}
	if got := e.mock.count(); got != n {
		t.Errorf("inputs outside the policy reached Twenty %d times", got-n)
	}
}

// TestIngestManyRefusedAfterUpdates: Twenty's batch upsert updates the
// records it finds before it inserts the others, with no transaction
// around the two; an insert it refuses (400) leaves the updates written,
// so the action is outcome_unknown saying how to read what was written.
// A batch of one record is one statement or the other: its 400 stays a
// failed result.
func TestIngestManyRefusedAfterUpdates(t *testing.T) {
	e := newEnv(t, allOperationsFile(t))
	id1, id2 := "aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002"
	e.mock.seed("people", map[string]any{"id": id1, "city": "Paris"})
	e.mock.setRefuseInsert(func(rec map[string]any) string {
		if rec["city"] == "Atlantis" {
			return `duplicate key value violates unique constraint "IDX_UNIQUE_person_city"`
		}
		return ""
	})

	a := action(OpIngestMany, `{"object":"people","records":[{"id":"`+id1+`","city":"Rome"},{"id":"`+id2+`","city":"Atlantis"}]}`)
	resp := e.Act(t, a)
	pe := resp.ProtocolError()
	if resp.Status != http.StatusBadGateway || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown ||
		!strings.Contains(pe.Message, "may have written part of the batch") || !strings.Contains(pe.Message, "id[in]") ||
		!strings.Contains(pe.Message, "IDX_UNIQUE_person_city") {
		t.Fatalf("HTTP %d %+v, want outcome_unknown saying part may be written", resp.Status, pe)
	}
	st, _, err := e.Dispatcher.Status(hostsdktest.Context(t), e.Target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateOutcomeUnknown {
		t.Fatalf("status %+v, %v", st, err)
	}
	e.mock.mu.Lock()
	got := e.mock.find("people", id1)["city"]
	e.mock.mu.Unlock()
	if got != "Rome" {
		t.Fatalf("the mock did not write the update before refusing the insert (city %v)", got)
	}

	one := action(OpIngestMany, `{"object":"people","records":[{"id":"`+id2+`","city":"Atlantis"}]}`)
	if pe := failedCode(t, e.Result(t, one)); pe.Code != provider.CodeInvalidRequest {
		t.Errorf("a one-record batch refused: %+v, want failed %s", pe, provider.CodeInvalidRequest)
	}
}

func TestIngestPolicyConfig(t *testing.T) {
	base := func() hostsdk.SettingValues {
		return hostsdk.SettingValues{FlagBaseURL: "https://crm.example.com", FlagWorkspaceID: workspace,
			FlagAPITokenFile: writeFile(t, "token", "key", 0o600)}
	}
	const flag = "--twenty-idempotent-ingest-policy-file"
	for name, policy := range map[string]string{
		"wrong version":        `{"version":"v1","objects":{"people":{"fields":["city"]}}}`,
		"unknown member":       `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"people":{"fields":["city"],"max_batch_records":2}}}`,
		"no objects":           `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{}}`,
		"no fields":            `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"people":{"fields":[]}}}`,
		"id listed":            `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"people":{"fields":["id","city"]}}}`,
		"field twice":          `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"people":{"fields":["city","city"]}}}`,
		"bad field name":       `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"people":{"fields":["name.firstName"]}}}`,
		"batch above 60":       `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"people":{"fields":["city"],"maxBatchRecords":61}}}`,
		"object not in config": `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"invoices":{"fields":["amount"]}}}`,
		"trailing data":        `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"people":{"fields":["city"]}}} {}`,
	} {
		v := base()
		v[FlagIngestPolicyFile] = writeFile(t, "ingest.json", policy, 0o600)
		if _, err := newFromSettings(v, nil); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: %v, want an error naming %s", name, err, flag)
		}
	}
	v := base()
	v[FlagIngestPolicyFile] = writeFile(t, "ingest.json", testIngestPolicy, 0o666)
	if _, err := newFromSettings(v, nil); err == nil || !strings.Contains(err.Error(), flag) {
		t.Errorf("policy writable by others: %v", err)
	}
	// Listing the ingests without a policy names the policy setting.
	v = base()
	v[FlagOperationsFile] = writeFile(t, "ops.json", `["record.ingest"]`, 0o600)
	if _, err := newFromSettings(v, nil); err == nil || !strings.Contains(err.Error(), flag) {
		t.Errorf("ingest listed without a policy: %v", err)
	}
	// A policy alone offers nothing more: the ingests must be listed.
	v = base()
	v[FlagIngestPolicyFile] = writeFile(t, "ingest.json", testIngestPolicy, 0o600)
	c, err := newFromSettings(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.(*Connector).offered(); slices.Contains(got, OpIngest) || slices.Contains(got, OpIngestMany) {
		t.Errorf("a policy without the operations listed offers %v", got)
	}
	// maxBatchRecords defaults to Twenty's 60, and the schema says so.
	v[FlagOperationsFile] = writeFile(t, "ops.json", `["record.ingest_many"]`, 0o600)
	v[FlagIngestPolicyFile] = writeFile(t, "ingest.json", `{"version":"aip.twenty.idempotent-ingest-policy/v1","objects":{"people":{"fields":["city"]}}}`, 0o600)
	if c, err = newFromSettings(v, nil); err != nil {
		t.Fatal(err)
	}
	if got := c.(*Connector).cfg.IngestPolicy.Objects["people"].MaxBatchRecords; got != MaxBatchRecords {
		t.Errorf("default maxBatchRecords %d", got)
	}
	m, err := c.(*Connector).Manifest(context.Background(), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
		t.Fatal(err)
	}
	if len(m.Capabilities) != 1 || !strings.Contains(string(m.Capabilities[0].InputSchema), `"maxItems":60`) {
		t.Errorf("ingest_many manifest %+v", m.Capabilities)
	}
}

// TestMutationsByFilterCountSoftDeleted: Twenty's mutations by filter
// (update, soft delete, restore, permanent delete) apply the filter alone,
// so they act on the soft-deleted matches too, which a list leaves out
// (and a restore on the live ones too); each
// counts them (its count names deletedAt, so Twenty reads them), refuses
// when live and soft-deleted matches are more than MaxFilterMatches, and
// at the bound acts on exactly what it counted, with the count's filter.
func TestMutationsByFilterCountSoftDeleted(t *testing.T) {
	seed := func(e *env, live, deleted int) {
		for i := range live + deleted {
			rec := map[string]any{"city": "Paris"}
			if i >= live {
				rec["deletedAt"] = "2026-11-01T10:00:00.000Z"
			}
			e.mock.seed("people", rec)
		}
		e.mock.seed("people", map[string]any{"city": "Lyon"})
	}
	const wrapped = "and(city[eq]:Paris,or(deletedAt[is]:NULL,deletedAt[is]:NOT_NULL))"
	for _, tc := range []struct {
		op, input string
		// after checks the records left at the bound.
		after func(t *testing.T, left []map[string]any)
	}{
		{OpUpdateMany, `{"object":"people","filter":"city[eq]:Paris","record":{"jobTitle":"x"}}`, func(t *testing.T, left []map[string]any) {
			n := 0
			for _, r := range left {
				if r["jobTitle"] == "x" {
					n++
				}
				if r["city"] == "Lyon" && r["jobTitle"] != nil {
					t.Error("Lyon was updated")
				}
			}
			if n != MaxFilterMatches {
				t.Errorf("%d records updated, want %d", n, MaxFilterMatches)
			}
		}},
		{OpSoftDeleteMany, `{"object":"people","filter":"city[eq]:Paris"}`, func(t *testing.T, left []map[string]any) {
			for _, r := range left {
				if (r["deletedAt"] == nil) != (r["city"] == "Lyon") {
					t.Errorf("after soft_delete_many %v", r)
				}
			}
		}},
		{OpDestroyMany, `{"object":"people","filter":"city[eq]:Paris"}`, func(t *testing.T, left []map[string]any) {
			if len(left) != 1 {
				t.Errorf("%d people left, want Lyon alone", len(left))
			}
		}},
		// Twenty's restore sets deletedAt to NULL on every match, and
		// answers (and announces as restored) the live ones too.
		{OpRestoreMany, `{"object":"people","filter":"city[eq]:Paris"}`, func(t *testing.T, left []map[string]any) {
			for _, r := range left {
				if r["deletedAt"] != nil {
					t.Errorf("after restore_many %v", r)
				}
			}
		}},
	} {
		t.Run(tc.op, func(t *testing.T) {
			e := newEnv(t, allOperationsFile(t))
			seed(e, 40, 30)
			// The list a caller sees counts the 40 live ones only.
			var listed listOut
			e.complete(t, action(OpList, `{"object":"people","filter":"city[eq]:Paris","limit":1}`), &listed)
			if listed.TotalCount == nil || *listed.TotalCount != 40 {
				t.Fatalf("the list counts %v, want the 40 live records", listed.TotalCount)
			}
			pe := failedCode(t, e.Result(t, action(tc.op, tc.input)))
			if pe.Code != CodeTooManyMatches || !strings.Contains(pe.Message, "matches 70 people (soft-deleted ones included") {
				t.Errorf("40 live and 30 soft-deleted matches: %+v, want %s over 70", pe, CodeTooManyMatches)
			}
			if r := e.mock.last(t); r.Method != http.MethodGet || r.Query.Get("filter") != wrapped {
				t.Errorf("the count sent %s %v, want the filter %s", r.Method, r.Query, wrapped)
			}
			if n := e.mock.writes(); n != 0 {
				t.Fatalf("%d mutations reached Twenty", n)
			}

			e2 := newEnv(t, allOperationsFile(t))
			seed(e2, 30, MaxFilterMatches-30)
			var out listOut
			e2.complete(t, action(tc.op, tc.input), &out)
			if len(out.Records) != MaxFilterMatches {
				t.Errorf("at the bound it acted on %d records, want %d", len(out.Records), MaxFilterMatches)
			}
			if r := e2.mock.last(t); r.Method == http.MethodGet || r.Query.Get("filter") != wrapped {
				t.Errorf("the mutation sent %s %v, want the count's filter %s", r.Method, r.Query, wrapped)
			}
			e2.mock.mu.Lock()
			defer e2.mock.mu.Unlock()
			tc.after(t, e2.mock.records["people"])
		})
	}
}

// TestFilterCannotLeaveTheCountWrapper: the count wraps the caller's
// filter as and(<filter>,or(deletedAt[is]:NULL,deletedAt[is]:NOT_NULL)).
// Twenty's filter parser (as the mock reproduces it) lets an unpaired
// quote or bracket swallow the added condition into a value, and reads a
// filter that starts with a conjunction closing before its end as one
// mangled condition, so such a filter could be counted as matching
// nothing and still act on every record. Such filters are refused before
// any request; filters whose quotes, brackets and parentheses pair up are
// counted and sent as the count was.
func TestFilterCannotLeaveTheCountWrapper(t *testing.T) {
	var recs []map[string]any
	for range MaxFilterMatches + 1 {
		recs = append(recs, map[string]any{"name": "O'Brien", "city": "Paris"})
	}
	for _, tc := range []struct{ name, filter, why string }{
		// Alone, Twenty reads name = O'Brien; in the count, the quote
		// left open hides the comma before the added condition.
		{"unpaired apostrophe", `name[eq]:O'Brien`, "odd number of ' characters"},
		// Alone, Twenty reads or(id[is]:NOT_NULLcity[eq]:Nowhere): every
		// record (is with a value other than NULL is IS NOT NULL); in the
		// count, or(...) and and(...) are two conditions: none.
		{"conjunction closed early", `or(id[is]:NOT_NULL),and(city[eq]:Nowhere)`, "closes at byte 18, before the end"},
		{"parenthesis closed and reopened", `city[eq]:Paris),or(city[eq]:Nowhere`, "closes a parenthesis it did not open at byte 14"},
		{"parenthesis left open", `or(city[eq]:Paris`, "leaves 1 parenthesis open"},
		{"unpaired double quote", `name[eq]:"O'Brien'`, `odd number of " characters`},
		{"unpaired bracket", `name[eq]:a[b`, "odd number of [ and ] characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, allOperationsFile(t))
			e.mock.seed("people", recs...)
			filter := `"filter":` + strconv.Quote(tc.filter)
			for _, a := range []*aip.Action{
				action(OpDestroyMany, `{"object":"people",`+filter+`}`),
				action(OpUpdateMany, `{"object":"people",`+filter+`,"record":{"jobTitle":"x"}}`),
				action(OpSoftDeleteMany, `{"object":"people",`+filter+`}`),
				action(OpRestoreMany, `{"object":"people",`+filter+`}`),
			} {
				pe := failedCode(t, e.Result(t, a))
				if pe.Code != hostsdk.CodeInputInvalid || retryable(pe) || !strings.Contains(pe.Message, tc.why) {
					t.Errorf("%s %s: %+v, want %s saying %q", a.CapabilityID, tc.filter, pe, hostsdk.CodeInputInvalid, tc.why)
				}
			}
			if n := e.mock.count(); n != 0 {
				t.Errorf("%d requests reached Twenty", n)
			}
			e.mock.mu.Lock()
			left := len(e.mock.records["people"])
			e.mock.mu.Unlock()
			if left != len(recs) {
				t.Errorf("%d people left of %d", left, len(recs))
			}
		})
	}

	// Filters whose quotes, brackets and parentheses pair up: counted,
	// and the mutation sends the count's filter.
	e := newEnv(t, allOperationsFile(t))
	e.mock.seed("people", recs[:3]...)
	e.mock.seed("people", map[string]any{"name": "D'Arcy", "city": "Lyon"}, map[string]any{"name": "Ada", "city": "Lyon"})
	for _, f := range []string{`or(city[eq]:Nowhere,name[in]:["O'Brien","D'Arcy"])`, `and(city[eq]:Lyon),name[ilike]:d_arcy`} {
		var out listOut
		e.complete(t, action(OpDestroyMany, `{"object":"people","filter":`+strconv.Quote(f)+`}`), &out)
		reqs := e.mock.requests()
		count, del := reqs[len(reqs)-2], reqs[len(reqs)-1]
		want := "and(" + f + ",or(deletedAt[is]:NULL,deletedAt[is]:NOT_NULL))"
		if count.Method != http.MethodGet || count.Query.Get("filter") != want || del.Method != http.MethodDelete || del.Query.Get("filter") != want {
			t.Errorf("%s: sent %s %v then %s %v; want the filter %s in both", f, count.Method, count.Query, del.Method, del.Query, want)
		}
	}
	e.mock.mu.Lock()
	defer e.mock.mu.Unlock()
	if left := e.mock.records["people"]; len(left) != 1 || left[0]["name"] != "Ada" {
		t.Errorf("left %v, want Ada alone", left)
	}
}

// TestLiveOnlyFilter: deletedAt[is]:NULL in the filter counts and acts on
// the live matches alone; the soft-deleted ones keep their deletedAt.
// Twenty answers a soft delete with what the filter selects afterwards:
// none here, though 40 records were deleted.
func TestLiveOnlyFilter(t *testing.T) {
	e := newEnv(t, allOperationsFile(t))
	for i := range 70 {
		rec := map[string]any{"city": "Paris"}
		if i >= 40 {
			rec["deletedAt"] = "2026-11-01T10:00:00.000Z"
		}
		e.mock.seed("people", rec)
	}
	var out listOut
	e.complete(t, action(OpSoftDeleteMany, `{"object":"people","filter":"city[eq]:Paris,deletedAt[is]:NULL"}`), &out)
	if len(out.Records) != 0 {
		t.Errorf("answered %d records, want none (Twenty's answer)", len(out.Records))
	}
	e.mock.mu.Lock()
	defer e.mock.mu.Unlock()
	renewed, kept := 0, 0
	for _, r := range e.mock.records["people"] {
		switch r["deletedAt"] {
		case "2026-11-30T10:00:00.000Z":
			renewed++
		case "2026-11-01T10:00:00.000Z":
			kept++
		}
	}
	if renewed != 40 || kept != 30 {
		t.Errorf("%d records soft-deleted now and %d kept, want 40 and 30", renewed, kept)
	}
}

// FuzzWrappedFilterKeepsItsCondition: for every filter checkWrappable
// accepts, Twenty's parser (as the mock reproduces it) either refuses the
// count's filter (a failed read: nothing is sent) or reads it as and(...)
// whose last part is the added condition, intact, so the count names
// deletedAt and reads soft-deleted records too; and the caller's filter
// then is the other parts, as Twenty reads the filter alone.
func FuzzWrappedFilterKeepsItsCondition(f *testing.F) {
	for _, s := range []string{
		`city[eq]:Paris`, `name[eq]:O'Brien`, `or(id[is]:NOT_NULL),and(city[eq]:Nowhere)`,
		`a[eq]:1),or(b[eq]:2`, `id[in]:["a","b"]`, `or(a[eq]:1,b[eq]:2),c[eq]:3`, `not(a[eq]:"x,y")`,
		`name[in]:["O'Brien","D'Arcy"]`, `a[eq]:[1],b[eq]:2`, `and(a[eq]:1)`, `a[eq]:"(",b[eq]:")"`, "a[eq]:1\n",
	} {
		f.Add(s)
	}
	cond, err := parseTwentyFilterPart(allRecords)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, filter string) {
		if filter == "" || checkWrappable(filter) != nil {
			return
		}
		got, err := parseTwentyFilter(countAllFilter(filter))
		if err != nil {
			return
		}
		if got.conj != "and" || len(got.subs) < 2 || !reflect.DeepEqual(got.subs[len(got.subs)-1], cond) {
			t.Fatalf("%q: the count's filter parses to %+v, without the added condition last", filter, got)
		}
		alone, err := parseTwentyFilter(filter)
		if err != nil {
			t.Fatalf("%q: Twenty refuses the filter alone (%v) but not in the count", filter, err)
		}
		inCount := flattenAnd(twentyFilter{conj: "and", subs: got.subs[:len(got.subs)-1]})
		if a := flattenAnd(alone); !reflect.DeepEqual(a, inCount) {
			t.Fatalf("%q: alone %+v, in the count %+v", filter, a, inCount)
		}
	})
}

// flattenAnd lists the conjuncts of f, and(...) within and(...) opened.
func flattenAnd(f twentyFilter) []twentyFilter {
	if f.conj != "and" {
		return []twentyFilter{f}
	}
	var out []twentyFilter
	for _, s := range f.subs {
		out = append(out, flattenAnd(s)...)
	}
	return out
}

// TestCountThenMutationFails: the filter forms send two requests, the
// count (a read) and the mutation. When the count succeeds and the
// mutation gets a 5xx or no answer, Twenty may have applied it: the
// action is outcome_unknown, never failed. A 4xx refusal of the mutation
// is a failed result (nothing was applied).
func TestCountThenMutationFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		state  aip.ActionState
		code   string
	}{
		{"500", 500, `{"statusCode":500,"error":"InternalServerErrorException","messages":["boom"]}`, aip.StateOutcomeUnknown, ""},
		{"no answer", 0, "", aip.StateOutcomeUnknown, ""},
		{"400", 400, `{"statusCode":400,"error":"BadRequestException","messages":["nope"]}`, aip.StateFailed, provider.CodeInvalidRequest},
		{"429", 429, `{"statusCode":429,"error":"TooManyRequestsException","messages":["slow down"]}`, aip.StateFailed, provider.CodeRateLimited},
	} {
		for _, op := range []string{OpUpdateMany, OpSoftDeleteMany, OpRestoreMany, OpDestroyMany} {
			t.Run(tc.name+" "+op, func(t *testing.T) {
				e := newEnv(t, allOperationsFile(t))
				e.mock.seed("people", map[string]any{"city": "Paris"})
				e.mock.setFail(func(r *http.Request) (int, string, bool) {
					return tc.status, tc.body, r.Method != http.MethodGet
				})
				input := `{"object":"people","filter":"city[eq]:Paris"}`
				if op == OpUpdateMany {
					input = `{"object":"people","filter":"city[eq]:Paris","record":{"city":"Lyon"}}`
				}
				a := action(op, input)
				ctx := hostsdktest.Context(t)
				if _, err := e.Dispatcher.Act(ctx, e.Target, a); err != nil {
					t.Fatal(err)
				}
				st, _, err := e.Dispatcher.Status(ctx, e.Target, a.ID, a.CapabilityID)
				if err != nil || st.State != tc.state {
					t.Fatalf("status %+v, %v; want %s", st, err, tc.state)
				}
				if tc.code != "" && (st.Result == nil || st.Result.Error == nil || st.Result.Error.Code != tc.code) {
					t.Errorf("result %+v, want %s", st.Result, tc.code)
				}
				if reqs := e.mock.count(); reqs != 2 {
					t.Errorf("%d requests, want the count and the mutation", reqs)
				}
			})
		}
	}
}

// TestOpenAPIKeyNotAccepted: Twenty answers GET /rest/open-api/core and
// /rest/open-api/metadata with 200 and its anonymous base document (no
// path but /open-api/<name>) when it does not accept the API key for a
// workspace (open-api.service.ts: getWorkspaceFromRequest's catch returns
// baseSchema), as the mock does with a wrong key. That document is not
// the workspace's: the action fails with provider.unauthorized instead of
// completing with a document that shows no objects.
func TestOpenAPIKeyNotAccepted(t *testing.T) {
	m := newMock(t)
	m.token = "another-key"
	e := newEnv(t, nil)
	for _, tc := range []struct{ op, name string }{{OpOpenAPICore, "core"}, {OpOpenAPIMeta, "metadata"}} {
		// What Twenty answers the adapter's request when it does not
		// accept the key: the mock's answer with a wrong key, replayed to
		// the host's connector.
		req, _ := http.NewRequest(http.MethodGet, m.srv.URL+"/rest/open-api/"+tc.name, nil)
		req.Header.Set("Authorization", "Bearer "+e.mock.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		base, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the mock answered a wrong key's %s document %d %s", tc.name, resp.StatusCode, base)
		}
		e.mock.setFail(func(r *http.Request) (int, string, bool) { return 200, string(base), true })
		pe := failedCode(t, e.Result(t, action(tc.op, `{}`)))
		if pe.Code != provider.CodeUnauthorized || retryable(pe) {
			t.Errorf("%s with the base document: %+v", tc.op, pe)
		}
	}
}

// TestNULRefused: an input holding U+0000 (a "\u0000" escape) anywhere, in
// a record's value or member name, a filter, of a mutation or a read, is
// refused connector_host.input_invalid naming where it is, and Twenty is
// not called: it keeps records in PostgreSQL, which cannot hold the
// character in text or jsonb nor compare with it, and its REST API
// answers the database's refusal with a 500, which a mutation could only
// report as outcome_unknown and a read as a retryable failure that can
// never succeed. An escaped backslash followed by "u0000" is text, and
// goes.
func TestNULRefused(t *testing.T) {
	e := newEnv(t, allOperationsFile(t))
	for _, tc := range []struct {
		op, input, path string
	}{
		{OpCreate, `{"object":"people","record":{"name":{"firstName":"Ada\u0000","lastName":"Lovelace"}}}`, `"/record/name/firstName"`},
		{OpCreateMany, `{"object":"people","records":[{"jobTitle":"x"},{"job\u0000Title":"y"}]}`, `"/records/1/job\x00Title"`},
		{OpUpdateMany, `{"object":"people","filter":"city[eq]:Par\u0000is","record":{"jobTitle":"x"}}`, `"/filter"`},
		{OpList, `{"object":"people","filter":"name[ilike]:%\u0000%"}`, `"/filter"`},
	} {
		res := e.Result(t, action(tc.op, tc.input))
		pe := failedCode(t, res)
		if pe.Code != hostsdk.CodeInputInvalid || retryable(pe) || !strings.Contains(pe.Message, tc.path) || !strings.Contains(pe.Message, "U+0000") {
			t.Errorf("%s %s: %+v, want %s naming %s and U+0000", tc.op, tc.input, pe, hostsdk.CodeInputInvalid, tc.path)
		}
	}
	if n := e.mock.count(); n != 0 {
		t.Errorf("inputs holding U+0000 reached Twenty: %+v", e.mock.requests())
	}
	var out struct {
		Record map[string]any `json:"record"`
	}
	e.complete(t, action(OpCreate, `{"object":"people","record":{"jobTitle":"C:\\u0000 is text"}}`), &out)
	if got := out.Record["jobTitle"]; got != `C:\u0000 is text` {
		t.Errorf("created jobTitle %q, want the text as sent", got)
	}
}
