package journal

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
)

// The argument rules of the contract, shared by every backend so they
// refuse the same input with the same ErrInvalid errors.

// Invalid returns an error wrapping ErrInvalid.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// CheckNewAction applies BeginAction's (and AcceptAction's) rules to a new
// record: an ID, a receipt time, no status but received, no result.
func CheckNewAction(a Action) error {
	switch {
	case a.ActionID == "":
		return Invalid("action ID is empty")
	case a.ReceivedAt.IsZero():
		return Invalid("action %s has no ReceivedAt", a.ActionID)
	case a.Status != "" && a.Status != aip.StateReceived:
		return Invalid("action %s begins with status %q; a new action is received", a.ActionID, a.Status)
	case len(a.Result) != 0:
		return Invalid("action %s begins with a result; results come with FinishAction", a.ActionID)
	}
	for _, f := range []struct{ name, v string }{
		{"action ID", a.ActionID}, {"capability ID", a.CapabilityID}, {"tenant ID", a.TenantID},
		{"idempotency key", a.IdempotencyKey}, {"input digest", a.InputDigest},
		{"fence token", a.FenceToken}, {"message ID", a.MessageID},
	} {
		if !isText(f.v) {
			return Invalid("action %q: the %s %q is not UTF-8 text without NUL", a.ActionID, f.name, f.v)
		}
	}
	return nil
}

// CheckID refuses an empty identifier, and one that is not UTF-8 text
// without NUL; what names it in the error.
func CheckID(what, id string) error {
	if id == "" {
		return Invalid("%s is empty", what)
	}
	if !isText(id) {
		return Invalid("%s %q is not UTF-8 text without NUL", what, id)
	}
	return nil
}

// CheckTime refuses the zero time; what names it in the error.
func CheckTime(what string, t time.Time) error {
	if t.IsZero() {
		return Invalid("%s is the zero time", what)
	}
	return nil
}

// CheckLimit refuses a limit that is not positive.
func CheckLimit(limit int) error {
	if limit <= 0 {
		return Invalid("limit %d is not positive", limit)
	}
	return nil
}

// CheckTerminal refuses a FinishAction status that is not terminal.
func CheckTerminal(id string, st aip.ActionState) error {
	if !st.Terminal() {
		return Invalid("action %s cannot finish with status %q; use completed, failed, outcome_unknown or cancelled", id, st)
	}
	return nil
}

// CheckJSON refuses invalid JSON, and JSON whose bytes are not UTF-8
// (encoding/json takes those, PostgreSQL's json type refuses them, so
// every backend does); what names it in the error.
func CheckJSON(what string, raw json.RawMessage) error {
	if !json.Valid(raw) {
		return Invalid("%s is not valid JSON", what)
	}
	if !utf8.Valid(raw) {
		return Invalid("%s is JSON holding bytes that are not UTF-8", what)
	}
	return nil
}

