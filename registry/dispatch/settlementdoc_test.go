package dispatch_test

import (
	"os"
	"strings"
	"testing"
)

// TestActionOutcomesAreDocumented: every outcome aip_dispatch_actions_total
// counts (each settlement the dispatcher reports, not_routed and unsettled; their
// series exist from the start) is named in the operator guide's row of the
// metric, so an alert or a dashboard written from the guide sees every
// series (pruned, added with registry.SettlementPruned, was missing).
func TestActionOutcomesAreDocumented(t *testing.T) {
	_, reg := metricsDispatcher(t)
	guide, err := os.ReadFile("../../docs/operator-guide.md")
	must(t, err)
	const metric = "aip_dispatch_actions_total"
	var row string
	for _, line := range strings.Split(string(guide), "\n") {
		if strings.HasPrefix(line, "| dispatcher | `"+metric+"` |") {
			row = line
		}
	}
	if row == "" {
		t.Fatalf("the operator guide has no row of %s", metric)
	}
	mfs, err := reg.Gather()
	must(t, err)
	outcomes := 0
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "outcome" {
					continue
				}
				outcomes++
				if !strings.Contains(row, "`"+lp.GetValue()+"`") {
					t.Errorf("the operator guide's row of %s does not name the outcome %q:\n%s", metric, lp.GetValue(), row)
				}
			}
		}
	}
	if outcomes == 0 {
		t.Fatalf("%s has no outcome series", metric)
	}
}
