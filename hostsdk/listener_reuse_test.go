package hostsdk_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestReusedClosedListenerSaysWhatToDo: a host closes Config.Listener when
// it stops, so a Config reused for the next host (a test restarting a
// connector on the same journal) hands it a closed listener. The failure
// says so and what to do at step 5, before the host registers, not at
// step 10 (serve) with only "use of closed network connection".
func TestReusedClosedListenerSaysWhatToDo(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	cfg := hostsdktest.HostConfig(t, cp, d, nil)
	first := hostsdktest.StartHost(t, cfg, newTestConnector())
	if err := first.Stop(ctxT(t)); err != nil {
		t.Fatalf("stop: %v", err)
	}

	h, err := hostsdk.New(cfg, newTestConnector()) // cfg.Listener is the one the first host closed
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 30*time.Second)
	defer cancel()
	err = h.Run(ctx)
	if err == nil {
		t.Fatal("a host on a closed Config.Listener ran cleanly")
	}
	for _, want := range []string{"step 5 (build_routes)", "Config.Listener is closed", "a host closes its Listener when it stops", "nil to bind Bind"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
