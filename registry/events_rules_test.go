package registry_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

func TestCheckRedelivery(t *testing.T) {
	at := aip.At(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	b := registry.EventBatch{TenantID: "t", InstanceID: "cinst_a", ReplicaID: "crep_1", VersionID: "cver_1", ChannelID: "c"}
	stored := registry.StoredEvent{TenantID: "t", InstanceID: "cinst_a", ReplicaID: "crep_1", VersionID: "cver_1", ChannelID: "c",
		Event: aip.Event{ID: "evt_1", Kind: "k", OccurredAt: at,
			Data: json.RawMessage(`{"n": 100, "s": "x", "aip_connector": {"instance_id": "cinst_a", "replica_id": "crep_1", "version_id": "cver_1", "channel_id": "c", "lease_sequence": 3}}`)}}
	for _, c := range []struct {
		name, data string
		occurred   time.Duration
		field      string // "" for a redelivery
	}{
		{"same bytes", string(stored.Event.Data), 0, ""},
		{"other replica, version and lease; keys reordered; number forms", `{"aip_connector":{"lease_sequence":9,"version_id":"cver_2","replica_id":"crep_2","channel_id":"c","instance_id":"cinst_a"},"s":"x","n":1e2}`, 0, ""},
		{"sub-millisecond occurred_at", string(stored.Event.Data), 300 * time.Microsecond, ""},
		{"other instance in the stamp", `{"n":100,"s":"x","aip_connector":{"instance_id":"cinst_b","channel_id":"c"}}`, 0, "data"},
		{"stamp without provenance", `{"n":100,"s":"x","aip_connector":{"instance_id":"cinst_a","channel_id":"c"}}`, 0, ""},
		{"string for number", `{"n":"100","s":"x","aip_connector":{"instance_id":"cinst_a","channel_id":"c"}}`, 0, "data"},
		{"extra member", `{"n":100,"s":"x","t":1,"aip_connector":{"instance_id":"cinst_a","channel_id":"c"}}`, 0, "data"},
		{"later occurred_at", string(stored.Event.Data), time.Millisecond, "occurred_at"},
	} {
		e := stored.Event
		e.Data, e.OccurredAt = json.RawMessage(c.data), aip.Timestamp{Time: at.Add(c.occurred)}
		err := registry.CheckRedelivery(&stored, &b, &e)
		var fe *registry.FieldError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%s: %v, want a redelivery", c.name, err)
		case c.field != "" && (!errors.Is(err, registry.ErrConflict) || !errors.As(err, &fe) || fe.Field != c.field || fe.ID != "evt_1"):
			t.Errorf("%s: %v, want a conflict on evt_1's %s", c.name, err, c.field)
		}
	}
}
