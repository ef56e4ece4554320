package spectest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dify := Load(t, "dify/openapi_service.json")
	if dify.Prefix != "/v1" {
		t.Fatalf("dify prefix %q, want /v1 (from the server variable's default)", dify.Prefix)
	}
	chatwoot := Load(t, "chatwoot/swagger.json")
	crew := Load(t, "crewai/enterprise-api.en.yaml")
	cal := Load(t, "cal-diy/openapi.json")
	for _, tc := range []struct {
		name    string
		spec    *Spec
		method  string
		path    string
		header  map[string]string
		body    string
		want    string // template on success
		wantErr string
	}{
		{"dify chat", dify, "POST", "/v1/chat-messages", map[string]string{"Authorization": "Bearer k"},
			`{"inputs":{},"query":"hi","user":"u1","response_mode":"blocking"}`, "/chat-messages", ""},
		{"dify chat without query", dify, "POST", "/v1/chat-messages", map[string]string{"Authorization": "Bearer k"},
			`{"inputs":{},"user":"u1"}`, "", "does not match"},
		{"dify without credentials", dify, "POST", "/v1/chat-messages", nil,
			`{"inputs":{},"query":"hi","user":"u1"}`, "", "no credentials"},
		{"dify outside the server path", dify, "POST", "/chat-messages", map[string]string{"Authorization": "Bearer k"},
			`{}`, "", "not under the server path"},
		{"chatwoot message", chatwoot, "POST", "/api/v1/accounts/1/conversations/7/messages", map[string]string{"api_access_token": "t"},
			`{"content":"hello","message_type":"outgoing","private":false}`, "/api/v1/accounts/{account_id}/conversations/{conversation_id}/messages", ""},
		{"chatwoot message with a misspelled member", chatwoot, "POST", "/api/v1/accounts/1/conversations/7/messages", map[string]string{"api_access_token": "t"},
			`{"content":"hello","privat":true}`, "", "the body member privat is not in the document's schema"},
		{"chatwoot conversation with an undocumented nested member", chatwoot, "POST", "/api/v1/accounts/1/conversations", map[string]string{"api_access_token": "t"},
			`{"source_id":"s","message":{"content":"hi","content_attributes":{}}}`, "", "the body member message.content_attributes is not in the document's schema"},
		{"chatwoot conversation with free-form attributes", chatwoot, "POST", "/api/v1/accounts/1/conversations", map[string]string{"api_access_token": "t"},
			`{"source_id":"s","custom_attributes":{"anything":1},"message":{"content":"hi","template_params":{"name":"n","processed_params":{"1":"x"}}}}`,
			"/api/v1/accounts/{account_id}/conversations", ""},
		{"chatwoot without token", chatwoot, "GET", "/api/v1/accounts/1/conversations", nil, "", "", "no credentials"},
		{"chatwoot unknown method", chatwoot, "PUT", "/api/v1/accounts/1/conversations/7/messages", map[string]string{"api_access_token": "t"},
			"", "", "has no PUT operation"},
		{"unknown path", chatwoot, "GET", "/api/v9/nothing", nil, "", "", "no path matches"},
		{"chatwoot list with documented parameters", chatwoot, "GET", "/api/v1/accounts/1/conversations?status=open&inbox_id=2&labels=vip,billing&page=3",
			map[string]string{"api_access_token": "t"}, "", "/api/v1/accounts/{account_id}/conversations", ""},
		{"chatwoot undocumented query parameter", chatwoot, "GET", "/api/v1/accounts/1/conversations?per_page=5",
			map[string]string{"api_access_token": "t"}, "", "", `query parameter "per_page" is not in the document`},
		{"chatwoot query value outside the enum", chatwoot, "GET", "/api/v1/accounts/1/conversations?status=closed",
			map[string]string{"api_access_token": "t"}, "", "", `"closed" is not one of`},
		{"chatwoot query integer spelled as a decimal", chatwoot, "GET", "/api/v1/accounts/1/conversations?inbox_id=2.0",
			map[string]string{"api_access_token": "t"}, "", "", `"2.0" is not of type integer`},
		{"chatwoot query parameter repeated", chatwoot, "GET", "/api/v1/accounts/1/conversations?page=1&page=2",
			map[string]string{"api_access_token": "t"}, "", "", `"page" is given 2 times`},
		{"chatwoot path ID not an integer", chatwoot, "GET", "/api/v1/accounts/1/conversations/42.0",
			map[string]string{"api_access_token": "t"}, "", "", `path parameter {conversation_id}: "42.0" is not of type integer`},
		{"crewai kickoff", crew, "POST", "/kickoff", map[string]string{"Authorization": "Bearer k"},
			`{"inputs":{"topic":"x"}}`, "/kickoff", ""},
		{"crewai status", crew, "GET", "/status/abc-123", map[string]string{"Authorization": "Bearer k"}, "", "/status/{kickoff_id}", ""},
		{"cal bookings without version header", cal, "GET", "/v2/bookings", map[string]string{"Authorization": "Bearer k"}, "", "", "cal-api-version"},
		{"cal booking create (oneOf of overlapping inputs)", cal, "POST", "/v2/bookings",
			map[string]string{"Authorization": "Bearer k", "cal-api-version": "2024-08-13"},
			`{"start":"2030-01-01T10:00:00Z","eventTypeId":1,"attendee":{"name":"A","email":"a@example.com","timeZone":"Europe/Rome"}}`, "/v2/bookings", ""},
		{"cal booking create without attendee", cal, "POST", "/v2/bookings",
			map[string]string{"Authorization": "Bearer k", "cal-api-version": "2024-08-13"},
			`{"start":"2030-01-01T10:00:00Z","eventTypeId":1}`, "", "does not match"},
		{"cal bookings", cal, "GET", "/v2/bookings", map[string]string{"Authorization": "Bearer k", "cal-api-version": "2024-08-13"}, "", "/v2/bookings", ""},
		{"dify upload", dify, "POST", "/v1/files/upload", map[string]string{"Authorization": "Bearer k", "Content-Type": multipartType},
			multipartBody(`name="file"; filename="a.png"`, `name="user"`), "/files/upload", ""},
		{"dify upload without user", dify, "POST", "/v1/files/upload", map[string]string{"Authorization": "Bearer k", "Content-Type": multipartType},
			multipartBody(`name="file"; filename="a.png"`), "/files/upload", ""},
		{"dify upload without the file", dify, "POST", "/v1/files/upload", map[string]string{"Authorization": "Bearer k", "Content-Type": multipartType},
			multipartBody(`name="user"`), "", `required part "file"`},
		{"dify upload with the file as a field", dify, "POST", "/v1/files/upload", map[string]string{"Authorization": "Bearer k", "Content-Type": multipartType},
			multipartBody(`name="file"`), "", "must be a file"},
		{"dify upload with an unknown part", dify, "POST", "/v1/files/upload", map[string]string{"Authorization": "Bearer k", "Content-Type": multipartType},
			multipartBody(`name="file"; filename="a.png"`, `name="purpose"`), "", `"purpose" is not a property`},
		{"dify upload as JSON", dify, "POST", "/v1/files/upload", map[string]string{"Authorization": "Bearer k"},
			`{"file":"x"}`, "", "the document accepts multipart/form-data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if tc.body != "" && tc.header["Content-Type"] == "" {
				r.Header.Set("Content-Type", "application/json")
			}
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			got, err := tc.spec.Check(r, []byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Check: %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Check = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

const multipartType = "multipart/form-data; boundary=XyZ"

// multipartBody is a multipart/form-data body (boundary XyZ) with one part
// per Content-Disposition parameter list.
func multipartBody(dispositions ...string) string {
	var b strings.Builder
	for _, d := range dispositions {
		b.WriteString("--XyZ\r\nContent-Disposition: form-data; " + d + "\r\n\r\nvalue\r\n")
	}
	b.WriteString("--XyZ--\r\n")
	return b.String()
}

type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) { r.errs = append(r.errs, format) }

func TestHandlerFailsTheTestOnAnUndocumentedRequest(t *testing.T) {
	crew := Load(t, "crewai/enterprise-api.en.yaml")
	rec := &recorder{TB: t}
	served := 0
	h := crew.Handler(rec, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/launch", nil))
	if w.Code != http.StatusBadRequest || len(rec.errs) != 1 || served != 0 {
		t.Fatalf("undocumented request: status %d, %d test errors, served %d; want 400, 1, 0", w.Code, len(rec.errs), served)
	}
	r := httptest.NewRequest("GET", "/inputs", nil)
	r.Header.Set("Authorization", "Bearer k")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if served != 1 || len(h.Served()) != 1 || h.Served()[0] != "GET /inputs" {
		t.Fatalf("documented request: served %d, Served() = %v", served, h.Served())
	}
}

func TestValidateSchema(t *testing.T) {
	cal := Load(t, "cal-diy/openapi.json")
	const ptr = "/components/schemas/CreateBookingInput_2024_08_13"
	ok := `{"start":"2030-01-01T10:00:00Z","eventTypeId":1,"attendee":{"name":"A","email":"a@example.com","timeZone":"Europe/Rome"}}`
	if err := cal.ValidateSchema(ptr, []byte(ok)); err != nil {
		t.Fatal(err)
	}
	if err := cal.ValidateSchema(ptr, []byte(`{"start":"x"}`)); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("an incomplete body: %v", err)
	}
	if err := cal.ValidateSchema("/components/schemas/NoSuchSchema", []byte(ok)); err == nil {
		t.Fatal("an unknown schema validated")
	}
}
