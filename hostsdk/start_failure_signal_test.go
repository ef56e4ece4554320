package hostsdk_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// errSIGTERM is the cause signal.NotifyContext gives its context on
// SIGTERM; like it, it does not wrap context.Canceled.
var errSIGTERM = errors.New("terminated signal received")

// signalDuringDiscovery is a connector whose discovery fails for a reason
// of its own (the product is unreachable) just as SIGTERM arrives.
type signalDuringDiscovery struct {
	*testConnector
	cancel context.CancelCauseFunc
}

var errCatalogueDown = errors.New("the product's catalogue is unreachable")

func (c *signalDuringDiscovery) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	c.cancel(errSIGTERM)
	return nil, errCatalogueDown
}

// signalAfterAnswer delivers SIGTERM (cancels with errSIGTERM) once the
// first lifecycle answer has been read in full, so the answer itself is
// what the host decides on.
type signalAfterAnswer struct {
	next   http.RoundTripper
	cancel context.CancelCauseFunc
	once   sync.Once
}

func (s *signalAfterAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	s.once.Do(func() { s.cancel(errSIGTERM) })
	return resp, nil
}

// TestStartFailureRacingSIGTERMIsReported: a start that fails for a reason
// of its own while SIGTERM arrives is a failed start, not a clean stop:
// Run returns the step's error (a main exits non-zero), so the operator's
// supervisor sees it. Run returned nil whenever its context was cancelled
// by then and nothing was left registered, losing the failure — here the
// product's discovery failure, and the control plane's signed refusal of
// the registration.
func TestStartFailureRacingSIGTERMIsReported(t *testing.T) {
	t.Run("discovery fails", func(t *testing.T) {
		f := newFleet(t)
		ctx, cancel := context.WithCancelCause(ctxT(t))
		defer cancel(nil)
		h, err := hostsdk.New(f.cfg, &signalDuringDiscovery{testConnector: newTestConnector(), cancel: cancel})
		if err != nil {
			t.Fatal(err)
		}
		err = h.Run(ctx)
		var de *hostsdk.DiscoverError
		if !errors.As(err, &de) || !errors.Is(err, errCatalogueDown) {
			t.Fatalf("Run = %v; want the DiscoverError with the connector's own failure, though SIGTERM arrived meanwhile", err)
		}
		if n := len(f.cp.Operations()); n != 0 {
			t.Errorf("%d lifecycle requests after a failed discovery", n)
		}
	})
	t.Run("registration refused", func(t *testing.T) {
		f := newFleet(t)
		ctx, cancel := context.WithCancelCause(ctxT(t))
		defer cancel(nil)
		rt := f.cfg.ControlPlaneTransport
		if rt == nil {
			rt = http.DefaultTransport
		}
		f.cfg.ControlPlaneTransport = &signalAfterAnswer{next: rt, cancel: cancel}
		f.cp.FailNext(1, hostsdktest.FaultReject)
		h, err := hostsdk.New(f.cfg, newTestConnector())
		if err != nil {
			t.Fatal(err)
		}
		err = h.Run(ctx)
		var re *hostsdk.RegisterError
		var rej *hostsdk.ControlRejectedError
		if !errors.As(err, &re) || !errors.As(err, &rej) {
			t.Fatalf("Run = %v; want the RegisterError with the control plane's refusal, though SIGTERM arrived meanwhile", err)
		}
		if strings.Contains(err.Error(), "may stay registered") {
			t.Errorf("Run = %v; a refused registration leaves nothing registered", err)
		}
	})
}

// signalAtPendingEvents is a journal whose outbox count, the last read of
// recovery (step 6), is where SIGTERM arrives: the count is cut short.
type signalAtPendingEvents struct {
	journal.Journal
	cancel context.CancelCauseFunc
}

func (j signalAtPendingEvents) PendingEvents(ctx context.Context) (int, error) {
	j.cancel(errSIGTERM)
	return j.Journal.PendingEvents(ctx)
}

// TestSIGTERMDuringRecoveryIsACleanStop: a SIGTERM that cuts recovery's
// journal reads short is a shutdown requested while starting (Run returns
// nil), and a reconcile that failed for a reason of its own before it is
// still a failed start. Recovery turned each of its errors into text, so
// the cancellation of its outbox count was not recognised as one, and a
// plain SIGTERM at step 6 made the start fail (exit status 1).
func TestSIGTERMDuringRecoveryIsACleanStop(t *testing.T) {
	errProduct := errors.New("the product's status API answered 500")
	for _, c := range []struct {
		name      string
		reconcile error // nil: no action is left running
		wantErr   error
	}{
		{"nothing to reconcile", nil, nil},
		{"a reconcile failed on its own", errProduct, errProduct},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			ctx, cancel := context.WithCancelCause(ctxT(t))
			defer cancel(nil)
			f.cfg.Journal = signalAtPendingEvents{Journal: f.j, cancel: cancel}
			conn := newTestConnector()
			if c.reconcile != nil {
				leaveRunning(t, f.j, action(capEcho, `{"message":"left running"}`), true)
				conn.reconcile = func(context.Context, *hostsdk.UncertainAction) (*aip.ActionResult, error) {
					return nil, c.reconcile
				}
			}
			h, err := hostsdk.New(f.cfg, reconcilingConnector{conn})
			if err != nil {
				t.Fatal(err)
			}
			err = h.Run(ctx)
			if c.wantErr == nil {
				if err != nil {
					t.Fatalf("Run = %v; want nil: SIGTERM during recovery is a clean stop", err)
				}
				return
			}
			var re *hostsdk.RecoverError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), c.wantErr.Error()) {
				t.Fatalf("Run = %v; want the RecoverError naming the reconcile's own failure, though SIGTERM arrived meanwhile", err)
			}
		})
	}
}
