package aip

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// availability_target is a double upstream (Option<f64>), which serde_json
// writes with a fraction: a target of 1 is signed and digested as 1.0
// there, so it must be written 1.0 here, not as the integer 1.
func TestSLAAvailabilityTargetIsWrittenAsADouble(t *testing.T) {
	for target, want := range map[float64]string{
		1:     `"availability_target":1.0`,
		0:     `"availability_target":0.0`,
		99:    `"availability_target":99.0`,
		0.999: `"availability_target":0.999`,
	} {
		sla := SLAContract{AsyncExpected: true, AvailabilityTarget: &target}
		c, err := CanonicalJSON(&sla)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(c), want) {
			t.Errorf("availability target %v canonicalizes as %s, want %s", target, c, want)
		}
		var back SLAContract
		if err := json.Unmarshal(c, &back); err != nil || back.AvailabilityTarget == nil || *back.AvailabilityTarget != target || !back.AsyncExpected {
			t.Errorf("%s decodes as %+v (%v)", c, back, err)
		}
	}
	c, err := CanonicalJSON(&SLAContract{})
	if err != nil || strings.Contains(string(c), "availability_target") {
		t.Errorf("no target: %s (%v), want it omitted", c, err)
	}
	inf := math.Inf(1)
	if _, err := json.Marshal(&SLAContract{AvailabilityTarget: &inf}); err == nil {
		t.Error("an infinite availability target marshals")
	}
}

// TestContractMissingMembersAreNamed: a contract decoded from JSON
// without its data object (or idempotency, or execution) was refused as
// an "unknown data sensitivity \"\"": the error now says the member is
// missing; a value that is there but not one of the enum's is still
// named as unknown.
func TestContractMissingMembersAreNamed(t *testing.T) {
	full := `{"side_effects":["read"],
		"idempotency":{"requirement":"optional","collision_behavior":"return_original_result","key_scope":"action"},
		"execution":{"supports_sync":true,"supports_async":false,"supports_streaming":false,"supports_cancel":false,"supports_retry":false,"expected_completion":"sync","retry_safety":"safe"},
		"data":{"sensitivity":"internal","contains_pii":false,"redaction_required":false}}`
	var base map[string]json.RawMessage
	if err := json.Unmarshal([]byte(full), &base); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		drop, set, value, want string
	}{
		{drop: "data", want: "data.sensitivity is missing (the contract's data object and its required members must be there)"},
		{drop: "idempotency", want: "idempotency.requirement is missing"},
		{drop: "execution", want: "execution.expected_completion is missing"},
		{set: "data", value: `{"sensitivity":"secret","contains_pii":false,"redaction_required":false}`, want: `unknown data sensitivity "secret"`},
		{set: "execution", value: `{"supports_sync":true,"expected_completion":"sync","retry_safety":"maybe"}`, want: `unknown execution retry_safety "maybe"`},
		{set: "idempotency", value: `{"requirement":"optional","collision_behavior":"return_original_result"}`, want: "idempotency.key_scope is missing"},
	} {
		m := map[string]json.RawMessage{}
		for k, v := range base {
			m[k] = v
		}
		delete(m, c.drop)
		if c.set != "" {
			m[c.set] = json.RawMessage(c.value)
		}
		raw, _ := json.Marshal(m)
		var k CapabilityContract
		if err := json.Unmarshal(raw, &k); err != nil {
			t.Fatal(err)
		}
		if err := k.Validate(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v; want %q", raw, err, c.want)
		}
	}
	var ok CapabilityContract
	if err := json.Unmarshal([]byte(full), &ok); err != nil || ok.Validate() != nil {
		t.Errorf("the full contract: %v, %v", err, ok.Validate())
	}
}

