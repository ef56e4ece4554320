package sqliteruntime_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// These tests re-execute the test binary as a child process. TestMain sends
// a child straight to childMain when childRoleEnv is set.
const (
	childRoleEnv = "AIP_SQLITERUNTIME_CHILD_ROLE" // "writer" or "opener"
	childDirEnv  = "AIP_SQLITERUNTIME_CHILD_DIR"
	childSyncEnv = "AIP_SQLITERUNTIME_CHILD_SYNC"
)

func childMain(role string) int {
	dir, mode := os.Getenv(childDirEnv), sqliteruntime.SyncMode(os.Getenv(childSyncEnv))
	switch role {
	case "writer":
		return crashWriter(dir, mode)
	case "opener":
		return tryOpen(dir)
	case "filler":
		return fillDisk(dir)
	}
	fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
	return 2
}

// crashWriter runs journaltest.CrashWriter on the journal in dir.
func crashWriter(dir string, mode sqliteruntime.SyncMode) int {
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: dir, Sync: mode})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return journaltest.CrashWriter(j)
}

// tryOpen opens the journal and reports the outcome on stdout.
func tryOpen(dir string) int {
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: dir})
	if err != nil {
		var le *sqliteruntime.LockedError
		if errors.As(err, &le) && errors.Is(err, sqliteruntime.ErrLocked) {
			fmt.Printf("locked pid=%d\n%s\n", le.PID, err)
			return 0
		}
		fmt.Printf("error\n%s\n", err)
		return 0
	}
	if err := j.Close(); err != nil {
		fmt.Printf("error\n%s\n", err)
		return 0
	}
	fmt.Println("opened")
	return 0
}

func child(t *testing.T, role, dir string, mode sqliteruntime.SyncMode) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRoleEnv+"="+role, childDirEnv+"="+dir, childSyncEnv+"="+string(mode))
	cmd.Stderr = journaltest.LogWriter(t, role+" child: ")
	return cmd
}

// TestCrashRecovery kills a writing process with SIGKILL mid-stream, several
// times over one state directory, and checks after each kill that the
// database opens and passes SQLite's integrity check and that the journal
// holds what the child reported (journaltest.CrashReport.Verify: every
// write it reported as returned is there, and the receipt chain verifies
// from the first receipt to the last).
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for _, mode := range []sqliteruntime.SyncMode{sqliteruntime.SyncFull, sqliteruntime.SyncNormal} {
		t.Run(string(mode), func(t *testing.T) {
			dir := t.TempDir()
			r := journaltest.NewCrashReport()
			for round := range 3 {
				journaltest.KillMidStream(t, child(t, "writer", dir, mode), 150+100*round, r)
				verifyAfterCrash(t, dir, r)
			}
		})
	}
}

// verifyAfterCrash checks the journal in dir: SQLite's integrity check,
// then what r says the children wrote.
func verifyAfterCrash(t *testing.T, dir string, r *journaltest.CrashReport) {
	t.Helper()
	// The file opens and is not corrupt (opening also recovers the log).
	db, err := sql.Open("sqlite", filepath.Join(dir, sqliteruntime.DatabaseFile))
	if err != nil {
		t.Fatal(err)
	}
	var check string
	if err := db.QueryRowContext(context.Background(), "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check after SIGKILL = %q, %v", check, err)
	}
	db.Close()
	j := open(t, sqliteruntime.Config{Dir: dir})
	defer j.Close()
	r.Verify(t, j)
}

// TestLockAcrossProcesses: while this process holds the state directory,
// another process cannot open it and is told which process holds it; once
// closed, the other process opens it.
func TestLockAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	j := open(t, sqliteruntime.Config{Dir: dir})

	out, err := child(t, "opener", dir, "").Output()
	if err != nil {
		t.Fatalf("opener child: %v", err)
	}
	got := string(out)
	if !strings.HasPrefix(got, fmt.Sprintf("locked pid=%d\n", os.Getpid())) {
		t.Fatalf("second process opening a held state directory said:\n%s\nwant locked by pid %d", got, os.Getpid())
	}
	if !strings.Contains(got, dir) || !strings.Contains(got, strconv.Itoa(os.Getpid())) {
		t.Fatalf("lock error does not name the directory %s and the holder %d:\n%s", dir, os.Getpid(), got)
	}

	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	out, err = child(t, "opener", dir, "").Output()
	if err != nil || string(out) != "opened\n" {
		t.Fatalf("opener child after Close said %q (err %v), want opened", out, err)
	}
}

