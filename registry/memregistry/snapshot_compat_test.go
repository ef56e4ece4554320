package memregistry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// oldSnapshot is a snapshot as a build before the current event rules
// wrote it: tenant acme's log holds an event for each rule added since
// (registry.StoredRule), tenant "beta\u200b" has an invisible formatting
// character in its ID, and tenant gamma's events meet every rule.
func oldSnapshot(deep string) string {
	event := func(seq, id, data string) string {
		return `{"sequence":` + seq + `,"instance_id":"cinst_a","replica_id":"crep_a","version_id":"cver_1","channel_id":"webhooks",` +
			`"event":{"id":"` + id + `","kind":"thing.happened","occurred_at":"2029-12-31T23:59:00.000Z","data":` + data + `},` +
			`"received_at":"2030-01-01T00:00:00Z"}`
	}
	return `{"format":"aipfleet.memregistry.snapshot/v1","catalog_revision":0,"policies":[],"types":[],"versions":[],` +
		`"definitions":[],"instances":[],"bindings":[],"replicas":[],"routes":[],"counters":[],"history":[],"replay_claims":[],` +
		`"events":[` +
		`{"tenant_id":"acme","events":[` +
		event("1", "evt_big", `{"n":1e131072}`) + `,` +
		event("2", "evt_lone", `{"s":"\ud800 alone"}`) + `,` +
		event("3", "evt_big2", `{"m":[1,-5e131073]}`) + `,` +
		event("4", "evt_deep", deep) + `,` +
		event("5", "evt_nul", `{"s":"a\u0000b"},"session_id":"s\u0000"`) + // two fields, one event
		`],"last_sequence":5},` +
		`{"tenant_id":"beta\u200b","events":[` + event("1", "evt_1", `{"ok":true}`) + `],"last_sequence":1},` +
		`{"tenant_id":"gamma","events":[` + event("1", "evt_1", `{"ok":true}`) + `],"last_sequence":1}` +
		`]}` + "\n"
}

// deepData nests MaxEventDataDepth+1 objects.
var deepData = strings.Repeat(`{"d":`, registry.MaxEventDataDepth+1) + "1" + strings.Repeat("}", registry.MaxEventDataDepth+1)

