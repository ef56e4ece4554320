package twenty

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// mockTwenty is a Twenty server as its reference page describes it
// (products/internal/spectest/specs/twenty/api.mdx; Twenty publishes no
// static OpenAPI document, so spectest cannot check requests and this
// mock checks them itself, failing the test, as spectest.Handler does,
// on a request neither the page nor Twenty's generated REST API
// describes: see refuse). Each route says which part of the page it
// follows:
//
//   - "Authentication": every request needs Authorization: Bearer <API
//     key>; otherwise 401.
//   - "Two APIs", Core API under /rest/, and "Schema-per-tenant APIs"
//     ("endpoints use your object and field names directly"; the page's
//     example GET /rest/people): GET and POST /rest/<plural>, GET, PATCH
//     and DELETE /rest/<plural>/<id>; an object the workspace does not
//     have is 404.
//   - "Batch operations" (up to 60 records per request): POST
//     /rest/batch/<plural>. The page does not spell the batch path; it is
//     the path of Twenty's generated REST API (reference §8.6, task brief).
//   - "Two APIs", Metadata API under /rest/metadata/: GET
//     /rest/metadata/objects.
//   - "Batch operations" (create, update or delete in one request) and
//     Twenty's generated REST API (reference §8.6; the page spells none of
//     these): PATCH and DELETE /rest/<plural>?filter=... (update many,
//     delete many with soft_delete), PATCH /rest/restore/<plural>/<id> and
//     /rest/restore/<plural>?filter=..., POST /rest/<plural>/duplicates
//     ({"ids":[...]} or {"data":[...]}), PATCH /rest/<plural>/merge
//     ({"ids","conflictPriorityIndex","dryRun"}; the others are deleted,
//     softly for people only; a dry run answers a preview under a new ID
//     with deletedAt set), GET
//     /rest/<plural>/groupBy?group_by=<JSON array>, GET
//     /rest/metadata/objects/<id>, /rest/metadata/fields[/<id>] and GET
//     /rest/open-api/core|metadata (the generated OpenAPI documents, no
//     data envelope). The mock parses the filter parameter as Twenty's
//     REST layer does (parseTwentyFilter: unbalanced parentheses, a
//     condition not of the form field[comparator]:value or an unknown
//     comparator are 400, and its quirks are kept: unpaired quotes and
//     brackets, a conjunction closed before the end) and evaluates eq,
//     neq, in, is, like and ilike on top-level fields; a mutation or
//     group-by whose filter it cannot evaluate is 400, a list ignores
//     such a filter. As Twenty's query runners do, a list (GET
//     /rest/<plural>) leaves soft-deleted records out unless its filter
//     names deletedAt, and the mutations by filter (update, delete,
//     restore) apply the filter alone, soft-deleted records included.
//   - The generated REST API's upsert parameter on POST /rest/<plural> and
//     /rest/batch/<plural>: with upsert=true a record whose id exists is
//     updated; without it, an id already taken is 400.
//   - "Selecting fields (REST)": the fields and depth query parameters.
//     The list parameters filter, order_by, limit, starting_after and
//     ending_before are not on the page; they are those of Twenty's
//     generated REST API.
//
// The page gives no answer or error shapes either; the mock answers as
// Twenty's generated REST API does: {"data":{<name>:...}} (with pageInfo
// and totalCount on lists; 201 on creation) and errors as its Nest
// exception filter writes them: {"statusCode":n,"error":"...",
// "messages":["..."]}.
type mockTwenty struct {
	t     testing.TB
	token string
	srv   *httptest.Server

	mu      sync.Mutex
	reqs    []recorded
	records map[string][]map[string]any // by plural object name, in creation order
	nextID  int
	// fail, when set, answers a request instead of the mock: status and
	// body, or status 0 to drop the connection.
	fail func(r *http.Request) (status int, body string, ok bool)
	// refuseInsert, when set, is a constraint of the database: the
	// message of the violation a new record would cause ("" for none),
	// which Twenty answers with 400.
	refuseInsert func(rec map[string]any) string
}

func (m *mockTwenty) setRefuseInsert(f func(rec map[string]any) string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refuseInsert = f
}

type recorded struct {
	Method string
	Path   string // escaped
	Query  url.Values
	Header http.Header
	Body   string
}

// singular names of the mock workspace's objects (what Twenty calls the
// data members of single-record answers).
var mockObjects = map[string]string{
	"people": "person", "companies": "company", "opportunities": "opportunity",
	"notes": "note", "tasks": "task", "invoices": "invoice",
}

func newMock(t testing.TB) *mockTwenty {
	m := &mockTwenty{t: t, token: "tw-api-key-123", records: map[string][]map[string]any{}}
	m.srv = httptest.NewServer(m)
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mockTwenty) setFail(f func(r *http.Request) (int, string, bool)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail = f
}

func (m *mockTwenty) requests() []recorded {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.reqs)
}

// count is the number of requests received other than the host's health
// probes.
func (m *mockTwenty) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.reqs {
		if !r.probe() {
			n++
		}
	}
	return n
}

// writes is the number of requests other than GETs (the mutations).
func (m *mockTwenty) writes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.reqs {
		if r.Method != http.MethodGet {
			n++
		}
	}
	return n
}

