package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// cursorSource is a polling event source that keeps its cursor in
// EventPublisher.State: it writes polled at once, then reports the cursor
// it found when RunEvents started (so the test stops the host only after
// that write), and writes final when its ctx ends (a drain).
type cursorSource struct {
	*testConnector
	found         chan string // the cursor RunEvents started from ("" none), sent once polled is written
	failed        chan error  // a read or the first write failed
	polled, final string
}

func newCursorSource(polled, final string) *cursorSource {
	return &cursorSource{testConnector: newTestConnector(), found: make(chan string, 1), failed: make(chan error, 1), polled: polled, final: final}
}

// started returns the cursor RunEvents found, failing t if it could not
// read it or write its first cursor.
func (c *cursorSource) started(t *testing.T) string {
	t.Helper()
	select {
	case got := <-c.found:
		return got
	case err := <-c.failed:
		t.Fatalf("RunEvents: %v", err)
	}
	return ""
}

func (c *cursorSource) RunEvents(ctx context.Context, events *hostsdk.EventPublisher) error {
	st := events.State()
	var cursor string
	v, err := st.Get(ctx, "poller", "cursor")
	switch {
	case errors.Is(err, journal.ErrNotFound):
	case err != nil:
		c.failed <- err
		return err
	default:
		if err := json.Unmarshal(v.Value, &cursor); err != nil {
			c.failed <- err
			return err
		}
	}
	rev, err := st.Put(ctx, "poller", "cursor", c.polled, v.Revision)
	if err != nil {
		c.failed <- err
		return err
	}
	c.found <- cursor
	<-ctx.Done()
	// The drain began: the last batch's cursor is still written.
	_, err = st.Put(context.WithoutCancel(ctx), "poller", "cursor", c.final, rev)
	return err
}

// TestEventSourceCursorSurvivesARestart: a polling event source's cursor,
// kept in EventPublisher.State, is in the journal for the next process:
// a host restarted on the same embedded journal starts RunEvents with the
// cursor the last one wrote, even one written as its ctx ended.
func TestEventSourceCursorSurvivesARestart(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	cfg := hostsdktest.HostConfig(t, cp, d, nil) // the embedded journal in cfg.StateDir

	first := newCursorSource("page-1", "page-2")
	h := hostsdktest.StartHost(t, cfg, first)
	if got := first.started(t); got != "" {
		t.Fatalf("the first process found cursor %q in a fresh journal", got)
	}
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// The next process binds the address the first one listened on.
	cfg.Listener = nil
	second := newCursorSource("page-3", "page-4")
	hostsdktest.StartHost(t, cfg, second)
	if got := second.started(t); got != "page-2" {
		t.Fatalf("after a restart on the same journal RunEvents found cursor %q, want %q (written by the last process as it stopped)", got, "page-2")
	}
}
