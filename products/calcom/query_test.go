package calcom

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// A list sent as one comma-separated query parameter may not carry an
// item holding a comma: Cal.diy would read it as two values, so
// usernames ["alice,mallory"] asked for mallory's slots and event types
// too. Refused (input_invalid) and nothing sent.
func TestCommaInListItemRefused(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	for _, tc := range []struct{ suffix, input string }{
		{"slot.list", `{"start":"2050-09-05","end":"2050-09-06","usernames":["alice,mallory"]}`},
		{"event_type.list", `{"usernames":["alice","bob,mallory"]}`},
	} {
		_, resp := h.act(t, tc.suffix, tc.input)
		code := ""
		if pe := resp.ProtocolError(); pe != nil {
			code = pe.Code
		} else if res, err := resp.Result(); err == nil && res.Status == aip.ResultFailed && res.Error != nil {
			code = res.Error.Code
		}
		if code != hostsdk.CodeInputInvalid {
			t.Errorf("%s %s: HTTP %d %s; want %s", tc.suffix, tc.input, resp.Status, resp.Raw, hostsdk.CodeInputInvalid)
		}
	}
	if reqs := mock.requests(); len(reqs) != 0 {
		t.Fatalf("the provider got %d requests, first %s %s?%s", len(reqs), reqs[0].Method, reqs[0].EscapedPath, reqs[0].Query)
	}
}

// build refuses the comma itself, whatever the schema says.
func TestBuildRefusesCommaInListItem(t *testing.T) {
	o := operationsByID[CapabilityPrefix+"slot.list"]
	_, err := o.build(json.RawMessage(`{"start":"2050-09-05","end":"2050-09-06","usernames":["alice,mallory"]}`))
	var pe *aip.ProtocolError
	if !errors.As(err, &pe) || pe.Code != hostsdk.CodeInputInvalid {
		t.Fatalf("build = %v, want %s", err, hostsdk.CodeInputInvalid)
	}
	r, err := o.build(json.RawMessage(`{"start":"2050-09-05","end":"2050-09-06","usernames":["alice","bob"]}`))
	if err != nil || r.query.Get("usernames") != "alice,bob" {
		t.Fatalf("build = %+v, %v", r, err)
	}
}
