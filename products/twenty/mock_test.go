package twenty

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// mockTwenty is a Twenty server as its reference page describes it
// (products/internal/spectest/specs/twenty/api.mdx; Twenty publishes no
// static OpenAPI document, so spectest cannot check requests and this
// mock checks them itself). Each route says which part of the page it
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
	mutation := r.Method != http.MethodGet
	if mutation {
		if r.Header.Get("Idempotency-Key") == "" || r.Header.Get("X-AIP-Action-ID") == "" {
			twentyError(w, http.StatusBadRequest, "BadRequestException", "mock: mutation without Idempotency-Key or X-AIP-Action-ID")
			return
		}
	}
	if (r.Method == http.MethodPost || r.Method == http.MethodPatch) && r.Header.Get("Content-Type") != "application/json" {
		twentyError(w, http.StatusBadRequest, "BadRequestException", "mock: body is not application/json")
		return
	}
	segs := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	if len(segs) < 2 || segs[0] != "rest" {
		twentyError(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case segs[1] == "metadata":
		// "Metadata API — /rest/metadata/": GET /rest/metadata/objects.
		if len(segs) != 3 || segs[2] != "objects" || r.Method != http.MethodGet {
			twentyError(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
			return
		}
		if !m.queryOK(w, r, "limit", "starting_after") {
			return
		}
		var objs []map[string]any
		for _, plural := range slices.Sorted(maps.Keys(mockObjects)) {
			objs = append(objs, map[string]any{"namePlural": plural, "nameSingular": mockObjects[plural], "isActive": true})
		}
		if n, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && n < len(objs) {
			objs = objs[:n]
		}
		reply(w, 200, map[string]any{"data": map[string]any{"objects": objs},
			"pageInfo": map[string]any{"hasNextPage": false, "startCursor": "m0", "endCursor": "m1"}, "totalCount": len(objs)})
	case segs[1] == "batch":
		// "Batch operations": POST /rest/batch/<plural>, at most 60 records.
		if len(segs) != 3 || r.Method != http.MethodPost {
			twentyError(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
			return
		}
		if _, ok := m.object(w, segs[2]); !ok {
			return
		}
		var recs []map[string]any
		if err := json.Unmarshal(body, &recs); err != nil || len(recs) == 0 || len(recs) > 60 {
			twentyError(w, http.StatusBadRequest, "BadRequestException", "batch body must be an array of 1 to 60 records")
			return
		}
		for _, rec := range recs {
			m.create(segs[2], rec)
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
			if n, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && n < len(recs) {
				recs = recs[:n]
			}
			if recs == nil {
				recs = []map[string]any{}
			}
			reply(w, 200, map[string]any{"data": map[string]any{segs[1]: recs},
				"pageInfo": map[string]any{"hasNextPage": false, "startCursor": "c-start", "endCursor": "c-end"}, "totalCount": len(m.records[segs[1]])})
		case http.MethodPost:
			var rec map[string]any
			if err := json.Unmarshal(body, &rec); err != nil {
				twentyError(w, http.StatusBadRequest, "BadRequestException", "body must be a record object")
				return
			}
			m.create(segs[1], rec)
			reply(w, 201, map[string]any{"data": map[string]any{"create" + upper(singular): rec}})
		default:
			twentyError(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
		}
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
			reply(w, 200, map[string]any{"data": map[string]any{singular: rec}})
		case http.MethodPatch:
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
			if r.URL.Query().Get("soft_delete") == "true" {
				rec["deletedAt"] = "2026-11-30T10:00:00.000Z"
			} else {
				m.records[segs[1]] = slices.DeleteFunc(m.records[segs[1]], func(x map[string]any) bool { return x["id"] == segs[2] })
			}
			reply(w, 200, map[string]any{"data": map[string]any{"delete" + upper(singular): map[string]any{"id": rec["id"]}}})
		default:
			twentyError(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
		}
	default:
		twentyError(w, http.StatusNotFound, "NotFoundException", "Cannot "+r.Method+" "+r.URL.Path)
	}
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
			twentyError(w, http.StatusBadRequest, "BadRequestException", "mock: unexpected query parameter "+k)
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

func (m *mockTwenty) create(plural string, rec map[string]any) {
	m.nextID++
	rec["id"] = fmt.Sprintf("00000000-0000-4000-8000-%012d", m.nextID)
	rec["createdAt"] = "2026-11-30T10:00:00.000Z"
	m.records[plural] = append(m.records[plural], rec)
}

func upper(s string) string { return strings.ToUpper(s[:1]) + s[1:] }
