package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// updatingConnector's test.block ignores its context and updates a state
// key whose update function waits, after its read, until unstick is
// closed; updated gets what the Update returned.
type updatingConnector struct {
	*testConnector
	reading chan struct{}
	unstick chan struct{}
	updated chan error
}

func (c *updatingConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	c.countRun(call.Action.ID)
	_, _, err := call.State().Update(context.Background(), "test.late", call.Action.ID, func(json.RawMessage) (json.RawMessage, error) {
		close(c.reading)
		<-c.unstick
		return json.RawMessage(`"late"`), nil
	})
	c.updated <- err
	return call.Complete(map[string]any{"message": "late"})
}

// TestStateUpdateInProgressAtStopWritesNothing: an abandoned call whose
// State().Update had read the key before Stop and writes after it is
// refused (journal.ErrClosed) and writes nothing, as a call that starts
// after Stop is. Update checked that the host runs only before its first
// read: the write landed, after Stop returned, in a journal the caller
// owns and the host no longer serves.
func TestStateUpdateInProgressAtStopWritesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var conn *updatingConnector
		b := newWrappedBubbleFleet(t, func(c *hostsdk.Config) {
			c.HandleGrace = time.Second
		}, func(tc *testConnector) hostsdk.Connector {
			conn = &updatingConnector{testConnector: tc, reading: make(chan struct{}), unstick: make(chan struct{}), updated: make(chan error, 1)}
			return conn
		})
		ctx := b.awaitFirstBeat(t)
		target := hostsdktest.TargetOf(b.h, b.cfg)
		a := action(capBlock, `{"message":"x"}`)
		ms := uint64(100)
		a.TimeoutMS = &ms
		resp, err := b.d.Act(ctx, target, a)
		if err != nil {
			close(conn.unstick)
			t.Fatal(err)
		}
		wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
		<-conn.reading
		var se *hostsdk.ShutdownError
		if err := b.h.Stop(ctx); !errors.As(err, &se) {
			t.Errorf("Stop: %v, want a *ShutdownError naming the abandoned call", err)
		}
		close(conn.unstick)
		if err := <-conn.updated; !errors.Is(err, journal.ErrClosed) {
			t.Errorf("an Update that writes after Stop: %v, want an error matching journal.ErrClosed", err)
		}
		synctest.Wait()
		if v, err := b.cfg.Journal.State(ctx, "test.late", a.ID); !errors.Is(err, journal.ErrNotFound) {
			t.Errorf("after Stop the state holds %s (%v), want nothing", v.Value, err)
		}
	})
}
