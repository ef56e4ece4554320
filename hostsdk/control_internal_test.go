package hostsdk

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/aipfleet/aipfleet/aip"
)

type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	c.n.Add(1)
	return nil, errors.New("connection reset by peer")
}

// TestRequestWithNoTimeLeftIsNotSentNorMaybeApplied: a lifecycle request
// whose caller's time has already run out (a shutdown step's budget spent
// on replays) is not sent, and is known not applied: it was marked
// possibly applied, so the shutdown replayed a drain that never left the
// host and reported the registry's state as unknown.
func TestRequestWithNoTimeLeftIsNotSentNorMaybeApplied(t *testing.T) {
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	tr := &countingTransport{}
	c := &controlClient{endpoint: "http://127.0.0.1:1/aip/v1/connector-control", http: &http.Client{Transport: tr},
		key: key, timeout: time.Second, now: time.Now, tracer: otel.GetTracerProvider().Tracer("test")}
	sr, err := c.seal(aip.TransitionCommand(aip.OpDrain, aip.Transition{ReplicaID: "crepl_x", PreviousSequence: 3}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.do(ctx, sr)
	var na notAppliedError
	if !errors.As(err, &na) || !errors.Is(err, ErrControlUnavailable) || sr.maybeApplied || tr.n.Load() != 0 {
		t.Fatalf("do with no time left = %v (sent %d times, maybe applied %v); want not sent, known not applied", err, tr.n.Load(), sr.maybeApplied)
	}
	// Sent and cut off, it may have been applied.
	_, err = c.do(context.Background(), sr)
	if err == nil || !sr.maybeApplied || tr.n.Load() == 0 {
		t.Fatalf("do = %v (sent %d times, maybe applied %v); want sent and possibly applied", err, tr.n.Load(), sr.maybeApplied)
	}
}
