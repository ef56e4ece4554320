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
