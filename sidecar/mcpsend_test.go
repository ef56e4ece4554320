package sidecar

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestMCPCallOnABrokenSessionWasNotSent: a call made after the stdio
// server's session broke, before the bridge noticed (here: no loop runs
// to notice), is refused by the SDK before anything is written. It did
// not run, read or not: it fails sidecar.connector_unavailable,
// retryable, as a call made while the session is down does. It was
// recorded outcome_unknown (a read: connector_host.interrupted).
func TestMCPCallOnABrokenSessionWasNotSent(t *testing.T) {
	ctx := ctxT(t)
	m, err := NewMCP(MCPConfig{
		Command:     []string{os.Args[0], "-test.run=^$"},
		Env:         []string{envMCPChild + "=1", "GORACE=atexit_sleep_ms=0"},
		StopTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	// Connected without the loop that would take the broken session
	// down: the window between the break and the bridge noticing it,
	// held open.
	sess, srv, _, err := m.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.setSession(sess, srv)
	man, err := m.Manifest(ctx, hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { sess.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("the killed server's session did not end")
	}
	for _, tool := range []string{"stuck", "lookup"} {
		_, err := m.Handle(ctx, toolCall(t, man, tool, `{}`))
		var pe *aip.ProtocolError
		if !errors.As(err, &pe) || pe.Code != CodeConnectorUnavailable || !pe.IsRetryable() {
			t.Errorf("%s on the broken session: %v; want %s, retryable (the call was never sent)", tool, err, CodeConnectorUnavailable)
		}
	}
}
