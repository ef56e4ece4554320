package aip

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

// The input of RFC 8785 section 3.2.2, canonicalized as serde_json prints
// it (the numbers differ from RFC 8785's: 1e30, not 1e+30).
func TestCanonicalizeRFC8785Example(t *testing.T) {
	in := `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`
	got, err := Canonicalize([]byte(in))
	if err != nil {
		t.Fatalf("Canonicalize: %v", err)
	}
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// Member names sort by their UTF-8 bytes, as Rust orders Strings (the
// input is RFC 8785 section 3.2.3's, whose UTF-16 order puts the emoji
// before U+FB33; byte order puts it after).
func TestCanonicalizeSortsNamesByBytes(t *testing.T) {
	in := `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
	want := "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\",\"😀\":\"Emoji: Grinning Face\"}"
	got, err := Canonicalize([]byte(in))
	if err != nil {
		t.Fatalf("Canonicalize: %v", err)
	}
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	// U+FFFF (EF BF BF) sorts before U+10000 (F0 90 80 80) by bytes.
	got, err = Canonicalize([]byte("{\"\U00010000\":1,\"\uffff\":2}"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\"\uffff\":2,\"\U00010000\":1}"; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// Doubles print as serde_json prints an f64 (the ryu crate's format). The
// bit patterns are RFC 8785 appendix B's; the expected forms are ryu's.
func TestAppendNumberSerdeJSONVectors(t *testing.T) {
	tests := []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0.0"},
		{0x8000000000000000, "-0.0"},
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e308"},
		{0xffefffffffffffff, "-1.7976931348623157e308"},
		{0x4340000000000000, "9007199254740992.0"},
		{0xc340000000000000, "-9007199254740992.0"},
		{0x4430000000000000, "2.9514790517935283e20"},
		{0x44b52d02c7e14af5, "9.999999999999997e22"},
		{0x44b52d02c7e14af6, "1e23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e23"},
		{0x444b1ae4d6e2ef50, "1e21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "1e-6"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0xbecbf647612f3696, "-3.3333333333333333e-6"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	}
	for _, tt := range tests {
		f := math.Float64frombits(tt.bits)
		if got := string(AppendNumber(nil, f)); got != tt.want {
			t.Errorf("AppendNumber(%#016x) = %s, want %s", tt.bits, got, tt.want)
		}
		// The same value written as JSON text with a fraction or an
		// exponent (so it is a double, not an integer) canonicalizes
		// identically.
		lit := strconv.FormatFloat(f, 'e', -1, 64)
		got, err := Canonicalize([]byte(lit))
		if err != nil {
			t.Errorf("Canonicalize(%s): %v", lit, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("Canonicalize(%s) = %s, want %s", lit, got, tt.want)
		}
	}
	// ryu's own test vectors (value, pretty form).
	for f, want := range map[float64]string{
		0.3: "0.3", 1.234e15: "1234000000000000.0", 1.234e16: "1.234e16",
		2.71828: "2.71828", 1.1e128: "1.1e128", 1.1e-64: "1.1e-64", 1: "1.0", -1: "-1.0",
		-2.109808898695963e16: "-2.109808898695963e16", 9.0608011534336e15: "9060801153433600.0",
		4.708356024711512e18: "4.708356024711512e18", 2.9802322387695312e-8: "2.9802322387695312e-8",
		0.0001: "0.0001", 0.00001: "0.00001", 0.000001: "1e-6", 123.456: "123.456",
	} {
		if got := string(AppendNumber(nil, f)); got != want {
			t.Errorf("AppendNumber(%v) = %s, want %s", f, got, want)
		}
	}
}

func TestCanonicalizeForms(t *testing.T) {
	tests := []struct{ in, want string }{
		{`  {"b" : 1 , "a" : [ 1 , 2 ] }  `, `{"a":[1,2],"b":1}`},
		{`-0`, `-0.0`}, // serde_json reads -0 as the double -0.0
		{`-0.0`, `-0.0`},
		{`0`, `0`},
		{`1.0`, `1.0`},
		{`1.50`, `1.5`},
		{`1E2`, `100.0`},
		{`1e-400`, `0.0`}, // underflows to zero, as in serde_json
		{`123456789012345678901234`, `1.2345678901234569e23`},
		{`18446744073709551616`, `1.8446744073709552e19`},    // u64 max + 1
		{`-9223372036854775809`, `-9.223372036854776e18`},    // i64 min - 1
		{`"<>&\u2028\u2029"`, "\"<>&\u2028\u2029\""},         // no HTML or JS escaping
		{`"\u0000\u001f\u007f"`, "\"\\u0000\\u001f\u007f\""}, // control characters only
		{`"\/"`, `"/"`}, // solidus unescaped
		{`{"a":{"d":1,"c":2},"b":[{"z":0,"y":0}]}`, `{"a":{"c":2,"d":1},"b":[{"y":0,"z":0}]}`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{`"é"`, `"é"`},
	}
	for _, tt := range tests {
		got, err := Canonicalize([]byte(tt.in))
		if err != nil {
			t.Errorf("Canonicalize(%s): %v", tt.in, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("Canonicalize(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	tests := map[string]string{
		"duplicate member":  `{"a":1,"a":2}`,
		"escaped duplicate": `{"a":1,"\u0061":2}`,
		"lone high":         `"\ud83d"`,
		"lone low":          `"\ude00"`,
		"invalid utf-8":     "\"\xff\"",
		"trailing data":     `{} {}`,
		"trailing comma":    `[1,]`,
		"leading zero":      `01`,
		"bare dot":          `1.`,
		"out of range":      `1e400`,
		"control in string": "\"a\nb\"",
		"single quotes":     `'a'`,
		"empty":             ``,
		"unterminated":      `{"a":`,
		"bad escape":        `"\x"`,
		"NaN literal":       `NaN`,
		"missing colon":     `{"a" 1}`,
		"deep nesting":      strings.Repeat("[", maxCanonicalDepth+1) + strings.Repeat("]", maxCanonicalDepth+1),
		"non-string name":   `{1:2}`,
		"truncated literal": `tru`,
		"plus sign":         `+1`,
	}
	for name, in := range tests {
		if got, err := Canonicalize([]byte(in)); !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("%s: Canonicalize(%q) = %q, %v; want ErrInvalidJSON", name, in, got, err)
		}
	}
}

func TestCanonicalJSONOfStruct(t *testing.T) {
	got, err := CanonicalJSON(struct {
		B string `json:"b"`
		A int    `json:"a"`
	}{"<x>", 2})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":2,"b":"<x>"}`; string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestDigest(t *testing.T) {
	d, err := DigestJSON([]byte(`{"b":1,"a":2}`))
	if err != nil {
		t.Fatal(err)
	}
	// sha256 of {"a":2,"b":1}
	if want := "sha256:d3626ac30a87e6f7a6428233b3c68299976865fa5508e4267c5415c76af7a772"; d != want {
		t.Fatalf("digest = %s, want %s", d, want)
	}
	if err := ValidateDigest(d); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "sha256:", "sha256:" + strings.Repeat("A", 64), "md5:" + strings.Repeat("a", 64), d + "0"} {
		if err := ValidateDigest(bad); !errors.Is(err, ErrInvalidDigest) {
			t.Errorf("ValidateDigest(%q) = %v, want ErrInvalidDigest", bad, err)
		}
	}
}

// Integers that fit serde_json's u64 (or, negative, i64) travel exactly:
// canonicalization must not round them through a double, and Seal and
// SignEnvelope send the canonical bytes, so rounding would change the data.
func TestCanonicalizeKeepsIntegersExact(t *testing.T) {
	for _, in := range []string{
		`9007199254740993`,     // 2^53 + 1: not a double
		`1234567890123456789`,  // a snowflake-style ID
		`18446744073709551615`, // u64 max
		`-9223372036854775808`, // i64 min
		`-9007199254740993`,
		`{"sequence":9223372036854775809}`,
	} {
		got, err := Canonicalize([]byte(in))
		if err != nil {
			t.Errorf("Canonicalize(%s): %v", in, err)
			continue
		}
		if string(got) != in {
			t.Errorf("Canonicalize(%s) = %s, want it unchanged", in, got)
		}
	}

	key := hostKey(t)
	hb := Heartbeat{ReplicaID: "crepl_0194a3b2c1d07e3f8a9b0c1d2e3f4a01", PreviousSequence: 1<<63 + 1}
	sealed, err := Seal(key, SignedRequestField, hb)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(sealed, SignedRequestField)
	if err != nil {
		t.Fatal(err)
	}
	var back Heartbeat
	if err := s.Decode(&back); err != nil {
		t.Fatalf("decode the sealed heartbeat: %v", err)
	}
	if back.PreviousSequence != hb.PreviousSequence {
		t.Fatalf("previous_sequence sealed as %d, want %d", back.PreviousSequence, hb.PreviousSequence)
	}
}
