package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// writeSecretFile writes content to path in place (the same inode), with
// the given modification time so that a rewrite of the same size within
// the file system's timestamp granularity still looks changed.
func writeSecretFile(t *testing.T, path, content string, mode os.FileMode, mtime time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// followedSecret reads path with ReadSecret on a fake clock and a log
// buffer.
func followedSecret(t *testing.T, path string) (Secret, *fakeClock, *syncBuffer) {
	t.Helper()
	var logs syncBuffer
	s, err := ReadSecret("--x-token-file (AIP_X_TOKEN_FILE)", path, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	s.f.now = clock.Now
	st := s.f.cur.Load()
	s.f.cur.Store(&secretState{value: st.value, info: st.info, checked: clock.Now()})
	return s, clock, &logs
}

// TestSecretFollowsItsFile: a credential rewritten in place is used once
// SecretCheckInterval has passed since the last check, not before (a
// request path does not stat the file on every call), and the change is
// logged without the credential.
func TestSecretFollowsItsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	t0 := time.Now().Add(-time.Hour)
	writeSecretFile(t, path, "tok-old\n", 0o600, t0)
	s, clock, logs := followedSecret(t, path)
	if got := s.Reveal(); got != "tok-old" {
		t.Fatalf("Reveal = %q, want tok-old", got)
	}
	writeSecretFile(t, path, "tok-new\n", 0o600, t0.Add(time.Second))
	if got := s.Reveal(); got != "tok-old" {
		t.Fatalf("Reveal within the check interval = %q, want tok-old (no stat per call)", got)
	}
	clock.Add(SecretCheckInterval)
	if got := s.Reveal(); got != "tok-new" {
		t.Fatalf("Reveal after the check interval = %q, want tok-new", got)
	}
	copied := s // a copy follows the same file
	if got := copied.Reveal(); got != "tok-new" {
		t.Fatalf("a copy's Reveal = %q, want tok-new", got)
	}
	out := logs.String()
	if !strings.Contains(out, "credential file changed") || !strings.Contains(out, "AIP_X_TOKEN_FILE") || !strings.Contains(out, path) {
		t.Errorf("log %q: want an info line naming the setting and the file", out)
	}
	if strings.Contains(out, "tok-") {
		t.Errorf("the log shows a credential: %q", out)
	}
	if s.Empty() || fmt.Sprint(s) != "[redacted]" || fmt.Sprintf("%#v", s) != "provider.Secret([redacted])" {
		t.Errorf("a file secret prints as %v / %#v or is empty", s, s)
	}
}

// TestSecretAtomicRename: a new file renamed over the old one (how a
// Kubernetes secret volume and most tools update a file) is picked up.
func TestSecretAtomicRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	writeSecretFile(t, path, "tok-first", 0o600, time.Now())
	s, clock, _ := followedSecret(t, path)
	tmp := filepath.Join(dir, ".token.tmp")
	// Same size and modification time: only the inode tells it apart.
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	writeSecretFile(t, tmp, "tok-secnd", 0o600, info.ModTime())
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	clock.Add(SecretCheckInterval)
	if got := s.Reveal(); got != "tok-secnd" {
		t.Fatalf("Reveal after a rename = %q, want tok-secnd", got)
	}
}

