package sqliteruntime_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
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

// crashWriter writes actions from several goroutines until it is killed.
// A line goes to stdout only after the write it reports has returned:
//
//	committed <action_id>   the action is completed (FinishAction returned)
//	running <action_id>     the action was started and is left running
//	state <revision>        PutState returned this revision
func crashWriter(dir string, mode sqliteruntime.SyncMode) int {
	ctx := context.Background()
	j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir, Sync: mode})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...) // os.Stdout is unbuffered
	}
	// The parent kills us long before this; the bound only keeps a stray
	// child from running forever.
	deadline := time.Now().Add(2 * time.Minute)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				now := time.Now()
				msg := aip.NewMessageID()
				if _, err := j.ClaimMessage(ctx, msg, now.Add(time.Hour), now); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				a := journal.Action{ActionID: aip.NewActionID(), CapabilityID: "echo.say", MessageID: msg, ReceivedAt: now}
				if _, _, err := j.BeginAction(ctx, a); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				if err := j.StartAction(ctx, a.ActionID, time.Now()); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				if i%10 == 9 {
					say("running %s", a.ActionID)
					continue
				}
				result := json.RawMessage(`{"worker":` + strconv.Itoa(w) + `,"i":` + strconv.Itoa(i) + `}`)
				if _, err := j.FinishAction(ctx, a.ActionID, aip.StateCompleted, result, "", time.Now()); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				say("committed %s", a.ActionID)
			}
		})
	}
	wg.Go(func() {
		var rev uint64
		if v, err := j.State(ctx, "crash", "counter"); err == nil {
			rev = v.Revision
		}
		for time.Now().Before(deadline) {
			next, err := j.PutState(ctx, "crash", "counter", json.RawMessage(strconv.FormatUint(rev+1, 10)), rev)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			rev = next
			say("state %d", rev)
		}
	})
	wg.Wait()
	fmt.Fprintln(os.Stderr, "crash writer was never killed")
	return 1
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
	cmd.Stderr = &prefixWriter{t: t, prefix: role + " child: "}
	return cmd
}

type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.t.Log(w.prefix + strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestCrashRecovery kills a writing process with SIGKILL mid-stream, several
// times over one state directory, and checks after each kill that the
// database opens and passes SQLite's integrity check, that every write the
// child reported as returned is there, and that the receipt chain verifies
// from the first receipt to the last.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for _, mode := range []sqliteruntime.SyncMode{sqliteruntime.SyncFull, sqliteruntime.SyncNormal} {
		t.Run(string(mode), func(t *testing.T) {
			dir := t.TempDir()
			committed := map[string]bool{}
			running := map[string]bool{}
			var stateRev uint64
			for round := range 3 {
				killMidStream(t, dir, mode, 150+100*round, committed, running, &stateRev)
				verifyAfterCrash(t, dir, committed, running, int64(stateRev))
			}
		})
	}
}

// killMidStream starts a writer child, SIGKILLs it once it has reported
// `after` more committed actions, and collects every line it wrote.
func killMidStream(t *testing.T, dir string, mode sqliteruntime.SyncMode, after int, committed, running map[string]bool, stateRev *uint64) {
	t.Helper()
	cmd := child(t, "writer", dir, mode)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start writer child: %v", err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	sc := bufio.NewScanner(stdout)
	seen := 0
	record := func(line string) {
		kind, val, _ := strings.Cut(line, " ")
		switch kind {
		case "committed":
			committed[val] = true
			delete(running, val)
			seen++
		case "running":
			running[val] = true
		case "state":
			rev, err := strconv.ParseUint(val, 10, 64)
			if err != nil {
				t.Fatalf("child wrote %q", line)
			}
			*stateRev = max(*stateRev, rev)
		default:
			t.Fatalf("child wrote %q", line)
		}
	}
	for seen < after && sc.Scan() {
		record(sc.Text())
	}
	if seen < after {
		t.Fatalf("writer child stopped after %d committed actions (scan error %v)", seen, sc.Err())
	}
	// Kill while its goroutines are in the middle of writes.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill writer child: %v", err)
	}
	killed = true
	// Whatever it printed before dying reports a write that had returned.
	// (Each line is one write of less than PIPE_BUF bytes, so none is torn.)
	for sc.Scan() {
		record(sc.Text())
	}
	_, _ = io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("writer child ended with %v, want death by SIGKILL", err)
	}
}

