package chatwoot

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/spectest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testAccount = 7
	testToken   = "cw-token-0123456789"
	testSecret  = "cw-webhook-secret-abc"
	// inboxSecret stands for the channel credentials of inbox answers.
	inboxSecret = "cw-inbox-credential-xyz"
)

// request is what the mock provider received.
type request struct {
	Method, Path string
	Query        url.Values
	Token        string
	Body         map[string]any
}

// fault makes the mock answer a matching request ("METHOD /path" after
// the account prefix) with a status, or drop the connection (status 0).
type fault struct {
	status int
	body   string
}

// mockChatwoot answers as swagger.json describes: the response shapes of
// its schemas (account_show_response, agent list, conversation_list,
// conversation meta, conversation_show, message list, contacts_list_response,
// contact_show_response, extended_contact, message, toggle_status payload,
// user, agent, canned_response, team, inbox, label list, custom attribute
// definitions, conversation and contact label payloads), 204 for a contact
// update, 200 without a body where the document gives none (deletes,
// toggle_priority), and bad_request_error bodies.
type mockChatwoot struct {
	mu     sync.Mutex
	reqs   []request
	faults map[string]fault
	// faultHeaders are set on the answer of a fault.
	faultHeaders map[string]map[string]string
	// storing are the keys of faults of POST .../messages that store the
	// message (a GET of the conversation's messages then lists it) before
	// answering: Chatwoot answers 422 to an error raised after the
	// message was committed.
	storing map[string]bool
	// messages are the messages GET .../conversations/{id}/messages lists
	// (its latest 20), by path under the account; a conversation without
	// any lists one message of another sender.
	messages map[string][]map[string]any
	// token is the api_access_token the mock accepts ("": testToken).
	token string
}

// setToken makes the mock accept only token, as Chatwoot does once an
// agent's access token is reset.
func (m *mockChatwoot) setToken(token string) {
	m.mu.Lock()
	m.token = token
	m.mu.Unlock()
}

// setStoringFault is setFault for a POST .../messages that stores the
// message before answering f.
func (m *mockChatwoot) setStoringFault(key string, f fault) {
	m.setFault(key, f)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.storing == nil {
		m.storing = map[string]bool{}
	}
	m.storing[key] = true
}

// addMessages stores messages of the conversation at path (under the
// account, "/conversations/8/messages").
func (m *mockChatwoot) addMessages(path string, msgs ...map[string]any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.messages == nil {
		m.messages = map[string][]map[string]any{}
	}
	m.messages[path] = append(m.messages[path], msgs...)
}

func (m *mockChatwoot) setFault(key string, f fault) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.faults == nil {
		m.faults = map[string]fault{}
	}
	m.faults[key] = f
}

// setFaultHeaders sets headers on the answer of the fault of key.
func (m *mockChatwoot) setFaultHeaders(key string, h map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.faultHeaders == nil {
		m.faultHeaders = map[string]map[string]string{}
	}
	m.faultHeaders[key] = h
}

// requests returns the requests received, without reads of the account
// itself (GET /api/v1/accounts/{id}), which the host's health probes make
// at any time.
func (m *mockChatwoot) requests() []request {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []request
	for _, r := range m.reqs {
		if r.Method != "GET" || r.Path != accountPath {
			out = append(out, r)
		}
	}
	return out
}

// all returns every request received.
func (m *mockChatwoot) all() []request {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]request(nil), m.reqs...)
}

// count returns how many requests matched "METHOD /path-under-account".
func (m *mockChatwoot) count(key string) int {
	n := 0
	for _, r := range m.all() {
		if r.Method+" "+strings.TrimPrefix(r.Path, accountPath) == key {
			n++
		}
	}
	return n
}

var accountPath = fmt.Sprintf("/api/v1/accounts/%d", testAccount)

var (
	convRE        = regexp.MustCompile(`^/conversations/(\d+)$`)
	convSubRE     = regexp.MustCompile(`^/conversations/(\d+)/(messages|toggle_status|assignments)$`)
	contactRE     = regexp.MustCompile(`^/contacts/(\d+)$`)
	labelsRE      = regexp.MustCompile(`^/(conversations|contacts)/(\d+)/labels$`)
	messageRE     = regexp.MustCompile(`^/conversations/\d+/messages/\d+$`)
	contactConvRE = regexp.MustCompile(`^/contacts/\d+/conversations$`)
	idRE          = regexp.MustCompile(`^/(agents|canned_responses|inboxes|teams)/(\d+)$`)
	errorsBody    = `{"description":"%s","errors":[]}`
)

