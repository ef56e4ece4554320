package crewai

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// handlerTransport answers requests with a handler in memory, so that a
// test can run the connector inside a synctest bubble (fake time).
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// A status read refused with 429 and Retry-After is read again only after
// the wait the provider asked for, not at the next poll interval: reading
// sooner spent the run's failures within moments and left a healthy run
// outcome_unknown.
func TestRunWaitsForRetryAfterOfStatusReads(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		wantGap    time.Duration
	}{
		{"429 seconds", http.StatusTooManyRequests, "30", 30 * time.Second},
		{"503 seconds", http.StatusServiceUnavailable, "45", 45 * time.Second},
		{"429 beyond the bound", http.StatusTooManyRequests, "86400", MaxPollInterval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const kickoffID = "5b3f2c1e-8a4d-4f6b-9c2e-1d7a8b9c0e1f"
				var (
					mu    sync.Mutex
					reads []time.Time
				)
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					reads = append(reads, time.Now())
					n := len(reads)
					mu.Unlock()
					if r.URL.Path != "/status/"+kickoffID {
						http.NotFound(w, r)
						return
					}
					w.Header().Set("Content-Type", "application/json")
					if n < maxPollFailures {
						w.Header().Set("Retry-After", tc.retryAfter)
						w.WriteHeader(tc.status)
						_, _ = w.Write([]byte(`{"error":"Too Many Requests","message":"slow down"}`))
						return
					}
					_, _ = w.Write([]byte(`{"status":"completed","result":{"output":"done"}}`))
				})
				crews, err := loadCrews(writeCrews(t, "http://127.0.0.1:1", "amp-token"), DefaultMaxResponseBytes, handlerTransport{h})
				if err != nil {
					t.Fatal(err)
				}
				c := newConnector(crews, time.Millisecond, slog.New(slog.DiscardHandler))
				ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
				defer cancel()
				res, err := c.wait(ctx, "act_1", crews[0], kickoffID, slog.New(slog.DiscardHandler))
				if err != nil {
					t.Fatalf("wait: %v", err)
				}
				if res.Status != aip.ResultCompleted {
					t.Fatalf("result %+v", res)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(reads) != maxPollFailures {
					t.Fatalf("%d status reads, want %d", len(reads), maxPollFailures)
				}
				for i := 1; i < len(reads); i++ {
					if gap := reads[i].Sub(reads[i-1]); gap < tc.wantGap {
						t.Errorf("read %d came %s after a refusal with Retry-After %s; want at least %s", i, gap, tc.retryAfter, tc.wantGap)
					}
				}
			})
		})
	}
}

func TestRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		poll, retryAfter, want time.Duration
	}{
		{time.Second, 0, time.Second},
		{time.Second, 500 * time.Millisecond, time.Second},
		{time.Second, 30 * time.Second, 30 * time.Second},
		{time.Second, 24 * time.Hour, MaxPollInterval},
	} {
		if got := retryDelay(tc.poll, &provider.Error{RetryAfter: tc.retryAfter}); got != tc.want {
			t.Errorf("retryDelay(%s, Retry-After %s) = %s, want %s", tc.poll, tc.retryAfter, got, tc.want)
		}
	}
}