// verifyAfterCrash checks the journal in dir against what a child
// reported; stateRev -1: the child wrote no state.
func verifyAfterCrash(t *testing.T, dir string, committed, running map[string]bool, stateRev int64) {
	t.Helper()
	ctx := context.Background()

	// The file opens and is not corrupt (opening also recovers the log).
	db, err := sql.Open("sqlite", filepath.Join(dir, sqliteruntime.DatabaseFile))
	if err != nil {
		t.Fatal(err)
	}
	var check string
	if err := db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check after SIGKILL = %q, %v", check, err)
	}
	db.Close()

	j := open(t, sqliteruntime.Config{Dir: dir})
	defer j.Close()
	for id := range committed {
		a, err := j.Action(ctx, id)
		if err != nil {
			t.Fatalf("action %s was reported committed but is lost: %v", id, err)
		}
		if a.Status != aip.StateCompleted || len(a.Result) == 0 {
			t.Fatalf("action %s was reported completed but is %s with result %s", id, a.Status, a.Result)
		}
	}
	for id := range running {
		a, err := j.Action(ctx, id)
		if err != nil || a.Status != aip.StateRunning {
			t.Fatalf("action %s was reported running but is %+v (err %v)", id, a, err)
		}
	}
	var v journal.StateValue
	if stateRev >= 0 {
		var err error
		v, err = j.State(ctx, "crash", "counter")
		if err != nil || v.Revision < uint64(stateRev) {
			t.Fatalf("state revision after crash = %d (err %v), want at least the reported %d", v.Revision, err, stateRev)
		}
	}

	var all []journal.Receipt
	for after := uint64(0); ; {
		page, err := j.Receipts(ctx, after, 500)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
	if err := journal.VerifyChain("", all); err != nil {
		t.Fatalf("receipt chain after SIGKILL: %v", err)
	}
	if len(all) == 0 || all[0].Seq != 1 {
		t.Fatalf("receipt chain after SIGKILL starts at %v", all)
	}
	inChain := make(map[string]bool, len(all))
	for _, r := range all {
		inChain[r.ActionID] = true
	}
	for id := range committed {
		if !inChain[id] {
			t.Fatalf("committed action %s has no receipt", id)
		}
	}
	// Every receipt belongs to a terminal action: receipt and status
	// committed together or not at all.
	for _, r := range all {
		a, err := j.Action(ctx, r.ActionID)
		if err != nil || !a.Status.Terminal() {
			t.Fatalf("receipt %d names action %s in status %q (err %v)", r.Seq, r.ActionID, a.Status, err)
		}
	}
	t.Logf("after kill: %d receipts verify, %d reported completed actions, %d running, state revision %d", len(all), len(committed), len(running), v.Revision)
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
//	running <action_id>     AcceptAction returned, FinishAction failed
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
			fmt.Printf("running %s\n", id)
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
	committed, running := map[string]bool{}, map[string]bool{}
	var fullErr, probeFull, probeFreed string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		kind, val, _ := strings.Cut(line, " ")
		switch kind {
		case "committed":
			committed[val] = true
		case "running":
			running[val] = true
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
	t.Logf("full: %s; probe: %s; %d completed, %d left running", fullErr, probeFull, len(committed), len(running))
	verifyAfterCrash(t, dir, committed, running, -1)
	j := open(t, sqliteruntime.Config{Dir: dir})
	all, err := j.ActionsByStatus(context.Background(), 100000, aip.StateReceived, aip.StateRunning, aip.StateCompleted, aip.StateFailed)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(committed)+len(running) {
		t.Fatalf("the journal holds %d actions, the child journaled %d: a write that failed left a record", len(all), len(committed)+len(running))
	}
}
