package hostsdk_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// dropConnector streams chunks until the receiver is gone and returns the
// Send error, as a connector written the usual way does, after the first
// chunk has signalled sent.
type dropConnector struct {
	*testConnector
	sent chan struct{}
}

func (c dropConnector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	c.countRun(call.Action.ID)
	for i := 0; ; i++ {
		// The provider's side effect for this step happens here.
		if err := chunks.Send(aip.ChunkProgress, map[string]int{"step": i}); err != nil {
			return nil, err
		}
		if i == 0 {
			close(c.sent)
		}
	}
}

// readOnlyDrop is dropConnector with read-only capabilities.
type readOnlyDrop struct{ dropConnector }

func (c readOnlyDrop) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	return readOnlyConnector{c.testConnector}.Manifest(ctx, tenant)
}

// TestStreamReceiverGoneIsOutcomeUnknown: a streaming action whose
// receiver went away mid-stream, and whose connector gave up with the
// ChunkWriter's error, did not say what it did. For a capability with
// effects it is journaled outcome_unknown, never failed (which tells the
// caller it may safely run it again under a new action ID); a read-only
// capability's changed nothing and is failed connector_host.interrupted,
// retryable, as any read cut off live.
func TestStreamReceiverGoneIsOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conn  func(dropConnector) hostsdk.Connector
		state aip.ActionState
	}{
		{"write", func(c dropConnector) hostsdk.Connector { return c }, aip.StateOutcomeUnknown},
		{"read", func(c dropConnector) hostsdk.Connector { return readOnlyDrop{c} }, aip.StateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			conn := dropConnector{testConnector: newTestConnector(), sent: make(chan struct{})}
			_, target := f.start(t, tc.conn(conn))
			ctx := ctxT(t)

			a := action(capStream, `{"message":"drop"}`)
			a.Mode = aip.ModeStreaming
			actx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := f.d.Act(actx, target, a)
				done <- err
			}()
			<-conn.sent
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Logf("the dropped stream's request ended with %v", err)
			}
			// The action settles once the connector returns; a status
			// query waits for nothing, so ask until it is terminal.
			for {
				st, _, err := f.d.Status(ctx, target, a.ID, a.CapabilityID)
				if err != nil {
					t.Fatal(err)
				}
				if st.State.Terminal() {
					if st.State != tc.state {
						t.Fatalf("journaled %s, want %s: the receiver went away mid-stream", st.State, tc.state)
					}
					if tc.state == aip.StateFailed {
						if r := st.Result; r == nil || r.Error == nil || r.Error.Code != hostsdk.CodeInterrupted || !r.Error.IsRetryable() {
							t.Fatalf("journaled result %+v, want failed %s, retryable", r, hostsdk.CodeInterrupted)
						}
					}
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("the action never settled (state %s)", st.State)
				default:
				}
			}
			if n := conn.runCount(a.ID); n != 1 {
				t.Errorf("ran %d times", n)
			}
		})
	}
}
