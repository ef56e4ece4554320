package hostsdk

import (
	"testing"

	"github.com/aipfleet/aipfleet/aip"
)

// TestLeaseGone: only a heartbeat's or a drain's definitive refusal under
// the sequence or state rule says the lease is gone; other refusals, and
// an offline's (which needs no lease), say nothing of it.
func TestLeaseGone(t *testing.T) {
	for _, c := range []struct {
		op, code, message string
		gone              bool
	}{
		{"heartbeat", aip.CodeControlRejected, "state: replica crepl_1 is offline; register again", true},
		{"heartbeat", aip.CodeControlRejected, "state: the lease of replica crepl_1 expired at 2026-01-01T00:00:00Z; register again", true},
		{"heartbeat", aip.CodeControlRejected, "sequence: replica crepl_1 lost its lease-sequence fence: previous_sequence 3, but the registry is at 5", true},
		{"heartbeat", aip.CodeControlRejected, "sequence: replica crepl_1 is already offline: its lease ran out", true},
		{"heartbeat", aip.CodeControlRejected, "capacity: in_flight 5 exceeds the replica's admitted capacity 4", false},
		{"heartbeat", aip.CodeControlRejected, "replay: request msg_1 was already consumed by another lifecycle decision; send a new request ID", false},
		{"heartbeat", aip.CodeControlRejected, "injected: the request is rejected", false},
		{"heartbeat", aip.CodeControlRejected, "request expired: state: is not a rule here", false},
		{"heartbeat", aip.CodeControlUnavailable, "state: not a definitive refusal", false},
		{"register", aip.CodeControlRejected, "state: a registration's refusal", false},
		{"drain", aip.CodeControlRejected, "state: replica crepl_1 is offline; register again", true},
		{"drain", aip.CodeControlRejected, "sequence: replica crepl_1 lost its lease-sequence fence: previous_sequence 3, but the registry is at 5", true},
		{"drain", aip.CodeControlRejected, "injected: the request is rejected", false},
		{"offline", aip.CodeControlRejected, "sequence: replica crepl_1 is already offline: its lease ran out", false},
	} {
		rej := &ControlRejectedError{Operation: c.op, Code: c.code, Message: c.message}
		if got := leaseGone(rej); got != c.gone {
			t.Errorf("leaseGone(%s %s %q) = %v, want %v", c.op, c.code, c.message, got, c.gone)
		}
	}
}
