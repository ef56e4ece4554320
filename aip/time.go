package aip

import (
	"bytes"
	"errors"
	"fmt"
	"time"
)

// TimestampLayout is the wire form of every AIP timestamp: RFC 3339 in UTC
// with millisecond precision, written as the Rust time crate writes it
// (reference 12.5): the fraction without trailing zeros, and none at all on
// a whole second ("…:05Z", "…:05.69Z", "…:05.678Z"). Upstream verifies a
// signature over its own re-serialization of the parsed message, so any
// other spelling ("…:05.690Z") breaks signatures and digests there.
const TimestampLayout = "2006-01-02T15:04:05.999Z07:00"

// Timestamp is a point in time that travels as an RFC 3339 UTC string with
// millisecond precision (see TimestampLayout). Any RFC 3339 form is
// accepted when decoding.
// The zero Timestamp is omitted by fields tagged omitzero.
type Timestamp struct{ time.Time }

// At returns t truncated to milliseconds, in UTC.
func At(t time.Time) Timestamp { return Timestamp{t.UTC().Truncate(time.Millisecond)} }

// MarshalJSON implements json.Marshaler. A time whose UTC year is outside
// 0000..9999 has no RFC 3339 form and is an error.
func (t Timestamp) MarshalJSON() ([]byte, error) {
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return nil, fmt.Errorf("aip: timestamp %s: year %d is outside RFC 3339's 0000..9999", t.Time, y)
	}
	b := make([]byte, 0, len(TimestampLayout)+2)
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, TimestampLayout)
	return append(b, '"'), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (t *Timestamp) UnmarshalJSON(data []byte) error {
	if bytes.Equal(data, []byte("null")) {
		*t = Timestamp{}
		return nil
	}
	if len(data) < 2 || data[0] != '"' || data[len(data)-1] != '"' {
		return fmt.Errorf("aip: timestamp must be an RFC 3339 string, got %s", data)
	}
	text := string(data[1 : len(data)-1])
	parsed, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return fmt.Errorf("aip: timestamp %s is not RFC 3339: %w", data, err)
	}
	if err := checkRFC3339Extras(text); err != nil {
		return fmt.Errorf("aip: timestamp %s is not RFC 3339: %w", data, err)
	}
	if y := parsed.UTC().Year(); y < 0 || y > 9999 {
		return fmt.Errorf("aip: timestamp %s is year %d in UTC, outside RFC 3339's 0000..9999", data, y)
	}
	t.Time = parsed.UTC()
	return nil
}

// String returns the wire form.
func (t Timestamp) String() string { return t.UTC().Format(TimestampLayout) }

// checkRFC3339Extras refuses what time.Parse accepts beyond RFC 3339 in a
// text it parsed with time.RFC3339Nano: a comma before the fraction, and
// an offset hour above 23 or minute above 59.
func checkRFC3339Extras(text string) error {
	if len(text) > 19 && text[19] == ',' {
		return errors.New("the fraction must follow a '.', not a ','")
	}
	if n := len(text); n >= 6 && (text[n-6] == '+' || text[n-6] == '-') {
		h := int(text[n-5]-'0')*10 + int(text[n-4]-'0')
		m := int(text[n-2]-'0')*10 + int(text[n-1]-'0')
		if h > 23 || m > 59 {
			return fmt.Errorf("offset %s is outside -23:59..+23:59", text[n-6:])
		}
	}
	return nil
}
