package hermes

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

type chunkSeen struct {
	Kind aip.ChunkKind
	Data string
}

func chunksOf(t *testing.T, resp *hostsdktest.Response) []chunkSeen {
	t.Helper()
	var got []chunkSeen
	for _, c := range resp.Chunks {
		var v any
		if err := json.Unmarshal(c.Data, &v); err != nil {
			t.Fatalf("chunk data %s: %v", c.Data, err)
		}
		got = append(got, chunkSeen{c.Kind, string(mustJSON(t, v))})
	}
	return got
}

// runEventsStream is a run's event stream as § GET /v1/runs/{run_id}/events
// names its events: answer deltas, reasoning deltas, tool progress,
// subagent lifecycle and the run's end.
var runEventsStream = sse(
	"tool.started\x00"+`{"tool":"terminal"}`,
	"reasoning.delta\x00"+`{"delta":"thinking"}`,
	"message.delta\x00"+`{"delta":"Done"}`,
	"subagent.complete\x00"+`{"status":"completed","child_session_id":"c1","delegation_id":"d1"}`,
	`{"event":"run.completed","status":"completed"}`,
)

// TestRunEventsStream: in streaming mode each event is forwarded as a
// chunk of its kind; the result counts them.
func TestRunEventsStream(t *testing.T) {
	f := newFixture(t)
	f.main.setRunEvents(runEventsStream)
	a := hostsdktest.NewAction("cap:hermes_agent:main:run_events", `{"run_id":"run_abc123"}`)
	a.Mode = aip.ModeStreaming
	resp := f.Act(t, a)
	want := []chunkSeen{
		{aip.ChunkTool, `{"data":{"tool":"terminal"},"event":"tool.started"}`},
		{aip.ChunkThought, `{"data":{"delta":"thinking"},"event":"reasoning.delta"}`},
		{aip.ChunkData, `{"data":{"delta":"Done"},"event":"message.delta"}`},
		{aip.ChunkProgress, `{"data":{"child_session_id":"c1","delegation_id":"d1","status":"completed"},"event":"subagent.complete"}`},
		{aip.ChunkProgress, `{"data":{"event":"run.completed","status":"completed"},"event":"run.completed"}`},
	}
	if d := cmp.Diff(want, chunksOf(t, resp)); d != "" {
		t.Errorf("chunks (-want +got):\n%s", d)
	}
	jsonEqual(t, "output", string(mustJSON(t, completed(t, resp))), `{"run_id":"run_abc123","count":5}`)
	reqs := f.main.of(a.ID)
	if len(reqs) != 1 || reqs[0].Method != "GET" || reqs[0].Path != "/v1/runs/run_abc123/events" || reqs[0].Body != "" {
		t.Fatalf("requests %+v", reqs)
	}
	if h := reqs[0].Header; h.Get("Accept") != "text/event-stream" || h.Get("Authorization") != "Bearer "+keyMain || h.Get("Idempotency-Key") != "" {
		t.Errorf("headers %v", h)
	}
}

// TestRunEventsMaxEvents: reading stops at max_events and says so.
func TestRunEventsMaxEvents(t *testing.T) {
	f := newFixture(t)
	f.main.setRunEvents(runEventsStream)
	out := completed(t, f.Act(t, hostsdktest.NewAction("cap:hermes_agent:main:run_events", `{"run_id":"run_abc123","max_events":2}`)))
	jsonEqual(t, "output", string(mustJSON(t, out)), `{"run_id":"run_abc123","count":2,"max_events_reached":true,"events":[
		{"event":"tool.started","data":{"tool":"terminal"}},{"event":"reasoning.delta","data":{"delta":"thinking"}}]}`)
}

