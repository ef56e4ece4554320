package hostsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// ReservedStatePrefix starts the state namespaces the host keeps for itself;
// connectors may not use them.
const ReservedStatePrefix = "aipfleet."

// Bounds of a state namespace and key, in bytes, the same on every
// journal (journal.CheckStateKey).
const (
	MaxStateNamespaceBytes = journal.MaxStateNamespaceBytes
	MaxStateKeyBytes       = journal.MaxStateKeyBytes
)

// maxStateUpdateAttempts bounds the compare-and-set retries of State.Update.
const maxStateUpdateAttempts = 32

// State is the journal-backed key/value store connectors use for their own
// bookkeeping (mutation ledgers, cursors, side-effect counters). Every write
// is a compare-and-set on the value's revision, so concurrent writers never
// lose updates. Values live in the same durable journal as the actions.
// Namespaces (at most MaxStateNamespaceBytes, not under
// ReservedStatePrefix) and keys (at most MaxStateKeyBytes) are non-empty
// UTF-8 text without NUL on every journal (an error matching
// journal.ErrInvalid otherwise); values are JSON.
//
// Once the host has stopped (Stop, or Run, returned), every method returns
// an error matching journal.ErrClosed, whoever owns the journal: a
// connector call the host abandoned (Config.HandleGrace) may still be
// running then, and its writes are refused rather than land in a journal
// the host no longer serves. Each journal operation is checked, so an
// Update that read before the stop does not write after it; an operation
// already in the journal when the host stops completes (the host does not
// wait for it: the call may be stuck in it).
//
// A write the journal fails for a storage reason (not a conflict, an
// invalid value, a closed journal, or the caller's context ending) makes
// the replica's storage not ready, as a failed action write does, until a
// storage check writes as much again (see storageRecheckMinBytes).
type State struct {
	j      journal.Journal
	h      *Host // told of a write storage failed
	closed atomic.Bool
}

// errStateClosed refuses State calls after the host stopped.
var errStateClosed = fmt.Errorf("hostsdk: state: the host has stopped: %w", journal.ErrClosed)

// close refuses every later call with errStateClosed.
func (s *State) close() { s.closed.Store(true) }

// check refuses a call after close, and a namespace or key no journal takes.
func (s *State) check(namespace, key string) error {
	if s.closed.Load() {
		return errStateClosed
	}
	return checkNamespace(namespace, key)
}

// ErrStateConflict is returned (wrapped) by Put when the stored revision is
// not the expected one, and by Update when it gives up after repeated
// conflicts. It matches journal.ErrConflict too.
var ErrStateConflict = fmt.Errorf("hostsdk: state revision conflict: %w", journal.ErrConflict)

// checkNamespace refuses, with an error matching journal.ErrInvalid, a
// state namespace or key no journal takes (journal.CheckStateKey), and a
// namespace reserved for the host.
func checkNamespace(namespace, key string) error {
	if err := journal.CheckStateKey(namespace, key); err != nil {
		return err
	}
	if strings.HasPrefix(namespace, ReservedStatePrefix) {
		return journal.Invalid("state namespace %q is reserved for the host; choose a namespace named after your connector", namespace)
	}
	return nil
}

// checkActionStateNamespace checks a namespace ActionStateNamespaces names
// as checkNamespace checks one a State call names, with errors that name
// the namespace only (the connector gave no key).
func checkActionStateNamespace(namespace string) error {
	switch {
	case namespace == "":
		return journal.Invalid("a state namespace is empty; name each namespace that holds values keyed by action ID")
	case !utf8.ValidString(namespace) || strings.ContainsRune(namespace, 0):
		return journal.Invalid("state namespace %q is not UTF-8 text without NUL", namespace)
	}
	return checkNamespace(namespace, "k")
}

// Get returns the value stored under namespace/key, or an error matching
// journal.ErrNotFound.
func (s *State) Get(ctx context.Context, namespace, key string) (journal.StateValue, error) {
	if err := s.check(namespace, key); err != nil {
		return journal.StateValue{}, err
	}
	return s.j.State(ctx, namespace, key)
}

// Put marshals value and stores it if the stored revision equals
// expectedRevision (0: the key must be absent). It returns the new revision,
// or an error matching ErrStateConflict.
func (s *State) Put(ctx context.Context, namespace, key string, value any, expectedRevision uint64) (uint64, error) {
	if err := s.check(namespace, key); err != nil {
		return 0, err
	}
	raw, err := json.Marshal(value)
	if err != nil {
		return 0, fmt.Errorf("hostsdk: state %s/%s: %w", namespace, key, err)
	}
	rev, err := s.j.PutState(ctx, namespace, key, raw, expectedRevision)
	if errors.Is(err, journal.ErrConflict) {
		return 0, fmt.Errorf("%w: %s/%s: %v", ErrStateConflict, namespace, key, err)
	}
	s.writeFailed(ctx, namespace, key, raw, err)
	return rev, err
}

// writeFailed tells the host of a state write that failed with err (nil:
// none); the host decides whether storage failed it (writeFailedBy).
func (s *State) writeFailed(ctx context.Context, namespace, key string, value json.RawMessage, err error) {
	if err != nil {
		s.h.connectorWriteFailed(ctx, fmt.Sprintf("writing state %q/%q", namespace, key), len(namespace)+len(key)+len(value)+2*8, err)
	}
}

// Update reads namespace/key, calls fn with the current value (nil when
// absent) and writes what fn returns with a compare-and-set, retrying from
// the read when another writer got there first. It returns the value written
// and its revision. fn may run more than once and must not have side
// effects.
func (s *State) Update(ctx context.Context, namespace, key string, fn func(current json.RawMessage) (json.RawMessage, error)) (json.RawMessage, uint64, error) {
	if err := s.check(namespace, key); err != nil {
		return nil, 0, err
	}
	for attempt := range maxStateUpdateAttempts {
		if attempt > 0 && s.closed.Load() {
			return nil, 0, errStateClosed
		}
		cur, err := s.j.State(ctx, namespace, key)
		if err != nil && !errors.Is(err, journal.ErrNotFound) {
			return nil, 0, err
		}
		next, err := fn(cur.Value)
		if err != nil {
			return nil, 0, err
		}
		// fn may have taken long (the host may have stopped meanwhile).
		if s.closed.Load() {
			return nil, 0, errStateClosed
		}
		rev, err := s.j.PutState(ctx, namespace, key, next, cur.Revision)
		if errors.Is(err, journal.ErrConflict) {
			continue
		}
		if err != nil {
			s.writeFailed(ctx, namespace, key, next, err)
			return nil, 0, err
		}
		return next, rev, nil
	}
	return nil, 0, fmt.Errorf("%w: %s/%s changed %d times in a row", ErrStateConflict, namespace, key, maxStateUpdateAttempts)
}
