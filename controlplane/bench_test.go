package controlplane_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// BenchmarkServeHeartbeat measures the service's own cost of one signed
// heartbeat on memregistry, without a network or a client: open and decode
// the request, check window, signer and signature, apply it through the
// batcher, and sign the answer. The requests are signed before the timer
// starts. (controlplane/cmd/heartbeat-bench measures the whole path with
// clients over loopback HTTP.)
func BenchmarkServeHeartbeat(b *testing.B) {
	clock := registrytest.NewClock(registrytest.Epoch)
	reg, err := memregistry.New(memregistry.Config{Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	w, err := registrytest.NewLifecycleWorld(ctx, reg)
	if err != nil {
		b.Fatal(err)
	}
	svc, err := controlplane.New(controlKey, reg, controlplane.Config{Now: clock.Now, DisableMaintenance: true})
	if err != nil {
		b.Fatal(err)
	}
	defer runService(b, svc)()
	serve := func(body []byte) int {
		rec := httptest.NewRecorder()
		svc.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, controlplane.PathControl, bytes.NewReader(body)))
		return rec.Code
	}
	const replicas = 256
	keys := make([]*aip.SigningKey, replicas)
	ids := make([]string, replicas)
	for i := range replicas {
		rep := w.ProvisionedReplica(fmt.Sprintf("crepl_b%04d", i), clock.Now())
		if err := reg.PutReplica(ctx, rep); err != nil {
			b.Fatal(err)
		}
		keys[i], ids[i] = registrytest.Key(rep.ID), rep.ID
		req := aip.NewControlRequest(clock.Now(), keys[i].DID(), aip.RegisterCommand(w.Registration(&rep)))
		if code := serve(sealWith(b, keys[i], req)); code != http.StatusOK {
			b.Fatalf("register: HTTP %d", code)
		}
	}
	bodies := make([][]byte, b.N)
	for n := range bodies {
		i := n % replicas
		req := aip.NewControlRequest(clock.Now(), keys[i].DID(), aip.HeartbeatCommand(aip.Heartbeat{
			ReplicaID: ids[i], PreviousSequence: uint64(n/replicas + 1), InFlight: 1, ConnectorReady: true,
		}))
		bodies[n] = sealWith(b, keys[i], req)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		if code := serve(bodies[n]); code != http.StatusOK {
			b.Fatalf("heartbeat %d: HTTP %d", n, code)
		}
	}
}
