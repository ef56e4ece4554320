package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// TestOpenJournalRunsAtStepTwo: Config.OpenJournal opens the journal at
// step 2, only once step 1 accepted the files, and the host closes what it
// opened when it stops, or when its start fails.
func TestOpenJournalRunsAtStepTwo(t *testing.T) {
	opener := func(j journal.Journal, err error, calls *int) func(context.Context) (journal.Journal, error) {
		return func(context.Context) (journal.Journal, error) { *calls++; return j, err }
	}
	closed := func(j *memjournal.Journal) bool {
		_, err := j.State(context.Background(), "ns", "key")
		return errors.Is(err, journal.ErrClosed)
	}

	// A signing key file readable by others fails step 1: the journal is
	// not opened.
	f := newFleet(t)
	seed := filepath.Join(t.TempDir(), "seed")
	if err := aip.WriteSeedFile(seed, f.cfg.SigningKey); err != nil {
		t.Fatal(err)
	}
	os.Chmod(seed, 0o644)
	var calls int
	f.cfg.Journal, f.cfg.OpenJournal = nil, opener(memjournal.New(), nil, &calls)
	f.cfg.SigningKey, f.cfg.SigningSeedFile = nil, seed
	var ve *hostsdk.ValidateError
	if err := startErr(t, f, newTestConnector()); !errors.As(err, &ve) || calls != 0 {
		t.Fatalf("Start with a loose key file: %v, OpenJournal called %d times; want a *ValidateError and no call", err, calls)
	}

	// Its error is step 2's.
	f = newFleet(t)
	calls = 0
	f.cfg.Journal, f.cfg.OpenJournal = nil, opener(nil, memjournal.ErrInjected, &calls)
	var oe *hostsdk.OpenJournalError
	if err := startErr(t, f, newTestConnector()); !errors.As(err, &oe) || !errors.Is(err, memjournal.ErrInjected) || calls != 1 {
		t.Fatalf("Start with a failing OpenJournal: %v (%d calls); want an *OpenJournalError wrapping its error", err, calls)
	}

	// A start failing after step 2 closes the journal it opened.
	f = newFleet(t)
	j := memjournal.New()
	f.cfg.Journal, f.cfg.OpenJournal = nil, opener(j, nil, &calls)
	f.cfg.RegisterWait = hostsdk.NoRegisterWait
	f.cp.SetUnavailable(true)
	if err := startErr(t, f, newTestConnector()); !errors.Is(err, hostsdk.ErrControlUnavailable) || !closed(j) {
		t.Fatalf("Start without a control plane: %v, journal closed %v; want ErrControlUnavailable and the journal closed", err, closed(j))
	}

	// A host that served closes it when it stops.
	f = newFleet(t)
	j = memjournal.New()
	f.cfg.Journal, f.cfg.OpenJournal = nil, opener(j, nil, &calls)
	h, _ := f.start(t, newTestConnector())
	if closed(j) {
		t.Fatal("the journal is closed while the host runs")
	}
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !closed(j) {
		t.Error("the host did not close the journal OpenJournal opened")
	}

	// Journal and OpenJournal together are refused.
	f = newFleet(t)
	f.cfg.OpenJournal = opener(memjournal.New(), nil, &calls)
	if _, err := hostsdk.New(f.cfg, newTestConnector()); !errors.As(err, &ve) {
		t.Fatalf("New with Journal and OpenJournal: %v; want a *ValidateError", err)
	}
}

// TestAfterOpenJournalRunsWithTheJournalLocked: Config.AfterOpenJournal is
// called at step 2 once the journal is open and locked (a second open of
// the same state directory is refused) and before discovery; its error
// fails step 2 and the journal is released (the directory can be opened
// again).
func TestAfterOpenJournalRunsWithTheJournalLocked(t *testing.T) {
	f := newFleet(t)
	dir := t.TempDir()
	f.cfg.Journal, f.cfg.StateDir = nil, dir
	conn := newTestConnector()
	boom := errors.New("boom")
	var lockErr error
	calls := 0
	f.cfg.AfterOpenJournal = func(ctx context.Context) error {
		calls++
		j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir})
		if err == nil {
			j.Close()
		}
		lockErr = err
		conn.manifestErr = errors.New("discovery ran although AfterOpenJournal failed")
		return boom
	}
	var oe *hostsdk.OpenJournalError
	if err := startErr(t, f, conn); !errors.As(err, &oe) || !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("Start with a failing AfterOpenJournal: %v (%d calls); want an *OpenJournalError wrapping its error", err, calls)
	}
	if !errors.Is(lockErr, sqliteruntime.ErrLocked) {
		t.Errorf("opening the state directory again inside AfterOpenJournal: %v; want ErrLocked (the host holds the journal)", lockErr)
	}
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: dir})
	if err != nil {
		t.Fatalf("the journal was not released after the failed start: %v", err)
	}
	j.Close()
}

// TestStateDirLoggedAbsolute: the embedded journal's directory is logged as
// an absolute path, so an operator sees which journal a host opened when
// --state-dir (or its default) is relative to the working directory.
func TestStateDirLoggedAbsolute(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	f := newFleet(t)
	f.cfg.Journal, f.cfg.StateDir = nil, filepath.Join("rel", "state")
	var logs hostsdktest.LogBuffer
	f.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	h := hostsdktest.StartHost(t, f.cfg, newTestConnector())
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(work, "rel", "state")
	for line := range strings.Lines(logs.String()) {
		var rec struct {
			Msg      string
			StateDir string `json:"state_dir"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "runtime journal opened" {
			if rec.StateDir != want {
				t.Fatalf("state_dir %q, want %q", rec.StateDir, want)
			}
			return
		}
	}
	t.Fatalf("no \"runtime journal opened\" line:\n%s", logs.String())
}
