package hostsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// The journal's origin: which routes its records can answer for.
//
// A replica whose journal is lost (a state directory wiped, or a relative
// --state-dir taken from another working directory; a volume not mounted;
// a new PostgreSQL namespace) starts on an empty one under the same
// replica ID. The registry still pins that replica's earlier actions to
// it, and the journal has no record of them: without more, a retry of an
// action that ran on the lost journal would look new and run a second
// time, a status query would answer not_found (which a dispatcher settles
// as never run), and a not_ready refusal would let the dispatcher reroute
// it elsewhere.
//
// Every route carries replica_health_revision, the replica's health
// revision in the registry when the route was assigned (kept with the
// assignment, so a retry's route carries the first one), and the revision
// only goes up: each registration and heartbeat raises it. So a journal
// records, per replica ID, the lease sequence (the health revision) of the
// first registration it served under that ID: its origin. Every route
// assigned while this journal served the replica has a revision at or
// above it; a route below it was assigned before, to a predecessor whose
// journal this is not, and for such a route the journal's silence proves
// nothing. An action, cancel or status query of such a route that the
// journal holds no record of is answered as for a pruned action
// (connector_host.action_expired, status pruned): it may have run, it is
// never run here.
//
// A journal created before origins were kept (it has an owner record but
// no originsKey) keeps trusting itself for the replica ID it is opened
// under (origin 0: nothing is checked), as before; a route with revision 0
// is not checked either (no registry assigns one: a replica is routed to
// only after it registered, which raises its revision to at least 1).
const (
	// originsKey, in the host's reserved namespace, marks a journal that
	// has recorded origins since it was created.
	originsKey = "origins"
	// originKeyPrefix, followed by a replica ID, is the key of that
	// replica ID's journalOrigin.
	originKeyPrefix = "origin:"
)

// originPending is Host.origin until the first registration under this
// replica ID with this journal fixes it: every route of a revision other
// than 0 is below it.
const originPending = math.MaxUint64

// journalOrigin is the value of an origin key.
type journalOrigin struct {
	// Revision is the lease sequence of the first registration of the
	// replica ID with this journal; 0 for a journal that kept no origins
	// before (trusted, as it always was).
	Revision uint64 `json:"revision"`
}

// errBeforeJournal wraps the refusal of a route assigned before this
// journal served the replica (see expired).
var errBeforeJournal = errors.New("the route is older than this replica's journal")

// markOriginsKept records, in a journal just created, that it keeps
// origins. claimJournal calls it before writing the owner record, so a
// journal with an owner and no mark is one created before origins were
// kept.
func (h *Host) markOriginsKept(ctx context.Context) error {
	_, err := h.journal.PutState(ctx, ownerNamespace, originsKey, json.RawMessage("true"), 0)
	if err != nil && !errors.Is(err, journal.ErrConflict) {
		return fmt.Errorf("mark the new journal as keeping its origin: %w", err)
	}
	return nil
}

// loadOrigin reads the origin of the configured replica ID (after
// claimJournal). A journal without the originsKey mark predates origins:
// its origin for this replica ID is recorded as 0 (trusted) and the mark
// written, so another replica ID opening it later is checked. An origin
// not recorded yet is pending until the registration (fixOrigin).
func (h *Host) loadOrigin(ctx context.Context) error {
	key := originKeyPrefix + h.cfg.ReplicaID
	switch _, err := h.journal.State(ctx, ownerNamespace, originsKey); {
	case errors.Is(err, journal.ErrNotFound):
		if err := h.putOrigin(ctx, key, 0); err != nil {
			return err
		}
		if err := h.markOriginsKept(ctx); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("read whether the journal keeps its origin: %w", err)
	}
	v, err := h.journal.State(ctx, ownerNamespace, key)
	switch {
	case errors.Is(err, journal.ErrNotFound):
		h.origin.Store(originPending)
		return nil
	case err != nil:
		return fmt.Errorf("read the journal's origin for replica %s: %w", h.cfg.ReplicaID, err)
	}
	var o journalOrigin
	if err := json.Unmarshal(v.Value, &o); err != nil {
		return fmt.Errorf("the journal's origin record for replica %s, %s, does not decode: %w", h.cfg.ReplicaID, v.Value, err)
	}
	h.origin.Store(o.Revision)
	return nil
}

// fixOrigin records a pending origin as the lease sequence seq of the
// registration just granted. It takes effect in memory first: routes the
// registry assigns from now on carry seq or more. A write that fails fails
// the start; the next start's registration fixes a higher origin, which
// only refuses more (actions this journal never received).
func (h *Host) fixOrigin(ctx context.Context, seq uint64) error {
	if h.origin.Load() != originPending {
		return nil
	}
	h.origin.Store(seq)
	key := originKeyPrefix + h.cfg.ReplicaID
	if err := h.putOrigin(ctx, key, seq); err != nil {
		return err
	}
	h.log.Info("the journal serves this replica ID from its registration on: actions routed to it before, which an earlier journal may have run, are refused if this journal does not hold them",
		"origin_revision", seq)
	return nil
}

// putOrigin writes the origin under key unless one is there already.
func (h *Host) putOrigin(ctx context.Context, key string, rev uint64) error {
	raw, err := json.Marshal(journalOrigin{Revision: rev})
	if err != nil {
		return err
	}
	if _, err := h.journal.PutState(ctx, ownerNamespace, key, raw, 0); err != nil && !errors.Is(err, journal.ErrConflict) {
		return fmt.Errorf("record the journal's origin for replica %s: %w", h.cfg.ReplicaID, err)
	}
	return nil
}

// beforeJournal returns an error wrapping errBeforeJournal when the route
// was assigned before this journal served the replica (its revision is
// below the journal's origin), nil otherwise. The caller has found no
// record of the route's action.
func (h *Host) beforeJournal(route *aip.ConnectorRoute) error {
	if route == nil || route.ReplicaHealthRevision == 0 {
		return nil
	}
	origin := h.origin.Load()
	if route.ReplicaHealthRevision >= origin {
		return nil
	}
	if origin == originPending {
		return fmt.Errorf("%w: the route was assigned at replica health revision %d, and this journal has not served replica %s yet",
			errBeforeJournal, route.ReplicaHealthRevision, h.cfg.ReplicaID)
	}
	return fmt.Errorf("%w: the route was assigned at replica health revision %d, and this journal serves replica %s from revision %d on",
		errBeforeJournal, route.ReplicaHealthRevision, h.cfg.ReplicaID, origin)
}