// probe reports whether r is the connector's health probe.
func (r recorded) probe() bool {
	return r.Method == http.MethodGet && r.Path == "/rest/people" && r.Query.Encode() == "limit=1"
}

// last is the last request other than a health probe.
func (m *mockTwenty) last(t *testing.T) recorded {
	t.Helper()
	var r []recorded
	for _, x := range m.requests() {
		if !x.probe() {
			r = append(r, x)
		}
	}
	if len(r) == 0 {
		t.Fatal("the mock received no request")
	}
	return r[len(r)-1]
}

// refuse answers a request the adapter must never send — one api.mdx and
// Twenty's generated REST API do not describe (a path or method Twenty
// does not serve, a query parameter the operation does not take, a body
// that is not JSON, a mutation without its idempotency headers, a read
// with them) — as Twenty would, and fails the test: a test expecting a
// provider error must not pass on a request the adapter got wrong.
func (m *mockTwenty) refuse(w http.ResponseWriter, status int, name, msg string) {
	m.t.Errorf("mock Twenty: the adapter sent a request Twenty does not describe: %s", msg)
	twentyError(w, status, name, msg)
}

func twentyError(w http.ResponseWriter, status int, name, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"statusCode": status, "error": name, "messages": []string{msg}})
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (m *mockTwenty) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	m.reqs = append(m.reqs, recorded{Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.Query(),
		Header: r.Header.Clone(), Body: string(body)})
	fail := m.fail
	m.mu.Unlock()
	if r.Method == http.MethodGet && (r.URL.Path == "/rest/open-api/core" || r.URL.Path == "/rest/open-api/metadata") && r.Header.Get("Authorization") != "Bearer "+m.token {
		// Twenty's open-api.service.ts: a key it does not accept for a
		// workspace gets the anonymous base document (baseSchema), 200,
		// whose only path is the document's own.
		name := strings.TrimPrefix(r.URL.Path, "/rest/open-api/")
		reply(w, 200, map[string]any{"openapi": "3.1.1", "info": map[string]any{"title": "Twenty Api", "version": "v0.1"},
			"components": map[string]any{"securitySchemes": map[string]any{"bearerAuth": map[string]any{"type": "http", "scheme": "bearer"}}},
			"paths":      map[string]any{"/open-api/" + name: map[string]any{"get": map[string]any{}}}})
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+m.token {
		// api.mdx, "Authentication": Authorization: Bearer YOUR_API_KEY.
		twentyError(w, http.StatusUnauthorized, "UnauthorizedException", "Token invalid.")
		return
	}
	// The host's health probe (GET /rest/people?limit=1) is never failed
	// by the hook, so the replica stays ready while a test fails calls.
	probe := r.Method == http.MethodGet && r.URL.Path == "/rest/people" && r.URL.RawQuery == "limit=1"
	if fail != nil && !probe {
		if status, b, ok := fail(r); ok {
			if status == 0 {
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, b)
			return
		}
	}
	// Every method but GET changes state, except the duplicates search
	// (a POST that reads).
	mutation := r.Method != http.MethodGet && !strings.HasSuffix(r.URL.Path, "/duplicates")
	if mutation {
		if r.Header.Get("Idempotency-Key") == "" || r.Header.Get("X-AIP-Action-ID") == "" {
			m.refuse(w, http.StatusBadRequest, "BadRequestException", "mock: mutation without Idempotency-Key or X-AIP-Action-ID")
			return
		}
	}
	if !mutation && (r.Header.Get("Idempotency-Key") != "" || r.Header.Get("X-AIP-Action-ID") != "") {
		m.refuse(w, http.StatusBadRequest, "BadRequestException", "mock: a read with Idempotency-Key or X-AIP-Action-ID")
		return
	}
	if len(body) > 0 && (r.Method == http.MethodGet || r.Method == http.MethodDelete) {
		m.refuse(w, http.StatusBadRequest, "BadRequestException", "mock: a "+r.Method+" with a body")
		return
	}
	if len(body) > 0 && r.Header.Get("Content-Type") != "application/json" {
		m.refuse(w, http.StatusBadRequest, "BadRequestException", "mock: body is not application/json")
		return
	}
	segs := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	if len(segs) < 2 || segs[0] != "rest" {
		m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case segs[1] == "open-api":
		// GET /rest/open-api/core and /rest/open-api/metadata: the
		// generated OpenAPI documents themselves.
		if len(segs) != 3 || (segs[2] != "core" && segs[2] != "metadata") || r.Method != http.MethodGet || !m.queryOK(w, r) {
			m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
			return
		}
		reply(w, 200, map[string]any{"openapi": "3.1.1", "info": map[string]any{"title": "Twenty Api", "version": segs[2]},
			"servers": []any{map[string]any{"url": m.srv.URL + "/rest"}}, "paths": map[string]any{"/people": map[string]any{}}})
	case segs[1] == "metadata":
		m.metadata(w, r, segs)
	case segs[1] == "restore":
		// PATCH /rest/restore/<plural>/<id> (restore one) and
		// /rest/restore/<plural>?filter=... (restore many); no body.
		if r.Method != http.MethodPatch || len(segs) < 3 || len(segs) > 4 {
			m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
			return
		}
		singular, ok := m.object(w, segs[2])
		if !ok {
			return
		}
		if len(body) != 0 {
			m.refuse(w, http.StatusBadRequest, "BadRequestException", "mock: restore takes no body")
			return
		}
		if len(segs) == 4 {
			if !m.queryOK(w, r, "depth") {
				return
			}
			rec := m.find(segs[2], segs[3])
			if rec == nil {
				twentyError(w, http.StatusNotFound, "NotFoundException", "Record not found")
				return
			}
			delete(rec, "deletedAt")
			reply(w, 200, map[string]any{"data": map[string]any{"restore" + upper(singular): rec}})
			return
		}
		match, ok := m.filter(w, r, segs[2], "filter", "depth")
		if !ok {
			return
		}
		// Twenty's restore many (CommonRestoreManyQueryRunnerService.run,
		// engine/api/common/common-query-runners/
		// common-restore-many-query-runner.service.ts) applies the filter
		// alone and restores every match: TypeORM's restore sets deletedAt
		// to NULL on the live matches too, and WorkspaceSoftDeleteQueryBuilder
		// (engine/twenty-orm/repository/workspace-soft-delete-query-builder.ts)
		// answers, and emits as restored, every record the filter selects.
		// It answers what the filter selects after the change (its "after"
		// select reuses the restore's WHERE): with deletedAt[is]:NOT_NULL
		// in the filter, none.
		for _, rec := range match {
			delete(rec, "deletedAt")
		}
		after, _ := m.filter(httptest.NewRecorder(), r, segs[2], "filter", "depth")
		reply(w, 200, map[string]any{"data": map[string]any{"restore" + upper(segs[2]): nonNil(after)}})
	case segs[1] == "batch":
		// "Batch operations": POST /rest/batch/<plural>, at most 60 records.
		if len(segs) != 3 || r.Method != http.MethodPost {
			m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
			return
		}
		if _, ok := m.object(w, segs[2]); !ok {
			return
		}
		if !m.queryOK(w, r, "upsert", "depth") {
			return
		}
		var recs []map[string]any
		if err := json.Unmarshal(body, &recs); err != nil || len(recs) == 0 || len(recs) > 60 {
			twentyError(w, http.StatusBadRequest, "BadRequestException", "batch body must be an array of 1 to 60 records")
			return
		}
		if r.URL.Query().Get("upsert") == "true" {
			// Twenty's CommonCreateManyQueryRunnerService
			// (performUpsertOperation): the records it finds are updated
			// first, then the others inserted in one statement, with no
			// transaction around the two, so an insert the database
			// refuses leaves the updates written.
			var fresh []int
			for i, rec := range recs {
				id, _ := rec["id"].(string)
				if old := m.find(segs[2], id); old != nil {
					maps.Copy(old, rec)
					recs[i] = old
				} else {
					fresh = append(fresh, i)
				}
			}
			for _, i := range fresh {
				if m.refuseInsert != nil {
					if msg := m.refuseInsert(recs[i]); msg != "" {
						twentyError(w, http.StatusBadRequest, "BadRequestException", msg)
						return
					}
				}
			}
			for _, i := range fresh {
				m.create(segs[2], recs[i])
			}
			reply(w, 201, map[string]any{"data": map[string]any{"create" + upper(segs[2]): recs}})
			return
		}
		for i, rec := range recs {
			stored, ok := m.upsert(w, r, segs[2], rec)
			if !ok {
				return
			}
			recs[i] = stored
		}
		reply(w, 201, map[string]any{"data": map[string]any{"create" + upper(segs[2]): recs}})
	case len(segs) == 2:
		// Core API: GET (list) and POST (create) /rest/<plural>.
		singular, ok := m.object(w, segs[1])
		if !ok {
			return
		}
		switch r.Method {
		case http.MethodGet:
			if !m.queryOK(w, r, "filter", "order_by", "limit", "starting_after", "ending_before", "fields", "depth") {
				return
			}
			recs := m.records[segs[1]]
			withDeleted := false
			if r.URL.Query().Has("filter") {
				// A filter Twenty refuses is 400; one it accepts selects,
				// unless the mock cannot evaluate it (then it is ignored).
				parsed, err := parseTwentyFilter(r.URL.Query().Get("filter"))
				if err != nil {
					twentyError(w, http.StatusBadRequest, "BadRequestException", err.Error())
					return
				}
				withDeleted = parsed.namesDeletedAt()
				if match, err := parsed.compile(); err == nil {
					recs = slices.DeleteFunc(slices.Clone(recs), func(rec map[string]any) bool { return !match(rec) })
				}
			}
			// Soft-deleted records are left out, unless the filter names
			// deletedAt (Twenty's find-many: applyDeletedAtToBuilder).
			if !withDeleted {
				recs = slices.DeleteFunc(slices.Clone(recs), func(rec map[string]any) bool { return rec["deletedAt"] != nil })
			}
			total := len(recs)
			if n, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && n < len(recs) {
				recs = recs[:n]
			}
			recs = m.selectFields(w, r, recs)
			if recs == nil {
				recs = []map[string]any{}
			}
			reply(w, 200, map[string]any{"data": map[string]any{segs[1]: recs},
				"pageInfo": map[string]any{"hasNextPage": false, "startCursor": "c-start", "endCursor": "c-end"}, "totalCount": total})
		case http.MethodPost:
			if !m.queryOK(w, r, "upsert", "depth") {
				return
			}
			var rec map[string]any
			if err := json.Unmarshal(body, &rec); err != nil {
				twentyError(w, http.StatusBadRequest, "BadRequestException", "body must be a record object")
				return
			}
			if rec, ok = m.upsert(w, r, segs[1], rec); !ok {
				return
			}
			reply(w, 201, map[string]any{"data": map[string]any{"create" + upper(singular): rec}})
		case http.MethodPatch:
			// Update many: the fields of the body set on every match.
			match, ok := m.filter(w, r, segs[1], "filter", "depth")
			if !ok {
				return
			}
			var patch map[string]any
			if err := json.Unmarshal(body, &patch); err != nil || len(patch) == 0 {
				twentyError(w, http.StatusBadRequest, "BadRequestException", "body must be an object of fields")
				return
			}
			for _, rec := range match {
				maps.Copy(rec, patch)
			}
			reply(w, 200, map[string]any{"data": map[string]any{"update" + upper(segs[1]): nonNil(match)}})
		case http.MethodDelete:
			// Delete many: soft_delete (default false) decides.
			match, ok := m.filter(w, r, segs[1], "filter", "soft_delete")
			if !ok {
				return
			}
			soft := r.URL.Query().Get("soft_delete") == "true"
			var out []map[string]any
			for _, rec := range match {
				out = append(out, map[string]any{"id": rec["id"]})
				m.remove(segs[1], rec, soft)
			}
			if soft {
				// Twenty's soft delete (TypeORM's, on every match, a
				// soft-deleted one getting a new deletedAt) answers what
				// the filter selects after the change
				// (WorkspaceSoftDeleteQueryBuilder.execute, engine/
				// twenty-orm/repository/workspace-soft-delete-query-builder.ts:
				// its "after" select reuses the WHERE): with
				// deletedAt[is]:NULL in the filter, none.
				after, _ := m.filter(httptest.NewRecorder(), r, segs[1], "filter", "soft_delete")
				out = out[:0]
				for _, rec := range after {
					out = append(out, map[string]any{"id": rec["id"]})
				}
			}
			reply(w, 200, map[string]any{"data": map[string]any{"delete" + upper(segs[1]): nonNil(out)}})
		default:
			m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
		}
	case len(segs) == 3 && (segs[2] == "duplicates" || segs[2] == "merge" || segs[2] == "groupBy"):
		m.special(w, r, segs[1], segs[2], body)
	case len(segs) == 3:
		// Core API: GET, PATCH, DELETE /rest/<plural>/<id>.
		singular, ok := m.object(w, segs[1])
		if !ok {
			return
		}
		var rec map[string]any
		for _, x := range m.records[segs[1]] {
			if x["id"] == segs[2] {
				rec = x
			}
		}
		if rec == nil {
			twentyError(w, http.StatusNotFound, "NotFoundException", "Record not found")
			return
		}
		switch r.Method {
		case http.MethodGet:
			if !m.queryOK(w, r, "fields", "depth") {
				return
			}
			reply(w, 200, map[string]any{"data": map[string]any{singular: m.selectFields(w, r, []map[string]any{rec})[0]}})
		case http.MethodPatch:
			if !m.queryOK(w, r, "depth") {
				return
			}
			var patch map[string]any
			if err := json.Unmarshal(body, &patch); err != nil {
				twentyError(w, http.StatusBadRequest, "BadRequestException", "body must be an object")
				return
			}
			maps.Copy(rec, patch)
			reply(w, 200, map[string]any{"data": map[string]any{"update" + upper(singular): rec}})
		case http.MethodDelete:
			// Twenty's generated REST API: soft_delete (default false)
			// decides between a soft delete and a permanent one.
			if !m.queryOK(w, r, "soft_delete") {
				return
			}
			m.remove(segs[1], rec, r.URL.Query().Get("soft_delete") == "true")
			reply(w, 200, map[string]any{"data": map[string]any{"delete" + upper(singular): map[string]any{"id": rec["id"]}}})
		default:
			m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
		}
	default:
		m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
	}
}