// TestRestoreKeepsEventsOfOlderRules: a snapshot an older build wrote,
// whose events break rules added since (numbers beyond PostgreSQL's
// numeric, a lone surrogate escape, data nested too deep, a NUL
// character, an invisible formatting character in a tenant ID), restores:
// the events are served byte for byte as stored, the formatting character
// matches exactly, each rule is logged once at warn, and a new write of
// the same is still refused.
func TestRestoreKeepsEventsOfOlderRules(t *testing.T) {
	ctx := context.Background()
	clock := registrytest.NewClock(registrytest.Epoch)
	var logs bytes.Buffer
	r, err := memregistry.New(memregistry.Config{Now: clock.Now, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	must(t, err)
	doc := oldSnapshot(deepData)
	if err := r.Restore(strings.NewReader(doc)); err != nil {
		t.Fatalf("Restore of a snapshot an older build wrote: %v", err)
	}

	// Served as stored.
	var want struct {
		Events []struct {
			TenantID string `json:"tenant_id"`
			Events   []struct {
				Event struct {
					ID   string          `json:"id"`
					Data json.RawMessage `json:"data"`
				} `json:"event"`
			} `json:"events"`
		} `json:"events"`
	}
	must(t, json.Unmarshal([]byte(doc), &want))
	for _, wl := range want.Events {
		p, err := r.Events(ctx, wl.TenantID, 0, 100)
		must(t, err)
		if len(p.Events) != len(wl.Events) {
			t.Fatalf("tenant %q: %d events restored, want %d", wl.TenantID, len(p.Events), len(wl.Events))
		}
		for i, we := range wl.Events {
			if got := p.Events[i]; got.Event.ID != we.Event.ID || !bytes.Equal(got.Event.Data, we.Event.Data) {
				t.Errorf("tenant %q event %d: %s %s, want %s %s", wl.TenantID, i, got.Event.ID, got.Event.Data, we.Event.ID, we.Event.Data)
			}
		}
	}
	// The tenant ID with a formatting character matches itself only.
	if p, err := r.Events(ctx, "beta", 0, 100); err != nil || len(p.Events) != 0 || p.Last != 0 {
		t.Errorf(`Events of "beta" = %+v, %v; want none (the stored tenant is "beta\u200b")`, p, err)
	}

	// One warning per rule, naming how many events and the first.
	type warning struct {
		Level, Msg, Rule, First string
		Events                  int
	}
	got := map[string]warning{}
	for line := range strings.Lines(logs.String()) {
		var w warning
		must(t, json.Unmarshal([]byte(line), &w))
		if _, dup := got[w.Rule]; dup {
			t.Errorf("rule %q logged twice", w.Rule)
		}
		got[w.Rule] = w
	}
	for rule, n := range map[registry.StoredRule]int{
		registry.RuleNumberRange: 2, registry.RuleLoneSurrogate: 1, registry.RuleDataDepth: 1, registry.RuleNUL: 1, registry.RuleFormatCharacter: 1,
	} {
		w, ok := got[string(rule)]
		if !ok {
			t.Errorf("no warning for rule %q; logged:\n%s", rule, logs.String())
			continue
		}
		if w.Level != "WARN" || w.Events != n || !strings.Contains(w.First, "tenant ") || !strings.Contains(w.First, "event \"evt_") {
			t.Errorf("warning for rule %q: %+v, want WARN, %d events, naming the first's tenant and event", rule, w, n)
		}
	}
	if len(got) != 5 {
		t.Errorf("%d warnings, want 5:\n%s", len(got), logs.String())
	}
	if w := got[string(registry.RuleFormatCharacter)]; !strings.Contains(w.First, `tenant "beta\u200b"`) {
		t.Errorf("the formatting character warning does not show the character: %q", w.First)
	}

	// A new write of the same is refused, a redelivery and a new event
	// alike.
	for _, c := range []struct{ tenant, id, data string }{
		{"acme", "evt_big", `{"n":1e131072}`}, {"acme", "evt_new1", `{"n":1e131072}`},
		{"acme", "evt_lone", `{"s":"\ud800 alone"}`}, {"acme", "evt_new2", `{"s":"\ud800 alone"}`},
		{"acme", "evt_deep", deepData}, {"acme", "evt_nul", `{"s":"a\u0000b"}`},
		{"beta\u200b", "evt_1", `{"ok":true}`}, {"beta\u200b", "evt_2", `{"ok":true}`},
	} {
		b := registry.EventBatch{TenantID: c.tenant, InstanceID: "cinst_a", ReplicaID: "crep_a", VersionID: "cver_1", ChannelID: "webhooks",
			Events: []aip.Event{{ID: c.id, Kind: "thing.happened", OccurredAt: aip.At(registrytest.Epoch.Add(-time.Minute)), Data: json.RawMessage(c.data)}}}
		if _, err := r.AppendEvents(ctx, b); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("AppendEvents of tenant %q event %s with data %.40s: %v, want ErrInvalid", c.tenant, c.id, c.data, err)
		}
	}
	// Events that meet the rules are taken as before.
	if got, err := r.AppendEvents(ctx, registrytest.EventBatch("acme", "a", "evt_6")); err != nil || got[0].Sequence != 6 {
		t.Fatalf("AppendEvents of a valid event after the kept ones: %+v, %v; want sequence 6", got, err)
	}

	// The kept events survive the next snapshot byte for byte, and can be
	// pruned.
	again := restored(t, snapshotOf(t, r), clock)
	p, err := again.Events(ctx, "acme", 0, 100)
	must(t, err)
	if len(p.Events) != 6 || !bytes.Equal(p.Events[1].Event.Data, []byte(`{"s":"\ud800 alone"}`)) || !bytes.Equal(p.Events[0].Event.Data, []byte(`{"n":1e131072}`)) {
		t.Fatalf("after a second snapshot: %d events, first data %s, second %s", len(p.Events), p.Events[0].Event.Data, p.Events[1].Event.Data)
	}
	if n, err := again.PruneEvents(ctx, registrytest.Epoch.Add(time.Hour), 100); err != nil || n != 8 {
		t.Fatalf("PruneEvents of the kept events = %d, %v; want 8", n, err)
	}
}

// TestRestoreRefusesDamagedEvents: an event that breaks a rule every build
// held writes to is damage, not age: the snapshot is refused naming it.
func TestRestoreRefusesDamagedEvents(t *testing.T) {
	doc := oldSnapshot(`{}`)
	for _, c := range []struct{ name, from, to, want string }{
		{"tenant with a control character", `"tenant_id":"gamma"`, `"tenant_id":"gam\u0007ma"`, "control character"},
		{"empty channel", `"channel_id":"webhooks"`, `"channel_id":""`, "channel_id: is empty"},
		{"data not an object", `"data":{"ok":true}`, `"data":[true]`, "must be a JSON object"},
		{"no occurred_at", `"occurred_at":"2029-12-31T23:59:00.000Z",`, ``, "occurred_at: is missing"},
		{"broken JSON", `"last_sequence":1}`, `"last_sequence":1`, "invalid character"},
	} {
		bad := strings.Replace(doc, c.from, c.to, 1)
		if bad == doc {
			t.Fatalf("%s: the snapshot has no %s", c.name, c.from)
		}
		r, err := memregistry.New(memregistry.Config{})
		must(t, err)
		err = r.Restore(strings.NewReader(bad))
		if !errors.Is(err, memregistry.ErrSnapshot) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Restore = %v, want ErrSnapshot mentioning %q", c.name, err, c.want)
		}
	}
}
