package provider

import (
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/logthrottle"
)

// SecretCheckInterval is the least time between two checks of a
// credential file for a change (an os.Stat) made by Secret.Reveal, so
// that a request path under load does not stat the file on every call.
const SecretCheckInterval = time.Second

// SecretLogEvery is the least time between two log lines about one
// credential file that cannot be read again.
const SecretLogEvery = time.Minute

// Secret is a credential. It prints as [redacted] in every format, so it
// can sit in a config struct that gets logged.
//
// A Secret from NewSecret holds its value. One from ReadSecret follows
// its file: Reveal returns what the file holds, checked for a change at
// most once per SecretCheckInterval, so that a credential an operator
// rotates (rewriting the file, or renaming a new one over it, as a
// Kubernetes secret volume does) is used without a restart. A Secret is
// safe for concurrent use and may be copied: copies follow the same
// file.
type Secret struct {
	v string
	f *secretFile
}

// NewSecret wraps a credential value.
func NewSecret(v string) Secret { return Secret{v: v} }

// Reveal returns the credential, for the one place that sends it. For a
// Secret from ReadSecret it is the value the file held when last read:
// when SecretCheckInterval has passed since the last check, Reveal first
// checks whether the file changed (its inode, size, modification time or
// mode) and re-reads it if so. A re-read that fails keeps the last value
// read (see ReadSecret).
func (s Secret) Reveal() string {
	if s.f != nil {
		return s.f.value()
	}
	return s.v
}

// Empty reports whether no credential is set.
func (s Secret) Empty() bool { return s.f == nil && s.v == "" }

// Refresh checks the file of a Secret from ReadSecret now, without
// waiting for SecretCheckInterval, and re-reads it when it changed (its
// inode, size, modification time or mode), with the same keeping of the
// last value when the read fails. A webhook route calls it when a
// delivery verifies with none of its secrets: a stat per such delivery,
// which anyone may send. For a Secret from NewSecret it does nothing.
func (s Secret) Refresh() {
	if s.f == nil {
		return
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.checkLocked(false)
}

// reread reads the file of a Secret from ReadSecret now, whether or not
// it looks changed. The client calls it when the provider refused a
// request with 401 or 403 (see Config.Secrets), so that a rewrite of the
// file its inode, size, modification time and mode do not tell apart (the
// same size, within the file system's timestamp granularity) is read
// then.
func (s Secret) reread() {
	if s.f == nil {
		return
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.checkLocked(true)
}

// generation counts the changes of the value Reveal returns.
func (s Secret) generation() uint64 {
	if s.f == nil {
		return 0
	}
	return s.f.gen.Load()
}

func (s Secret) String() string   { return "[redacted]" }
func (s Secret) GoString() string { return "provider.Secret([redacted])" }

// MarshalJSON keeps a secret out of any JSON.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }

// ReadSecret reads a credential file: owner-only, a regular file, 1 to
// 16 KiB, surrounding whitespace removed, and no whitespace or control
// characters inside. what names the setting in errors
// ("--chatwoot-api-token-file (AIP_CHATWOOT_API_TOKEN_FILE)").
//
// The Secret it returns follows the file (see Secret): a change is read
// with the same checks. A re-read that fails them, or finds no file (for
// a moment during an atomic swap), keeps the last value read and logs a
// warning on logger naming what and the file, never the credential, at
// most once per SecretLogEvery; the next check tries again. A new value
// is logged at info. logger nil discards these lines.
func ReadSecret(what, path string, logger *slog.Logger) (Secret, error) {
	// The file's info is taken before it is read, as checkLocked does.
	info, _ := os.Stat(path)
	v, err := readSecretValue(what, path)
	if err != nil {
		return Secret{}, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	f := &secretFile{what: what, path: path, log: logger, now: time.Now,
		throttle: logthrottle.Throttle{Every: SecretLogEvery}}
	f.cur.Store(&secretState{value: v, info: info, checked: f.now()})
	return Secret{f: f}, nil
}

// readSecretValue reads a credential file with ReadSecret's checks.
func readSecretValue(what, path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%s: no file given; point it at an owner-only file holding the credential", what)
	}
	b, err := aip.ReadSecretFile(path, MaxSecretBytes)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	for _, r := range string(b) {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return "", fmt.Errorf("%s: %s holds whitespace or a control character inside the credential; it must hold the credential alone", what, path)
		}
	}
	return string(b), nil
}

// secretFile is the file a Secret follows.
type secretFile struct {
	what, path string
	log        *slog.Logger
	now        func() time.Time

	// cur is the value last read, read without a lock by Reveal.
	cur atomic.Pointer[secretState]
	// gen counts the changes of cur's value.
	gen atomic.Uint64
	// mu serializes the checks: one request checks while the others
	// go on with cur.
	mu       sync.Mutex
	failing  bool // the last check could not read the file; under mu
	throttle logthrottle.Throttle
}

// secretState is a value read and the file it was read from.
type secretState struct {
	value string
	// info is the file's os.Stat taken just before the value was read:
	// a change made during the read shows as a different info at the
	// next check, which reads again.
	info os.FileInfo
	// checked is when the file was last checked.
	checked time.Time
}

func (f *secretFile) value() string {
	st := f.cur.Load()
	if d := f.now().Sub(st.checked); d >= 0 && d < SecretCheckInterval {
		return st.value
	}
	if !f.mu.TryLock() {
		// Another request is checking the file.
		return st.value
	}
	defer f.mu.Unlock()
	return f.checkLocked(false).value
}

// checkLocked stats the file and re-reads it when it is not the file
// last read (another inode, size, modification time or mode), when the
// last read failed, or always with force; f.mu is held.
func (f *secretFile) checkLocked(force bool) *secretState {
	st := f.cur.Load()
	now := f.now()
	info, err := os.Stat(f.path)
	if err == nil && !force && !f.failing && sameFile(st.info, info) {
		next := &secretState{value: st.value, info: st.info, checked: now}
		f.cur.Store(next)
		return next
	}
	v, err := readSecretValue(f.what, f.path)
	if err != nil {
		// Keep the value and the info of the last read; the next check
		// reads again (f.failing).
		next := &secretState{value: st.value, info: st.info, checked: now}
		f.cur.Store(next)
		f.failing = true
		if suppressed, ok := f.throttle.Allow("reread", now); ok {
			args := []any{"setting", f.what, "file", f.path, "error", err}
			if suppressed > 0 {
				args = append(args, "not_logged_since", suppressed)
			}
			f.log.Warn("credential file cannot be read again; still using the credential read before it, until it reads", args...)
		}
		return next
	}
	next := &secretState{value: v, info: info, checked: now}
	f.cur.Store(next)
	f.recovered(now)
	if v != st.value {
		f.gen.Add(1)
		f.log.Info("credential file changed; using the credential it now holds", "setting", f.what, "file", f.path)
	}
	return next
}

// recovered logs that the file reads again after failed re-reads.
func (f *secretFile) recovered(now time.Time) {
	if !f.failing {
		return
	}
	f.failing = false
	f.throttle = logthrottle.Throttle{Every: SecretLogEvery} // the next failure logs at once
	f.log.Info("credential file reads again", "setting", f.what, "file", f.path)
}

// sameFile reports whether b is the file a was taken from, unchanged:
// the same inode, size, modification time and mode (a file opened to
// others is read again, and refused).
func sameFile(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() &&
		a.ModTime().Equal(b.ModTime()) && a.Mode() == b.Mode()
}