func (m *mockChatwoot) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	rec := request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Token: r.Header.Get("api_access_token")}
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &rec.Body)
	}
	rest, ok := strings.CutPrefix(r.URL.Path, accountPath)
	key := r.Method + " " + rest
	m.mu.Lock()
	m.reqs = append(m.reqs, rec)
	f, faulty := m.faults[key]
	storing := m.storing[key]
	fh := m.faultHeaders[key]
	accepted := m.token
	m.mu.Unlock()
	if accepted == "" {
		accepted = testToken
	}
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, errorsBody, "Account not found")
		return
	}
	if rec.Token != accepted {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":"You need to sign in or sign up before continuing."}`)
		return
	}
	if faulty && storing && r.Method == "POST" && convSubRE.MatchString(rest) {
		m.mu.Lock()
		id := 901 + len(m.messages[rest])
		m.mu.Unlock()
		m.addMessages(rest, map[string]any{"id": id, "content": rec.Body["content"], "message_type": 1,
			"private": rec.Body["private"], "created_at": time.Now().Unix(), "content_attributes": rec.Body["content_attributes"]})
	}
	if faulty {
		if f.status == 0 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		for k, v := range fh {
			w.Header().Set(k, v)
		}
		w.WriteHeader(f.status)
		io.WriteString(w, f.body)
		return
	}
	switch {
	case key == "DELETE /contacts/404":
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, errorsBody, "Resource could not be found")
	case key == "POST /agents":
		fmt.Fprintf(w, `{"id":4,"account_id":%d,"name":%q,"email":%q,"role":%q,"availability_status":"offline","confirmed":false}`,
			testAccount, rec.Body["name"], rec.Body["email"], rec.Body["role"])
	case r.Method == "PATCH" && idRE.MatchString(rest):
		sub := idRE.FindStringSubmatch(rest)
		if sub[1] == "agents" {
			fmt.Fprintf(w, `{"id":%s,"account_id":%d,"name":"Ada","email":"ada@acme.test","role":%q,"availability_status":"busy"}`, sub[2], testAccount, rec.Body["role"])
		} else {
			fmt.Fprintf(w, `{"id":%s,"account_id":%d,"short_code":"refund","content":%q}`, sub[2], testAccount, rec.Body["content"])
		}
	case r.Method == "DELETE" && (idRE.MatchString(rest) || contactRE.MatchString(rest)):
		// The document answers 200 without a body.
	case r.Method == "GET" && idRE.MatchString(rest):
		sub := idRE.FindStringSubmatch(rest)
		if sub[1] == "inboxes" {
			// Chatwoot adds channel credentials for administrators.
			fmt.Fprintf(w, `{"id":%s,"name":"Website","channel_type":"Channel::Email","hmac_token":"%s","imap_password":"%s",`+
				`"smtp_password":"%s","provider_config":{"api_key":"%s"}}`, sub[2], inboxSecret, inboxSecret, inboxSecret, inboxSecret)
		} else {
			fmt.Fprintf(w, `{"id":%s,"name":"Billing","description":null,"allow_auto_assign":true,"account_id":%d,"is_member":false}`, sub[2], testAccount)
		}
	case key == "GET /canned_responses":
		fmt.Fprintf(w, `[{"id":1,"account_id":%d,"short_code":"refund","content":"Refunds take 5 days."}]`, testAccount)
	case key == "POST /canned_responses":
		fmt.Fprintf(w, `{"id":2,"account_id":%d,"short_code":%q,"content":%q}`, testAccount, rec.Body["short_code"], rec.Body["content"])
	case key == "POST /conversations":
		inbox, _ := json.Marshal(rec.Body["inbox_id"])
		fmt.Fprintf(w, `{"id":77,"account_id":%d,"inbox_id":%s}`, testAccount, inbox)
	case key == "POST /conversations/filter":
		fmt.Fprint(w, `{"data":{"meta":{"mine_count":0,"unassigned_count":1,"assigned_count":0,"all_count":1},"payload":[{"id":43,"status":"pending","messages":[]}]}}`)
	case key == "POST /contacts/filter":
		fmt.Fprint(w, `{"meta":{"count":1,"current_page":2},"payload":[{"id":11,"name":"Carol","email":"carol@acme.test"}]}`)
	case r.Method == "PATCH" && convRE.MatchString(rest):
		fmt.Fprintf(w, `{"id":%s,"priority":%q,"messages":[]}`, convRE.FindStringSubmatch(rest)[1], rec.Body["priority"])
	case r.Method == "POST" && strings.HasSuffix(rest, "/toggle_priority"):
		// 200 without a body, as documented.
	case r.Method == "POST" && strings.HasSuffix(rest, "/custom_attributes"):
		b, _ := json.Marshal(map[string]any{"custom_attributes": rec.Body["custom_attributes"]})
		w.Write(b)
	case labelsRE.MatchString(rest):
		labels := rec.Body["labels"]
		if r.Method == "GET" {
			labels = []string{"vip", "billing"}
		}
		b, _ := json.Marshal(map[string]any{"payload": labels})
		w.Write(b)
	case r.Method == "DELETE" && messageRE.MatchString(rest):
		// 200 without a body, as documented.
	case r.Method == "GET" && contactConvRE.MatchString(rest):
		fmt.Fprint(w, `{"payload":[{"id":42,"status":"open","messages":[]}]}`)
	case key == "GET /inboxes":
		fmt.Fprintf(w, `{"payload":[{"id":1,"name":"Website","channel_type":"Channel::WebWidget","website_token":"public-widget","hmac_token":"%s"},`+
			`{"id":2,"name":"WhatsApp","channel_type":"Channel::Whatsapp","provider_config":{"api_key":"%s","phone_number_id":"1"}}]}`, inboxSecret, inboxSecret)
	case key == "GET /teams":
		fmt.Fprintf(w, `[{"id":2,"name":"Billing","description":null,"allow_auto_assign":true,"account_id":%d,"is_member":true}]`, testAccount)
	case key == "GET /labels":
		fmt.Fprint(w, `{"payload":[{"id":1,"title":"vip","description":"Important","color":"#ff0000","show_on_sidebar":true}]}`)
	case key == "GET /custom_attribute_definitions":
		model := map[string]string{"0": "conversation_attribute", "1": "contact_attribute"}[r.URL.Query().Get("attribute_model")]
		fmt.Fprintf(w, `[{"id":1,"attribute_display_name":"Tier","attribute_display_type":"list","attribute_key":"tier","attribute_model":%q}]`, model)
	case key == "GET ":
		fmt.Fprintf(w, `{"id":%d,"name":"Acme Support","locale":"en","domain":"acme.test","support_email":"support@acme.test","status":"active"}`, testAccount)
	case key == "GET /agents":
		fmt.Fprint(w, `[{"id":3,"name":"Ada","email":"ada@acme.test","role":"agent","availability_status":"online","confirmed":true}]`)
	case key == "GET /conversations":
		fmt.Fprint(w, `{"data":{"meta":{"mine_count":1,"unassigned_count":0,"assigned_count":1,"all_count":1},"payload":[{"id":42,"status":"open","inbox_id":1}]}}`)
	case key == "GET /conversations/meta":
		fmt.Fprint(w, `{"meta":{"mine_count":1,"unassigned_count":2,"assigned_count":3,"all_count":5}}`)
	case r.Method == "GET" && convRE.MatchString(rest):
		id := convRE.FindStringSubmatch(rest)[1]
		fmt.Fprintf(w, `{"id":%s,"status":"open","inbox_id":1,"messages":[]}`, id)
	case r.Method == "GET" && strings.HasSuffix(rest, "/messages"):
		m.mu.Lock()
		msgs := m.messages[rest]
		m.mu.Unlock()
		if len(msgs) == 0 {
			fmt.Fprint(w, `{"meta":{"labels":[]},"payload":[{"id":100,"content":"hi","message_type":0,"private":false}]}`)
			break
		}
		b, _ := json.Marshal(map[string]any{"meta": map[string]any{"labels": []string{}}, "payload": msgs[max(0, len(msgs)-20):]})
		w.Write(b)
	case key == "GET /contacts" || key == "GET /contacts/search":
		fmt.Fprint(w, `{"meta":{"count":1,"current_page":1},"payload":[{"id":9,"name":"Alice","email":"alice@acme.test"}]}`)
	case key == "GET /contacts/404":
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, errorsBody, "Contact not found")
	case r.Method == "GET" && contactRE.MatchString(rest):
		fmt.Fprintf(w, `{"payload":{"id":%s,"name":"Alice"}}`, contactRE.FindStringSubmatch(rest)[1])
	case key == "POST /contacts":
		fmt.Fprintf(w, `{"payload":{"contact":{"id":10,"name":%q},"contact_inbox":{"source_id":"src-1"}}}`, rec.Body["name"])
	case r.Method == "PUT" && contactRE.MatchString(rest):
		w.WriteHeader(http.StatusNoContent)
	case r.Method == "POST" && convSubRE.MatchString(rest):
		sub := convSubRE.FindStringSubmatch(rest)
		switch sub[2] {
		case "messages":
			b, _ := json.Marshal(map[string]any{"id": 101 + m.count("POST "+rest) - 1, "content": rec.Body["content"], "message_type": 1,
				"private": rec.Body["private"], "conversation_id": sub[1], "content_attributes": rec.Body["content_attributes"]})
			w.Write(b)
		case "toggle_status":
			fmt.Fprintf(w, `{"meta":{},"payload":{"success":true,"current_status":%q,"conversation_id":%s}}`, rec.Body["status"], sub[1])
		case "assignments":
			if id, ok := rec.Body["assignee_id"]; ok {
				fmt.Fprintf(w, `{"id":%v,"name":"Ada","email":"ada@acme.test"}`, id)
			} else { // a team assignment answers with the team
				fmt.Fprintf(w, `{"id":%v,"name":"Billing"}`, rec.Body["team_id"])
			}
		}
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, errorsBody, "not found")
	}
}

