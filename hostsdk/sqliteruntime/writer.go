package sqliteruntime

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The writer owns the one connection that writes and runs every write
// request through group commit: it takes the first waiting request, then
// every request already queued behind it (up to MaxBatch), runs them in one
// IMMEDIATE transaction and commits once. Concurrent callers therefore share
// one commit, and one fsync in SyncFull mode, instead of queueing for one
// each; a lone caller is committed at once, never delayed to wait for
// company.
//
// A request reports domain errors (ErrConflict, ErrNotFound, ErrInvalid)
// only before it has written anything, so those never spoil the batch. A
// storage error (an *opError from the database) rolls the whole batch back;
// the writer then re-runs each request of the batch alone in its own
// transaction, so one request's failure is never reported to another.

// writeFunc is the body of a write request. It runs on the writer goroutine
// inside the batch transaction and stores its outputs in variables it
// closes over; those are read by the caller only after it got the result.
type writeFunc func(tx *wtx) error

const (
	opPending   int32 = iota // queued, nobody has decided yet
	opTaken                  // the writer runs it; its result will come
	opAbandoned              // the caller gave up first; the writer skips it
)

type writeOp struct {
	fn    writeFunc
	state atomic.Int32
	done  chan error // buffered: the writer never blocks on a caller
}

// wtx is what a request sees: the writer's prepared statements, and the
// receipt chain head and prune horizon as of this point in the batch.
type wtx struct {
	*writeStmts
	head    chainHead
	horizon time.Time
}

// chainHead is the last receipt: the next one has Seq+1 and links to Hash.
type chainHead struct {
	Seq  uint64
	Hash string
}

// opError marks a storage failure inside a write request.
type opError struct{ err error }

func (e *opError) Error() string { return e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// storageErr wraps err as a storage failure with context.
func storageErr(err error, format string, args ...any) error {
	return &opError{fmt.Errorf("sqliteruntime: "+format+": %w", append(args, err)...)}
}

type writer struct {
	conn     *sql.Conn
	stmts    writeStmts
	head     chainHead
	horizon  time.Time // the prune horizon as committed
	maxBatch int

	ops      chan *writeOp
	stop     chan struct{}
	finished chan struct{}
	started  bool
	stopOnce sync.Once
}

func newWriter(ctx context.Context, conn *sql.Conn, maxBatch int) (*writer, error) {
	w := &writer{
		conn:     conn,
		maxBatch: maxBatch,
		ops:      make(chan *writeOp, 4*maxBatch),
		stop:     make(chan struct{}),
		finished: make(chan struct{}),
	}
	if err := w.stmts.prepare(ctx, conn); err != nil {
		_ = w.stmts.close()
		return nil, err
	}
	err := w.stmts.lastReceipt.QueryRowContext(ctx).Scan(&w.head.Seq, &w.head.Hash)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		_ = w.stmts.close()
		return nil, fmt.Errorf("read the receipt chain head: %w", err)
	}
	var horizon int64
	err = w.stmts.horizon.QueryRowContext(ctx).Scan(&horizon)
	switch {
	case err == nil:
		w.horizon = fromMicros(horizon)
	case !errors.Is(err, sql.ErrNoRows):
		_ = w.stmts.close()
		return nil, fmt.Errorf("read the prune horizon: %w", err)
	}
	return w, nil
}

func (w *writer) start() {
	w.started = true
	go w.run()
}

// close stops the writer goroutine (callers are gone: Close waited for
// them) and closes its statements and connection.
func (w *writer) close() error {
	w.stopOnce.Do(func() { close(w.stop) })
	if w.started {
		<-w.finished
	}
	return errors.Join(w.stmts.close(), w.conn.Close())
}

// do submits fn and waits for its result. If ctx ends before the writer
// took the request, the request is withdrawn and nothing is written; once
// taken, do waits for the outcome (one batch) so the caller never sees
// ctx.Err() for a write that committed.
func (w *writer) do(ctx context.Context, fn writeFunc) error {
	op := &writeOp{fn: fn, done: make(chan error, 1)}
	select {
	case w.ops <- op:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-op.done:
		return err
	case <-ctx.Done():
		if op.state.CompareAndSwap(opPending, opAbandoned) {
			return ctx.Err()
		}
		return <-op.done
	}
}

func (w *writer) run() {
	defer close(w.finished)
	batch := make([]*writeOp, 0, w.maxBatch)
	for {
		select {
		case <-w.stop:
			return
		case op := <-w.ops:
			batch = append(batch[:0], op)
		}
	fill:
		for len(batch) < w.maxBatch {
			select {
			case op := <-w.ops:
				batch = append(batch, op)
			default:
				break fill
			}
		}
		live := batch[:0]
		for _, op := range batch {
			if op.state.CompareAndSwap(opPending, opTaken) {
				live = append(live, op)
			}
		}
		if len(live) > 0 {
			w.commit(live)
		}
		clear(batch)
	}
}

// commit runs ops in one transaction and delivers their results after the
// commit. On a storage failure it falls back to one transaction per op.
func (w *writer) commit(ops []*writeOp) {
	errs, err := w.runTx(ops)
	if err != nil && len(ops) > 1 {
		for _, op := range ops {
			w.commit([]*writeOp{op})
		}
		return
	}
	for i, op := range ops {
		if err != nil {
			op.done <- err
		} else {
			op.done <- errs[i]
		}
	}
}

// runTx returns each op's own result, or a batch error when the transaction
// was rolled back.
func (w *writer) runTx(ops []*writeOp) ([]error, error) {
	ctx := context.Background() // a batch is never cut short by one caller
	if _, err := w.stmts.begin.ExecContext(ctx); err != nil {
		return nil, fmt.Errorf("sqliteruntime: begin transaction: %w", err)
	}
	tx := &wtx{writeStmts: &w.stmts, head: w.head, horizon: w.horizon}
	errs := make([]error, len(ops))
	for i, op := range ops {
		err := op.fn(tx)
		var oe *opError
		if errors.As(err, &oe) {
			w.rollback()
			return nil, err
		}
		errs[i] = err
	}
	if _, err := w.stmts.commit.ExecContext(ctx); err != nil {
		w.rollback()
		return nil, fmt.Errorf("sqliteruntime: commit: %w", err)
	}
	w.head, w.horizon = tx.head, tx.horizon
	return errs, nil
}

func (w *writer) rollback() {
	// A failed COMMIT may already have ended the transaction; then ROLLBACK
	// fails harmlessly.
	_, _ = w.stmts.rollback.ExecContext(context.Background())
}