// testManifest returns a manifest Validate accepts: two capabilities, a
// read and a write, each with a contract.
func testManifest() *Manifest {
	contract := func(e SideEffect) *CapabilityContract {
		return &CapabilityContract{
			SideEffects: []SideEffect{e},
			Idempotency: IdempotencyContract{Requirement: IdempotencyOptional, CollisionBehavior: CollisionReturnOriginal, KeyScope: ScopeAction},
			Execution:   ExecutionContract{SupportsSync: true, ExpectedCompletion: CompletionSync, RetrySafety: RetrySafe},
			Data:        DataContract{Sensitivity: SensitivityInternal},
		}
	}
	return &Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           Principal{ID: "agent:notes", Kind: PrincipalAgent},
		Profiles:        []string{NativeHTTPProfile},
		Capabilities: []Capability{
			{ID: "notes.get", Name: "Get", Kind: KindTool, InputSchema: json.RawMessage(`{"type":"object"}`), Contract: contract(EffectRead)},
			{ID: "notes.put", Name: "Put", Kind: KindTool, InputSchema: json.RawMessage(`{"type":"object"}`), Contract: contract(SideEffect("write"))},
		},
	}
}

// TestManifestHostRules: a Go connector's manifest bound by hostsdk took
// a capability without a contract (read as one that may write: a read
// cut off by a crash became outcome_unknown) and any manifest_version,
// which only aip-sidecar refused. Validate, which every host applies to
// the manifest it binds, refuses both, naming the capability and what to
// declare; ValidateShape, AIP's own rules (a version the registry
// admits), still takes them.
func TestManifestHostRules(t *testing.T) {
	if err := testManifest().Validate(); err != nil {
		t.Fatalf("the test manifest: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*Manifest)
		want string
	}{
		{"no contract", func(m *Manifest) { m.Capabilities[1].Contract = nil },
			`capability notes.put has no contract; declare one with side_effects (["read"] for a capability that changes nothing), idempotency, execution and data`},
		{"empty side_effects", func(m *Manifest) { m.Capabilities[0].Contract.SideEffects = []SideEffect{} },
			`capability notes.get contract: side_effects is empty; declare what the capability does (["read"] for one that changes nothing)`},
		{"no side_effects", func(m *Manifest) { m.Capabilities[0].Contract.SideEffects = nil }, `capability notes.get contract: side_effects is empty`},
		{"manifest_version v2", func(m *Manifest) { m.ManifestVersion = "aip-manifest/v2" },
			`manifest_version is "aip-manifest/v2"; want "aip-manifest/v1" (the form AIP connectors write; "1.0", the form of its registry examples, is accepted too)`},
		{"manifest_version v1", func(m *Manifest) { m.ManifestVersion = "v1" }, `manifest_version is "v1"; want "aip-manifest/v1"`},
	} {
		m := testManifest()
		c.edit(m)
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v; want an error saying %q", c.name, err, c.want)
		}
		if err := m.ValidateShape(); err != nil {
			t.Errorf("%s: ValidateShape = %v; want it accepted (AIP's own rules)", c.name, err)
		}
	}
	for _, v := range manifestVersions {
		m := testManifest()
		m.ManifestVersion = v
		if err := m.Validate(); err != nil {
			t.Errorf("manifest_version %q: Validate = %v; want it accepted", v, err)
		}
	}
}

// TestManifestChannelShapes: a channel entry such as 42 (or an object
// without "id") declared no channel, yet the manifest validated and the
// connector learned so only when publishing on it failed. ValidateShape
// (so Validate too) names the entry and the shapes a channel takes.
func TestManifestChannelShapes(t *testing.T) {
	const shapes = `declare a channel as its ID, a JSON string ("tickets.changes"), or an object naming it in "id" (or "channel_id")`
	for raw, want := range map[string]string{
		`42`:                           "channels[1] is 42, neither a string nor an object; " + shapes,
		`null`:                         "channels[1] is null, neither a string nor an object",
		`["a"]`:                        `channels[1] is ["a"], neither a string nor an object`,
		`""`:                           "channels[1] is an empty string; " + shapes,
		`{"name":"x"}`:                 `channels[1] is an object without "id" or "channel_id"; ` + shapes,
		`{"id":7}`:                     `channels[1] has "id" 7, not a channel ID; ` + shapes,
		`{"id":""}`:                    `channels[1] has "id" "", not a channel ID`,
		`{"id":"a","channel_id":true}`: `channels[1] has "channel_id" true, not a channel ID`,
		`{"id":`:                       `channels[1] is not JSON: {"id":`,
	} {
		m := testManifest()
		m.Channels = []json.RawMessage{json.RawMessage(`"ok.channel"`), json.RawMessage(raw)}
		for name, validate := range map[string]func() error{"Validate": m.Validate, "ValidateShape": m.ValidateShape} {
			if err := validate(); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("channel %s: %s = %v; want an error saying %q", raw, name, err, want)
			}
		}
	}
	m := testManifest()
	for _, raw := range []string{`"tickets.changes"`, `{"id":"a","direction":"inbound"}`, `{"channel_id":"b"}`, `{"id":"c","channel_id":"c"}`} {
		m.Channels = append(m.Channels, json.RawMessage(raw))
	}
	if err := m.Validate(); err != nil {
		t.Errorf("channels %s: Validate = %v; want them accepted", m.Channels, err)
	}
}