// TestRunEventsOpenAtTimeout: a live run's event stream stays open; when
// the action's timeout ends the read, the events read are the result
// (stream_open: true), in both modes, not a failure that drops them.
func TestRunEventsOpenAtTimeout(t *testing.T) {
	f := newFixture(t)
	f.main.setRunEvents(sse("tool.started\x00"+`{"tool":"terminal"}`, "message.delta\x00"+`{"delta":"Do"}`))
	f.main.setRunEventsOpen(true)
	for _, mode := range []aip.ActionMode{aip.ModeSync, aip.ModeStreaming} {
		a := hostsdktest.NewAction("cap:hermes_agent:main:run_events", `{"run_id":"run_abc123"}`)
		a.Mode = mode
		timeout := uint64(300)
		a.TimeoutMS = &timeout
		out := completed(t, f.Act(t, a))
		want := `{"run_id":"run_abc123","count":2,"stream_open":true,"events":[
			{"event":"tool.started","data":{"tool":"terminal"}},{"event":"message.delta","data":{"delta":"Do"}}]}`
		if mode == aip.ModeStreaming {
			want = `{"run_id":"run_abc123","count":2,"stream_open":true}`
		}
		jsonEqual(t, string(mode)+" output", string(mustJSON(t, out)), want)
	}
}

// TestRunEventsErrors: run_events is a read: a 4xx is failed, a 5xx or
// no answer failed and retryable, never outcome_unknown.
func TestRunEventsErrors(t *testing.T) {
	f := newFixture(t)
	for _, mode := range []aip.ActionMode{aip.ModeSync, aip.ModeStreaming} {
		t.Run(string(mode), func(t *testing.T) {
			a := hostsdktest.NewAction("cap:hermes_agent:main:run_events", `{"run_id":"run_other"}`)
			a.Mode = mode
			failedWith(t, f.Act(t, a), provider.CodeNotFound, false)

			f.alice.setFail("GET", "/p/alice/v1/runs/run_abc123/events", http.StatusServiceUnavailable)
			a = hostsdktest.NewAction("cap:hermes_agent:alice:run_events", `{"run_id":"run_abc123"}`)
			a.Mode = mode
			failedWith(t, f.Act(t, a), provider.CodeUnavailable, true)

			f.main.setDrop("GET", "/v1/runs/run_dropped/events")
			a = hostsdktest.NewAction("cap:hermes_agent:main:run_events", `{"run_id":"run_dropped"}`)
			a.Mode = mode
			failedWith(t, f.Act(t, a), provider.CodeUnavailable, true)
		})
	}
}

// TestSessionChatStream: session_chat in streaming mode posts to
// /chat/stream, forwards the events before run.completed as chunks and
// returns run.completed's data.
func TestSessionChatStream(t *testing.T) {
	f := newFixture(t)
	f.main.setSessionStream(sse(
		"reasoning.delta\x00"+`{"delta":"look at git"}`,
		"tool.started\x00"+`{"tool":"terminal","args":{"command":"git log"}}`,
		"tool.completed\x00"+`{"tool":"terminal"}`,
		"assistant.delta\x00"+`{"delta":"Two files."}`,
		"run.completed\x00"+`{"run_id":"run_9","output":"Two files."}`,
		"assistant.delta\x00"+`{"delta":"after the end"}`,
	))
	a := hostsdktest.NewAction("cap:hermes_agent:main:session_chat", `{"session_id":"space-session","input":"what files changed in the last hour?","model":"MiniMax-M3"}`)
	a.Mode = aip.ModeStreaming
	a.IdempotencyKey = "turn-7"
	resp := f.Act(t, a)
	want := []chunkSeen{
		{aip.ChunkThought, `{"data":{"delta":"look at git"},"event":"reasoning.delta"}`},
		{aip.ChunkTool, `{"data":{"args":{"command":"git log"},"tool":"terminal"},"event":"tool.started"}`},
		{aip.ChunkTool, `{"data":{"tool":"terminal"},"event":"tool.completed"}`},
		{aip.ChunkData, `{"data":{"delta":"Two files."},"event":"assistant.delta"}`},
	}
	if d := cmp.Diff(want, chunksOf(t, resp)); d != "" {
		t.Errorf("chunks (-want +got):\n%s", d)
	}
	jsonEqual(t, "output", string(mustJSON(t, completed(t, resp))), `{"events":4,"run_completed":{"run_id":"run_9","output":"Two files."}}`)
	reqs := f.main.of(a.ID)
	if len(reqs) != 1 || reqs[0].Method != "POST" || reqs[0].Path != "/api/sessions/space-session/chat/stream" {
		t.Fatalf("requests %+v", reqs)
	}
	jsonEqual(t, "request body", reqs[0].Body, `{"input":"what files changed in the last hour?","model":"MiniMax-M3"}`)
	h := reqs[0].Header
	if h.Get("Accept") != "text/event-stream" || h.Get("Content-Type") != "application/json" ||
		h.Get("Authorization") != "Bearer "+keyMain || h.Get("Idempotency-Key") != scopedKey(a, "turn-7") || h.Get(CorrelationHeader) != a.ID {
		t.Errorf("headers %v", h)
	}
}

