package fleettest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/products/chatwoot"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/spectest"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest/realfleet"
)

const (
	account = 7
	token   = "cw-fleet-token-42"
	secret  = "cw-fleet-webhook-secret"
	leaseTT = 10 * time.Second
)

// chatwootMock is the part of Chatwoot's account API the test uses,
// answering with the shapes of swagger.json (account_show_response, and
// the message a POST .../messages creates), behind the document's
// request checker.
type chatwootMock struct {
	mu    sync.Mutex
	posts []map[string]any
}

func (m *chatwootMock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("api_access_token") != token {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"errors":["Invalid Access Token"]}`)
		return
	}
	acct := fmt.Sprintf("/api/v1/accounts/%d", account)
	switch {
	case r.Method == http.MethodGet && r.URL.Path == acct:
		fmt.Fprintf(w, `{"id":%d,"name":"Acme Support","locale":"en"}`, account)
	case r.Method == http.MethodPost && r.URL.Path == acct+"/conversations/42/messages":
		var body map[string]any
		raw, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(raw, &body)
		m.mu.Lock()
		m.posts = append(m.posts, body)
		id := 500 + len(m.posts)
		m.mu.Unlock()
		b, _ := json.Marshal(map[string]any{"id": id, "content": body["content"], "message_type": 1,
			"private": body["private"], "conversation_id": 42, "content_attributes": body["content_attributes"]})
		w.Write(b)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"description":"not found","errors":[]}`)
	}
}

func (m *chatwootMock) messages() []map[string]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]map[string]any(nil), m.posts...)
}