// TestManifestChannelIDs: a channel the fleet's event log cannot store (a
// control character, an invisible formatting character, white space at
// either end, more than 256 bytes) passed Validate, so a host started
// with it and its connector learned so only when Publish refused the first
// event (or, for a formatting character, when the event log refused every
// delivery of a batch already in the outbox). Validate, every host's check
// of its manifest, refuses it naming the entry, the character and what a
// channel ID may be; ValidateShape, AIP's own rules (which bound a channel
// ID only in length, and only for publishing), still takes it.
func TestManifestChannelIDs(t *testing.T) {
	rule := "; a channel ID is 1 to 256 bytes of UTF-8 text without control characters, invisible formatting characters (Unicode Cf) or white space at either end (spaces inside are fine), as the fleet's event log stores it; rename the channel"
	long := strings.Repeat("a", 257)
	for _, c := range []struct{ raw, want string }{
		{`"tab\tname"`, `channels[1]: channel ID "tab\tname" holds the control character '\t' (U+0009) at byte 3`},
		{`"bell\u0007"`, `channels[1]: channel ID "bell\a" holds the control character '\a' (U+0007) at byte 4`},
		{`"del\u007f"`, `channels[1]: channel ID "del\x7f" holds the control character '\x7f' (U+007F) at byte 3`},
		{`"nl\n"`, `channels[1]: channel ID "nl\n" ends with the white space '\n' (U+000A) at byte 2`},
		{`" padded"`, `channels[1]: channel ID " padded" starts with the white space ' ' (U+0020) at byte 0`},
		{`"padded "`, `channels[1]: channel ID "padded " ends with the white space ' ' (U+0020) at byte 6`},
		{`"nbsp\u00a0"`, `channels[1]: channel ID "nbsp\u00a0" ends with the white space '\u00a0' (U+00A0) at byte 4`},
		{`"\u2028line"`, `channels[1]: channel ID "\u2028line" starts with the white space '\u2028' (U+2028) at byte 0`},
		{`"zw\u200bsp"`, `channels[1]: channel ID "zw\u200bsp" holds the invisible formatting character '\u200b' (U+200B) at byte 2`},
		{`"\ufeffbom"`, `channels[1]: channel ID "\ufeffbom" holds the invisible formatting character '\ufeff' (U+FEFF) at byte 0`},
		{`{"id":"rtl\u202eevil","direction":"inbound"}`, `channels[1].id: channel ID "rtl\u202eevil" holds the invisible formatting character '\u202e' (U+202E) at byte 3`},
		{`{"id":"ok","channel_id":"ok\r"}`, `channels[1].channel_id: channel ID "ok\r" ends with the white space '\r' (U+000D) at byte 2`},
		{`"` + long + `"`, `channels[1]: channel ID "` + long[:64] + `"... is 257 bytes`},
	} {
		m := testManifest()
		m.Channels = []json.RawMessage{json.RawMessage(`"ok.channel"`), json.RawMessage(c.raw)}
		if err := m.Validate(); err == nil || err.Error() != c.want+rule {
			t.Errorf("channel %s: Validate = %v\nwant %s", c.raw, err, c.want+rule)
		}
		if err := m.ValidateShape(); err != nil {
			t.Errorf("channel %s: ValidateShape = %v; want it accepted (AIP's own rules)", c.raw, err)
		}
	}
	m := testManifest()
	for _, raw := range []string{`"tickets changes"`, `"Bücher.änderungen"`, `"チャンネル"`, `"` + long[:256] + `"`, `{"id":"a b","channel_id":"c.d"}`} {
		m.Channels = append(m.Channels, json.RawMessage(raw))
	}
	if err := m.Validate(); err != nil {
		t.Errorf("channels %s: Validate = %v; want them accepted", m.Channels, err)
	}
}

