package journaltest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// A durable backend's crash test re-executes its test binary as a child
// that runs CrashWriter on the backend's storage, kills it with SIGKILL
// mid-stream (KillMidStream), and checks the storage, reopened, against
// what the child reported (CrashReport.Verify):
//
//	// in TestMain: if os.Getenv(childEnv) != "" { os.Exit(journaltest.CrashWriter(open())) }
//	r := journaltest.NewCrashReport()
//	for round := range 3 {
//		journaltest.KillMidStream(t, exec.Command(os.Args[0], "-test.run=^$"), 100, r)
//		r.Verify(t, reopen())
//	}
//
// A line goes to the child's stdout only after the write it reports has
// returned:
//
//	running <action_id>     AcceptAction returned: journaled running
//	left <action_id>        and the action is left running (no FinishAction)
//	committed <action_id>   FinishAction returned: completed
//	state <revision>        PutState returned this revision

// CrashWriter journals actions on j from several goroutines the way the
// host does (AcceptAction, then FinishAction for nine in ten), and a
// state value from another, reporting each write on stdout, until the
// process is killed. It returns the process's exit code when it fails (or
// is never killed).
func CrashWriter(j journal.Journal) int {
	ctx := context.Background()
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...) // os.Stdout is unbuffered
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The parent kills us long before this; the bound only keeps a stray
	// child from running forever.
	deadline := time.Now().Add(2 * time.Minute)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				now := time.Now()
				a := journal.Action{ActionID: aip.NewActionID(), CapabilityID: "echo.say", MessageID: aip.NewMessageID(), ReceivedAt: now, AssignedAt: now}
				acc, err := j.AcceptAction(ctx, a.MessageID, now.Add(time.Hour), now, a)
				if err != nil || !acc.Created {
					fail(fmt.Errorf("AcceptAction: %+v, %v", acc, err))
				}
				say("running %s", a.ActionID)
				if i%10 == 9 {
					say("left %s", a.ActionID)
					continue
				}
				result := json.RawMessage(`{"worker":` + strconv.Itoa(w) + `,"i":` + strconv.Itoa(i) + `}`)
				if _, err := j.FinishAction(ctx, a.ActionID, aip.StateCompleted, result, "", time.Now()); err != nil {
					fail(err)
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
				fail(err)
			}
			rev = next
			say("state %d", rev)
		}
	})
	wg.Wait()
	fmt.Fprintln(os.Stderr, "crash writer was never killed")
	return 1
}

// CrashReport is what writer children reported, over every round.
type CrashReport struct {
	// Committed holds the actions reported completed.
	Committed map[string]bool
	// Accepted holds the actions reported journaled running and not (yet)
	// completed: their finish may have committed unreported.
	Accepted map[string]bool
	// Left holds the actions reported left running: no finish was made,
	// or it failed.
	Left map[string]bool
	// StateRev is the highest state revision reported (0: none).
	StateRev uint64
}

// NewCrashReport returns an empty report.
func NewCrashReport() *CrashReport {
	return &CrashReport{Committed: map[string]bool{}, Accepted: map[string]bool{}, Left: map[string]bool{}}
}

// Record takes one line a child wrote; it reports false for a line that is
// not one of the writer's.
func (r *CrashReport) Record(line string) bool {
	kind, val, _ := strings.Cut(line, " ")
	switch kind {
	case "committed":
		r.Committed[val] = true
		delete(r.Accepted, val)
	case "running":
		if !r.Committed[val] {
			r.Accepted[val] = true
		}
	case "left":
		r.Left[val] = true
		delete(r.Accepted, val)
	case "state":
		rev, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return false
		}
		r.StateRev = max(r.StateRev, rev)
	default:
		return false
	}
	return true
}

// KillMidStream starts cmd, a child running CrashWriter (its stderr goes
// to the test log), SIGKILLs it once it has reported after more committed
// actions, and records in r every line it wrote.
func KillMidStream(t testing.TB, cmd *exec.Cmd, after int, r *CrashReport) {
	t.Helper()
	cmd.Stderr = LogWriter(t, "writer child: ")
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
	record := func(line string) {
		if !r.Record(line) {
			t.Fatalf("child wrote %q", line)
		}
	}
	for seen := 0; seen < after; {
		if !sc.Scan() {
			t.Fatalf("writer child stopped after %d committed actions (scan error %v)", seen, sc.Err())
		}
		line := sc.Text()
		record(line)
		if strings.HasPrefix(line, "committed ") {
			seen++
		}
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

// Verify checks j, reopened on the storage the children wrote, against
// the report: every action reported completed is completed with its
// result; one reported left running is running; one reported journaled
// running is running or completed (its finish may have committed
// unreported) — never missing, so it cannot run a second time; the state
// value is at least at the revision reported; the receipt chain verifies
// from the first receipt to the last, every completed action has a
// receipt, and every receipt names a completed action (an action and its
// receipt commit together or not at all).
func (r *CrashReport) Verify(t testing.TB, j journal.Journal) {
	t.Helper()
	ctx := context.Background()
	for id := range r.Committed {
		a, err := j.Action(ctx, id)
		if err != nil {
			t.Fatalf("action %s was reported committed but is lost: %v", id, err)
		}
		if a.Status != aip.StateCompleted || len(a.Result) == 0 {
			t.Fatalf("action %s was reported completed but is %s with result %s", id, a.Status, a.Result)
		}
	}
	for id := range r.Left {
		if a, err := j.Action(ctx, id); err != nil || a.Status != aip.StateRunning {
			t.Fatalf("action %s was reported left running but is %+v (err %v)", id, a, err)
		}
	}
	for id := range r.Accepted {
		if a, err := j.Action(ctx, id); err != nil || (a.Status != aip.StateRunning && a.Status != aip.StateCompleted) {
			t.Fatalf("action %s was reported journaled running but is %+v (err %v)", id, a, err)
		}
	}
	var v journal.StateValue
	if r.StateRev > 0 {
		var err error
		if v, err = j.State(ctx, "crash", "counter"); err != nil || v.Revision < r.StateRev {
			t.Fatalf("state revision after the crash = %d (err %v), want at least the reported %d", v.Revision, err, r.StateRev)
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
		t.Fatalf("receipt chain after the crash: %v", err)
	}
	if len(all) == 0 || all[0].Seq != 1 {
		t.Fatalf("receipt chain after the crash starts at %v", all)
	}
	inChain := make(map[string]bool, len(all))
	for _, rc := range all {
		inChain[rc.ActionID] = true
		if a, err := j.Action(ctx, rc.ActionID); err != nil || a.Status != aip.StateCompleted {
			t.Fatalf("receipt %d names action %s in status %q (err %v)", rc.Seq, rc.ActionID, a.Status, err)
		}
	}
	completed, err := j.ActionsByStatus(ctx, 100000, aip.StateCompleted)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range completed {
		if !inChain[a.ActionID] {
			t.Fatalf("completed action %s has no receipt", a.ActionID)
		}
	}
	t.Logf("after the crash: %d receipts verify, %d reported completed actions, %d journaled running, %d left running, state revision %d",
		len(all), len(r.Committed), len(r.Accepted), len(r.Left), v.Revision)
}

// LogWriter is an io.Writer that logs each write to t, after prefix: a
// child process's stderr.
func LogWriter(t testing.TB, prefix string) io.Writer { return &logWriter{t: t, prefix: prefix} }

type logWriter struct {
	t      testing.TB
	prefix string
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.t.Log(w.prefix + strings.TrimSpace(string(p)))
	return len(p), nil
}
