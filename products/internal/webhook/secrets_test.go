package webhook

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// TestSecretsVerify: a signature made with the current or the previous
// secret verifies, any other does not; both secrets are always tried;
// deliveries verified with the previous secret are logged at info once a
// streak, and the first verified with the current one after them once.
func TestSecretsVerify(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	s := &Secrets{Current: provider.NewSecret("new"), Previous: provider.NewSecret("old"), PreviousSetting: "--x-webhook-previous-secret-file"}
	verify := func(signedWith string) (ok bool, tried []string, logged string) {
		buf.Reset()
		ok = s.Verify(log, "test webhook", func(secret []byte) bool {
			tried = append(tried, string(secret))
			return string(secret) == signedWith
		}, "delivery", "d-"+signedWith)
		return ok, tried, buf.String()
	}
	steps := []struct {
		signedWith string
		ok         bool
		log        string // "" for no line
	}{
		{"new", true, ""}, // the current secret from the start: nothing to say
		{"old", true, "verified with the previous webhook secret (--x-webhook-previous-secret-file)"},
		{"old", true, ""},
		{"stranger", false, ""},
		{"new", true, "the product has switched; once no more deliveries verify with the previous secret, remove --x-webhook-previous-secret-file"},
		{"new", true, ""},
		{"old", true, "verified with the previous webhook secret"},
	}
	for i, st := range steps {
		ok, tried, logged := verify(st.signedWith)
		if ok != st.ok {
			t.Errorf("step %d: signed with %q: Verify = %v, want %v", i, st.signedWith, ok, st.ok)
		}
		if strings.Join(tried, ",") != "new,old" {
			t.Errorf("step %d: tried %v, want both secrets whatever the first answers", i, tried)
		}
		switch {
		case st.log == "" && logged != "":
			t.Errorf("step %d: logged %q, want nothing", i, logged)
		case st.log != "" && (!strings.Contains(logged, st.log) || !strings.Contains(logged, "level=INFO") ||
			!strings.Contains(logged, "delivery=d-"+st.signedWith) || strings.Count(logged, "\n") != 1):
			t.Errorf("step %d: logged %q, want one info line with %q", i, logged, st.log)
		}
	}

	// Without a previous secret only the current one is tried.
	one := &Secrets{Current: provider.NewSecret("new")}
	var tried []string
	if one.Verify(log, "test webhook", func(secret []byte) bool { tried = append(tried, string(secret)); return false }) || len(tried) != 1 {
		t.Errorf("without a previous secret: tried %v", tried)
	}
}

// TestSecretsFollowTheirFiles: secrets read from files are read again
// when a delivery verifies with neither: one signed with a secret just
// written to the file verifies at once, without waiting for the check
// interval; a signature matching no file is still refused.
func TestSecretsFollowTheirFiles(t *testing.T) {
	dir := t.TempDir()
	read := func(name, content string) (provider.Secret, string) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := provider.ReadSecret("--x-"+name, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s, path
	}
	cur, curPath := read("secret", "whsec-one")
	prev, prevPath := read("previous", "whsec-zero")
	s := &Secrets{Current: cur, Previous: prev, PreviousSetting: "--x-previous"}
	log := slog.New(slog.DiscardHandler)
	signedWith := func(signed string) func([]byte) bool {
		return func(secret []byte) bool { return string(secret) == signed }
	}
	replace := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	replace(prevPath, "whsec-one")
	replace(curPath, "whsec-two")
	for _, signed := range []string{"whsec-two", "whsec-one"} {
		if !s.Verify(log, "test webhook", signedWith(signed)) {
			t.Errorf("a delivery signed with %s after the rotation was refused", signed)
		}
	}
	if s.Verify(log, "test webhook", signedWith("whsec-zero")) {
		t.Error("a delivery signed with the secret no file holds any more verified")
	}
}
