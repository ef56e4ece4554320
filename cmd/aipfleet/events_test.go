package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// eventsDispatcher serves a real dispatcher's API on a memregistry event
// log that trusts issuerKey, and returns its URL and the log.
func eventsDispatcher(t *testing.T, issuerKey *aip.SigningKey) (string, *memregistry.Registry) {
	t.Helper()
	return eventsDispatcherAt(t, issuerKey, nil)
}

// eventsDispatcherAt is eventsDispatcher checking tokens by clock (nil:
// time.Now).
func eventsDispatcherAt(t *testing.T, issuerKey *aip.SigningKey, clock func() time.Time) (string, *memregistry.Registry) {
	t.Helper()
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "aipfleet-dev", DIDs: []string{issuerKey.DID()}}},
		Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := aip.GenerateSigningKey()
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: DefaultGatewayPrincipal, Now: clock},
		dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: v, Events: reg, Records: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(func() { srv.Close(); d.Close() })
	return srv.URL, reg
}

// appendEvents stores events of the given kinds in the tenant's log.
func appendEvents(t *testing.T, reg *memregistry.Registry, tenant string, kinds ...string) []string {
	t.Helper()
	var ids []string
	b := registry.EventBatch{TenantID: tenant, InstanceID: aip.NewID(aip.PrefixInstance), ReplicaID: aip.NewID(aip.PrefixReplica),
		ChannelID: "chatwoot.webhooks", ReceivedAt: time.Now()}
	for _, k := range kinds {
		id := aip.NewID(aip.PrefixEvent)
		ids = append(ids, id)
		b.Events = append(b.Events, aip.Event{ID: id, Kind: k, OccurredAt: aip.At(time.Now()), Data: json.RawMessage(`{"kind":"` + k + `"}`)})
	}
	if _, err := reg.AppendEvents(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestEventsList(t *testing.T) {
	issuerKey, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "issuer.key")
	if err := aip.WriteSeedFile(keyFile, issuerKey); err != nil {
		t.Fatal(err)
	}
	url, reg := eventsDispatcher(t, issuerKey)
	ids := appendEvents(t, reg, "acme", "a", "b", "c")
	appendEvents(t, reg, "other", "theirs")
	env := map[string]string{"AIP_CLIENT_URL": url, "AIP_CLIENT_ISSUER_KEY": keyFile}

	out, errOut, err := runCLI(t, env, "events", "list", "--tenant", "acme", "--limit", "2")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "1 ") || !strings.Contains(lines[0], ids[0]) || !strings.Contains(lines[1], ids[1]) ||
		!strings.Contains(lines[0], `chatwoot.webhooks a`) || !strings.Contains(lines[0], `{"kind":"a"}`) {
		t.Errorf("first page:\n%s", out)
	}
	if !strings.Contains(errOut, "aipfleet events list --after 2") {
		t.Errorf("stderr %q does not say how to read on", errOut)
	}

	out, errOut, err = runCLI(t, env, "events", "list", "--tenant", "acme", "--after", "2", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rec dispatch.EventRecord
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &rec); err != nil || rec.Sequence != 3 || rec.Event.ID != ids[2] {
		t.Errorf("--after 2 --json: %q (%v)", out, err)
	}
	if errOut != "" {
		t.Errorf("the last page says %q on stderr", errOut)
	}
	// Nothing after the last event: said on stderr, stdout stays empty.
	if out, errOut, err = runCLI(t, env, "events", "list", "--tenant", "acme", "--after", "3"); err != nil || out != "" || errOut != "no events after sequence 3\n" {
		t.Errorf("past the end: %q, %q, %v", out, errOut, err)
	}

	// --follow pages to the end, then prints events as they arrive.
	ctx, cancel := context.WithCancel(context.Background())
	w := &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"events", "list", "--tenant", "acme", "--limit", "1", "--follow", "--interval", "5ms"},
			func(k string) string { return env[k] }, w, &lineWriter{})
	}()
	next := func() string {
		t.Helper()
		select {
		case l := <-w.lines:
			return l
		case <-time.After(20 * time.Second):
			cancel()
			t.Fatal("no event line from --follow")
			return ""
		}
	}
	for _, id := range ids {
		if l := next(); !strings.Contains(l, id) {
			t.Errorf("--follow printed %q, want %s", l, id)
		}
	}
	later := appendEvents(t, reg, "acme", "d")
	if l := next(); !strings.HasPrefix(l, "4 ") || !strings.Contains(l, later[0]) {
		t.Errorf("--follow printed %q, want event 4 %s", l, later[0])
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("--follow ended with %v, want nil when interrupted", err)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"events"}, "name a subcommand"},
		{[]string{"events", "tail"}, "unknown subcommand"},
		{[]string{"events", "list", "--token", "x", "--after", "-1"}, "--after"},
		{[]string{"events", "list", "--token", "x", "--limit", "0"}, "--limit 0"},
		{[]string{"events", "list", "--token", "x", "--limit", "1001"}, "--limit 1001"},
		{[]string{"events", "list", "--token", "x", "extra"}, "unexpected argument"},
		{[]string{"events", "list", "--token", "x", "--tenant", "t"}, "events list: give either --token or --tenant"},
	} {
		_, _, err := runCLI(t, map[string]string{"AIP_CLIENT_URL": url}, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
	if _, _, err := runCLI(t, map[string]string{"AIP_CLIENT_URL": url}, "events", "list", "--token", "nope"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a bad token: err = %v, want HTTP 401", err)
	}
}

// lineWriter passes each complete line written to it to lines (when set).
type lineWriter struct {
	mu    sync.Mutex
	buf   []byte
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		if w.lines != nil {
			w.lines <- string(w.buf[:i])
		}
		w.buf = w.buf[i+1:]
	}
}

