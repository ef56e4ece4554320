package provider

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// degraded returns the detail of a *hostsdk.DegradedError err is, and
// fails the test for nil or another error: Check's outcome when some
// targets passed and others did not.
func degraded(t *testing.T, err error) string {
	t.Helper()
	d, ok := err.(*hostsdk.DegradedError)
	if !ok {
		t.Fatalf("Check = %v (%T), want a *hostsdk.DegradedError", err, err)
	}
	return d.Err.Error()
}

// TestTargetsLogRateLimited: a target failing at every probe is logged
// when it starts failing, when its failure changes (at most every
// TargetLogMinGap) and every TargetLogRepeat, not at every probe; its
// recovery is logged once.
func TestTargetsLogRateLimited(t *testing.T) {
	var logs hostsdktest.LogBuffer
	take := func() string { return strings.Join(logs.Take(""), "\n") }
	tg := NewTargets("crew", "crew_id", slog.New(slog.NewTextHandler(&logs, nil)))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tg.now = func() time.Time { return now }
	failing := map[string]error{}
	check := func(_ context.Context, id string) error { return failing[id] }
	ids := []string{"a", "b"}
	probe := func() {
		t.Helper()
		if err := tg.Check(context.Background(), ids, 0, check); err != nil {
			degraded(t, err)
		}
	}
	unauthorized := &Error{Product: "crewai", Method: "GET", Path: "/inputs", Status: http.StatusUnauthorized, Message: "bad token"}
	failing["b"] = unauthorized
	probe()
	if got := take(); strings.Count(got, "failed its health check") != 1 || !strings.Contains(got, "crew_id=b") {
		t.Fatalf("first failure logged %q", got)
	}
	for range 20 { // 20 probes, 10 s apart
		now = now.Add(10 * time.Second)
		probe()
	}
	if got := take(); got != "" {
		t.Fatalf("the same failure again within %s logged %q", TargetLogRepeat, got)
	}
	failing["b"] = &Error{Product: "crewai", Method: "GET", Path: "/inputs", Status: http.StatusForbidden, Message: "forbidden"}
	now = now.Add(10 * time.Second)
	probe()
	if got := take(); !strings.Contains(got, "403") {
		t.Fatalf("a changed failure logged %q", got)
	}
	failing["b"] = unauthorized
	now = now.Add(10 * time.Second)
	probe()
	if got := take(); got != "" {
		t.Fatalf("a failure changing again within %s logged %q", TargetLogMinGap, got)
	}
	now = now.Add(TargetLogRepeat)
	probe()
	if got := take(); strings.Count(got, "failed its health check") != 1 {
		t.Fatalf("a failure lasting %s logged %q", TargetLogRepeat, got)
	}
	delete(failing, "b")
	probe()
	probe()
	if got := take(); strings.Count(got, "passed its health check again") != 1 {
		t.Fatalf("recovery logged %q", got)
	}
	if _, refused := tg.Refusal("act-1", "b"); refused {
		t.Fatal("a target that passed again is refused")
	}
}

