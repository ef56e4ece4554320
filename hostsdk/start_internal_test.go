package hostsdk

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestProbeFailureRacingSIGTERMIsAFailure: when SIGTERM cuts the storage
// probe short while the connector's health check fails for a reason of
// its own (or the other way round), step 7's error is that failure, not a
// shutdown requested while starting: Run reports it. The two checks'
// errors were joined, and the cancellation in one of them made Run take
// the whole for a clean stop.
func TestProbeFailureRacingSIGTERMIsAFailure(t *testing.T) {
	sigterm := errors.New("terminated signal received")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(sigterm)
	cut := fmt.Errorf("durable runtime storage readiness check failed: %w", context.Canceled)
	own := errors.New("connector is not ready: provider unreachable")
	for _, c := range []struct {
		name              string
		storage, conn     error
		want              error
		wantStoppedByStop bool
	}{
		{"storage cut short, connector failed", cut, own, own, false},
		{"connector cut short, storage failed", own, fmt.Errorf("connector is not ready: %w", sigterm), own, false},
		{"both cut short", cut, fmt.Errorf("connector is not ready: %w", context.Canceled), nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := probeStepError(ctx, c.storage, c.conn)
			if err == nil {
				t.Fatal("no step error for two failed checks")
			}
			if got := stoppedByCancel(ctx, err); got != c.wantStoppedByStop {
				t.Errorf("stoppedByCancel(%v) = %v, want %v", err, got, c.wantStoppedByStop)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("step error %v does not carry the check's own failure %v", err, c.want)
			}
		})
	}
	// Without a shutdown request both failures are reported.
	if err := probeStepError(context.Background(), cut, own); !errors.Is(err, own) || !errors.Is(err, context.Canceled) {
		t.Errorf("probeStepError without a cancellation = %v; want both checks' errors", err)
	}
}
