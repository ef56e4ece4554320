package chatwoot

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/webhook"
)

// replaceFile writes content to a new file next to path and renames it
// over path, as a Kubernetes secret volume or a deploy tool rotates a
// credential.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".new")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestTokenRotationWithoutRestart: the operator resets the agent's
// access token in Chatwoot (which then accepts only the new one) and
// rewrites --chatwoot-api-token-file; the next action succeeds on the
// same connector, its request sent with the new token. Likewise a
// webhook secret rotated in --chatwoot-webhook-secret-file, with the
// secret being replaced kept in --chatwoot-webhook-previous-secret-file,
// verifies deliveries signed with either at once.
func TestTokenRotationWithoutRestart(t *testing.T) {
	const (
		newToken  = "cw-token-rotated-9876543210"
		oldSecret = "cw-old-secret-xyz"
		newSecret = "cw-webhook-secret-rotated"
	)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	secretFile := filepath.Join(dir, "webhook-secret")
	previousFile := filepath.Join(dir, "webhook-previous-secret")
	replaceFile(t, tokenFile, testToken+"\n")
	replaceFile(t, secretFile, testSecret+"\n")
	replaceFile(t, previousFile, oldSecret+"\n")
	read := func(flag, path string) provider.Secret {
		t.Helper()
		s, err := provider.ReadSecret("--"+flag, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	e := newEnv(t, func(c *Config) {
		c.Token = read(flagTokenFile, tokenFile)
		c.WebhookSecret = read(flagWebhookSecret, secretFile)
		c.PreviousWebhookSecret = read(flagPreviousWebhookSecret, previousFile)
	})
	action := func() {
		t.Helper()
		e.completed(t, hostsdktest.NewAction(CapConversationStatus, `{"conversation_id":5,"status":"resolved"}`))
	}
	action()

	e.mock.setToken(newToken)
	replaceFile(t, tokenFile, newToken+"\n")
	action()
	if got := e.last(t).Token; got != newToken {
		t.Errorf("the action after the rotation was sent with token %q, want the new one", got)
	}

	n := 0
	signedWith := func(secret string) delivery {
		n++
		at := time.Now().Add(time.Duration(n) * time.Second)
		ts := strconv.FormatInt(at.Unix(), 10)
		d := signed("dlv-rotation-"+strconv.Itoa(n), at, incoming)
		d.sig = "sha256=" + hex.EncodeToString(webhook.HMACSHA256([]byte(secret), []byte(ts), []byte("."), []byte(incoming)))
		return d
	}
	replaceFile(t, previousFile, testSecret+"\n")
	replaceFile(t, secretFile, newSecret+"\n")
	for _, secret := range []string{newSecret, testSecret} {
		if a := e.post(t, signedWith(secret)); a.status != 200 {
			t.Fatalf("a delivery signed with the %s secret after the rotation: %d %v, want accepted",
				map[string]string{newSecret: "new", testSecret: "replaced"}[secret], a.status, a.body)
		}
	}
	if a := e.post(t, signedWith(oldSecret)); a.status != 401 {
		t.Fatalf("a delivery signed with the secret no file holds any more: %d %v, want 401", a.status, a.body)
	}
}