// TestTargetsRefusal: a target that failed its last check refuses its
// actions classified as its failure was; an abandoned probe records
// nothing; every target failing fails the check.
func TestTargetsRefusal(t *testing.T) {
	tg := NewTargets("endpoint", "endpoint", nil)
	failing := map[string]error{
		"a": &Error{Product: "hermes", Method: "GET", Path: "/v1/models", Status: http.StatusServiceUnavailable, RetryAfter: 2 * time.Second},
		"b": errors.New("boom"),
	}
	check := func(_ context.Context, id string) error { return failing[id] }
	detail := degraded(t, tg.Check(context.Background(), []string{"a", "b", "c"}, 1, check))
	for _, want := range []string{"endpoint health check failed for 2 of 3", "endpoint a: ", "endpoint b: boom"} {
		if !strings.Contains(detail, want) {
			t.Errorf("degraded detail %q does not say %q", detail, want)
		}
	}
	if strings.Contains(detail, "endpoint c") {
		t.Errorf("degraded detail %q names the healthy target", detail)
	}
	res, refused := tg.Refusal("act-1", "a")
	if !refused || res.Status != aip.ResultFailed || res.Error.Code != CodeUnavailable || !res.Error.IsRetryable() ||
		res.Error.RetryAfter() != 2*time.Second || !strings.HasPrefix(res.Error.Message, "endpoint a failed its last health check") {
		t.Fatalf("refusal %+v %+v", res, res.Error)
	}
	if res, _ := tg.Refusal("act-2", "b"); res.Error.Code != CodeUnavailable || !strings.Contains(res.Error.Message, "boom") {
		t.Fatalf("refusal %+v", res.Error)
	}
	if _, refused := tg.Refusal("act-3", "c"); refused {
		t.Fatal("a healthy target refused")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tg.Check(ctx, []string{"a", "b", "c"}, 0, func(ctx context.Context, _ string) error { return ctx.Err() }); err == nil {
		t.Fatal("an abandoned check passed")
	}
	if _, refused := tg.Refusal("act-4", "c"); refused {
		t.Fatal("an abandoned check recorded a failure")
	}
	failing["c"] = errors.New("down")
	err := tg.Check(context.Background(), []string{"a", "b", "c"}, 0, check)
	if err == nil || !strings.Contains(err.Error(), "every endpoint failed") || !strings.Contains(err.Error(), "endpoint c: down") {
		t.Fatalf("every target failing: %v", err)
	}
}

// TestTargetsDeadline: a target that does not answer fails its own check
// before the probe's deadline, so Check returns in time with the others'
// outcome; targets whose check could not start by then keep their last
// outcome rather than being failed.
func TestTargetsDeadline(t *testing.T) {
	tg := NewTargets("crew", "crew_id", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	hang := func(ctx context.Context, id string) error {
		if id == "slow" {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	// One at a time: "slow" holds the only slot until the share of the
	// deadline passes, so "late" is never started.
	detail := degraded(t, tg.Check(ctx, []string{"fast", "slow", "late"}, 1, hang))
	if !strings.Contains(detail, "crew slow: ") || !strings.Contains(detail, "crew late: not checked") {
		t.Errorf("one target not answering: degraded detail %q", detail)
	}
	if ctx.Err() != nil {
		t.Fatal("Check returned after the probe's deadline")
	}
	if tg.Failed("slow") == nil {
		t.Error("the target that did not answer passed")
	}
	if err := tg.Failed("late"); err != nil {
		t.Errorf("a target never checked failed: %v", err)
	}
}

// TestAnyReady: kinds of targets combined are ready while one kind
// passes (even partly), degraded naming every failure; failed only when
// every kind failed outright.
func TestAnyReady(t *testing.T) {
	appsDown := errors.New("every app failed its health check: app a: 401")
	kbDegraded := hostsdk.Degraded(errors.New("knowledge base health check failed for 1 of 2: knowledge base k: 503"))
	kbDown := errors.New("every knowledge base failed its health check: knowledge base k: 503")
	if err := AnyReady(nil, nil); err != nil {
		t.Errorf("all passed: %v", err)
	}
	for _, c := range [][]error{{appsDown, nil}, {appsDown, kbDegraded}, {nil, kbDegraded}} {
		detail := degraded(t, AnyReady(c...))
		for _, err := range c {
			var d *hostsdk.DegradedError
			if errors.As(err, &d) {
				err = d.Err
			}
			if err != nil && !strings.Contains(detail, err.Error()) {
				t.Errorf("AnyReady(%v): detail %q leaves out %q", c, detail, err)
			}
		}
	}
	err := AnyReady(appsDown, kbDown)
	var d *hostsdk.DegradedError
	if err == nil || errors.As(err, &d) || !strings.Contains(err.Error(), "app a") || !strings.Contains(err.Error(), "knowledge base k") {
		t.Errorf("every kind failed: %v", err)
	}
}
