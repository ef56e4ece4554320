package sqliteruntime

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

func openInternal(t *testing.T) *Journal {
	t.Helper()
	j, err := Open(context.Background(), Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// holdWriter parks the writer inside a batch until release is called, so
// requests submitted meanwhile queue up and form the next batch.
func holdWriter(t *testing.T, j *Journal) (release func()) {
	t.Helper()
	entered, hold := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- j.w.do(context.Background(), func(*wtx) error { close(entered); <-hold; return nil }) }()
	<-entered
	return func() {
		close(hold)
		if err := <-done; err != nil {
			t.Errorf("holding request: %v", err)
		}
	}
}

// waitQueued spins until n requests wait for the writer.
func waitQueued(t *testing.T, j *Journal, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(j.w.ops) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", len(j.w.ops), n)
		}
		runtime.Gosched()
	}
}

// TestBatchStorageFailureIsIsolated: a request failing with a storage error
// in the middle of a group commit costs the others nothing: the batch is
// rolled back (including the failed request's own write), every other
// request is re-run alone and succeeds, and the receipt chain stays whole.
func TestBatchStorageFailureIsIsolated(t *testing.T) {
	ctx := context.Background()
	j := openInternal(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var ids []string
	for range 2 {
		a := journal.Action{ActionID: aip.NewActionID(), ReceivedAt: t0}
		if _, _, err := j.BeginAction(ctx, a); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, a.ActionID)
	}

	release := holdWriter(t, j)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	wg.Go(func() {
		_, errs[0] = j.FinishAction(ctx, ids[0], aip.StateCompleted, json.RawMessage(`{"n":0}`), "", t0.Add(time.Second))
	})
	wg.Go(func() {
		errs[1] = j.w.do(ctx, func(tx *wtx) error {
			if _, err := tx.insertState.Exec("test", "doomed", []byte(`1`), int64(0)); err != nil {
				return storageErr(err, "insert")
			}
			return storageErr(errors.New("disk on fire"), "injected failure")
		})
	})
	wg.Go(func() {
		_, errs[2] = j.PutState(ctx, "test", "kept", json.RawMessage(`2`), 0)
	})
	wg.Go(func() {
		_, errs[3] = j.FinishAction(ctx, ids[1], aip.StateFailed, nil, "", t0.Add(time.Second))
	})
	waitQueued(t, j, 4)
	release()
	wg.Wait()

	for i, err := range errs {
		if i == 1 {
			var oe *opError
			if !errors.As(err, &oe) {
				t.Fatalf("failing request returned %v, want its storage error", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("request %d failed with %v because another request of its batch failed", i, err)
		}
	}
	if _, err := j.State(ctx, "test", "doomed"); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("the failed request's write survived: %v", err)
	}
	if v, err := j.State(ctx, "test", "kept"); err != nil || v.Revision != 1 {
		t.Fatalf("State(kept) = %+v, %v", v, err)
	}
	rs, err := j.Receipts(ctx, 0, 10)
	if err != nil || len(rs) != 2 {
		t.Fatalf("Receipts = %d, %v; want 2", len(rs), err)
	}
	if err := journal.VerifyChain("", rs); err != nil {
		t.Fatal(err)
	}
}

// TestAbandonedRequestIsNotWritten: a caller whose context ends while its
// request is queued gets the context's error and nothing is written.
func TestAbandonedRequestIsNotWritten(t *testing.T) {
	j := openInternal(t)
	release := holdWriter(t, j)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := j.PutState(ctx, "test", "abandoned", json.RawMessage(`1`), 0)
		done <- err
	}()
	waitQueued(t, j, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("PutState = %v, want context.Canceled", err)
	}
	release()
	// A later write is committed after the abandoned one would have been.
	if _, err := j.PutState(context.Background(), "test", "later", json.RawMessage(`1`), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := j.State(context.Background(), "test", "abandoned"); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("abandoned request was written: %v", err)
	}
}

// TestTakenRequestReportsItsOutcome: once the writer runs a request, its
// caller gets the real outcome even if its context ends meanwhile, so a
// committed write is never reported as a context error.
func TestTakenRequestReportsItsOutcome(t *testing.T) {
	j := openInternal(t)
	ctx, cancel := context.WithCancel(context.Background())
	running := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- j.w.do(ctx, func(tx *wtx) error {
			close(running)
			<-ctx.Done() // the caller gives up while we write
			if _, err := tx.insertState.Exec("test", "taken", []byte(`1`), int64(0)); err != nil {
				return storageErr(err, "insert")
			}
			return nil
		})
	}()
	<-running
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("taken request returned %v, want its real outcome (nil)", err)
	}
	if _, err := j.State(context.Background(), "test", "taken"); err != nil {
		t.Fatalf("taken request not written: %v", err)
	}
}

// TestWriterSyncPragmas: the write connection runs with the durability
// Config.Sync promises. SyncFull also turns fullfsync on: on macOS fsync(2)
// leaves the data in the drive's volatile cache (only F_FULLFSYNC flushes
// it), so a commit SyncFull reported did not survive a loss of power there,
// while the documentation promised it would.
func TestWriterSyncPragmas(t *testing.T) {
	ctx := context.Background()
	for mode, want := range map[SyncMode][2]int{SyncFull: {2, 1}, SyncNormal: {1, 0}} {
		j, err := Open(ctx, Config{Dir: t.TempDir(), Sync: mode})
		if err != nil {
			t.Fatal(err)
		}
		var sync, full int
		if err := j.w.conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
			t.Fatal(err)
		}
		if err := j.w.conn.QueryRowContext(ctx, "PRAGMA fullfsync").Scan(&full); err != nil {
			t.Fatal(err)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		if sync != want[0] || full != want[1] {
			t.Errorf("Sync %s: synchronous = %d, fullfsync = %d; want %d and %d", mode, sync, full, want[0], want[1])
		}
	}
}
