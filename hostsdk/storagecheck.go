package hostsdk

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Storage readiness after a journal write failed.
//
// Journal.Probe writes one small row. On a nearly full volume that write
// fits (SQLite rewrites the probe row's page in place) while an action's
// writes do not (AcceptAction inserts the message claim and the action
// record into several B-trees, which may need new pages; FinishAction
// stores the result, up to MaxResultBytes, and a receipt): the probe alone
// would keep the replica ready, and routed to, while it answers every
// action connector_host.storage_unavailable.
//
// So a journal write that fails for a storage reason (writeFailedBy)
// makes storage not ready at once: Ready, the storage_ready gauge and
// /ready say so, and so does the next heartbeat (connector_ready=false,
// which takes the replica offline) unless its own check passes. The
// writes that do so are an action's (its accept, its outcome, a message
// claim, an early cancel's record) and the connector's: an event batch
// stored in the outbox (EventPublisher.Publish) and a state value written
// (State.Put, State.Update). A failed outbox write answers a provider's
// webhook with an error, and the provider delivers it again: a replica
// that stayed ready would keep being routed webhooks it cannot store,
// each redelivery failing the same way, where not ready sends them (and
// the actions) to a replica that can. A failed state write fails the
// connector's operation, often an action whose side effect is done (or
// about to be) and whose ledger entry or cursor cannot be recorded: the
// next actions routed here would fail the same way, inside the connector,
// which is worse than being refused before they start. Neither kind is
// made with the host's own context: a write that failed because its
// caller's context ended (a webhook's client that went away) was cut
// short by the caller and says nothing of storage (connectorWriteFailed).
// Reads (a state value, the outbox's size) mark nothing: the probe reads
// too.
//
// Only a storage check can make storage ready again, and only by writing
// as much as the write that failed, never less than storageRecheckMinBytes
// and never more than storageRecheckMaxBytes (recheckWrite): a small write
// passing says nothing of room for a large one, and a page-based store
// fits a small value where an action's record, spread over several
// indexes, needs new pages. 64 KiB is sixteen of SQLite's 4 KiB pages,
// room for the records of several actions; set back to null at once, the
// check's value gives its pages back to the journal's free list, where
// those actions find them. The check runs where the probe does (each
// heartbeat and each /ready) for as long as the failure stands; a
// connection lost for a moment (a PostgreSQL failover) so costs the
// replica at most one heartbeat interval of readiness, the check passing
// as soon as storage writes again. A later write that succeeds does not
// clear the failure: the host takes no new action or event while not
// ready, and an outcome write retried meanwhile (finishAction) is one
// write, not proof of room for the next.
const storageRecheckMinBytes = 64 << 10

// storageRecheckMaxBytes bounds what a storage check writes: a signed
// message's bound, above any action write (an outcome's result is at most
// MaxResultBytes). A state value has no bound of its own: one that failed
// for its very size (beyond SQLite's or PostgreSQL's largest value, which
// they report as a storage error) would ask every check for a write that
// never passes, made in memory at each /ready. A larger write that fails
// again once the check passed makes storage not ready again.
const storageRecheckMaxBytes = aip.MaxMessageBytes

// storageCheckKey is the key, in the host's reserved namespace, of the
// value recheckWrite writes and then sets back to null.
const storageCheckKey = "storage-check"

// writeFailure is a journal write that failed for a storage reason.
type writeFailure struct {
	err   error // what failed: "the journal write <what> failed: <error>"
	bytes int   // what recheckWrite must write: storageRecheckMinBytes to storageRecheckMaxBytes
}

// writeFailedBy records err, the error of the journal write named by what
// (such as "accepting action act_..."), which carried about size bytes, as
// a write storage failed, and reports whether it did: an error the journal
// answers about the record (a conflict, such as a stale state revision, an
// invalid or pruned record, one not found) or a closed journal (the host
// is stopping) is not a storage failure, and nil is none. From then on
// storage is not ready until a storage check writes size bytes, bounded by
// storageRecheckMinBytes and storageRecheckMaxBytes, and as much as any
// earlier failure still standing asked for.
func (h *Host) writeFailedBy(what string, size int, err error) bool {
	if err == nil || errors.Is(err, journal.ErrConflict) || errors.Is(err, journal.ErrInvalid) ||
		errors.Is(err, journal.ErrPruned) || errors.Is(err, journal.ErrNotFound) || errors.Is(err, journal.ErrClosed) {
		return false
	}
	f := &writeFailure{err: fmt.Errorf("the journal write %s failed: %w", what, err), bytes: min(max(size, storageRecheckMinBytes), storageRecheckMaxBytes)}
	for {
		old := h.writeFailed.Load()
		if old != nil {
			f.bytes = max(f.bytes, old.bytes)
		}
		// Always a new pointer, so that a check that began before this
		// failure cannot clear it (see checkStorage).
		if h.writeFailed.CompareAndSwap(old, f) {
			if old == nil {
				h.log.Error("runtime storage is not ready: a journal write failed; the replica takes no new actions or events until a storage check writes as much again",
					"error", f.err, "check_bytes", f.bytes)
			}
			return true
		}
	}
}

// connectorWriteFailed is writeFailedBy for a write the connector made
// with its own context ctx (an outbox batch, a state value): one that
// failed because ctx ended was cut short by its caller, not by storage.
func (h *Host) connectorWriteFailed(ctx context.Context, what string, size int, err error) {
	if err != nil && !senderWentAway(ctx, err) {
		h.writeFailedBy(what, size, err)
	}
}

// storageOK reports whether storage is ready: the last storage check
// passed and no journal write failed since.
func (h *Host) storageOK() bool {
	return h.storageReady.Load() && h.writeFailed.Load() == nil
}

// checkStorage is the storage check (see probe): Journal.Probe, then, while
// a journal write's failure stands, recheckWrite of as much as it asked
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
		h.log.Info("runtime storage takes writes again: a storage check wrote as much as the journal write that failed", "check_bytes", f.bytes)
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
