package sidecar

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// nativeEcho is the same echo.say as the fake local connector's, written
// directly on hostsdk.
type nativeEcho struct{}

func (nativeEcho) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	m := fakeManifest("")
	m.Agent.ID = "agent:native-echo"
	m.Capabilities = m.Capabilities[:1]
	return m, nil
}

func (nativeEcho) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	var in struct {
		Message string `json:"message"`
	}
	if err := jsonUnmarshal(call.Action.Input, &in); err != nil {
		return nil, err
	}
	return call.Complete(map[string]string{"message": in.Message})
}

// syncNormal gives a host the embedded journal without an fsync per
// commit, so that the figures measure the hop rather than the disk.
func syncNormal(b *testing.B, c *hostsdk.Config) {
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: b.TempDir(), Sync: sqliteruntime.SyncNormal})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { j.Close() })
	c.Journal, c.StateDir = j, ""
}

// BenchmarkSidecarHop measures the latency the sidecar adds to an action:
// the same echo.say runs through (a) a native Go connector on hostsdk and
// (b) the sidecar forwarding to a local echo connector in a child process
// (this test binary, Go, so the figure is the hop and not the connector's
// language), over a unix socket and over loopback TCP. Both hosts verify
// the signed envelope, journal the action and its result (SQLite,
// synchronous=NORMAL) and sign the answer; one client sends actions to the
// two in alternation. Reported: p50/p99 of each and the added p50/p99
// (sidecar minus native).
func BenchmarkSidecarHop(b *testing.B) {
	for _, transport := range []string{"unix", "tcp"} {
		b.Run("transport="+transport, func(b *testing.B) { benchHop(b, transport) })
	}
}

func benchHop(b *testing.B, transport string) {
	cp := hostsdktest.NewControlPlane(b, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(b, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	ncfg := hostsdktest.HostConfig(b, cp, d, nil)
	syncNormal(b, &ncfg)
	native := hostsdktest.StartHost(b, ncfg, nativeEcho{})
	nt := hostsdktest.TargetOf(native, ncfg)

	r := startReplica(b, func(c *Config) {
		syncNormal(b, &c.Host)
		if transport == "unix" {
			c.Local = LocalConfig{Socket: socketPath(b)}
		} else {
			c.Local = LocalConfig{URL: "http://" + freeAddr(b)}
		}
		c.Exec = []string{os.Args[0], "-test.run=^$"}
		c.ExecEnv = []string{envChild + "=1"}
	})
	ctx := ctxT(b)
	say := func(d *hostsdktest.Dispatcher, t hostsdktest.Target) time.Duration {
		a := act("echo.say", `{"message":"bench"}`)
		t0 := time.Now()
		resp, err := d.Act(ctx, t, a)
		elapsed := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
			b.Fatalf("HTTP %d: %v", resp.Status, err)
		}
		return elapsed
	}
	for range 50 { // warm connections, journals and the child
		say(d, nt)
		say(r.d, r.target)
	}
	nat := make([]time.Duration, 0, b.N)
	side := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		nat = append(nat, say(d, nt))
		side = append(side, say(r.d, r.target))
	}
	b.StopTimer()
	slices.Sort(nat)
	slices.Sort(side)
	pct := func(l []time.Duration, p float64) float64 {
		return float64(l[int(p*float64(len(l)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(nat, .5), "native-p50-ms")
	b.ReportMetric(pct(nat, .99), "native-p99-ms")
	b.ReportMetric(pct(side, .5), "sidecar-p50-ms")
	b.ReportMetric(pct(side, .99), "sidecar-p99-ms")
	b.ReportMetric(pct(side, .5)-pct(nat, .5), "added-p50-ms")
	b.ReportMetric(pct(side, .99)-pct(nat, .99), "added-p99-ms")
	b.ReportMetric(0, "ns/op")
}
