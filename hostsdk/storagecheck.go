package hostsdk

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Storage readiness after an action's journal write failed.
//
// Journal.Probe writes one small row. On a nearly full volume that write
// fits (SQLite rewrites the probe row's page in place) while an action's
// writes do not (AcceptAction inserts the message claim and the action
// record into several B-trees, which may need new pages; FinishAction
// stores the result, up to MaxResultBytes, and a receipt): the probe alone
// would keep the replica ready, and routed to, while it answers every
// action connector_host.storage_unavailable.
//
// So an action's write that fails for a storage reason (writeFailedBy)
// makes storage not ready at once: Ready, the storage_ready gauge and
// /ready say so, and so does the next heartbeat (connector_ready=false,
// which takes the replica offline) unless its own check passes. Only a
// storage check can make it ready again, and only by writing as much as
// the write that failed, never less than storageRecheckMinBytes
// (recheckWrite): a small write passing says nothing of room for a large
// one, and a page-based store fits a small value where an action's
// record, spread over several indexes, needs new pages. 64 KiB is sixteen
// of SQLite's 4 KiB pages, room for the records of several actions; set
// back to null at once, the check's value gives its pages back to the
// journal's free list, where those actions find them. The check runs where
// the probe does (each heartbeat and each /ready) for as long as the
// failure stands; a connection lost for a moment (a PostgreSQL failover)
// so costs the replica at most one heartbeat interval of readiness, the
// check passing as soon as storage writes again. A later action write
// that succeeds does not clear the failure: the host takes no new action
// while not ready, and an outcome write retried meanwhile (finishAction)
// is one write, not proof of room for the next.
const storageRecheckMinBytes = 64 << 10

// storageCheckKey is the key, in the host's reserved namespace, of the
// value recheckWrite writes and then sets back to null.
const storageCheckKey = "storage-check"

// writeFailure is an action's journal write that failed for a storage
// reason.
type writeFailure struct {
	err   error // what failed: "the journal write <what> failed: <error>"
	bytes int   // what recheckWrite must write: at least storageRecheckMinBytes
}

// writeFailedBy records err, the error of the journal write named by what
// (such as "accepting action act_..."), which carried about size bytes, as
// an action write storage failed, and reports whether it did: an error the
// journal answers about the record (a conflict, an invalid or pruned
// record, one not found) or a closed journal (the host is stopping) is not
// a storage failure, and nil is none. From then on storage is not ready
// until a storage check writes max(size, storageRecheckMinBytes) bytes, and
// as much as any earlier failure still standing asked for.
func (h *Host) writeFailedBy(what string, size int, err error) bool {
	if err == nil || errors.Is(err, journal.ErrConflict) || errors.Is(err, journal.ErrInvalid) ||
		errors.Is(err, journal.ErrPruned) || errors.Is(err, journal.ErrNotFound) || errors.Is(err, journal.ErrClosed) {
		return false
	}
	f := &writeFailure{err: fmt.Errorf("the journal write %s failed: %w", what, err), bytes: max(size, storageRecheckMinBytes)}
	for {
		old := h.writeFailed.Load()
		if old != nil {
			f.bytes = max(f.bytes, old.bytes)
		}
		// Always a new pointer, so that a check that began before this
		// failure cannot clear it (see checkStorage).
		if h.writeFailed.CompareAndSwap(old, f) {
			if old == nil {
				h.log.Error("runtime storage is not ready: an action's journal write failed; the replica takes no new actions until a storage check writes as much again",
					"error", f.err, "check_bytes", f.bytes)
			}
			return true
		}
	}
}

// storageOK reports whether storage is ready: the last storage check
// passed and no action write failed since.
func (h *Host) storageOK() bool {
	return h.storageReady.Load() && h.writeFailed.Load() == nil
}

// checkStorage is the storage check (see probe): Journal.Probe, then, while
// an action write's failure stands, recheckWrite of as much as it asked
// for, whose success clears that failure (not one recorded meanwhile).
func (h *Host) checkStorage(ctx context.Context) error {
	if err := h.journal.Probe(ctx); err != nil {
		return err
	}
	f := h.writeFailed.Load()
	if f == nil {
		return nil
	}
	if err := h.recheckWrite(ctx, f.bytes); err != nil {
		return fmt.Errorf("%w; a write of %d bytes to check that storage takes such writes again failed too: %w", f.err, f.bytes, err)
	}
	if h.writeFailed.CompareAndSwap(f, nil) {
		h.log.Info("runtime storage takes writes again: a storage check wrote as much as the action write that failed", "check_bytes", f.bytes)
	}
	return nil
}

// recheckWrite writes a JSON string of about n bytes (random base64 text, which
// neither SQLite nor PostgreSQL's TOAST compresses, so n bytes reach the
// storage) to the host's storage-check state value, through the journal's
// ordinary durable write, then sets the value back to null so the space
// goes back to the journal's free pages for the actions to use.
func (h *Host) recheckWrite(ctx context.Context, n int) error {
	var rev uint64
	switch v, err := h.journal.State(ctx, ownerNamespace, storageCheckKey); {
	case err == nil:
		rev = v.Revision
	case !errors.Is(err, journal.ErrNotFound):
		return err
	}
	rev, err := h.journal.PutState(ctx, ownerNamespace, storageCheckKey, padding(n), rev)
	if err != nil {
		return err
	}
	_, err = h.journal.PutState(ctx, ownerNamespace, storageCheckKey, json.RawMessage("null"), rev)
	return err
}

// padding is a JSON string of random base64 text, n bytes long or up to
// two bytes shorter (never shorter than 2).
func padding(n int) json.RawMessage {
	raw := make([]byte, base64.RawStdEncoding.DecodedLen(max(n-2, 0)))
	rand.Read(raw)
	out := make([]byte, 0, n)
	out = append(out, '"')
	out = base64.RawStdEncoding.AppendEncode(out, raw)
	return append(out, '"')
}

// recordBytes is about how many bytes a journal write of a carries: its
// strings, result and detail, and its times.
func recordBytes(a journal.Action) int {
	return len(a.ActionID) + len(a.CapabilityID) + len(a.TenantID) + len(a.IdempotencyKey) + len(a.InputDigest) +
		len(a.FenceToken) + len(a.MessageID) + len(a.Status) + len(a.Result) + len(a.Detail) + 5*8
}