// mockMaxFields is how many fields Twenty returns of a record when the
// fields parameter is omitted (api.mdx, "Selecting fields (REST)").
const mockMaxFields = 200

// selectFields is what a read returns of recs (api.mdx, "Selecting fields
// (REST)"): with fields, id and the fields listed; without, when the
// object has more than mockMaxFields fields, only mockMaxFields of them
// (id first, then the others by name), and the response carries
// X-Twenty-Fields-Capped: true and X-Twenty-Fields-Max. It sets those
// headers on w, so it runs before the answer is written.
func (m *mockTwenty) selectFields(w http.ResponseWriter, r *http.Request, recs []map[string]any) []map[string]any {
	var keep func(string) bool
	if r.URL.Query().Has("fields") {
		fields := strings.Split(r.URL.Query().Get("fields"), ",")
		keep = func(f string) bool { return f == "id" || slices.Contains(fields, f) }
	} else {
		names := map[string]bool{}
		for _, rec := range recs {
			for f := range rec {
				names[f] = true
			}
		}
		if len(names) <= mockMaxFields {
			return recs
		}
		delete(names, "id")
		kept := append([]string{"id"}, slices.Sorted(maps.Keys(names))[:mockMaxFields-1]...)
		keep = func(f string) bool { return slices.Contains(kept, f) }
		w.Header().Set("X-Twenty-Fields-Capped", "true")
		w.Header().Set("X-Twenty-Fields-Max", strconv.Itoa(mockMaxFields))
	}
	out := make([]map[string]any, len(recs))
	for i, rec := range recs {
		out[i] = maps.Clone(rec)
		maps.DeleteFunc(out[i], func(f string, _ any) bool { return !keep(f) })
	}
	return out
}

