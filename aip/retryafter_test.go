package aip_test

import (
	"math"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// TestRetryAfter: retry_after_ms converts without wrapping, however large
// the value a peer sends.
func TestRetryAfter(t *testing.T) {
	ms := func(v uint64) *aip.ProtocolError { return &aip.ProtocolError{RetryAfterMS: &v} }
	for _, tc := range []struct {
		e    *aip.ProtocolError
		d    time.Duration
		secs uint64
	}{
		{&aip.ProtocolError{}, 0, 0},
		{ms(0), 0, 0},
		{ms(1), time.Millisecond, 1},
		{ms(1000), time.Second, 1},
		{ms(1001), 1001 * time.Millisecond, 2},
		{ms(uint64(math.MaxInt64 / int64(time.Millisecond))), time.Duration(math.MaxInt64/int64(time.Millisecond)) * time.Millisecond, 9223372037},
		{ms(1 << 60), math.MaxInt64, 1<<60/1000 + 1},
		{ms(math.MaxUint64), math.MaxInt64, math.MaxUint64/1000 + 1},
	} {
		if d := tc.e.RetryAfter(); d != tc.d {
			t.Errorf("RetryAfter of %v ms = %v, want %v", tc.e.RetryAfterMS, d, tc.d)
		}
		if s := tc.e.RetryAfterSeconds(); s != tc.secs {
			t.Errorf("RetryAfterSeconds of %v ms = %d, want %d", tc.e.RetryAfterMS, s, tc.secs)
		}
	}
}
