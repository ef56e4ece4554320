package memregistry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// TestRestoreWarnsOfUnnamableRecords: a snapshot an older build wrote
// whose tenant tenant-2 and capability alpha.write carry an invisible
// formatting character (made here from a current snapshot by rewriting
// both IDs everywhere; Restore checks no digest) restores: every record is
// kept and the next snapshot holds the same bytes, no route request can
// name them, and Restore logs one warning per kind naming the records,
// the field and the character, and what to do.
func TestRestoreWarnsOfUnnamableRecords(t *testing.T) {
	ctx := context.Background()
	s := newFleetState(t)
	doc := string(snapshotOf(t, s.reg))
	// Kept as stored.
	r, logs := restoreReplaced(t, s, doc, [][2]string{{"tenant-2", "tenant-2\u200b"}, {"alpha.write", "alpha.write\u2060"}})
	key := registry.BindingKey{TenantID: "tenant-2\u200b", CapabilityID: "alpha.write\u2060", InstanceID: "cinst_b"}
	if b, err := r.CapabilityBinding(ctx, key); err != nil || b.Key() != key {
		t.Errorf("CapabilityBinding(%+q) = %+v, %v; want it kept", key.String(), b, err)
	}
	if i, err := r.ConnectorInstance(ctx, "cinst_b"); err != nil || i.TenantID != "tenant-2\u200b" {
		t.Errorf("ConnectorInstance(cinst_b) = %+v, %v; want tenant-2\u200b kept", i, err)
	}
	// And unreachable.
	for _, q := range []registry.RouteRequest{
		{ActionID: aip.NewActionID(), TenantID: key.TenantID, CapabilityID: key.CapabilityID},
		{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: key.CapabilityID},
	} {
		if _, err := r.Resolve(ctx, q); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("Resolve(%+q, %+q) = %v, want ErrInvalid", q.TenantID, q.CapabilityID, err)
		}
	}

	type warning struct {
		Level, Msg, Rule, Kind, Records, Fix string
		Count                                int
	}
	got := map[string]warning{}
	for line := range strings.Lines(logs.String()) {
		var w warning
		must(t, json.Unmarshal([]byte(line), &w))
		if w.Kind == "" {
			continue // the event logs' warning
		}
		if _, dup := got[w.Kind]; dup {
			t.Errorf("kind %q logged twice", w.Kind)
		}
		got[w.Kind] = w
	}
	for _, want := range []struct {
		kind  string
		count int
		names []string
	}{
		{"capability definitions", 1, []string{`capability "alpha.write\u2060" (capability.id U+2060)`}},
		{"connector instances", 1, []string{`instance "cinst_b" of tenant "tenant-2\u200b" (tenant_id U+200B)`}},
		{"capability bindings", 2, []string{
			`binding "tenant-1/alpha.write\u2060/cinst_a" (capability_id U+2060)`,
			`binding "tenant-2\u200b/alpha.write\u2060/cinst_b" (tenant_id U+200B, capability_id U+2060)`}},
		{"routes", 1, []string{`of tenant "tenant-2\u200b", capability "alpha.write\u2060" (tenant_id U+200B, capability_id U+2060)`}},
	} {
		w, ok := got[want.kind]
		if !ok {
			t.Errorf("no warning about %s; logged:\n%s", want.kind, logs.String())
			continue
		}
		if w.Level != "WARN" || w.Rule != string(registry.RuleFormatCharacter) || w.Count != want.count || w.Fix == "" ||
			!strings.Contains(w.Msg, "no request can name") {
			t.Errorf("warning about %s: %+v; want WARN, rule %q, count %d, a fix", want.kind, w, registry.RuleFormatCharacter, want.count)
		}
		for _, n := range want.names {
			if !strings.Contains(w.Records, n) {
				t.Errorf("warning about %s: records %q do not name %s", want.kind, w.Records, n)
			}
		}
	}
	if len(got) != 4 {
		t.Errorf("%d warnings about records, want 4:\n%s", len(got), logs.String())
	}
}