// fillDisk journals actions until the file system refuses the journal's
// writes (RLIMIT_FSIZE stands in for a full disk: a write past the limit
// fails with EFBIG), probes the journal, then frees the space and goes on.
// A line goes to stdout only after what it reports has returned:
//
//	committed <action_id>   AcceptAction and FinishAction returned
//	left <action_id>        AcceptAction returned, FinishAction failed
//	full <error>            the first write that failed
//	probe-full <error>      Probe while the limit holds ("ok" if it passed)
//	probe-freed <error>     Probe once the space is back
func fillDisk(dir string) int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir})
	if err != nil {
		return fail(err)
	}
	result := json.RawMessage(`{"pad":"` + strings.Repeat("x", 2000) + `"}`)
	lifecycle := func() (id string, accepted bool, err error) {
		now := time.Now()
		a := journal.Action{ActionID: aip.NewActionID(), CapabilityID: "echo.say", MessageID: aip.NewMessageID(), ReceivedAt: now}
		if _, err := j.AcceptAction(ctx, a.MessageID, now.Add(time.Hour), now, a); err != nil {
			return a.ActionID, false, err
		}
		_, err = j.FinishAction(ctx, a.ActionID, aip.StateCompleted, result, "", now)
		return a.ActionID, true, err
	}
	say := func(id string, accepted bool, err error) {
		switch {
		case err == nil:
			fmt.Printf("committed %s\n", id)
		case accepted:
			fmt.Printf("left %s\n", id)
		}
	}
	for range 20 {
		id, accepted, err := lifecycle()
		if err != nil {
			return fail(err)
		}
		say(id, accepted, err)
	}
	var largest int64
	for _, name := range []string{sqliteruntime.DatabaseFile, sqliteruntime.DatabaseFile + "-wal"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			largest = max(largest, fi.Size())
		}
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		return fail(err)
	}
	full := lim
	// No file may grow: a full disk. (With room for one page more, Probe's
	// one-page write passes while an action's do not.)
	full.Cur = uint64(largest)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &full); err != nil {
		return fail(err)
	}
	failures := 0
	for i := 0; i < 5000 && failures < 10; i++ {
		id, accepted, err := lifecycle()
		say(id, accepted, err)
		if err != nil {
			if failures == 0 {
				fmt.Printf("full %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			}
			failures++
		}
	}
	probe := func(label string) {
		if err := j.Probe(ctx); err != nil {
			fmt.Printf("%s %s\n", label, strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Printf("%s ok\n", label)
		}
	}
	probe("probe-full")
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		return fail(err)
	}
	probe("probe-freed")
	for range 20 {
		id, accepted, err := lifecycle()
		if err != nil {
			return fail(fmt.Errorf("once the space was back: %w", err))
		}
		say(id, accepted, err)
	}
	if err := j.Close(); err != nil {
		return fail(err)
	}
	return 0
}

// TestDiskFull: when the file system refuses the journal's writes (a
// full disk, here a file size limit), each write fails with an error and
// leaves nothing half-written: every action is journaled as its calls
// returned (completed with its receipt, or running when only the finish
// failed) and none whose journaling failed is there; Probe fails while no
// write fits (the limit is the size the files had), so the host stops
// being ready; once the space is back the same journal writes again, and
// the file passes SQLite's integrity check and its receipt chain verifies.
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	out, err := child(t, "filler", dir, "").Output()
	if err != nil {
		t.Fatalf("filler child: %v\n%s", err, out)
	}
	r := journaltest.NewCrashReport()
	var fullErr, probeFull, probeFreed string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if r.Record(line) {
			continue
		}
		kind, val, _ := strings.Cut(line, " ")
		switch kind {
		case "full":
			fullErr = val
		case "probe-full":
			probeFull = val
		case "probe-freed":
			probeFreed = val
		default:
			t.Fatalf("child wrote %q", line)
		}
	}
	if fullErr == "" {
		t.Fatal("no write failed under the file size limit")
	}
	if probeFull == "ok" || probeFull == "" {
		t.Errorf("Probe while writes failed (%s) = %q, want an error", fullErr, probeFull)
	}
	if probeFreed != "ok" {
		t.Errorf("Probe once the space was back = %q, want ok", probeFreed)
	}
	t.Logf("full: %s; probe: %s; %d completed, %d left running", fullErr, probeFull, len(r.Committed), len(r.Left))
	verifyAfterCrash(t, dir, r)
	j := open(t, sqliteruntime.Config{Dir: dir})
	all, err := j.ActionsByStatus(context.Background(), 100000, aip.StateReceived, aip.StateRunning, aip.StateCompleted, aip.StateFailed)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(r.Committed)+len(r.Left) {
		t.Fatalf("the journal holds %d actions, the child journaled %d: a write that failed left a record", len(all), len(r.Committed)+len(r.Left))
	}
}
