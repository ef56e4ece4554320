package hermes

import (
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// JSON allows other spellings of an integer (5.0, 1e1) and the input
// schemas' "integer" accepts them (JSON Schema 2020-12 §6.1.1), so the
// host passes them on: they are read as the integers they are and sent as
// such, never refused after the host accepted them.
func TestIntegerSpellings(t *testing.T) {
	f := newFixture(t)
	a := hostsdktest.NewAction("cap:hermes_agent:main:sessions_list", `{"limit":5.0,"offset":1e1}`)
	completed(t, f.Act(t, a))
	if reqs := f.main.of(a.ID); len(reqs) != 1 || reqs[0].Query != "limit=5&offset=10" {
		t.Errorf("sessions_list limit 5.0, offset 1e1: %+v", reqs)
	}
	a = hostsdktest.NewAction("cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":6.4e1}`)
	completed(t, f.Act(t, a))
	if reqs := f.main.of(a.ID); len(reqs) != 1 {
		t.Fatalf("chat max_tokens 6.4e1: %d requests", len(reqs))
	} else {
		jsonEqual(t, "chat body", reqs[0].Body, `{"model":"hermes-agent","messages":[{"role":"user","content":"Hi"}],"stream":false,"max_tokens":64}`)
	}
	f.main.setRunEvents(sse("message.delta\x00"+`{"delta":"a"}`, "message.delta\x00"+`{"delta":"b"}`))
	a = hostsdktest.NewAction("cap:hermes_agent:main:run_events", `{"run_id":"run_abc123","max_events":1.0}`)
	if out := completed(t, f.Act(t, a)); out["count"] != float64(1) || out["max_events_reached"] != true {
		t.Errorf("run_events max_events 1.0: %v", out)
	}
}
