package pgregistry_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// BenchmarkRegisterBatch measures re-registration after a control-plane
// outage: every lease has expired and the control plane coalesces the
// hosts' registrations into one ApplyLifecycle call per batch (--max-batch,
// default 256). Before each op the clock moves past the lease; the op is one
// call registering 256 replicas of one instance of one version whose
// manifest is about 440 KB or 3.6 MB of JSON (the limit is 4 MiB).
// ms/batch is the time per call.
//
//	bash -c 'source scripts/pg.sh; start_throwaway_pg bench; AIP_TEST_DATABASE_URL=$PG_URL \
//	  go test -run "^$" -bench RegisterBatch ./registry/pgregistry'
//
// Measured 2026-11-30 on the shared 2-core machine, bench server, six
// alternating before/after runs each (three at the default benchtime, three
// at -benchtime 5x), ms per call:
//
//	                                         440 KB       3.6 MB
//	a join per replica (before)             712–819  4 737–5 725
//	each instance and version once (now)  12.1–16.6    39.5–47.3
//
// Before, every registering replica's row carried its version's manifest,
// so a call fetched, decoded and qualified it 256 times: with a 3.6 MB
// manifest a batch took about the 5 s store timeout. (One more "before" run
// on a busier machine gave 2 195 ms and 5 660 ms.) The cost left is one
// fetch and decode of the manifest per call (the review that found this
// measured 5 ms for a call of 256 heartbeats).
func BenchmarkRegisterBatch(b *testing.B) {
	for _, kb := range []int{440, 3600} {
		b.Run(fmt.Sprintf("manifest=%dKB", kb), func(b *testing.B) { benchmarkRegisterBatch(b, 256, kb) })
	}
}

func benchmarkRegisterBatch(b *testing.B, replicas, manifestKB int) {
	r, _, clock := openClock(b, pgregistry.Config{})
	ctx := b.Context()
	w := &registrytest.LifecycleWorld{Type: registry.ConnectorType{ID: "ctype_big", Name: "big", Owner: "owner-big", Enabled: true}}
	w.Version = registrytest.Version("cver_big1", w.Type.ID, "1.0.0", w.Type.Owner, registry.VersionActive, largeManifest(b, "service:big", manifestKB<<10))
	w.Instance = registry.ConnectorInstance{ID: "cinst_big", ConnectorTypeID: w.Type.ID, VersionID: w.Version.ID, TenantID: "tenant-1",
		ConfigRevision: 1, SecretProviderRef: "secret://big", Status: registry.InstanceEnabled}
	must(b, r.PutConnectorType(ctx, w.Type))
	must(b, r.AdmitVersion(ctx, w.Version))
	must(b, r.PutInstance(ctx, w.Instance))
	reps := make([]registry.ConnectorReplica, replicas)
	for i := range reps {
		reps[i] = w.ProvisionedReplica(fmt.Sprintf("crepl_big-%04d", i), clock.Now())
		must(b, r.PutReplica(ctx, reps[i]))
	}
	regs := make([]aip.Registration, replicas)
	for i := range reps {
		regs[i] = w.Registration(&reps[i])
	}
	cmds := make([]registry.LifecycleCommand, replicas)
	batch := func() {
		b.StopTimer()
		clock.Advance(registrytest.LeaseTTL + time.Second) // every lease expired: the outage
		for i := range cmds {
			cmds[i] = registrytest.LifecycleCommand(clock.Now(), aip.RegisterCommand(regs[i]))
		}
		b.StartTimer()
		res, err := r.ApplyLifecycle(ctx, cmds)
		if err != nil {
			b.Fatal(err)
		}
		for i := range res {
			if res[i].Err != nil {
				b.Fatalf("register %s: %v", reps[i].ID, res[i].Err)
			}
		}
	}
	batch() // connections and prepared statements
	b.ResetTimer()
	for range b.N {
		batch()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/batch")
}

// largeManifest returns a valid manifest of agent agentID whose JSON is
// about size bytes: as many capabilities as the default limits allow, each
// with a long description.
func largeManifest(tb testing.TB, agentID string, size int) aip.Manifest {
	tb.Helper()
	n := min(registry.DefaultMaxCapabilitiesPerVersion, max(1, size/(8<<10)))
	probe := registrytest.Manifest(agentID, []aip.Capability{registrytest.Capability("big.cap0000", "")})
	base, err := json.Marshal(probe)
	if err != nil {
		tb.Fatal(err)
	}
	pad := max(0, size/n-len(base))
	caps := make([]aip.Capability, n)
	for i := range caps {
		phrase := fmt.Sprintf("capability %d of a large manifest. ", i)
		caps[i] = registrytest.Capability(fmt.Sprintf("big.cap%04d", i), strings.Repeat(phrase, pad/len(phrase)+1)[:pad])
	}
	return registrytest.Manifest(agentID, caps)
}