// TestEventsListEscapesControlCharacters: a provider's kind or data cannot
// send terminal escape sequences or forge lines of the listing.
func TestEventsListEscapesControlCharacters(t *testing.T) {
	issuerKey, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "issuer.key")
	if err := aip.WriteSeedFile(keyFile, issuerKey); err != nil {
		t.Fatal(err)
	}
	url, reg := eventsDispatcher(t, issuerKey)
	b := registry.EventBatch{TenantID: "acme", InstanceID: aip.NewID(aip.PrefixInstance), ReplicaID: aip.NewID(aip.PrefixReplica),
		ChannelID: "chatwoot.webhooks", ReceivedAt: time.Now(), Events: []aip.Event{{ID: aip.NewID(aip.PrefixEvent),
			Kind: "evil\x1b]0;pwned\x07\n2 forged", OccurredAt: aip.At(time.Now()), Data: json.RawMessage("{\"t\":\"a\u009b2J\u202eb\"}")}}}
	if _, err := reg.AppendEvents(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, map[string]string{"AIP_CLIENT_URL": url, "AIP_CLIENT_ISSUER_KEY": keyFile}, "events", "list", "--tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "\n") != 1 || strings.ContainsAny(out, "\x1b\x07\u009b\u202e") {
		t.Fatalf("the listing passes control characters through:\n%q", out)
	}
	if !strings.Contains(out, `evil\u001b]0;pwned\u0007\u000a2 forged`) || !strings.Contains(out, `{"t":"a\u009b2J\u202eb"}`) {
		t.Errorf("the listing does not show the escaped kind and data:\n%q", out)
	}
}