// TestSecretFailedRereadKeepsTheValue: a file that is opened to others,
// missing (the moment of a swap), empty, or holding two words keeps
// the credential read before; the failure is logged once a
// SecretLogEvery, naming the setting and the file, never the
// credential; once the file reads again its new value is used.
func TestSecretFailedRereadKeepsTheValue(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	t0 := time.Now().Add(-time.Hour)
	writeSecretFile(t, path, "tok-good", 0o600, t0)
	s, clock, logs := followedSecret(t, path)
	for _, tc := range []struct {
		name  string
		spoil func()
		want  string
	}{
		{"chmod 644", func() {
			if err := os.Chmod(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "chmod 600"},
		{"missing", func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, "does not exist"},
		{"empty", func() { writeSecretFile(t, path, "", 0o600, t0.Add(time.Minute)) }, ""},
		{"open to others", func() { writeSecretFile(t, path, "tok-leaked", 0o644, t0.Add(2*time.Minute)) }, "chmod 600"},
		{"two words", func() { writeSecretFile(t, path, "tok one", 0o600, t0.Add(3*time.Minute)) }, "whitespace or a control character"},
	} {
		before := logs.String()
		tc.spoil()
		clock.Add(SecretLogEvery) // each failure is the first of its minute
		if got := s.Reveal(); got != "tok-good" {
			t.Fatalf("%s: Reveal = %q, want the last good tok-good", tc.name, got)
		}
		line := strings.TrimPrefix(logs.String(), before)
		if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "cannot be read again") ||
			!strings.Contains(line, "AIP_X_TOKEN_FILE") || !strings.Contains(line, path) || !strings.Contains(line, tc.want) {
			t.Errorf("%s: logged %q, want a warning naming the setting, the file and %q", tc.name, line, tc.want)
		}
		// Checks within the minute try again but do not log again.
		before = logs.String()
		clock.Add(SecretCheckInterval)
		s.Reveal()
		s.Refresh()
		if line := strings.TrimPrefix(logs.String(), before); line != "" {
			t.Errorf("%s: a second failure within %s logged %q", tc.name, SecretLogEvery, line)
		}
	}
	if strings.Contains(logs.String(), "tok-") {
		t.Errorf("the log shows a credential: %q", logs.String())
	}
	writeSecretFile(t, path, "tok-fixed", 0o600, t0.Add(4*time.Minute))
	clock.Add(SecretCheckInterval)
	if got := s.Reveal(); got != "tok-fixed" {
		t.Fatalf("Reveal once the file reads = %q, want tok-fixed", got)
	}
	if !strings.Contains(logs.String(), "credential file reads again") {
		t.Errorf("log %q: want a line saying the file reads again", logs.String())
	}
	// A failure after the recovery logs at once.
	before := logs.String()
	writeSecretFile(t, path, "", 0o600, t0.Add(5*time.Minute))
	clock.Add(SecretCheckInterval)
	s.Reveal()
	if line := strings.TrimPrefix(logs.String(), before); !strings.Contains(line, "cannot be read again") {
		t.Errorf("a failure after a recovery logged %q, want a warning at once", line)
	}
}

// TestSecretRefresh: Refresh checks the file at once, whatever the
// check interval; a rewrite its inode, size, modification time and mode
// do not tell apart is read by reread (the client's, after a 401 or 403)
// alone.
func TestSecretRefresh(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	mtime := time.Now().Add(-time.Hour)
	writeSecretFile(t, path, "tok-aaa", 0o600, mtime)
	s, _, _ := followedSecret(t, path)
	writeSecretFile(t, path, "tok-bbb", 0o600, mtime.Add(time.Second))
	if got := s.Reveal(); got != "tok-aaa" {
		t.Fatalf("Reveal = %q before Refresh, want tok-aaa", got)
	}
	s.Refresh()
	if got := s.Reveal(); got != "tok-bbb" {
		t.Fatalf("Reveal after Refresh = %q, want tok-bbb", got)
	}
	writeSecretFile(t, path, "tok-ccc", 0o600, mtime.Add(time.Second))
	s.Refresh()
	if got := s.Reveal(); got != "tok-bbb" {
		t.Fatalf("Reveal after Refresh of a file that looks unchanged = %q, want tok-bbb (a stat, not a read)", got)
	}
	s.reread()
	if got := s.Reveal(); got != "tok-ccc" {
		t.Fatalf("Reveal after reread = %q, want tok-ccc", got)
	}
	NewSecret("static").Refresh() // nothing to do
	NewSecret("static").reread()
}

// TestSecretConcurrentRotation: Reveal, Refresh and rotations at once
// (run with -race) only ever give one of the values written.
func TestSecretConcurrentRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	writeSecretFile(t, path, "tok-0", 0o600, time.Now())
	s, clock, _ := followedSecret(t, path)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if v := s.Reveal(); !strings.HasPrefix(v, "tok-") {
					t.Errorf("Reveal = %q during rotations", v)
					return
				}
				s.Refresh()
				s.reread()
				clock.Add(SecretCheckInterval)
			}
		})
	}
	for i := 1; i <= 50; i++ {
		tmp := filepath.Join(dir, ".tmp")
		writeSecretFile(t, tmp, fmt.Sprintf("tok-%d", i), 0o600, time.Now())
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	s.reread() // the last file may have an inode read before, freed and reused
	if got := s.Reveal(); got != "tok-50" {
		t.Errorf("Reveal after the rotations = %q, want tok-50", got)
	}
}

// rotatingServer answers 401 unless the request carries the bearer token
// it accepts now, and counts requests; its 401 body echoes the token
// refused.
type rotatingServer struct {
	mu       sync.Mutex
	accept   string
	requests int
}

func (m *rotatingServer) handle(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests++
	if got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); got != m.accept {
		http.Error(w, `{"message":"invalid token `+got+`"}`, http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"ok":true}`)
}

func (m *rotatingServer) set(token string) (requests int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	requests, m.requests, m.accept = m.requests, 0, token
	return requests
}

// TestClientPicksUpARotatedToken: the provider starts accepting only the
// new token; the file is rewritten; the next request, within the check
// interval, is refused 401 with the old token, the client re-reads the
// file and sends it once more with the new one, which succeeds. A 401
// with a token that did not change is not sent again; the old token,
// echoed by the provider, is still redacted after the rotation.
func TestClientPicksUpARotatedToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	mtime := time.Now().Add(-time.Hour)
	writeSecretFile(t, path, "tok-old-1234", 0o600, mtime)
	token, _, _ := followedSecret(t, path)
	srv := &rotatingServer{accept: "tok-old-1234"}
	c := newClient(t, srv.handle, func(cfg *Config) {
		cfg.Auth = func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token.Reveal()) }
		cfg.Secrets = []Secret{token}
	})
	ctx := context.Background()
	get := Request{Method: http.MethodGet, Path: "/me"}
	if _, err := c.Do(ctx, get); err != nil {
		t.Fatal(err)
	}
	srv.set("tok-new-5678")
	// Same size and modification time: only the client's reread sees it.
	writeSecretFile(t, path, "tok-new-5678", 0o600, mtime)
	post := Request{Method: http.MethodPost, Path: "/things", JSON: map[string]int{"n": 1}}
	if _, err := c.Do(ctx, post); err != nil {
		t.Fatalf("after the rotation: %v", err)
	}
	if n := srv.set("tok-other-999"); n != 2 {
		t.Errorf("the rotation took %d requests, want 2 (the refused one, then the new token)", n)
	}
	_, err := c.Do(ctx, get)
	var pe *Error
	if !errors.As(err, &pe) || pe.Status != http.StatusUnauthorized {
		t.Fatalf("with a token the provider refuses: %v, want a 401", err)
	}
	if n := srv.set(""); n != 1 {
		t.Errorf("a 401 with an unchanged token took %d requests, want 1", n)
	}
	if strings.Contains(err.Error(), "tok-new-5678") {
		t.Errorf("the error shows the token: %v", err)
	}
	if got := c.Redacted("echo tok-old-1234"); got != "echo [redacted]" {
		t.Errorf("Redacted of the token used before the rotation = %q", got)
	}
}
