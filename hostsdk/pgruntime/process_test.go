package pgruntime_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// TestCrashRecovery re-executes the test binary as a child process.
// TestMain sends a child straight to crashWriter when childURLEnv is set.
const (
	childURLEnv = "AIP_PGRUNTIME_CHILD_URL"
	childNSEnv  = "AIP_PGRUNTIME_CHILD_NAMESPACE"
)

// crashWriter runs journaltest.CrashWriter on namespace ns of dbURL.
func crashWriter(dbURL, ns string) int {
	j, err := pgruntime.Open(context.Background(), pgruntime.Config{DatabaseURL: dbURL, Namespace: ns, MaxConns: 12})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return journaltest.CrashWriter(j)
}

// TestCrashRecovery kills a process writing to a PostgreSQL journal with
// SIGKILL mid-stream, several times over one namespace, and checks after
// each kill that the namespace opens again at once (PostgreSQL ended the
// dead session's lock) and that the journal holds what the child
// reported (journaltest.CrashReport.Verify: nothing it reported as
// written is missing, so no action can run a second time, and the receipt
// chain verifies).
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dbURL := pgtest.NewDatabase(t)
	ns := aip.NewID(aip.PrefixReplica)
	r := journaltest.NewCrashReport()
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childURLEnv+"="+dbURL, childNSEnv+"="+ns)
		journaltest.KillMidStream(t, cmd, 100+100*round, r)
		j := openAfterCrash(t, dbURL, ns)
		r.Verify(t, j)
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// openAfterCrash opens the namespace as a host restarted at once after the
// kill would: the dead process's sessions end with its sockets. (A
// generous bound: the server notices a closed socket at once, but the
// machine is shared.)
func openAfterCrash(t *testing.T, dbURL, ns string) *pgruntime.Journal {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		j, err := pgruntime.Open(context.Background(), pgruntime.Config{DatabaseURL: dbURL, Namespace: ns})
		if err == nil {
			return j
		}
		if !errors.Is(err, pgruntime.ErrLocked) || time.Now().After(deadline) {
			t.Fatalf("Open after the kill: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