// TestRestoreNamesAtMostTenUnnamableRecords: the warning about a kind
// names the first records and counts the rest.
func TestRestoreNamesAtMostTenUnnamableRecords(t *testing.T) {
	ctx := context.Background()
	clock := registrytest.NewClock(registrytest.Epoch)
	reg, err := memregistry.New(memregistry.Config{Now: clock.Now})
	must(t, err)
	w, err := registrytest.NewLifecycleWorld(ctx, reg)
	must(t, err)
	for i := range 12 {
		in := w.Instance
		in.ID, in.TenantID = fmt.Sprintf("cinst_z%02d", i), fmt.Sprintf("zw-%02d", i)
		must(t, reg.PutInstance(ctx, in))
	}
	doc := strings.ReplaceAll(string(snapshotOf(t, reg)), `"zw-`, "\"zw\u200b-")
	var logs bytes.Buffer
	r, err := memregistry.New(memregistry.Config{Now: clock.Now, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	must(t, err)
	must(t, r.Restore(strings.NewReader(doc)))
	var got struct {
		Kind, Records string
		Count         int
	}
	must(t, json.Unmarshal(logs.Bytes(), &got))
	if got.Kind != "connector instances" || got.Count != 12 || strings.Count(got.Records, "instance ") != 10 ||
		!strings.HasSuffix(got.Records, "; and 2 more") || !strings.Contains(got.Records, `"zw\u200b-09"`) || strings.Contains(got.Records, "-10") {
		t.Errorf("warning: %+v; want 12 instances, the first 10 named, and 2 more", got)
	}
}

// TestRestoreWarnsOfFormatCharactersInOtherIdentifiers: a snapshot an
// older build wrote whose other identifiers — an instance's secret
// provider reference, a binding's credential revision and quota policy
// references, a policy's reference, replicas' peer principal, trust
// domain and transport profile, a version's version string, the versions'
// manifest agent IDs and profiles — hold an invisible formatting
// character restores as stored, and Restore logs one warning per kind and
// field naming the records with the value, the field and the character,
// what it does to them and what to do. Only tenant and capability IDs
// were looked at: these were restored without a word (a version's agent
// ID until it was held to a replica's peer_principal_id rule).
func TestRestoreWarnsOfFormatCharactersInOtherIdentifiers(t *testing.T) {
	s := newFleetState(t)
	doc := string(snapshotOf(t, s.reg))
	var counts struct {
		Replicas, Versions []json.RawMessage
	}
	must(t, json.Unmarshal([]byte(doc), &counts))
	_, logs := restoreReplaced(t, s, doc, [][2]string{
		{`"secret://alpha/b"`, "\"secret://alpha/b\u200b\""},
		{`"cred-v1"`, "\"cred\u00ad-v1\""},
		{`"quota:t2"`, "\"quota:t2\u2060\""},
		{`"fleet.test"`, "\"fleet\u200b.test\""},
		{`"service:alpha"`, "\"service:alpha\u200d\""},
		{`"` + aip.NativeHTTPProfile + `"`, "\"" + aip.NativeHTTPProfile + "\ufeff\""},
		{`"3.0.0"`, "\"3.0.0\u202e\""},
	})

	type warning struct {
		Level, Msg, Rule, Kind, Field, Records, Fix string
		Count                                       int
	}
	got := map[string]warning{}
	for line := range strings.Lines(logs.String()) {
		var w warning
		must(t, json.Unmarshal([]byte(line), &w))
		if w.Kind == "" {
			continue // the event logs' warning
		}
		if w.Field == "" {
			t.Errorf("a warning about %s without a field (no tenant or capability ID holds a character): %+v", w.Kind, w)
			continue
		}
		k := w.Kind + " " + w.Field
		if _, dup := got[k]; dup {
			t.Errorf("%s logged twice", k)
		}
		got[k] = w
	}
	nr, nv := len(counts.Replicas), len(counts.Versions)
	for _, want := range []struct {
		kind, field string
		count       int
		name, fix   string
	}{
		{"connector instances", "secret_provider_ref", 1,
			`instance "cinst_b" with secret_provider_ref "secret://alpha/b\u200b" (secret_provider_ref U+200B)`, "greater config_revision"},
		{"capability bindings", "credential_revision_ref", 1,
			`binding "tenant-2/alpha.write/cinst_b" with credential_revision_ref "cred\u00ad-v1" (credential_revision_ref U+00AD)`, "greater policy_revision"},
		{"capability bindings", "quota_policy_ref", 1,
			`binding "tenant-2/alpha.write/cinst_b" with quota_policy_ref "quota:t2\u2060" (quota_policy_ref U+2060)`, "put the admission policy under a reference without the character"},
		{"admission policies", "policy_ref", 1, `policy "quota:t2\u2060" with policy_ref "quota:t2\u2060" (policy_ref U+2060)`, "move the bindings"},
		{"connector replicas", "peer_principal_id", nr, `replica "crepl_a1" with peer_principal_id "service:alpha\u200d" (peer_principal_id U+200D)`, "new replica ID"},
		{"connector replicas", "trust_domain", nr, `replica "crepl_b1" with trust_domain "fleet\u200b.test" (trust_domain U+200B)`, "--trust-domain"},
		{"connector replicas", "transport_profile", nr, `with transport_profile "aip.native.http.v1\ufeff" (transport_profile U+FEFF)`, "new replica ID"},
		{"connector versions", "version", 1, `version "cver_alpha3" with version "3.0.0\u202e" (version U+202E)`, "revoke this one"},
		// The alpha versions' manifest agent is the alpha replicas'
		// principal.
		{"connector versions", "manifest.agent.id", 3, `version "cver_alpha1" with manifest.agent.id "service:alpha\u200d" (manifest.agent.id U+200D)`, "new version ID"},
		{"connector versions", "manifest.profiles", nv, `version "cver_beta1" with manifest.profiles "aip.native.http.v1\ufeff" (manifest.profiles U+FEFF)`, "revoke this one"},
	} {
		w, ok := got[want.kind+" "+want.field]
		if !ok {
			t.Errorf("no warning about %s' %s; logged:\n%s", want.kind, want.field, logs.String())
			continue
		}
		if w.Level != "WARN" || w.Rule != string(registry.RuleFormatCharacter) || w.Count != want.count || !strings.Contains(w.Fix, want.fix) ||
			!strings.Contains(w.Msg, "with an identifier that holds an invisible formatting character") || strings.Contains(w.Msg, "no request can name") {
			t.Errorf("warning about %s' %s: %+v; want WARN, rule %q, count %d, a fix with %q", want.kind, want.field, w, registry.RuleFormatCharacter, want.count, want.fix)
		}
		if !strings.Contains(w.Records, want.name) {
			t.Errorf("warning about %s' %s: records %q do not name %s", want.kind, want.field, w.Records, want.name)
		}
	}
	if len(got) != 10 {
		t.Errorf("%d warnings about records, want 10:\n%s", len(got), logs.String())
	}
}

// restoreReplaced restores into a new registry (on s's clock, logging to
// the buffer it returns) the snapshot doc with each pair's first string,
// which it must hold, replaced by the second: records an older build
// stored. The registry keeps them as stored: its snapshot is the document
// restored.
func restoreReplaced(t *testing.T, s *fleetState, doc string, replace [][2]string) (*memregistry.Registry, *bytes.Buffer) {
	t.Helper()
	for _, rw := range replace {
		if !strings.Contains(doc, rw[0]) {
			t.Fatalf("the snapshot does not hold %s", rw[0])
		}
		doc = strings.ReplaceAll(doc, rw[0], rw[1])
	}
	logs := new(bytes.Buffer)
	r, err := memregistry.New(memregistry.Config{Now: s.clock.Now, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	must(t, err)
	if err := r.Restore(strings.NewReader(doc)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if again := string(snapshotOf(t, r)); again != doc {
		t.Errorf("the snapshot after Restore differs from the restored document")
	}
	return r, logs
}
