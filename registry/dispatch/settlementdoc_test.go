package dispatch_test

import (
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// TestActionOutcomesAreDocumented: every outcome aip_dispatch_actions_total
// counts (each settlement the dispatcher reports, and not_routed; their
// series exist from the start) is named in the operator guide's row of the
// metric, so an alert or a dashboard written from the guide sees every
// series (pruned, added with registry.SettlementPruned, was missing).
func TestActionOutcomesAreDocumented(t *testing.T) {
	key, _ := aip.GenerateSigningKey()
	store, err := memregistry.New(memregistry.Config{})
	must(t, err)
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: issuer, DIDs: []string{key.DID()}}}})
	must(t, err)
	reg := prometheus.NewRegistry()
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID, Metrics: reg},
		dispatch.Deps{Resolver: store, Catalog: store, Tokens: verifier})
	must(t, err)
	defer d.Close()
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
