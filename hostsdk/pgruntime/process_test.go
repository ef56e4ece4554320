package pgruntime_test

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
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// These tests re-execute the test binary as a child process. TestMain sends
// a child straight to crashWriter when childURLEnv is set.
const (
	childURLEnv = "AIP_PGRUNTIME_CHILD_URL"
	childNSEnv  = "AIP_PGRUNTIME_CHILD_NAMESPACE"
)

// crashWriter journals actions from several goroutines the way the host
// does (AcceptAction, then FinishAction) until it is killed. A line goes
// to stdout only after the write it reports has returned:
//
//	running <action_id>     AcceptAction returned: journaled running
//	committed <action_id>   FinishAction returned: completed
//	state <revision>        PutState returned this revision
func crashWriter(dbURL, ns string) int {
	ctx := context.Background()
	j, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: dbURL, Namespace: ns, MaxConns: 12})
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
					continue // left running
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

// TestCrashRecovery kills a process writing to a PostgreSQL journal with
// SIGKILL mid-stream, several times over one namespace, and checks after
// each kill that the namespace opens again at once (PostgreSQL ended the
// dead session's lock), that every write the child reported as returned is
// there (an action it reported running is running or, when its finish
// committed unreported, completed: never missing, so it cannot run a
// second time), that every action is running or completed with a receipt,
// and that the receipt chain verifies from the first receipt to the last.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dbURL := pgtest.NewDatabase(t)
	ns := aip.NewID(aip.PrefixReplica)
	committed := map[string]bool{}
	running := map[string]bool{}
	var stateRev uint64
	for round := range 3 {
		killMidStream(t, dbURL, ns, 100+100*round, committed, running, &stateRev)
		verifyAfterCrash(t, dbURL, ns, committed, running, stateRev)
	}
}

// killMidStream starts a writer child, SIGKILLs it once it has reported
// `after` more committed actions, and collects every line it wrote.
func killMidStream(t *testing.T, dbURL, ns string, after int, committed, running map[string]bool, stateRev *uint64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childURLEnv+"="+dbURL, childNSEnv+"="+ns)
	cmd.Stderr = &prefixWriter{t: t, prefix: "writer child: "}
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
			if !committed[val] {
				running[val] = true
			}
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
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill writer child: %v", err)
	}
	killed = true
	// Whatever it printed before dying reports a write that had returned.
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

func verifyAfterCrash(t *testing.T, dbURL, ns string, committed, running map[string]bool, stateRev uint64) {
	t.Helper()
	ctx := context.Background()
	// A host restarted at once after the kill opens its namespace: the
	// dead process's sessions end with its sockets. (A generous bound: the
	// server notices a closed socket at once, but the machine is shared.)
	var j *pgruntime.Journal
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		j, err = pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: dbURL, Namespace: ns})
		if err == nil {
			break
		}
		if !errors.Is(err, pgruntime.ErrLocked) || time.Now().After(deadline) {
			t.Fatalf("Open after the kill: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
		if err != nil || (a.Status != aip.StateRunning && a.Status != aip.StateCompleted) {
			t.Fatalf("action %s was reported journaled running but is %+v (err %v)", id, a, err)
		}
	}
	v, err := j.State(ctx, "crash", "counter")
	if err != nil || v.Revision < stateRev {
		t.Fatalf("state revision after crash = %d (err %v), want at least the reported %d", v.Revision, err, stateRev)
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
		a, err := j.Action(ctx, r.ActionID)
		if err != nil || a.Status != aip.StateCompleted {
			t.Fatalf("receipt %d names action %s in status %q (err %v)", r.Seq, r.ActionID, a.Status, err)
		}
	}
	for id := range committed {
		if !inChain[id] {
			t.Fatalf("committed action %s has no receipt", id)
		}
	}
	// Every action is running (AcceptAction committed) or completed with
	// its receipt: an action and its receipt committed together.
	actions, err := j.ActionsByStatus(ctx, 100000, aip.StateCompleted)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range actions {
		if !inChain[a.ActionID] {
			t.Fatalf("completed action %s has no receipt", a.ActionID)
		}
	}
	t.Logf("after kill: %d receipts verify, %d reported completed actions, %d reported running, state revision %d", len(all), len(committed), len(running), v.Revision)
}

type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.t.Log(w.prefix + strings.TrimSpace(string(p)))
	return len(p), nil
}