// CheckStatuses validates ActionsByStatus's statuses and returns them
// without duplicates.
func CheckStatuses(statuses []aip.ActionState) ([]aip.ActionState, error) {
	if len(statuses) == 0 {
		return nil, Invalid("no statuses given")
	}
	out := make([]aip.ActionState, 0, len(statuses))
	for _, s := range statuses {
		if !s.Valid() || s == aip.StateNotFound {
			return nil, Invalid("unknown action status %q", s)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// CheckOutboxEntry applies EnqueueEvents's rules to a batch. Events must be
// a non-empty JSON array: the fleet refuses an empty event batch, so one
// could never be delivered.
func CheckOutboxEntry(e OutboxEntry) error {
	if err := CheckID("outbox batch ID", e.ID); err != nil {
		return err
	}
	if e.ChannelID == "" {
		return Invalid("outbox batch %s has no channel", e.ID)
	}
	if err := CheckID("channel of outbox batch "+e.ID, e.ChannelID); err != nil {
		return err
	}
	switch {
	case e.CreatedAt.IsZero():
		return Invalid("outbox batch %s has no CreatedAt", e.ID)
	case e.Attempts < 0:
		return Invalid("outbox batch %s has %d attempts", e.ID, e.Attempts)
	}
	var events []json.RawMessage
	if err := json.Unmarshal(e.Events, &events); err != nil || len(events) == 0 {
		return Invalid("outbox batch %s: events must be a non-empty JSON array", e.ID)
	}
	if !utf8.Valid(e.Events) {
		return Invalid("outbox batch %s: events hold bytes that are not UTF-8", e.ID)
	}
	return nil
}

// Bounds of a state namespace and key, in bytes, the same on every
// backend: PostgreSQL indexes the pair (with the journal's namespace) in a
// B-tree whose entries hold at most 2704 bytes, so a longer key that
// another backend took would fail there with a storage error.
const (
	MaxStateNamespaceBytes = 256
	MaxStateKeyBytes       = 1024
)

// CheckStateKey refuses an empty state namespace or key, one longer than
// its bound (MaxStateNamespaceBytes, MaxStateKeyBytes), and one that is
// not text: not UTF-8, or holding NUL (PostgreSQL's text type refuses
// both, so every backend does).
func CheckStateKey(namespace, key string) error {
	if namespace == "" || key == "" {
		return Invalid("state namespace and key must not be empty (got %q, %q)", namespace, key)
	}
	if len(namespace) > MaxStateNamespaceBytes {
		return Invalid("state namespace %.32q... is %d bytes; at most %d", namespace, len(namespace), MaxStateNamespaceBytes)
	}
	if len(key) > MaxStateKeyBytes {
		return Invalid("state key %.32q... in namespace %s is %d bytes; at most %d (hash a longer key, e.g. with aip.DigestBytes)", key, namespace, len(key), MaxStateKeyBytes)
	}
	if !isText(namespace) || !isText(key) {
		return Invalid("state namespace and key must be UTF-8 text without NUL (got %q, %q)", namespace, key)
	}
	return nil
}

func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// CheckClaim applies ClaimMessage's (and AcceptAction's) rules to a message
// claim: a message ID and an expiry after now.
func CheckClaim(messageID string, expiresAt, now time.Time) error {
	if err := CheckID("message ID", messageID); err != nil {
		return err
	}
	if !expiresAt.After(now) {
		return Invalid("message %s expires at %v, not after now (%v)", messageID, expiresAt, now)
	}
	return nil
}

// Micro returns t as every backend stores it: to the microsecond, in UTC.
// The zero time stays zero ("not set").
func Micro(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return time.UnixMicro(t.UnixMicro()).UTC()
}

// NewRecord returns the record a backend journals for a new action a
// (already checked by CheckNewAction) in status received or running:
// ReceivedAt to the microsecond, UpdatedAt = ReceivedAt, StartedAt =
// ReceivedAt when running (zero otherwise), no result, detail or
// completion time, and no AssignedAt (it is not stored).
func NewRecord(a Action, status aip.ActionState) Action {
	a.Status = status
	a.AssignedAt = time.Time{}
	a.ReceivedAt = Micro(a.ReceivedAt)
	a.UpdatedAt = a.ReceivedAt
	a.StartedAt, a.CompletedAt = time.Time{}, time.Time{}
	if status == aip.StateRunning {
		a.StartedAt = a.ReceivedAt
	}
	a.Result, a.Detail = nil, ""
	return a
}

// NewReceipt applies FinishAction's rules to its arguments and returns the
// receipt to append, still without Seq, PrevHash and Hash (the chain head
// supplies them): a new receipt ID, At to the microsecond, and the
// ResultDigest of result ("" when there is none).
func NewReceipt(actionID string, status aip.ActionState, result json.RawMessage, at time.Time) (Receipt, error) {
	if err := CheckID("action ID", actionID); err != nil {
		return Receipt{}, err
	}
	if err := CheckTerminal(actionID, status); err != nil {
		return Receipt{}, err
	}
	if err := CheckTime("finish time", at); err != nil {
		return Receipt{}, err
	}
	r := Receipt{ID: aip.NewID(aip.PrefixReceipt), ActionID: actionID, Status: status, At: Micro(at)}
	if len(result) > 0 {
		d, err := aip.DigestJSON(result)
		if err != nil {
			return Receipt{}, Invalid("result of action %s is not valid JSON: %v", actionID, err)
		}
		r.ResultDigest = d
	}
	return r, nil
}

// Text returns free text (Action.Detail, OutboxEntry.LastError) as every
// backend stores it: valid UTF-8 without NUL, each run of bytes that are not
// UTF-8 and each NUL replaced by U+FFFD. Such text often quotes a provider
// verbatim, and PostgreSQL's text type refuses both.
func Text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// CheckHorizon applies the prune horizon to a record about to be created:
// ErrPruned when the journal has pruned actions (horizon is not zero) and
// a.AssignedAt is zero or not after the horizon. a.AssignedAt is compared
// to the microsecond (Micro), as the times the horizon was taken from were
// stored: a pruned action stored as received at the horizon may have been
// received up to a microsecond after it.
func CheckHorizon(a Action, horizon time.Time) error {
	switch {
	case horizon.IsZero():
		return nil
	case a.AssignedAt.IsZero():
		return fmt.Errorf("%w: action %s carries no assignment time and this journal has pruned actions received and completed up to %s",
			ErrPruned, a.ActionID, horizon.Format(time.RFC3339Nano))
	case !Micro(a.AssignedAt).After(horizon):
		return fmt.Errorf("%w: action %s can have been received as early as %s, and this journal has pruned actions received and completed up to %s",
			ErrPruned, a.ActionID, a.AssignedAt.UTC().Format(time.RFC3339Nano), horizon.Format(time.RFC3339Nano))
	}
	return nil
}

// CheckPrune applies PruneActions' rules to its arguments.
func CheckPrune(before time.Time, limit int, stateNamespaces []string) error {
	if err := CheckTime("prune cutoff", before); err != nil {
		return err
	}
	for _, ns := range stateNamespaces {
		if err := CheckID("state namespace", ns); err != nil {
			return err
		}
	}
	return CheckLimit(limit)
}