// TestSessionChatStreamOutcomeUnknown: the turn ran, so a stream that
// ends before run.completed, a 5xx or a dropped connection is
// outcome_unknown, and the action is not sent again.
func TestSessionChatStreamOutcomeUnknown(t *testing.T) {
	f := newFixture(t)
	t.Run("no run.completed", func(t *testing.T) {
		f.main.setSessionStream(sse("assistant.delta\x00" + `{"delta":"Two"}`))
		a := hostsdktest.NewAction("cap:hermes_agent:main:session_chat", `{"session_id":"s1","input":"x"}`)
		a.Mode = aip.ModeStreaming
		f.outcomeUnknown(t, f.Act(t, a), a, f.main)
	})
	t.Run("cut inside run.completed", func(t *testing.T) {
		f.main.setSessionStream(sse("assistant.delta\x00"+`{"delta":"Two"}`) + "event: run.completed\ndata: {\"run_id\"")
		a := hostsdktest.NewAction("cap:hermes_agent:main:session_chat", `{"session_id":"s2","input":"x"}`)
		a.Mode = aip.ModeStreaming
		f.outcomeUnknown(t, f.Act(t, a), a, f.main)
	})
	t.Run("5xx", func(t *testing.T) {
		f.alice.setFail("POST", "/p/alice/api/sessions/s3/chat/stream", http.StatusBadGateway)
		a := hostsdktest.NewAction("cap:hermes_agent:alice:session_chat", `{"session_id":"s3","input":"x"}`)
		a.Mode = aip.ModeStreaming
		f.outcomeUnknown(t, f.Act(t, a), a, f.alice)
	})
	t.Run("4xx", func(t *testing.T) {
		f.main.setFail("POST", "/api/sessions/s4/chat/stream", http.StatusTooManyRequests)
		a := hostsdktest.NewAction("cap:hermes_agent:main:session_chat", `{"session_id":"s4","input":"x"}`)
		a.Mode = aip.ModeStreaming
		failedWith(t, f.Act(t, a), provider.CodeRateLimited, true)
	})
}

// TestRunEventsStreamBound: a stream past --hermes-max-response-bytes is a
// failed, non-retryable read that names the setting.
func TestRunEventsStreamBound(t *testing.T) {
	f := newFixtureWith(t, 1024)
	f.main.setRunEvents(strings.Repeat(sse("message.delta\x00"+`{"delta":"0123456789"}`), 60))
	for _, mode := range []aip.ActionMode{aip.ModeSync, aip.ModeStreaming} {
		a := hostsdktest.NewAction("cap:hermes_agent:main:run_events", `{"run_id":"run_abc123"}`)
		a.Mode = mode
		resp := f.Act(t, a)
		failedWith(t, resp, provider.CodeBadResponse, false)
		if res, _ := resp.Result(); !strings.Contains(res.Error.Message, "--hermes-max-response-bytes") {
			t.Errorf("%s: message %q", mode, res.Error.Message)
		}
	}
}
