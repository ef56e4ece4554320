package aip

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
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
