package hostsdk_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestActionContextCause: context.Cause of the context Handle gets tells
// why it ended — the caller's cancel (the host also calls the Canceler),
// the action's timeout, or the host's shutdown, which tells the provider
// nothing — so a connector whose provider runs on can say which. The
// shutdown cancelled it without a cause (context.Canceled, as a cancel
// whose cause it could not read), and the other causes were unexported.
func TestActionContextCause(t *testing.T) {
	f := newFleet(t)
	f.cfg.DrainTimeout, f.cfg.DrainLinger = 200*time.Millisecond, time.Millisecond
	conn := newTestConnector()
	h, target := f.start(t, conn)
	ctx := ctxT(t)
	wait := func(id string) error {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if v, ok := conn.causes.Load(id); ok {
				err, _ := v.(error)
				return err
			}
		}
		t.Fatalf("action %s: Handle's context did not end", id)
		return nil
	}

	cancelled := action(capBlock, `{"message":"hold"}`)
	go f.d.Act(ctx, target, cancelled)
	<-conn.started
	if _, err := f.d.Cancel(ctx, target, cancelled.ID, cancelled.CapabilityID, "no longer needed"); err != nil {
		t.Fatal(err)
	}
	if cause := wait(cancelled.ID); !errors.Is(cause, hostsdk.ErrActionCancelled) {
		t.Errorf("cancelled action: cause %v, want ErrActionCancelled", cause)
	}

	timed := action(capBlock, `{"message":"hold"}`)
	ms := uint64(50)
	timed.TimeoutMS = &ms
	go f.d.Act(ctx, target, timed)
	<-conn.started
	if cause := wait(timed.ID); !errors.Is(cause, hostsdk.ErrActionTimeout) {
		t.Errorf("timed-out action: cause %v, want ErrActionTimeout", cause)
	}

	stopped := action(capBlock, `{"message":"hold"}`)
	go f.d.Act(ctx, target, stopped)
	<-conn.started
	_ = h.Stop(ctx)
	if cause := wait(stopped.ID); !errors.Is(cause, hostsdk.ErrHostStopping) {
		t.Errorf("action running at the drain timeout: cause %v, want ErrHostStopping", cause)
	}
}
