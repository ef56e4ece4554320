package registry_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
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
		checkDigest(t, c.name, &stored, &b, &e)
	}
}

// checkDigest fails unless the RedeliveryDigests of stored and of e
// delivered in b are equal exactly when CheckRedelivery finds e a
// redelivery of stored.
func checkDigest(t *testing.T, name string, stored *registry.StoredEvent, b *registry.EventBatch, e *aip.Event) {
	t.Helper()
	redelivery := registry.CheckRedelivery(stored, b, e) == nil
	same := bytes.Equal(registry.RedeliveryDigest(stored.ChannelID, stored.InstanceID, &stored.Event), registry.RedeliveryDigest(b.ChannelID, b.InstanceID, e))
	if same != redelivery {
		t.Errorf("%s: equal digests %t, but CheckRedelivery finds a redelivery: %t", name, same, redelivery)
	}
}

// TestRedeliveryDigest: two events have the same digest exactly when one
// is a redelivery of the other, for every field CheckRedelivery compares.
func TestRedeliveryDigest(t *testing.T) {
	at := aip.At(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	stored := registry.StoredEvent{TenantID: "t", InstanceID: "cinst_a", ChannelID: "c",
		Event: aip.Event{ID: "evt_1", Kind: "k", OccurredAt: at, SessionID: "s", ActionID: "a", CorrelationID: "r",
			Data: json.RawMessage(`{"a":[1,2.50,{"x":null,"y":true}],"b":"1"}`)}}
	for _, c := range []struct {
		name   string
		change func(b *registry.EventBatch, e *aip.Event)
	}{
		{"same", func(*registry.EventBatch, *aip.Event) {}},
		{"number forms and spacing", func(_ *registry.EventBatch, e *aip.Event) {
			e.Data = json.RawMessage(`{ "b":"1", "a":[1.0, 25e-1, {"y":true,"x":null}] }`)
		}},
		{"kind", func(_ *registry.EventBatch, e *aip.Event) { e.Kind = "k2" }},
		{"session", func(_ *registry.EventBatch, e *aip.Event) { e.SessionID = "" }},
		{"action", func(_ *registry.EventBatch, e *aip.Event) { e.ActionID = "a2" }},
		{"correlation", func(_ *registry.EventBatch, e *aip.Event) { e.CorrelationID = "r2" }},
		{"channel", func(b *registry.EventBatch, _ *aip.Event) { b.ChannelID = "c2" }},
		{"instance", func(b *registry.EventBatch, _ *aip.Event) { b.InstanceID = "cinst_b" }},
		{"string for number", func(_ *registry.EventBatch, e *aip.Event) {
			e.Data = json.RawMessage(`{"a":[1,2.5,{"x":null,"y":true}],"b":1}`)
		}},
		{"null for false", func(_ *registry.EventBatch, e *aip.Event) {
			e.Data = json.RawMessage(`{"a":[1,2.5,{"x":false,"y":true}],"b":"1"}`)
		}},
		{"array order", func(_ *registry.EventBatch, e *aip.Event) {
			e.Data = json.RawMessage(`{"a":[2.5,1,{"x":null,"y":true}],"b":"1"}`)
		}},
		{"key moved into a nested object", func(_ *registry.EventBatch, e *aip.Event) {
			e.Data = json.RawMessage(`{"a":[1,2.5,{"x":null,"y":true,"b":"1"}]}`)
		}},
		{"no data", func(_ *registry.EventBatch, e *aip.Event) { e.Data = nil }},
	} {
		b := registry.EventBatch{TenantID: "t", InstanceID: "cinst_a", ReplicaID: "crep_1", ChannelID: "c"}
		e := stored.Event
		c.change(&b, &e)
		checkDigest(t, c.name, &stored, &b, &e)
	}
	// An event without data is stored with {}.
	empty := stored
	empty.Event.Data = nil
	b := registry.EventBatch{TenantID: "t", InstanceID: "cinst_a", ReplicaID: "crep_1", ChannelID: "c"}
	e := stored.Event
	e.Data = json.RawMessage(`{}`)
	checkDigest(t, "no data and {}", &empty, &b, &e)
	if !bytes.Equal(registry.RedeliveryDigest("c", "cinst_a", &empty.Event), registry.RedeliveryDigest("c", "cinst_a", &e)) {
		t.Error("an event without data and the same event with data {} have different digests")
	}
}

// TestValidateStored: a stored event breaking a StoredRule is kept
// (ValidateStored names the rule and what Validate answers), and Validate
// still refuses it; any other rule fails both, even after a kept break.
func TestValidateStored(t *testing.T) {
	at := aip.At(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	batch := func(edit func(b *registry.EventBatch, e *aip.Event)) registry.EventBatch {
		b := registry.EventBatch{TenantID: "t", InstanceID: "cinst_a", ReplicaID: "crep_1", VersionID: "cver_1", ChannelID: "c",
			Events: []aip.Event{{ID: "evt_1", Kind: "k", OccurredAt: at, Data: json.RawMessage(`{"ok":true}`)}}}
		edit(&b, &b.Events[0])
		return b
	}
	deep := strings.Repeat("[", registry.MaxEventDataDepth) + "{}" + strings.Repeat("]", registry.MaxEventDataDepth)
	for _, c := range []struct {
		name  string
		edit  func(b *registry.EventBatch, e *aip.Event)
		rules []registry.StoredRule // kept by ValidateStored; nil: refused by it too
	}{
		{"number beyond numeric", func(_ *registry.EventBatch, e *aip.Event) { e.Data = json.RawMessage(`{"n":1e131072}`) },
			[]registry.StoredRule{registry.RuleNumberRange}},
		{"lone surrogate", func(_ *registry.EventBatch, e *aip.Event) { e.Data = json.RawMessage(`{"s":"\udc00"}`) },
			[]registry.StoredRule{registry.RuleLoneSurrogate}},
		{"too deep", func(_ *registry.EventBatch, e *aip.Event) { e.Data = json.RawMessage(`{"a":` + deep + `}`) },
			[]registry.StoredRule{registry.RuleDataDepth}},
		{"NUL in data and session", func(_ *registry.EventBatch, e *aip.Event) {
			e.Data, e.SessionID = json.RawMessage(`{"s":"\u0000"}`), "s\x00"
		}, []registry.StoredRule{registry.RuleNUL, registry.RuleNUL}},
		{"formatting characters in tenant and event ID", func(b *registry.EventBatch, e *aip.Event) {
			b.TenantID, e.ID = "t\u200b", "evt_\ufeff1"
		}, []registry.StoredRule{registry.RuleFormatCharacter, registry.RuleFormatCharacter}},
		{"kept break, then an empty kind", func(b *registry.EventBatch, e *aip.Event) { b.TenantID, e.Kind = "t\u200b", "" }, nil},
		{"control character", func(b *registry.EventBatch, _ *aip.Event) { b.ChannelID = "c\x07" }, nil},
		{"data not an object", func(_ *registry.EventBatch, e *aip.Event) { e.Data = json.RawMessage(`[1e131072]`) }, nil},
		{"invalid UTF-8 data", func(_ *registry.EventBatch, e *aip.Event) { e.Data = json.RawMessage("{\"s\":\"\xff\"}") }, nil},
	} {
		b := batch(c.edit)
		err := b.Validate()
		if !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", c.name, err)
		}
		kept, serr := b.ValidateStored()
		if c.rules == nil {
			if !errors.Is(serr, registry.ErrInvalid) {
				t.Errorf("%s: ValidateStored = %v, %v; want ErrInvalid", c.name, kept, serr)
			}
			continue
		}
		if serr != nil {
			t.Errorf("%s: ValidateStored = %v, want the event kept", c.name, serr)
			continue
		}
		var rules []registry.StoredRule
		for _, k := range kept {
			rules = append(rules, k.Rule)
		}
		if !slices.Equal(rules, c.rules) || kept[0].Err.Error() != err.Error() {
			t.Errorf("%s: ValidateStored kept %v (first: %v), want %v (first: %v)", c.name, kept, kept[0].Err, c.rules, err)
		}
	}
}

// TestEventLogTakesTheChannelIDsAHostPublishes: aip.CheckChannelID is the
// rule a host holds the channels of its manifest (aip.Manifest.Validate)
// and every Publish to; a channel it takes that the event log refused
// would fill a host's outbox with batches never delivered, and one it
// refuses that the log takes would refuse a connector for nothing. Both
// answer alike for every ID here.
func TestEventLogTakesTheChannelIDsAHostPublishes(t *testing.T) {
	at := aip.At(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	for _, id := range []string{
		"c", "tickets.changes", "a b", "Bücher.änderungen", "チャンネル", strings.Repeat("a", 256), strings.Repeat("é", 128),
		"", strings.Repeat("a", 257), " c", "c ", "\tc", "c\n", "c\u00a0", "\u2028c", "c\u3000", "a\x00b", "a\x07b", "a\tb", "a\x7fb", "a\u0085b",
		"a\u200bb", "a\u200cb", "\ufeffc", "a\u202eb", "a\u00adb", "a\xffb",
	} {
		b := registry.EventBatch{TenantID: "t", InstanceID: "cinst_a", ReplicaID: "crep_1", VersionID: "cver_1", ChannelID: id,
			Events: []aip.Event{{ID: "evt_1", Kind: "k", OccurredAt: at, Data: json.RawMessage(`{}`)}}}
		logErr, hostErr := b.Validate(), aip.CheckChannelID(id)
		if (logErr == nil) != (hostErr == nil) {
			t.Errorf("channel %q: the event log answers %v, aip.CheckChannelID %v; want both to take it or both to refuse it", id, logErr, hostErr)
		}
	}
}
