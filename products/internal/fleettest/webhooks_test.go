package fleettest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/products/internal/spectest"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest/realfleet"
)

func hmacHex(secret string, parts ...string) string {
	m := hmac.New(sha256.New, []byte(secret))
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// webhookProduct is a product whose signed webhooks become provider
// events: its settings against a mock of its API (enough for the host's
// health probe) and one signed delivery.
type webhookProduct struct {
	name string
	// mock answers the health probe as the product does.
	mock http.Handler
	// env returns the product's settings, given the mock's URL and files
	// holding its token and webhook secret.
	env func(base, token, secret string) []string
	// deliver returns a signed delivery to the replica at base.
	deliver func(base, secret string) *http.Request
	kind    string
}

// TestWebhooksReachTheEventLog: for every product with webhooks, the
// real aip-host process prints the manifest the registry admits, registers
// with the real control plane, accepts a signed delivery on its own
// listener and delivers its event to the real dispatcher, where the tenant
// reads it; SIGTERM then drains it to a clean exit.
func TestWebhooksReachTheEventLog(t *testing.T) {
	workspace := "3b8e6458-5fc1-4e63-8563-008ccddaa6db"
	bearer := func(next func(http.ResponseWriter, *http.Request)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if r.Header.Get("Authorization") != "Bearer "+token {
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, `{"statusCode":401,"error":"Unauthorized","messages":["bad token"]}`)
				return
			}
			next(w, r)
		})
	}
	products := []webhookProduct{
		{
			name: "twenty",
			// Twenty's REST API (api.mdx): GET /rest/<object> lists records.
			mock: bearer(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodGet || r.URL.Path != "/rest/people" {
					w.WriteHeader(http.StatusNotFound)
					fmt.Fprint(w, `{"statusCode":404,"error":"NotFoundException","messages":["not found"]}`)
					return
				}
				fmt.Fprint(w, `{"data":{"people":[]},"pageInfo":{"hasNextPage":false},"totalCount":0}`)
			}),
			env: func(base, token, secret string) []string {
				return []string{"AIP_TWENTY_BASE_URL=" + base, "AIP_TWENTY_WORKSPACE_ID=" + workspace,
					"AIP_TWENTY_API_TOKEN_FILE=" + token, "AIP_TWENTY_WEBHOOK_SECRET_FILE=" + secret}
			},
			deliver: func(base, secret string) *http.Request {
				body := fmt.Sprintf(`{"eventName":"person.created","workspaceId":%q,"webhookId":"9f2a2f4e-0d39-4c47-9a3d-3c3e8d9f7a11",`+
					`"eventDate":%q,"record":{"id":"0a6ba1d4-6c2b-4bd4-9e3a-5f0e0f0a1b2c","name":{"firstName":"Ada"}}}`,
					workspace, time.Now().UTC().Format(time.RFC3339))
				ts := strconv.FormatInt(time.Now().UnixMilli(), 10)
				req, _ := http.NewRequest(http.MethodPost, base+"/webhooks/twenty", strings.NewReader(body))
				req.Header.Set("X-Twenty-Webhook-Timestamp", ts)
				req.Header.Set("X-Twenty-Webhook-Signature", hmacHex(readFile(secret), ts, ":", body))
				req.Header.Set("X-Twenty-Webhook-Nonce", strings.Repeat("ab", 16))
				return req
			},
			kind: "twenty.person.created",
		},
		{
			name: "cal-diy",
			// GET /v2/me, the health probe, as the published document
			// describes it (the mock runs behind its checker below).
			mock: bearer(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, `{"status":"success","data":{"id":1,"email":"owner@example.com","timeFormat":24,"defaultScheduleId":1,"weekStart":"Monday","timeZone":"Europe/Rome","username":"owner"}}`)
			}),
			env: func(base, token, secret string) []string {
				return []string{"AIP_CAL_DIY_BASE_URL=" + base, "AIP_CAL_DIY_BEARER_TOKEN_FILE=" + token,
					"AIP_CAL_DIY_WEBHOOK_SECRET_FILES=sub-1=" + secret}
			},
			deliver: func(base, secret string) *http.Request {
				body := `{"triggerEvent":"BOOKING_CREATED","createdAt":"` + time.Now().UTC().Format(time.RFC3339) +
					`","payload":{"uid":"bk-1","title":"Intro call","startTime":"2050-09-05T09:00:00Z"}}`
				req, _ := http.NewRequest(http.MethodPost, base+"/webhooks/cal-diy/sub-1", strings.NewReader(body))
				req.Header.Set("X-Cal-Signature-256", hmacHex(readFile(secret), body))
				req.Header.Set("X-Cal-Webhook-Version", "2021-10-20")
				return req
			},
			kind: "cal_diy.booking_created",
		},
	}
	bin := sidecartest.Build(t, "github.com/aipfleet/aipfleet/cmd/aip-host")
	for _, p := range products {
		t.Run(p.name, func(t *testing.T) {
			f := realfleet.StartWith(t, realfleet.Options{LeaseTTL: leaseTT, LogTail: 40})
			mock := p.mock
			if p.name == "cal-diy" {
				mock = spectest.Load(t, "cal-diy/openapi.json").Handler(t, mock)
			}
			srv := httptest.NewServer(mock)
			t.Cleanup(srv.Close)
			dir := t.TempDir()
			tokenFile, secretFile := filepath.Join(dir, "token"), filepath.Join(dir, "secret")
			must(t, os.WriteFile(tokenFile, []byte(token), 0o600))
			must(t, os.WriteFile(secretFile, []byte("whsec-"+p.name), 0o600))
			productEnv := p.env(srv.URL, tokenFile, secretFile)

			// The manifest the registry admits is the one the binary prints.
			cmd := exec.Command(bin, p.name, "--print-manifest")
			cmd.Env = append(append(os.Environ(), productEnv...),
				"AIP_CONNECTOR_HOST_TRUST_DOMAIN="+realfleet.TrustDomain, "AIP_CONNECTOR_HOST_TENANT_ID="+realfleet.TenantID)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("aip-host %s --print-manifest: %v\n%s", p.name, err, out)
			}
			var printed struct {
				Manifest aip.Manifest `json:"manifest"`
			}
			must(t, json.Unmarshal(out, &printed))
			f.Admit(t, &printed.Manifest)

			r := f.NewReplica(t, sidecartest.ReplicaOptions{HeartbeatInterval: time.Second, LeaseTTL: leaseTT})
			env := append(append(append([]string(nil), r.Env...), productEnv...),
				"AIP_CONNECTOR_HOST_EVENT_ENDPOINT="+f.APIURL()+aip.EventsPath)
			host := sidecartest.StartWith(t, bin, sidecartest.StartOptions{Name: "aip-host " + p.name, Env: env, KillWithTest: true, LogTail: 40}, p.name)
			reg := f.Registry()
			sidecartest.WaitUntil(t, "the "+p.name+" replica to be ready", []*sidecartest.Process{host, f.ControlPlane()}, func() bool {
				rep, err := reg.ConnectorReplica(context.Background(), r.ID)
				return err == nil && rep.Status == aip.ReplicaReady && rep.LeaseValid(time.Now())
			})

			client := &http.Client{Timeout: time.Minute}
			t.Cleanup(client.CloseIdleConnections)
			resp, err := client.Do(p.deliver(r.Base, secretFile))
			if err != nil {
				t.Fatal(err)
			}
			var answer bytes.Buffer
			answer.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(answer.String(), `"accepted_events":1`) {
				t.Fatalf("the signed delivery: %d %s", resp.StatusCode, answer.String())
			}

			tok := f.Token(t, realfleet.TenantID)
			logged := awaitEvents(t, f, host, client, tok, "the delivery's event in the tenant's event log")
			if ev := logged.Events[0]; len(logged.Events) != 1 || ev.Event.Kind != p.kind || aip.ValidateID(aip.PrefixEvent, ev.Event.ID) != nil {
				t.Fatalf("the tenant's event log: %+v", logged)
			}
			if err := host.Term(t); err != nil {
				t.Fatalf("SIGTERM: %v", err)
			}
		})
	}
}

// awaitEvents reads the tenant's event log through the dispatcher's API
// with tok until it holds an event, and returns it.
func awaitEvents(t *testing.T, f *realfleet.Fleet, host *sidecartest.Process, client *http.Client, tok, what string) dispatch.EventsResponse {
	t.Helper()
	var logged dispatch.EventsResponse
	sidecartest.WaitUntil(t, what, []*sidecartest.Process{host, f.Dispatcher()}, func() bool {
		req, _ := http.NewRequest(http.MethodGet, f.APIURL()+dispatch.PathEvents, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		logged = dispatch.EventsResponse{}
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&logged) == nil && len(logged.Events) > 0
	})
	return logged
}

func readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
