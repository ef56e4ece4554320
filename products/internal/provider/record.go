package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// ErrRecordUnreadable is wrapped by LoadRecord's error for a record that
// is not the JSON it was written as.
var ErrRecordUnreadable = errors.New("record is unreadable")

// LoadRecord reads the JSON record an adapter keeps in the journal's
// state under namespace and key (a started run's or task's IDs, to cancel
// or reconcile the action by) into v; what names the record in errors
// ("the kickoff record"). It answers false, leaving v as it
// is, when there is none or st is nil (an UncertainAction of a connector
// without state); an error when the journal cannot be read, or one
// wrapping ErrRecordUnreadable when the value does not decode into v.
func LoadRecord(ctx context.Context, st *hostsdk.State, namespace, key, what string, v any) (bool, error) {
	if st == nil {
		return false, nil
	}
	sv, err := st.Get(ctx, namespace, key)
	if errors.Is(err, journal.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s of %s: %w", what, key, err)
	}
	if err := json.Unmarshal(sv.Value, v); err != nil {
		return false, fmt.Errorf("%s of %s: %w (%v)", what, key, ErrRecordUnreadable, err)
	}
	return true, nil
}
