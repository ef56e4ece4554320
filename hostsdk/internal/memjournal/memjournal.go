// Package memjournal is an in-memory journal.Journal for the host's own
// tests: it keeps everything in maps behind one mutex, reports Ephemeral
// durability, and lets a test make its probe fail. It passes the journaltest
// conformance suite like the durable backends.
package memjournal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Journal is an in-memory journal. The zero value is not usable; call New.
type Journal struct {
	mu       sync.Mutex
	closed   bool
	actions  map[string]*journal.Action
	order    []string // action IDs in arrival order
	messages map[string]time.Time
	outbox   map[string]*journal.OutboxEntry
	receipts []journal.Receipt
	lastSeq  uint64    // the newest receipt's Seq, kept when receipts are pruned
	horizon  time.Time // the prune horizon
	state    map[[2]string]journal.StateValue
	probeErr error
}

var _ journal.Journal = (*Journal)(nil)

// New returns an empty journal.
func New() *Journal {
	return &Journal{
		actions:  make(map[string]*journal.Action),
		messages: make(map[string]time.Time),
		outbox:   make(map[string]*journal.OutboxEntry),
		state:    make(map[[2]string]journal.StateValue),
	}
}

// SetProbeError makes Probe return err (nil restores health).
func (j *Journal) SetProbeError(err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.probeErr = err
}

// Durability implements journal.Journal.
func (j *Journal) Durability() journal.Durability { return journal.Ephemeral }

func (j *Journal) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return journal.ErrClosed
	}
	return nil
}