// TestChatwootHostInARealFleet: `aip-host chatwoot`, its journal on
// PostgreSQL, registers with the real control plane, an action sent to the dispatcher's API posts one
// message to Chatwoot and comes back completed and signed, the same
// action ID again is answered from the replica's journal without a second
// message, a signed webhook delivery to the replica's listener reaches the
// tenant's event log through the replica's outbox and the dispatcher's
// event ingress (a badly signed one is refused), and SIGTERM drains the
// replica to a clean exit with its outbox empty.
func TestChatwootHostInARealFleet(t *testing.T) {
	f := realfleet.StartWith(t, realfleet.Options{LeaseTTL: leaseTT, LogTail: 40})
	mock := &chatwootMock{}
	srv := httptest.NewServer(spectest.Load(t, "chatwoot/swagger.json").Handler(t, mock))
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "chatwoot-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(dir, "chatwoot-webhook-secret")
	if err := os.WriteFile(secretFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	// Admit the manifest the host will bind: the same configuration, the
	// fleet's trust domain.
	base, err := provider.ParseBaseURL("base", srv.URL, false, false)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := chatwoot.New(chatwoot.Config{BaseURL: base, AccountID: account, Token: provider.NewSecret(token),
		WebhookSecret: provider.NewSecret(secret)})
	if err != nil {
		t.Fatal(err)
	}
	src, err := conn.Manifest(context.Background(), hostsdk.TenantContext{TenantID: realfleet.TenantID, TrustDomain: realfleet.TrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := hostsdk.BindManifest(src, realfleet.TrustDomain)
	if err != nil {
		t.Fatal(err)
	}
	f.Admit(t, m)

	// The replica's journal is PostgreSQL (--database-url-file), as a
	// product host's is in production.
	journalURL := filepath.Join(dir, "journal-url")
	if err := os.WriteFile(journalURL, []byte(pgtest.NewDatabase(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	r := f.NewReplica(t, sidecartest.ReplicaOptions{HeartbeatInterval: time.Second, LeaseTTL: leaseTT})
	env := append(append([]string(nil), r.Env...),
		"AIP_CHATWOOT_BASE_URL="+srv.URL, fmt.Sprintf("AIP_CHATWOOT_ACCOUNT_ID=%d", account),
		"AIP_CHATWOOT_API_TOKEN_FILE="+tokenFile, "AIP_CHATWOOT_WEBHOOK_SECRET_FILE="+secretFile, "AIP_HOST_LOG_LEVEL=info",
		"AIP_CONNECTOR_HOST_DATABASE_URL_FILE="+journalURL,
		"AIP_CONNECTOR_HOST_EVENT_ENDPOINT="+f.APIURL()+aip.EventsPath)
	bin := sidecartest.Build(t, "github.com/aipfleet/aipfleet/cmd/aip-host")
	host := sidecartest.StartWith(t, bin, sidecartest.StartOptions{Name: "aip-host chatwoot", Env: env, KillWithTest: true, LogTail: 40}, "chatwoot")
	reg := f.Registry()
	sidecartest.WaitUntil(t, "the chatwoot replica to be ready", []*sidecartest.Process{host, f.ControlPlane()}, func() bool {
		rep, err := reg.ConnectorReplica(context.Background(), r.ID)
		return err == nil && rep.Status == aip.ReplicaReady && rep.LeaseValid(time.Now())
	})

	client := &http.Client{Timeout: time.Minute}
	t.Cleanup(client.CloseIdleConnections)
	tok := f.Token(t, realfleet.TenantID)
	actionID := aip.NewActionID()
	send := func() dispatch.ActionResponse {
		t.Helper()
		body := fmt.Sprintf(`{"action_id":%q,"capability_id":%q,"input":{"conversation_id":42,"content":"Your refund is on its way"}}`,
			actionID, chatwoot.CapMessageCreate)
		req, _ := http.NewRequest(http.MethodPost, f.APIURL()+dispatch.PathActions, bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out dispatch.ActionResponse
		if err := json.Unmarshal(raw, &out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("dispatcher answered %d: %s", resp.StatusCode, raw)
		}
		return out
	}
	first := send()
	if first.Result == nil || first.Result.Status != aip.ResultCompleted || first.Result.Receipt == nil {
		t.Fatalf("first answer: %+v", first)
	}
	var out map[string]any
	if err := json.Unmarshal(first.Result.Output, &out); err != nil || out["message_id"] != float64(501) {
		t.Fatalf("output %s (%v)", first.Result.Output, err)
	}
	if got := mock.messages(); len(got) != 1 || got[0]["content"] != "Your refund is on its way" ||
		got[0]["content_attributes"].(map[string]any)[chatwoot.ActionIDAttribute] != actionID {
		t.Fatalf("Chatwoot received %v", got)
	}

	again := send()
	if again.Result == nil || again.Result.Status != aip.ResultCompleted || !bytes.Equal(again.Result.Output, first.Result.Output) {
		t.Fatalf("the same action again: %+v", again)
	}
	if n := len(mock.messages()); n != 1 {
		t.Fatalf("Chatwoot received %d messages for one action", n)
	}

	// A signed webhook delivery to the replica's own listener is accepted
	// (a wrong signature is refused), its event goes through the outbox to
	// the dispatcher, and the tenant reads it from its event log.
	webhookBody := fmt.Sprintf(`{"event":"message_created","id":77,"content":"Where is my refund?","message_type":"incoming",`+
		`"private":false,"account":{"id":%d,"name":"Acme Support"},"conversation":{"id":42}}`, account)
	deliver := func(sig string) (int, string) {
		t.Helper()
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		if sig == "" {
			mac := hmac.New(sha256.New, []byte(secret))
			mac.Write([]byte(ts + "." + webhookBody))
			sig = "sha256=" + hex.EncodeToString(mac.Sum(nil))
		}
		req, _ := http.NewRequest(http.MethodPost, r.Base+chatwoot.WebhookPath, strings.NewReader(webhookBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(chatwoot.HeaderDelivery, "delivery-77")
		req.Header.Set(chatwoot.HeaderTimestamp, ts)
		req.Header.Set(chatwoot.HeaderSignature, sig)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	if status, body := deliver("sha256=" + strings.Repeat("0", 64)); status != http.StatusUnauthorized || !strings.Contains(body, "webhook.authentication_failed") {
		t.Fatalf("a badly signed delivery: %d %s", status, body)
	}
	if status, body := deliver(""); status != http.StatusOK || !strings.Contains(body, `"accepted_events":1`) {
		t.Fatalf("a signed delivery: %d %s", status, body)
	}
	logged := awaitEvents(t, f, host, client, tok, "the webhook's event in the tenant's event log")
	if ev := logged.Events[0]; len(logged.Events) != 1 || ev.Sequence != 1 || ev.ChannelID != chatwoot.Channel ||
		ev.Event.Kind != "chatwoot.message_created" || !strings.Contains(string(ev.Event.Data), `"replica_id":"`+r.ID+`"`) {
		t.Fatalf("the tenant's event log: %+v", logged)
	}
	// Delivered again (the same delivery ID): the log does not grow.
	if status, body := deliver(""); status != http.StatusOK || !strings.Contains(body, `"duplicate":true`) {
		t.Fatalf("the same delivery again: %d %s", status, body)
	}

	if err := host.Term(t); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if log := host.Log(); !strings.Contains(log, "offline") {
		t.Errorf("the host's log does not show the offline transition:\n%s", log)
	}
	rep, err := reg.ConnectorReplica(context.Background(), r.ID)
	if err != nil || rep.Status != aip.ReplicaOffline {
		t.Fatalf("after SIGTERM the registry has %+v (%v), want offline", rep.Status, err)
	}
	// The action is journaled in PostgreSQL, under the replica's namespace.
	j, err := pgruntime.OpenURLFile(context.Background(), journalURL, pgruntime.Config{Namespace: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if a, err := j.Action(context.Background(), actionID); err != nil || a.Status != aip.StateCompleted {
		t.Fatalf("the PostgreSQL journal has %+v (%v), want the action completed", a, err)
	}
	if n, err := j.PendingEvents(context.Background()); err != nil || n != 0 {
		t.Fatalf("the outbox holds %d batches (%v) after delivery, want none", n, err)
	}
}