// TestEventsFollowOutlastsADispatcherRestart: with --follow, a request that
// gets no answer or a 5xx (the dispatcher restarting) is reported and asked
// again; a definitive refusal still ends the command.
func TestEventsFollowOutlastsADispatcherRestart(t *testing.T) {
	issuerKey, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "issuer.key")
	if err := aip.WriteSeedFile(keyFile, issuerKey); err != nil {
		t.Fatal(err)
	}
	real, reg := eventsDispatcher(t, issuerKey)
	ids := appendEvents(t, reg, "acme", "a")
	var mu sync.Mutex
	failures := 2 // a 503, then a dropped connection
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := failures
		failures--
		mu.Unlock()
		switch n {
		case 2:
			http.Error(w, `{"error":{"code":"dispatch.unavailable","message":"restarting"}}`, http.StatusServiceUnavailable)
			return
		case 1:
			hj, _ := w.(http.Hijacker)
			c, _, _ := hj.Hijack()
			c.Close()
			return
		}
		proxy := httputil.NewSingleHostReverseProxy(mustParseURL(t, real))
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	env := map[string]string{"AIP_CLIENT_URL": front.URL, "AIP_CLIENT_ISSUER_KEY": keyFile}

	ctx, cancel := context.WithCancel(context.Background())
	w, errw := &lineWriter{lines: make(chan string, 16)}, &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"events", "list", "--tenant", "acme", "--follow", "--interval", "5ms"},
			func(k string) string { return env[k] }, w, errw)
	}()
	select {
	case l := <-w.lines:
		if !strings.Contains(l, ids[0]) {
			t.Errorf("--follow printed %q, want %s", l, ids[0])
		}
	case err := <-done:
		cancel()
		t.Fatalf("--follow ended at a failed request: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("no event line from --follow")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("--follow ended with %v, want nil when interrupted", err)
	}
	if l := <-errw.lines; !strings.Contains(l, "HTTP 503") || !strings.Contains(l, "asking again") {
		t.Errorf("stderr %q does not report the 503", l)
	}

	// A definitive refusal (a token for no trusted issuer) ends it.
	other, _ := aip.GenerateSigningKey()
	otherFile := filepath.Join(t.TempDir(), "other.key")
	aip.WriteSeedFile(otherFile, other)
	_, _, err := runCLI(t, map[string]string{"AIP_CLIENT_URL": real, "AIP_CLIENT_ISSUER_KEY": otherFile}, "events", "list", "--tenant", "acme", "--follow")
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("--follow with an untrusted token: %v, want the 401", err)
	}
}

func mustParseURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestEventsFollowOutlastsItsToken: --follow with --tenant and --issuer-key
// runs past the 15 minutes a minted token lasts (it mints a new one before
// the old one expires) instead of ending at the dispatcher's 401.
func TestEventsFollowOutlastsItsToken(t *testing.T) {
	issuerKey, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(t.TempDir(), "issuer.key")
	if err := aip.WriteSeedFile(keyFile, issuerKey); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	url, reg := eventsDispatcherAt(t, issuerKey, clock)

	f := &eventsFlags{limit: 10, follow: true, interval: time.Millisecond, client: actionFlags{
		url: url, tenant: "acme", issuerKey: keyFile, issuer: "aipfleet-dev", audience: tenanttoken.DefaultAudience,
		requestTimeout: 10 * time.Second, command: "events", now: clock}}
	w := &lineWriter{lines: make(chan string, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.list(ctx, &http.Client{}, &env{stdout: w, stderr: &lineWriter{}}) }()

	// Each step moves the clock less than a token's lifetime, so the
	// token of a request in flight stays valid; three steps outlast the
	// first token by far.
	for step := range 4 {
		if step > 0 {
			mu.Lock()
			now = now.Add(mintedTokenTTL - 30*time.Second)
			mu.Unlock()
		}
		ids := appendEvents(t, reg, "acme", fmt.Sprint("step-", step))
		select {
		case l := <-w.lines:
			if !strings.Contains(l, ids[0]) {
				t.Fatalf("step %d: --follow printed %q, want %s", step, l, ids[0])
			}
		case err := <-done:
			t.Fatalf("step %d (%s after the first token was minted): --follow ended with %v", step,
				time.Duration(step)*(mintedTokenTTL-30*time.Second), err)
		case <-time.After(20 * time.Second):
			t.Fatalf("step %d: no event line from --follow", step)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("--follow ended with %v, want nil when interrupted", err)
	}
}