// env is a Chatwoot connector in a real host (hostsdktest.Start, on a
// journal the test can read) against the mock provider.
type env struct {
	*hostsdktest.Fixture
	mock    *mockChatwoot
	checked *spectest.Checked
	conn    *Connector
	journal *sqliteruntime.Journal
}

func newEnv(t *testing.T, edit func(*Config)) *env {
	t.Helper()
	return newEnvWithHost(t, edit, nil)
}

// newEnvWithHost is newEnv with editHost applied to the host's config too.
func newEnvWithHost(t *testing.T, edit func(*Config), editHost func(*hostsdk.Config)) *env {
	t.Helper()
	e := &env{mock: &mockChatwoot{}}
	e.checked = spectest.Load(t, "chatwoot/swagger.json").Handler(t, e.mock)
	srv := httptest.NewServer(e.checked)
	t.Cleanup(srv.Close)
	base, err := provider.ParseBaseURL("test", srv.URL, false, false)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{BaseURL: base, AccountID: testAccount, Token: provider.NewSecret(testToken),
		WebhookSecret: provider.NewSecret(testSecret)}
	if edit != nil {
		edit(&cfg)
	}
	if e.conn, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	e.journal, err = sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.journal.Close() }) // after the host stops (cleanups run last first)
	e.Fixture = hostsdktest.Start(t, e.conn, func(c *hostsdk.Config) {
		c.Journal = e.journal
		if editHost != nil {
			editHost(c)
		}
	})
	return e
}

// completed runs an action, requires completion and decodes its output.
func (e *env) completed(t *testing.T, a *aip.Action) map[string]any {
	t.Helper()
	res := e.Result(t, a)
	if res.Status != aip.ResultCompleted {
		t.Fatalf("%s: %s %+v", a.CapabilityID, res.Status, res.Error)
	}
	var out map[string]any
	if err := json.Unmarshal(res.Output, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// last returns the last request the mock received.
func (e *env) last(t *testing.T) request {
	t.Helper()
	reqs := e.mock.requests()
	if len(reqs) == 0 {
		t.Fatal("the mock received no request")
	}
	return reqs[len(reqs)-1]
}

// writeFile writes a file with a mode and returns its path.
func writeFile(t *testing.T, name, content string, mode os.FileMode) string {
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