// object resolves a plural name; an unknown one is 404.
func (m *mockTwenty) object(w http.ResponseWriter, plural string) (string, bool) {
	s, ok := mockObjects[plural]
	if !ok {
		twentyError(w, http.StatusNotFound, "NotFoundException", fmt.Sprintf("object '%s' not found", plural))
	}
	return s, ok
}

// queryOK refuses query parameters the operation does not take.
func (m *mockTwenty) queryOK(w http.ResponseWriter, r *http.Request, allowed ...string) bool {
	for k := range r.URL.Query() {
		if !slices.Contains(allowed, k) {
			m.refuse(w, http.StatusBadRequest, "BadRequestException", "mock: unexpected query parameter "+k)
			return false
		}
	}
	return true
}

// record returns the stored record of plural with id, nil when there is
// none (never created, or deleted permanently).
func (m *mockTwenty) record(plural, id string) map[string]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, x := range m.records[plural] {
		if x["id"] == id {
			return maps.Clone(x)
		}
	}
	return nil
}

// upsert creates rec, or with upsert=true updates the record with its id
// when there is one (Twenty's upsert parameter); without upsert an id
// already taken is 400. The caller holds m.mu.
func (m *mockTwenty) upsert(w http.ResponseWriter, r *http.Request, plural string, rec map[string]any) (map[string]any, bool) {
	id, _ := rec["id"].(string)
	if old := m.find(plural, id); old != nil {
		if r.URL.Query().Get("upsert") != "true" {
			twentyError(w, http.StatusBadRequest, "BadRequestException", "A duplicate entry was detected")
			return nil, false
		}
		maps.Copy(old, rec)
		return old, true
	}
	m.create(plural, rec)
	return rec, true
}

