package pgruntime

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Argument checks of the journal contract (sqliteruntime has the same ones).

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{journal.ErrInvalid}, args...)...)
}

func checkBegin(a journal.Action) error {
	switch {
	case a.ActionID == "":
		return invalid("action ID is empty")
	case a.ReceivedAt.IsZero():
		return invalid("action %s has no ReceivedAt", a.ActionID)
	case a.Status != "" && a.Status != aip.StateReceived:
		return invalid("action %s begins with status %q; a new action is received", a.ActionID, a.Status)
	case len(a.Result) != 0:
		return invalid("action %s begins with a result; results come with FinishAction", a.ActionID)
	}
	return nil
}

func checkID(what, id string) error {
	if id == "" {
		return invalid("%s is empty", what)
	}
	return nil
}

func checkTime(what string, t time.Time) error {
	if t.IsZero() {
		return invalid("%s is the zero time", what)
	}
	return nil
}

func checkLimit(limit int) error {
	if limit <= 0 {
		return invalid("limit %d is not positive", limit)
	}
	return nil
}

func checkTerminal(id string, st aip.ActionState) error {
	if !st.Terminal() {
		return invalid("action %s cannot finish with status %q; use completed, failed, outcome_unknown or cancelled", id, st)
	}
	return nil
}

func checkJSON(what string, raw json.RawMessage) error {
	if !json.Valid(raw) {
		return invalid("%s is not valid JSON", what)
	}
	return nil
}

func checkStatuses(statuses []aip.ActionState) ([]aip.ActionState, error) {
	if len(statuses) == 0 {
		return nil, invalid("no statuses given")
	}
	out := make([]aip.ActionState, 0, len(statuses))
	for _, s := range statuses {
		if !s.Valid() || s == aip.StateNotFound {
			return nil, invalid("unknown action status %q", s)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

func checkEntry(e journal.OutboxEntry) error {
	switch {
	case e.ID == "":
		return invalid("outbox batch ID is empty")
	case e.ChannelID == "":
		return invalid("outbox batch %s has no channel", e.ID)
	case e.CreatedAt.IsZero():
		return invalid("outbox batch %s has no CreatedAt", e.ID)
	case e.Attempts < 0:
		return invalid("outbox batch %s has %d attempts", e.ID, e.Attempts)
	}
	var events []json.RawMessage
	if err := json.Unmarshal(e.Events, &events); err != nil || events == nil {
		return invalid("outbox batch %s: events must be a JSON array", e.ID)
	}
	return nil
}

func checkStateKey(namespace, key string) error {
	if namespace == "" || key == "" {
		return invalid("state namespace and key must not be empty (got %q, %q)", namespace, key)
	}
	return nil
}