// TestCheckChannelID: what JSON cannot carry into a manifest's channel (a
// byte that is not UTF-8) or a manifest entry checkChannel refuses first
// (an empty ID), CheckChannelID refuses too, as Publish is given it; every
// refusal matches ErrInvalidID.
func TestCheckChannelID(t *testing.T) {
	rule := "; a channel ID is 1 to 256 bytes of UTF-8 text without control characters, invisible formatting characters (Unicode Cf) or white space at either end (spaces inside are fine), as the fleet's event log stores it; rename the channel"
	for id, want := range map[string]string{
		"":          `channel ID is empty`,
		"a\xffb":    `channel ID "a\xffb" holds the byte 0xFF at byte 1, which is not UTF-8`,
		"nul\x00":   `channel ID "nul\x00" holds the control character '\x00' (U+0000) at byte 3`,
		"\u00adshy": `channel ID "\u00adshy" holds the invisible formatting character '\u00ad' (U+00AD) at byte 0`,
	} {
		err := CheckChannelID(id)
		if err == nil || err.Error() != want+rule {
			t.Errorf("CheckChannelID(%q) = %v\nwant %s", id, err, want+rule)
		}
		if !errors.Is(err, ErrInvalidID) {
			t.Errorf("CheckChannelID(%q) = %v; want it to match ErrInvalidID", id, err)
		}
	}
	for _, id := range []string{"a", "tickets.changes", "a b", "cal-diy-webhooks", strings.Repeat("é", 128)} {
		if err := CheckChannelID(id); err != nil {
			t.Errorf("CheckChannelID(%q) = %v; want it accepted", id, err)
		}
	}
}

// ChannelIDs is the one reading of the channel entries the host publishes
// on and the dispatcher checks events against: a string entry is its ID,
// an object declares its "id" and its "channel_id", in entry order; other
// members and entries of other shapes declare nothing.
func TestManifestChannelIDs_Declared(t *testing.T) {
	m := &Manifest{Channels: []json.RawMessage{
		json.RawMessage(`"tickets.changes"`),
		json.RawMessage(`{"id":"a.b","description":"x"}`),
		json.RawMessage(`{"channel_id":"c.d"}`),
		json.RawMessage(`{"id":"e","channel_id":"f"}`),
		json.RawMessage(`{"name":"g"}`),
		json.RawMessage(`{"id":7}`),
		json.RawMessage(`""`),
		json.RawMessage(`42`),
	}}
	want := []string{"tickets.changes", "a.b", "c.d", "e", "f"}
	if diff := cmp.Diff(want, m.ChannelIDs()); diff != "" {
		t.Errorf("ChannelIDs (-want +got):\n%s", diff)
	}
	if got := (&Manifest{}).ChannelIDs(); len(got) != 0 {
		t.Errorf("no channels: %v", got)
	}
}

// TestCapabilityKindMissingListsTheKinds: a capability without a kind is
// told which kinds there are, not `unknown kind ""`; a misspelled kind is
// still quoted as written.
func TestCapabilityKindMissingListsTheKinds(t *testing.T) {
	m := testManifest()
	m.Capabilities[0].Kind = ""
	err := m.Validate()
	if want := `capability notes.get: kind is missing; give one of agent, tool, workflow, channel, resource, human_task`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Validate of a capability without a kind: %v, want %q", err, want)
	}
	m.Capabilities[0].Kind = "toool"
	if err, want := m.Validate(), `capability notes.get: unknown kind "toool"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Validate of a misspelled kind: %v, want %q", err, want)
	}
}