// create stores rec, under its own id if it has one.
func (m *mockTwenty) create(plural string, rec map[string]any) {
	m.nextID++
	if _, ok := rec["id"].(string); !ok {
		rec["id"] = fmt.Sprintf("00000000-0000-4000-8000-%012d", m.nextID)
	}
	rec["createdAt"] = "2026-11-30T10:00:00.000Z"
	m.records[plural] = append(m.records[plural], rec)
}

func upper(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

// remove soft-deletes rec (deletedAt set) or deletes it permanently. The
// caller holds m.mu.
func (m *mockTwenty) remove(plural string, rec map[string]any, soft bool) {
	if soft {
		rec["deletedAt"] = "2026-11-30T10:00:00.000Z"
		return
	}
	m.records[plural] = slices.DeleteFunc(m.records[plural], func(x map[string]any) bool { return x["id"] == rec["id"] })
}

// find returns the stored record (not a copy); the caller holds m.mu.
func (m *mockTwenty) find(plural, id string) map[string]any {
	for _, x := range m.records[plural] {
		if x["id"] == id {
			return x
		}
	}
	return nil
}

// mockFieldPattern is a field name the mock's filter accepts.
var mockFieldPattern = regexp.MustCompile(`^[a-z][A-Za-z0-9]*$`)

func nonNil(recs []map[string]any) []map[string]any {
	if recs == nil {
		return []map[string]any{}
	}
	return recs
}

// filter returns the records of plural matching the required filter
// query parameter, soft-deleted ones included (a mutation by filter
// applies the filter alone). Other query parameters must be in allowed. A
// filter Twenty refuses, or one the mock cannot evaluate, is 400.
func (m *mockTwenty) filter(w http.ResponseWriter, r *http.Request, plural string, allowed ...string) ([]map[string]any, bool) {
	if !m.queryOK(w, r, allowed...) {
		return nil, false
	}
	f := r.URL.Query().Get("filter")
	parsed, err := parseTwentyFilter(f)
	var match func(map[string]any) bool
	if err == nil {
		match, err = parsed.compile()
	}
	if f == "" || err != nil {
		twentyError(w, http.StatusBadRequest, "BadRequestException", fmt.Sprintf("mock: filter %q: %v", f, err))
		return nil, false
	}
	var out []map[string]any
	for _, rec := range m.records[plural] {
		if match(rec) {
			out = append(out, rec)
		}
	}
	return out, true
}

// twentyFilter is a filter as Twenty's REST layer parses the filter query
// parameter (parseFilterRestRequest, engine/api/rest/input-request-parsers/
// filter-parser-utils/parse-filter-rest-request.util.ts): a conjunction
// (and, or, not) of sub-filters, or one condition fields[comparator]:value.
type twentyFilter struct {
	conj       string // "and", "or", "not"; "" for a condition
	subs       []twentyFilter
	fields     []string // a condition's field path (name.firstName)
	comparator string
	value      string   // formatted (formatFieldValue); not for in
	values     []string // in and containsAny
}

// twentyRootConjunction is Twenty's ROOT_FILTER_CONJUNCTION_REGEX
// (parse-filter.util.ts): a filter that starts with and(, or( or not( and
// ends with ), whether or not that first parenthesis is the one closing
// at the end. JavaScript's . and Go's do not match a newline alike.
var twentyRootConjunction = regexp.MustCompile(`^(or|and|not)\((.+)\)$`)

// twentyBaseFilter is the form parseBaseFilter (parse-base-filter.util.ts)
// requires of a condition.
var twentyBaseFilter = regexp.MustCompile(`^(.+)\[(.+)\]:(.+)$`)

// twentyComparators are parseBaseFilter's FilterComparators.
var twentyComparators = []string{"eq", "neq", "in", "containsAny", "is", "gt", "gte", "lt", "lte", "startsWith", "endsWith", "like", "ilike"}

// parseTwentyFilter parses f as Twenty's parseFilterRestRequest does:
// checkFilterQuery (as many ( as ), wherever they are, else 400),
// addDefaultConjunctionIfMissing (and(f) unless f matches
// twentyRootConjunction), then parseFilter. Its errors are Twenty's 400s.
func parseTwentyFilter(f string) (twentyFilter, error) {
	if o, c := strings.Count(f, "("), strings.Count(f, ")"); o != c {
		return twentyFilter{}, fmt.Errorf("'filter' invalid. %d open and %d close brackets in the query", o, c)
	}
	if !twentyRootConjunction.MatchString(f) {
		f = "and(" + f + ")"
	}
	return parseTwentyFilterPart(f)
}

// parseTwentyFilterPart is Twenty's parseFilter (parse-filter.util.ts): a
// part matching twentyRootConjunction is that conjunction of the parts
// twentyFilterContent splits it into; anything else is one condition
// (parseBaseFilter).
func parseTwentyFilterPart(f string) (twentyFilter, error) {
	if m := twentyRootConjunction.FindStringSubmatch(f); m != nil {
		out := twentyFilter{conj: m[1]}
		for _, part := range twentyFilterContent(f) {
			sub, err := parseTwentyFilterPart(part)
			if err != nil {
				return twentyFilter{}, err
			}
			out.subs = append(out.subs, sub)
		}
		if out.conj == "not" && len(out.subs) > 1 {
			return twentyFilter{}, errors.New("'filter' invalid. 'not' conjunction should contain only 1 condition")
		}
		return out, nil
	}
	return parseTwentyCondition(f)
}

// twentyFilterContent splits a conjunction's text as Twenty's
// parseFilterContent (parse-filter-content.util.ts) does: it keeps the
// characters inside the outermost parentheses (any character read at
// depth 0, such as ",or(" after a parenthesis that closed early, is
// dropped) and splits at the commas at depth 1 outside brackets and
// quotes. Every [ and ] toggles "within brackets", every " and every '
// toggles its own "within quotes", whatever encloses it: an unpaired
// quote or bracket hides every later comma.
func twentyFilterContent(f string) []string {
	var parts []string
	var cur strings.Builder
	depth := 0
	brackets, double, single := false, false, false
	for _, c := range f {
		keep := depth >= 1
		switch c {
		case '(':
			depth++
		case ')':
			depth--
			keep = depth >= 1
		case '[', ']':
			brackets = !brackets
		case '"':
			double = !double
		case '\'':
			single = !single
		}
		if c == ',' && depth == 1 && !brackets && !double && !single {
			parts = append(parts, cur.String())
			cur.Reset()
			keep = false
		}
		if keep {
			cur.WriteRune(c)
		}
	}
	return append(parts, cur.String())
}

// parseTwentyCondition is Twenty's parseBaseFilter and formatFieldValue
// (format-field-values.util.ts, without the field type: the REST layer
// leaves typing to the common layer): the field path runs to the first
// [, the comparator to the next ], the value from the : after it to the
// end; in and containsAny take [v,...]; a value wholly in " or ' loses
// them, except after is.
func parseTwentyCondition(f string) (twentyFilter, error) {
	if !twentyBaseFilter.MatchString(f) {
		return twentyFilter{}, fmt.Errorf("'filter' invalid for '%s'. eg: price[gte]:10", f)
	}
	var fields, comparator, value strings.Builder
	inFields, inComparator, inValue := true, false, false
	for _, c := range f {
		if inValue {
			value.WriteRune(c)
		}
		if c == ']' && !inValue {
			inComparator = false
		}
		if c == ':' && !inComparator {
			inValue = true
		}
		if inComparator {
			comparator.WriteRune(c)
		}
		if c == '[' && inFields {
			inFields, inComparator = false, true
		}
		if inFields {
			fields.WriteRune(c)
		}
	}
	out := twentyFilter{fields: strings.Split(fields.String(), "."), comparator: comparator.String()}
	if !slices.Contains(twentyComparators, out.comparator) {
		return twentyFilter{}, fmt.Errorf("'filter' invalid for '%s', comparator %s not in %s", f, out.comparator, strings.Join(twentyComparators, ", "))
	}
	v := value.String()
	switch out.comparator {
	case "in", "containsAny":
		if !strings.HasPrefix(v, "[") || !strings.HasSuffix(v, "]") {
			return twentyFilter{}, fmt.Errorf("'filter' invalid for '%s' operator. Received '%s' but array value expected", out.comparator, v)
		}
		for _, x := range strings.Split(v[1:len(v)-1], ",") {
			out.values = append(out.values, unquoteTwenty(x))
		}
	case "is":
		out.value = v
	default:
		out.value = unquoteTwenty(v)
	}
	return out, nil
}

// unquoteTwenty drops the quotes of a value that starts and ends with "
// or ' (formatFieldValue: either kind at either end).
func unquoteTwenty(v string) string {
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && (v[len(v)-1] == '"' || v[len(v)-1] == '\'') {
		return v[1 : len(v)-1]
	}
	if len(v) == 1 && (v == `"` || v == "'") {
		return "" // JavaScript's substring(1, 0) of a lone quote
	}
	return v
}

// compile returns the predicate f is on a record, for the comparators the
// mock evaluates: eq, neq, in, is (Twenty's SQL: IS NULL when the value
// is NULL, IS NOT NULL for any other value), like and ilike (% and _).
// A condition on a sub-field or with another comparator is an error (the
// mock cannot tell what Twenty would match).
func (f twentyFilter) compile() (func(map[string]any) bool, error) {
	if f.conj != "" {
		var subs []func(map[string]any) bool
		for _, s := range f.subs {
			p, err := s.compile()
			if err != nil {
				return nil, err
			}
			subs = append(subs, p)
		}
		return func(rec map[string]any) bool {
			switch f.conj {
			case "not":
				return !subs[0](rec)
			case "or":
				return slices.ContainsFunc(subs, func(p func(map[string]any) bool) bool { return p(rec) })
			}
			return !slices.ContainsFunc(subs, func(p func(map[string]any) bool) bool { return !p(rec) })
		}, nil
	}
	if len(f.fields) != 1 || !mockFieldPattern.MatchString(f.fields[0]) {
		return nil, fmt.Errorf("mock: field %q is not one the mock evaluates", strings.Join(f.fields, "."))
	}
	field := f.fields[0]
	str := func(rec map[string]any) (string, bool) {
		v, ok := rec[field]
		if !ok || v == nil {
			return "", false // SQL NULL: no comparison holds
		}
		return fmt.Sprint(v), true
	}
	switch f.comparator {
	case "eq", "neq":
		return func(rec map[string]any) bool {
			s, ok := str(rec)
			return ok && (s == f.value) == (f.comparator == "eq")
		}, nil
	case "in":
		return func(rec map[string]any) bool {
			s, ok := str(rec)
			return ok && slices.Contains(f.values, s)
		}, nil
	case "is":
		return func(rec map[string]any) bool {
			_, ok := str(rec)
			return ok == (f.value != "NULL")
		}, nil
	case "like", "ilike":
		pattern := "^"
		for _, c := range f.value {
			switch c {
			case '%':
				pattern += ".*"
			case '_':
				pattern += "."
			default:
				pattern += regexp.QuoteMeta(string(c))
			}
		}
		if f.comparator == "ilike" {
			pattern = "(?i)" + pattern
		}
		re := regexp.MustCompile("(?s)" + pattern + "$")
		return func(rec map[string]any) bool {
			s, ok := str(rec)
			return ok && re.MatchString(s)
		}, nil
	}
	return nil, fmt.Errorf("mock: comparator %s is not one the mock evaluates", f.comparator)
}

// namesDeletedAt reports whether f names deletedAt anywhere: Twenty's
// find-many then reads soft-deleted records too (applyDeletedAtToBuilder,
// whose checkForDeletedAtFilter looks for a deletedAt key at any depth of
// the parsed filter, engine/api/graphql/graphql-query-runner/
// graphql-query-parsers/graphql-query.parser.ts); a list without it
// leaves them out.
func (f twentyFilter) namesDeletedAt() bool {
	return slices.Contains(f.fields, "deletedAt") || slices.ContainsFunc(f.subs, twentyFilter.namesDeletedAt)
}

// metadata serves GET /rest/metadata/objects[/<id>] and
// /rest/metadata/fields[/<id>]. The caller holds m.mu.
func (m *mockTwenty) metadata(w http.ResponseWriter, r *http.Request, segs []string) {
	var items []map[string]any
	singular := map[string]string{"objects": "object", "fields": "field"}
	if len(segs) < 3 || len(segs) > 4 || singular[segs[2]] == "" || r.Method != http.MethodGet {
		m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
		return
	}
	for i, plural := range slices.Sorted(maps.Keys(mockObjects)) {
		if segs[2] == "objects" {
			items = append(items, map[string]any{"id": fmt.Sprintf("00000000-0000-4000-a000-%012d", i+1),
				"namePlural": plural, "nameSingular": mockObjects[plural], "isActive": true})
		} else {
			items = append(items, map[string]any{"id": fmt.Sprintf("00000000-0000-4000-b000-%012d", i+1),
				"name": "name", "type": "TEXT", "objectMetadataId": fmt.Sprintf("00000000-0000-4000-a000-%012d", i+1)})
		}
	}
	if len(segs) == 4 {
		if !m.queryOK(w, r) {
			return
		}
		for _, it := range items {
			if it["id"] == segs[3] {
				reply(w, 200, map[string]any{"data": map[string]any{singular[segs[2]]: it}})
				return
			}
		}
		twentyError(w, http.StatusNotFound, "NotFoundException", "Metadata not found")
		return
	}
	if !m.queryOK(w, r, "limit", "starting_after") {
		return
	}
	if n, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && n < len(items) {
		items = items[:n]
	}
	reply(w, 200, map[string]any{"data": map[string]any{segs[2]: items},
		"pageInfo": map[string]any{"hasNextPage": false, "startCursor": "m0", "endCursor": "m1"}, "totalCount": len(items)})
}

// special serves POST /rest/<plural>/duplicates, PATCH
// /rest/<plural>/merge and GET /rest/<plural>/groupBy. The caller holds
// m.mu.
func (m *mockTwenty) special(w http.ResponseWriter, r *http.Request, plural, what string, body []byte) {
	singular, ok := m.object(w, plural)
	if !ok {
		return
	}
	switch {
	case what == "duplicates" && r.Method == http.MethodPost:
		// Duplicates of a record: the other records with the same name.
		if !m.queryOK(w, r, "depth") {
			return
		}
		var in struct {
			IDs  []string         `json:"ids"`
			Data []map[string]any `json:"data"`
		}
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil || (in.IDs == nil) == (in.Data == nil) {
			twentyError(w, http.StatusBadRequest, "BadRequestException", "body must hold ids or data")
			return
		}
		probes := in.Data
		for _, id := range in.IDs {
			rec := m.find(plural, id)
			if rec == nil {
				twentyError(w, http.StatusNotFound, "NotFoundException", "Record not found")
				return
			}
			probes = append(probes, rec)
		}
		var out []map[string]any
		for _, p := range probes {
			var dups []map[string]any
			for _, rec := range m.records[plural] {
				if rec["id"] != p["id"] && p["name"] != nil && fmt.Sprint(rec["name"]) == fmt.Sprint(p["name"]) {
					dups = append(dups, rec)
				}
			}
			out = append(out, map[string]any{"totalCount": len(dups), "pageInfo": map[string]any{"hasNextPage": false},
				singular + "Duplicates": nonNil(dups)})
		}
		reply(w, 200, map[string]any{"data": out})
	case what == "merge" && r.Method == http.MethodPatch:
		if !m.queryOK(w, r, "depth") {
			return
		}
		var in struct {
			IDs      []string `json:"ids"`
			Priority *int     `json:"conflictPriorityIndex"`
			DryRun   bool     `json:"dryRun"`
		}
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil || len(in.IDs) < 2 || in.Priority == nil || *in.Priority < 0 || *in.Priority >= len(in.IDs) {
			twentyError(w, http.StatusBadRequest, "BadRequestException", "body must hold 2 or more ids and a conflictPriorityIndex among them")
			return
		}
		var recs []map[string]any
		for _, id := range in.IDs {
			rec := m.find(plural, id)
			if rec == nil {
				twentyError(w, http.StatusNotFound, "NotFoundException", "Record not found")
				return
			}
			recs = append(recs, rec)
		}
		merged := maps.Clone(recs[*in.Priority])
		for _, rec := range recs {
			for k, v := range rec {
				if _, ok := merged[k]; !ok {
					merged[k] = v
				}
			}
		}
		if in.DryRun {
			// Twenty's preview: a new ID, deletedAt set, nothing stored.
			m.nextID++
			merged["id"] = fmt.Sprintf("00000000-0000-4000-9000-%012d", m.nextID)
			merged["deletedAt"] = "2026-11-30T10:00:00.000Z"
		} else {
			maps.Copy(recs[*in.Priority], merged)
			for i, rec := range recs {
				// Twenty soft-deletes merged people, other objects for good.
				if i != *in.Priority {
					m.remove(plural, rec, plural == "people")
				}
			}
		}
		reply(w, 200, map[string]any{"data": map[string]any{"merge" + upper(plural): merged}})
	case what == "groupBy" && r.Method == http.MethodGet:
		// Groups by one plain field ([{"<field>": true}]), counting.
		if !m.queryOK(w, r, "group_by", "filter", "limit") {
			return
		}
		var groupBy []map[string]bool
		if err := json.Unmarshal([]byte(r.URL.Query().Get("group_by")), &groupBy); err != nil || len(groupBy) != 1 || len(groupBy[0]) != 1 {
			twentyError(w, http.StatusBadRequest, "BadRequestException", "Invalid group_by query parameter - should be a valid array of objects")
			return
		}
		var field string
		for k := range groupBy[0] {
			field = k
		}
		recs := m.records[plural]
		if r.URL.Query().Has("filter") {
			if recs, ok = m.filter(w, r, plural, "group_by", "filter", "limit"); !ok {
				return
			}
		}
		counts := map[string]int{}
		for _, rec := range recs {
			counts[fmt.Sprint(rec[field])]++
		}
		var out []map[string]any
		for _, v := range slices.Sorted(maps.Keys(counts)) {
			out = append(out, map[string]any{"groupByDimensionValues": []string{v}, "totalCount": counts[v]})
		}
		if n, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && n < len(out) {
			out = out[:n]
		}
		reply(w, 200, map[string]any{"data": map[string]any{plural + "GroupBy": nonNil(out)}})
	default:
		m.refuse(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
	}
}
