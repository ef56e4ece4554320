package crewai

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
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
// sooner would spend the run's outage budget on answers the provider said
// it would refuse.
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
				const refusals = 4
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
					if n <= refusals {
						w.Header().Set("Retry-After", tc.retryAfter)
						w.WriteHeader(tc.status)
						_, _ = w.Write([]byte(`{"error":"Too Many Requests","message":"slow down"}`))
						return
					}
					_, _ = w.Write([]byte(`{"status":"completed","result":{"output":"done"}}`))
				})
				crews, err := loadCrews(writeCrews(t, "http://127.0.0.1:1", "amp-token"), DefaultMaxResponseBytes, handlerTransport{h}, nil)
				if err != nil {
					t.Fatal(err)
				}
				c := newConnector(crews, time.Millisecond, slog.New(slog.DiscardHandler))
				c.outageBudget = time.Hour // four 10 min refusals stay within it
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
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
				if len(reads) != refusals+1 {
					t.Fatalf("%d status reads, want %d", len(reads), refusals+1)
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

// outageAMP answers GET /status/{kickoff_id} of one run in memory, as
// the document does: 500 (or no answer at all, when drop) until outage has
// passed since the first read, then "running" once and "completed". It
// records when each read came.
type outageAMP struct {
	kickoffID string
	outage    time.Duration
	drop      bool

	mu    sync.Mutex
	reads []time.Time
}

func (m *outageAMP) RoundTrip(r *http.Request) (*http.Response, error) {
	m.mu.Lock()
	now := time.Now()
	m.reads = append(m.reads, now)
	down := now.Sub(m.reads[0]) < m.outage
	running := !down && (len(m.reads) < 2 || m.reads[len(m.reads)-2].Sub(m.reads[0]) < m.outage)
	m.mu.Unlock()
	if down && m.drop {
		return nil, errors.New("connection reset by peer")
	}
	rec := httptest.NewRecorder()
	switch {
	case r.URL.Path != "/status/"+m.kickoffID:
		writeJSON(rec, http.StatusNotFound, map[string]any{"error": "Execution not found", "message": "No execution found"})
	case down:
		writeJSON(rec, http.StatusInternalServerError, errorBody(http.StatusInternalServerError))
	case running:
		writeJSON(rec, http.StatusOK, map[string]any{"status": "running", "current_task": "research_task"})
	default:
		writeJSON(rec, http.StatusOK, map[string]any{"status": "completed", "result": map[string]any{"output": "done"}})
	}
	return rec.Result(), nil
}

func (m *outageAMP) gaps() []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var g []time.Duration
	for i := 1; i < len(m.reads); i++ {
		g = append(g, m.reads[i].Sub(m.reads[i-1]))
	}
	return g
}

// waitThrough runs wait, with the default poll interval, backoff cap and
// outage budget, against an AMP whose status reads fail for outage.
func waitThrough(t *testing.T, amp *outageAMP) (*aip.ActionResult, time.Duration, error) {
	t.Helper()
	crews, err := loadCrews(writeCrews(t, "http://127.0.0.1:1", "amp-token"), DefaultMaxResponseBytes, amp, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newConnector(crews, DefaultPollInterval, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	start := time.Now()
	res, err := c.wait(ctx, "act_1", crews[0], amp.kickoffID, slog.New(slog.DiscardHandler))
	return res, time.Since(start), err
}

// An AMP outage of a few minutes while a crew runs (status reads answered
// 500, or not at all) is waited out with exponential backoff — 1 s, 2 s,
// 4 s ... up to 30 s between reads — and the run's real result comes back.
// Before, the fifth failed read (about 4 s in) ended the wait and left the
// run outcome_unknown although it went on and completed on AMP.
func TestRunWaitsOutAnOutageShorterThanTheBudget(t *testing.T) {
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				amp := &outageAMP{kickoffID: "5b3f2c1e-8a4d-4f6b-9c2e-1d7a8b9c0e1f", outage: 4 * time.Minute, drop: drop}
				res, _, err := waitThrough(t, amp)
				if err != nil {
					t.Fatalf("wait: %v", err)
				}
				if res.Status != aip.ResultCompleted || !strings.Contains(string(res.Output), `"done"`) {
					t.Fatalf("result %+v", res)
				}
				gaps := amp.gaps()
				want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
				if len(gaps) < len(want)+2 {
					t.Fatalf("gaps between reads %v", gaps)
				}
				for i, w := range want {
					if gaps[i] != w*time.Second {
						t.Fatalf("gaps between reads %v, want them to begin %v seconds", gaps, want)
					}
				}
				// Once AMP answers again, the poll interval is back.
				if last := gaps[len(gaps)-1]; last != DefaultPollInterval {
					t.Errorf("gap after the outage %s, want the poll interval", last)
				}
			})
		})
	}
}

// An outage longer than the budget ends the wait, just after the budget,
// as outcome_unknown naming the kickoff and the status capability.
func TestRunOutageLongerThanTheBudgetIsOutcomeUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		amp := &outageAMP{kickoffID: "5b3f2c1e-8a4d-4f6b-9c2e-1d7a8b9c0e1f", outage: 20 * time.Minute}
		res, took, err := waitThrough(t, amp)
		if !errors.Is(err, hostsdk.ErrOutcomeUnknown) {
			t.Fatalf("wait: %+v, %v; want outcome_unknown", res, err)
		}
		for _, s := range []string{amp.kickoffID, CapabilityPrefix + crewID + ":" + SuffixStatus, "outage budget"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not name %q", err, s)
			}
		}
		if took <= DefaultOutageBudget || took > DefaultOutageBudget+provider.DefaultBackoffCap {
			t.Errorf("the wait ended after %s; want just past the %s budget", took, DefaultOutageBudget)
		}
	})
}