// BeginAction implements journal.Journal.
func (j *Journal) BeginAction(ctx context.Context, a journal.Action) (journal.Action, bool, error) {
	if err := j.lock(ctx); err != nil {
		return journal.Action{}, false, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckNewAction(a); err != nil {
		return journal.Action{}, false, err
	}
	if _, ok := j.actions[a.ActionID]; !ok {
		if err := journal.CheckHorizon(a, j.horizon); err != nil {
			return journal.Action{}, false, err
		}
	}
	existing, created := j.beginLocked(a, aip.StateReceived)
	return existing, created, nil
}

// beginLocked journals a in status (received or running) unless its ID is
// known, and returns the stored record. j.mu is held; the caller has
// applied the prune horizon.
func (j *Journal) beginLocked(a journal.Action, status aip.ActionState) (journal.Action, bool) {
	if existing, ok := j.actions[a.ActionID]; ok {
		return clone(*existing), false
	}
	a = journal.NewRecord(a, status)
	c := clone(a)
	j.actions[a.ActionID] = &c
	j.order = append(j.order, a.ActionID)
	return clone(a), true
}

// AcceptAction implements journal.Journal.
func (j *Journal) AcceptAction(ctx context.Context, messageID string, messageExpiresAt, now time.Time, a journal.Action) (journal.Accepted, error) {
	if err := j.lock(ctx); err != nil {
		return journal.Accepted{}, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckClaim(messageID, messageExpiresAt, now); err != nil {
		return journal.Accepted{}, err
	}
	if err := journal.CheckNewAction(a); err != nil {
		return journal.Accepted{}, err
	}
	messageExpiresAt, now = journal.Micro(messageExpiresAt), journal.Micro(now)
	if exp, ok := j.messages[messageID]; ok && exp.After(now) {
		return journal.Accepted{}, nil
	}
	if _, ok := j.actions[a.ActionID]; !ok {
		if err := journal.CheckHorizon(a, j.horizon); err != nil {
			return journal.Accepted{}, err
		}
	}
	j.messages[messageID] = messageExpiresAt
	rec, created := j.beginLocked(a, aip.StateRunning)
	out := journal.Accepted{Claimed: true, Created: created}
	if !created {
		out.Existing = rec
	}
	return out, nil
}

// StartAction implements journal.Journal.
func (j *Journal) StartAction(ctx context.Context, actionID string, at time.Time) error {
	if err := j.lock(ctx); err != nil {
		return err
	}
	defer j.mu.Unlock()
	if err := journal.CheckID("action ID", actionID); err != nil {
		return err
	}
	if err := journal.CheckTime("start time", at); err != nil {
		return err
	}
	at = journal.Micro(at)
	a, ok := j.actions[actionID]
	if !ok {
		return journal.ErrNotFound
	}
	if a.Status != aip.StateReceived {
		return fmt.Errorf("%w: action %s is %s, not received", journal.ErrConflict, actionID, a.Status)
	}
	a.Status, a.StartedAt, a.UpdatedAt = aip.StateRunning, at, at
	return nil
}

// FinishAction implements journal.Journal.
func (j *Journal) FinishAction(ctx context.Context, actionID string, status aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	if err := j.lock(ctx); err != nil {
		return journal.Receipt{}, err
	}
	defer j.mu.Unlock()
	r, err := journal.NewReceipt(actionID, status, result, at)
	if err != nil {
		return journal.Receipt{}, err
	}
	a, ok := j.actions[actionID]
	if !ok {
		return journal.Receipt{}, journal.ErrNotFound
	}
	if a.Status.Terminal() {
		return journal.Receipt{}, fmt.Errorf("%w: action %s is already %s", journal.ErrConflict, actionID, a.Status)
	}
	r.Seq = j.lastSeq + 1
	if n := len(j.receipts); n > 0 {
		r.PrevHash = j.receipts[n-1].Hash
	}
	h, err := journal.ReceiptHash(r)
	if err != nil {
		return journal.Receipt{}, err
	}
	r.Hash = h
	j.receipts = append(j.receipts, r)
	j.lastSeq = r.Seq
	a.Status, a.Result, a.Detail, a.UpdatedAt, a.CompletedAt = status, slices.Clone(result), journal.Text(detail), r.At, r.At
	return r, nil
}

// Action implements journal.Journal.
func (j *Journal) Action(ctx context.Context, actionID string) (journal.Action, error) {
	if err := j.lock(ctx); err != nil {
		return journal.Action{}, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckID("action ID", actionID); err != nil {
		return journal.Action{}, err
	}
	a, ok := j.actions[actionID]
	if !ok {
		return journal.Action{}, journal.ErrNotFound
	}
	return clone(*a), nil
}

// ActionsByStatus implements journal.Journal.
func (j *Journal) ActionsByStatus(ctx context.Context, limit int, statuses ...aip.ActionState) ([]journal.Action, error) {
	if err := j.lock(ctx); err != nil {
		return nil, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckLimit(limit); err != nil {
		return nil, err
	}
	statuses, err := journal.CheckStatuses(statuses)
	if err != nil {
		return nil, err
	}
	var out []journal.Action
	for _, id := range j.order {
		if a := j.actions[id]; slices.Contains(statuses, a.Status) {
			out = append(out, clone(*a))
		}
	}
	sort.SliceStable(out, func(x, y int) bool {
		if !out[x].ReceivedAt.Equal(out[y].ReceivedAt) {
			return out[x].ReceivedAt.Before(out[y].ReceivedAt)
		}
		return out[x].ActionID < out[y].ActionID
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// PruneActions implements journal.Journal.
func (j *Journal) PruneActions(ctx context.Context, before time.Time, limit int, stateNamespaces []string) (int, error) {
	if err := j.lock(ctx); err != nil {
		return 0, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckPrune(before, limit, stateNamespaces); err != nil {
		return 0, err
	}
	before = journal.Micro(before)
	var old []*journal.Action
	for _, a := range j.actions {
		if a.Status.Terminal() && a.CompletedAt.Before(before) {
			old = append(old, a)
		}
	}
	sort.Slice(old, func(x, y int) bool { return old[x].CompletedAt.Before(old[y].CompletedAt) })
	if len(old) > limit {
		old = old[:limit]
	}
	if len(old) == 0 {
		return 0, nil
	}
	for _, a := range old {
		delete(j.actions, a.ActionID)
		for _, ns := range stateNamespaces {
			delete(j.state, [2]string{ns, a.ActionID})
		}
		// The horizon covers the receipt time too: a record can complete
		// before it was received when the clock went back meanwhile.
		for _, t := range []time.Time{a.ReceivedAt, a.CompletedAt} {
			if t.After(j.horizon) {
				j.horizon = t
			}
		}
	}
	j.order = slices.DeleteFunc(j.order, func(id string) bool { _, ok := j.actions[id]; return !ok })
	n := 0
	for n < len(j.receipts)-1 {
		if _, ok := j.actions[j.receipts[n].ActionID]; ok {
			break
		}
		n++
	}
	j.receipts = slices.Delete(j.receipts, 0, n)
	return len(old), nil
}

// PruneHorizon implements journal.Journal.
func (j *Journal) PruneHorizon(ctx context.Context) (time.Time, error) {
	if err := j.lock(ctx); err != nil {
		return time.Time{}, err
	}
	defer j.mu.Unlock()
	return j.horizon, nil
}

// ClaimMessage implements journal.Journal.
func (j *Journal) ClaimMessage(ctx context.Context, messageID string, expiresAt, now time.Time) (bool, error) {
	if err := j.lock(ctx); err != nil {
		return false, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckClaim(messageID, expiresAt, now); err != nil {
		return false, err
	}
	expiresAt, now = journal.Micro(expiresAt), journal.Micro(now)
	if exp, ok := j.messages[messageID]; ok && exp.After(now) {
		return false, nil
	}
	j.messages[messageID] = expiresAt
	return true, nil
}

// PruneMessages implements journal.Journal.
func (j *Journal) PruneMessages(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := j.lock(ctx); err != nil {
		return 0, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckLimit(limit); err != nil {
		return 0, err
	}
	now = journal.Micro(now)
	n := 0
	for id, exp := range j.messages {
		if n == limit {
			break
		}
		if !exp.After(now) {
			delete(j.messages, id)
			n++
		}
	}
	return n, nil
}

// EnqueueEvents implements journal.Journal.
func (j *Journal) EnqueueEvents(ctx context.Context, e journal.OutboxEntry) error {
	if err := j.lock(ctx); err != nil {
		return err
	}
	defer j.mu.Unlock()
	if err := journal.CheckOutboxEntry(e); err != nil {
		return err
	}
	// As the SQL backends: a new batch is never leased.
	e.CreatedAt, e.LeaseUntil = journal.Micro(e.CreatedAt), time.Time{}
	e.LastError = journal.Text(e.LastError)
	if e.NextAttempt.IsZero() {
		e.NextAttempt = e.CreatedAt
	}
	e.NextAttempt = journal.Micro(e.NextAttempt)
	if _, ok := j.outbox[e.ID]; !ok {
		e.Events = slices.Clone(e.Events)
		j.outbox[e.ID] = &e
	}
	return nil
}

// ClaimEvents implements journal.Journal.
func (j *Journal) ClaimEvents(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]journal.OutboxEntry, error) {
	if err := j.lock(ctx); err != nil {
		return nil, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckLimit(limit); err != nil {
		return nil, err
	}
	if lease <= 0 {
		return nil, journal.Invalid("lease %v is not positive", lease)
	}
	now = journal.Micro(now)
	var due []*journal.OutboxEntry
	for _, e := range j.outbox {
		if !e.NextAttempt.After(now) && !e.LeaseUntil.After(now) {
			due = append(due, e)
		}
	}
	sort.Slice(due, func(a, b int) bool { return due[a].CreatedAt.Before(due[b].CreatedAt) })
	var out []journal.OutboxEntry
	for _, e := range due {
		if len(out) == limit {
			break
		}
		e.LeaseUntil = journal.Micro(now.Add(lease))
		out = append(out, *e)
	}
	return out, nil
}

// AckEvents implements journal.Journal.
func (j *Journal) AckEvents(ctx context.Context, id string) error {
	if err := j.lock(ctx); err != nil {
		return err
	}
	defer j.mu.Unlock()
	if err := journal.CheckID("outbox batch ID", id); err != nil {
		return err
	}
	if _, ok := j.outbox[id]; !ok {
		return journal.ErrNotFound
	}
	delete(j.outbox, id)
	return nil
}

// RetryEvents implements journal.Journal.
func (j *Journal) RetryEvents(ctx context.Context, id string, next time.Time, lastError string) error {
	if err := j.lock(ctx); err != nil {
		return err
	}
	defer j.mu.Unlock()
	if err := journal.CheckID("outbox batch ID", id); err != nil {
		return err
	}
	if err := journal.CheckTime("next attempt", next); err != nil {
		return err
	}
	next = journal.Micro(next)
	e, ok := j.outbox[id]
	if !ok {
		return journal.ErrNotFound
	}
	e.Attempts++
	e.NextAttempt, e.LastError, e.LeaseUntil = next, journal.Text(lastError), time.Time{}
	return nil
}

// PendingEvents implements journal.Journal.
func (j *Journal) PendingEvents(ctx context.Context) (int, error) {
	if err := j.lock(ctx); err != nil {
		return 0, err
	}
	defer j.mu.Unlock()
	return len(j.outbox), nil
}

// Receipts implements journal.Journal.
func (j *Journal) Receipts(ctx context.Context, after uint64, limit int) ([]journal.Receipt, error) {
	if err := j.lock(ctx); err != nil {
		return nil, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckLimit(limit); err != nil {
		return nil, err
	}
	var out []journal.Receipt
	for _, r := range j.receipts {
		if r.Seq > after {
			out = append(out, r)
			if len(out) == limit {
				break
			}
		}
	}
	return out, nil
}

// ReceiptFor implements journal.Journal.
func (j *Journal) ReceiptFor(ctx context.Context, actionID string) (journal.Receipt, error) {
	if err := j.lock(ctx); err != nil {
		return journal.Receipt{}, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckID("action ID", actionID); err != nil {
		return journal.Receipt{}, err
	}
	for _, r := range j.receipts {
		if r.ActionID == actionID {
			return r, nil
		}
	}
	return journal.Receipt{}, fmt.Errorf("%w: no receipt for action %s", journal.ErrNotFound, actionID)
}

// State implements journal.Journal.
func (j *Journal) State(ctx context.Context, namespace, key string) (journal.StateValue, error) {
	if err := j.lock(ctx); err != nil {
		return journal.StateValue{}, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckStateKey(namespace, key); err != nil {
		return journal.StateValue{}, err
	}
	v, ok := j.state[[2]string{namespace, key}]
	if !ok {
		return journal.StateValue{}, journal.ErrNotFound
	}
	v.Value = slices.Clone(v.Value)
	return v, nil
}

// PutState implements journal.Journal.
func (j *Journal) PutState(ctx context.Context, namespace, key string, value json.RawMessage, expectedRevision uint64) (uint64, error) {
	if err := j.lock(ctx); err != nil {
		return 0, err
	}
	defer j.mu.Unlock()
	if err := journal.CheckStateKey(namespace, key); err != nil {
		return 0, err
	}
	if err := journal.CheckJSON("state value", value); err != nil {
		return 0, err
	}
	k := [2]string{namespace, key}
	cur := j.state[k]
	if cur.Revision != expectedRevision {
		return 0, fmt.Errorf("%w: state %s/%s is at revision %d, not %d", journal.ErrConflict, namespace, key, cur.Revision, expectedRevision)
	}
	j.state[k] = journal.StateValue{Value: slices.Clone(value), Revision: cur.Revision + 1}
	return cur.Revision + 1, nil
}

// Probe implements journal.Journal.
func (j *Journal) Probe(ctx context.Context) error {
	if err := j.lock(ctx); err != nil {
		return err
	}
	defer j.mu.Unlock()
	if j.probeErr != nil {
		return j.probeErr
	}
	return ctx.Err()
}

// Close implements journal.Journal. Closing twice is not an error.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	return nil
}

// ErrInjected is a convenience error for tests that break the journal.
var ErrInjected = errors.New("memjournal: injected failure")

func clone(a journal.Action) journal.Action {
	a.Result = slices.Clone(a.Result)
	return a
}
