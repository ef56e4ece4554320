package aip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrInvalidJSON is returned (wrapped) when a document is not valid I-JSON
// (RFC 7493): malformed text, duplicate object member names, lone UTF-16
// surrogates, invalid UTF-8, numbers outside the IEEE 754 double range, or data
// after the top-level value.
var ErrInvalidJSON = errors.New("aip: invalid JSON")

// maxCanonicalDepth bounds nesting so hostile input cannot exhaust the stack.
const maxCanonicalDepth = 256

// Canonicalize returns the canonical form of the JSON text data, as the
// reference computes it with serde_json (sorted keys, compact output; not
// RFC 8785): object members sorted by the UTF-8 bytes of their names (Rust's
// String order), no insignificant whitespace, numbers as serde_json prints them (integers within u64/i64
// unchanged, other numbers as the shortest round-tripping double, see
// AppendNumber) and minimal string escaping (no HTML escaping).
func Canonicalize(data []byte) ([]byte, error) {
	return AppendCanonical(nil, data)
}

// AppendCanonical appends the canonical form of data to dst.
func AppendCanonical(dst, data []byte) ([]byte, error) {
	c := getCanonicalizer(data, dst)
	defer putCanonicalizer(c)
	if err := c.document(nil); err != nil {
		return dst, err
	}
	return c.out, nil
}

// CanonicalJSON marshals v with encoding/json and returns its canonical form.
func CanonicalJSON(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("aip: marshal for canonical JSON: %w", err)
	}
	return Canonicalize(raw)
}

// canonicalized is the result of canonicalizeWithout.
type canonicalized struct {
	canonical []byte
	removed   []byte // canonical value of the member left out; nil if absent
	members   int    // members of the top-level object, the removed one included
	// foldable reports a member name (anywhere) with a character
	// encoding/json folds when it matches names to fields: an ASCII upper
	// case letter, U+212A or U+017F. Without one, no member can bind to a
	// lower case field name other than its own (see checkMemberNames).
	foldable bool
}

// canonicalizeWithout canonicalizes data while leaving out the member named by
// path (for example security.signature), whose canonical value is returned
// separately. A missing member is not an error: removed is nil.
func canonicalizeWithout(data []byte, path ...string) (canonicalized, error) {
	c := getCanonicalizer(data, nil)
	defer putCanonicalizer(c)
	if err := c.document(path); err != nil {
		return canonicalized{}, err
	}
	r := canonicalized{canonical: c.out, members: c.topMembers, foldable: c.foldable}
	if c.removedSet {
		r.removed = append([]byte(nil), c.removed...)
	}
	return r, nil
}

type canonMember struct {
	keyStart, keyEnd int // decoded name in keys
	start, end       int // canonical "name":value in out
}

type canonicalizer struct {
	data []byte
	pos  int
	out  []byte

	keys    []byte        // arena of decoded member names (stack discipline)
	members []canonMember // stack of members of the objects being parsed
	scratch []byte        // reorder buffer

	removed    []byte
	removedSet bool
	topMembers int
	foldable   bool
}

var canonPool = sync.Pool{New: func() any { return new(canonicalizer) }}

func getCanonicalizer(data, dst []byte) *canonicalizer {
	c := canonPool.Get().(*canonicalizer)
	c.data, c.pos = data, 0
	if dst == nil {
		dst = make([]byte, 0, len(data))
	}
	c.out = dst
	c.keys, c.members, c.scratch = c.keys[:0], c.members[:0], c.scratch[:0]
	c.removed, c.removedSet, c.topMembers, c.foldable = nil, false, 0, false
	return c
}

func putCanonicalizer(c *canonicalizer) {
	c.data, c.out, c.removed = nil, nil, nil
	if cap(c.scratch) > 1<<20 {
		c.scratch = nil
	}
	if cap(c.keys) > 1<<16 {
		c.keys = nil
	}
	canonPool.Put(c)
}

func (c *canonicalizer) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalidJSON, fmt.Sprintf(format, args...), c.pos)
}

func (c *canonicalizer) document(skip []string) error {
	c.skipSpace()
	if err := c.value(0, skip); err != nil {
		return err
	}
	c.skipSpace()
	if c.pos != len(c.data) {
		return c.errorf("unexpected data after the top-level value")
	}
	return nil
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.data) {
		switch c.data[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonicalizer) value(depth int, skip []string) error {
	if c.pos >= len(c.data) {
		return c.errorf("unexpected end of input")
	}
	switch b := c.data[c.pos]; {
	case b == '{':
		return c.object(depth, skip)
	case b == '[':
		return c.array(depth)
	case b == '"':
		return c.str(nil)
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	case b == '-' || (b >= '0' && b <= '9'):
		return c.number()
	default:
		return c.errorf("unexpected character %q", b)
	}
}

func (c *canonicalizer) literal(lit string) error {
	if len(c.data)-c.pos < len(lit) || string(c.data[c.pos:c.pos+len(lit)]) != lit {
		return c.errorf("invalid literal")
	}
	c.pos += len(lit)
	c.out = append(c.out, lit...)
	return nil
}

func (c *canonicalizer) array(depth int) error {
	if depth >= maxCanonicalDepth {
		return c.errorf("nesting deeper than %d levels", maxCanonicalDepth)
	}
	c.pos++ // [
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		return nil
	}
	for {
		c.skipSpace()
		if err := c.value(depth+1, nil); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.data) {
			return c.errorf("unterminated array")
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			return nil
		default:
			return c.errorf("expected ',' or ']' in array")
		}
	}
}

func (c *canonicalizer) object(depth int, skip []string) error {
	if depth >= maxCanonicalDepth {
		return c.errorf("nesting deeper than %d levels", maxCanonicalDepth)
	}
	c.pos++ // {
	objStart := len(c.out)
	c.out = append(c.out, '{')
	keysBase, membersBase := len(c.keys), len(c.members)
	defer func() {
		c.keys = c.keys[:keysBase]
		c.members = c.members[:membersBase]
	}()

	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		return nil
	}
	for {
		c.skipSpace()
		if c.pos >= len(c.data) || c.data[c.pos] != '"' {
			return c.errorf("expected a member name")
		}
		memberStart := len(c.out)
		keyStart := len(c.keys)
		if err := c.str(&c.keys); err != nil {
			return err
		}
		keyEnd := len(c.keys)
		if !c.foldable {
			c.foldable = hasFoldable(c.keys[keyStart:keyEnd])
		}
		c.skipSpace()
		if c.pos >= len(c.data) || c.data[c.pos] != ':' {
			return c.errorf("expected ':' after a member name")
		}
		c.pos++
		c.out = append(c.out, ':')
		c.skipSpace()

		var childSkip []string
		dropped := false
		if len(skip) > 0 && string(c.keys[keyStart:keyEnd]) == skip[0] {
			if len(skip) == 1 {
				dropped = true
			} else {
				childSkip = skip[1:]
			}
		}
		valueStart := len(c.out)
		if err := c.value(depth+1, childSkip); err != nil {
			return err
		}
		if dropped {
			c.removed = append(c.removed[:0], c.out[valueStart:]...)
			c.removedSet = true
			c.out = c.out[:memberStart]
			// Keep the name for the duplicate check, with an empty span.
			c.members = append(c.members, canonMember{keyStart, keyEnd, -1, -1})
		} else {
			c.members = append(c.members, canonMember{keyStart, keyEnd, memberStart, len(c.out)})
		}

		c.skipSpace()
		if c.pos >= len(c.data) {
			return c.errorf("unterminated object")
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
			continue
		case '}':
			c.pos++
		default:
			return c.errorf("expected ',' or '}' in object")
		}
		break
	}

	ms := c.members[membersBase:]
	if depth == 0 {
		c.topMembers = len(ms)
	}
	keys := c.keys
	slices.SortFunc(ms, func(a, b canonMember) int {
		return bytes.Compare(keys[a.keyStart:a.keyEnd], keys[b.keyStart:b.keyEnd])
	})
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(keys[ms[i-1].keyStart:ms[i-1].keyEnd], keys[ms[i].keyStart:ms[i].keyEnd]) {
			return fmt.Errorf("%w: duplicate member name %q", ErrInvalidJSON, keys[ms[i].keyStart:ms[i].keyEnd])
		}
	}

	// Rewrite the members in sorted order.
	c.scratch = append(c.scratch[:0], c.out[objStart+1:]...)
	c.out = c.out[:objStart+1]
	base := objStart + 1
	first := true
	for _, m := range ms {
		if m.start < 0 {
			continue
		}
		if !first {
			c.out = append(c.out, ',')
		}
		first = false
		c.out = append(c.out, c.scratch[m.start-base:m.end-base]...)
	}
	c.out = append(c.out, '}')
	return nil
}

// hasFoldable reports whether name holds an ASCII upper case letter,
// U+212A KELVIN SIGN or U+017F LATIN SMALL LETTER LONG S: the characters
// encoding/json's case-insensitive matching folds onto lower case ASCII.
func hasFoldable(name []byte) bool {
	for i, b := range name {
		switch {
		case b >= 'A' && b <= 'Z':
			return true
		case b == 0xe2 && i+2 < len(name) && name[i+1] == 0x84 && name[i+2] == 0xaa: // U+212A
			return true
		case b == 0xc5 && i+1 < len(name) && name[i+1] == 0xbf: // U+017F
			return true
		}
	}
	return false
}

const hexDigits = "0123456789abcdef"

// str parses a JSON string at c.pos, writes its canonical form to c.out and,
// when decoded is not nil, appends the decoded bytes to *decoded.
func (c *canonicalizer) str(decoded *[]byte) error {
	c.pos++ // opening quote
	c.out = append(c.out, '"')
	for {
		// Fast path: a run of bytes that need no escaping.
		start := c.pos
		for c.pos < len(c.data) {
			b := c.data[c.pos]
			if b == '"' || b == '\\' || b < 0x20 || b >= utf8.RuneSelf {
				break
			}
			c.pos++
		}
		if c.pos > start {
			c.out = append(c.out, c.data[start:c.pos]...)
			if decoded != nil {
				*decoded = append(*decoded, c.data[start:c.pos]...)
			}
		}
		if c.pos >= len(c.data) {
			return c.errorf("unterminated string")
		}
		b := c.data[c.pos]
		switch {
		case b == '"':
			c.pos++
			c.out = append(c.out, '"')
			return nil
		case b < 0x20:
			return c.errorf("control character in string")
		case b >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(c.data[c.pos:])
			if r == utf8.RuneError && n <= 1 {
				return c.errorf("invalid UTF-8 in string")
			}
			c.out = append(c.out, c.data[c.pos:c.pos+n]...)
			if decoded != nil {
				*decoded = append(*decoded, c.data[c.pos:c.pos+n]...)
			}
			c.pos += n
		default: // backslash
			r, err := c.escape()
			if err != nil {
				return err
			}
			c.writeRune(r)
			if decoded != nil {
				*decoded = utf8.AppendRune(*decoded, r)
			}
		}
	}
}

func (c *canonicalizer) escape() (rune, error) {
	c.pos++ // backslash
	if c.pos >= len(c.data) {
		return 0, c.errorf("unterminated escape")
	}
	e := c.data[c.pos]
	c.pos++
	switch e {
	case '"':
		return '"', nil
	case '\\':
		return '\\', nil
	case '/':
		return '/', nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r1, err := c.hex4()
		if err != nil {
			return 0, err
		}
		if !utf16.IsSurrogate(r1) {
			return r1, nil
		}
		if r1 >= 0xDC00 {
			return 0, c.errorf("lone low surrogate")
		}
		if len(c.data)-c.pos < 2 || c.data[c.pos] != '\\' || c.data[c.pos+1] != 'u' {
			return 0, c.errorf("lone high surrogate")
		}
		c.pos += 2
		r2, err := c.hex4()
		if err != nil {
			return 0, err
		}
		r := utf16.DecodeRune(r1, r2)
		if r == utf8.RuneError {
			return 0, c.errorf("invalid surrogate pair")
		}
		return r, nil
	default:
		return 0, c.errorf("invalid escape character %q", e)
	}
}

func (c *canonicalizer) hex4() (rune, error) {
	if len(c.data)-c.pos < 4 {
		return 0, c.errorf("short \\u escape")
	}
	var r rune
	for _, h := range c.data[c.pos : c.pos+4] {
		r <<= 4
		switch {
		case h >= '0' && h <= '9':
			r |= rune(h - '0')
		case h >= 'a' && h <= 'f':
			r |= rune(h - 'a' + 10)
		case h >= 'A' && h <= 'F':
			r |= rune(h - 'A' + 10)
		default:
			return 0, c.errorf("invalid hex digit in \\u escape")
		}
	}
	c.pos += 4
	return r, nil
}

// writeRune writes r with minimal escaping, as serde_json does: only the
// quote, the backslash and control characters are escaped.
func (c *canonicalizer) writeRune(r rune) {
	switch r {
	case '"':
		c.out = append(c.out, '\\', '"')
	case '\\':
		c.out = append(c.out, '\\', '\\')
	case '\b':
		c.out = append(c.out, '\\', 'b')
	case '\f':
		c.out = append(c.out, '\\', 'f')
	case '\n':
		c.out = append(c.out, '\\', 'n')
	case '\r':
		c.out = append(c.out, '\\', 'r')
	case '\t':
		c.out = append(c.out, '\\', 't')
	default:
		if r < 0x20 {
			c.out = append(c.out, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
			return
		}
		c.out = utf8.AppendRune(c.out, r)
	}
}

func (c *canonicalizer) number() error {
	start := c.pos
	if c.data[c.pos] == '-' {
		c.pos++
	}
	intStart := c.pos
	if c.pos >= len(c.data) {
		return c.errorf("invalid number")
	}
	switch b := c.data[c.pos]; {
	case b == '0':
		c.pos++
	case b >= '1' && b <= '9':
		for c.pos < len(c.data) && c.data[c.pos] >= '0' && c.data[c.pos] <= '9' {
			c.pos++
		}
	default:
		return c.errorf("invalid number")
	}
	simple := true
	if c.pos < len(c.data) && c.data[c.pos] == '.' {
		simple = false
		c.pos++
		d := c.pos
		for c.pos < len(c.data) && c.data[c.pos] >= '0' && c.data[c.pos] <= '9' {
			c.pos++
		}
		if c.pos == d {
			return c.errorf("invalid number: no digits after '.'")
		}
	}
	if c.pos < len(c.data) && (c.data[c.pos] == 'e' || c.data[c.pos] == 'E') {
		simple = false
		c.pos++
		if c.pos < len(c.data) && (c.data[c.pos] == '+' || c.data[c.pos] == '-') {
			c.pos++
		}
		d := c.pos
		for c.pos < len(c.data) && c.data[c.pos] >= '0' && c.data[c.pos] <= '9' {
			c.pos++
		}
		if c.pos == d {
			return c.errorf("invalid number: no digits in exponent")
		}
	}
	tok := c.data[start:c.pos]
	// serde_json keeps an integer exactly when it fits a u64 (or, negative,
	// an i64) and prints it as itself; only other numbers become doubles.
	if simple && exactInteger(tok[intStart-start:], intStart > start) {
		c.out = append(c.out, tok...)
		return nil
	}
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil || math.IsInf(f, 0) {
		return c.errorf("number %s is outside the IEEE 754 double range", tok)
	}
	c.out = AppendNumber(c.out, f)
	return nil
}

// exactInteger reports whether the decimal digits (no sign, no leading
// zero) name an integer serde_json keeps as a u64, or, when negative, as an
// i64. Negative zero is not one: serde_json reads "-0" as the double -0.0.
func exactInteger(digits []byte, negative bool) bool {
	if len(digits) > 20 {
		return false
	}
	var v uint64
	for _, d := range digits {
		x := uint64(d - '0')
		if v > (math.MaxUint64-x)/10 {
			return false // beyond u64
		}
		v = v*10 + x
	}
	if negative {
		return v != 0 && v <= 1<<63
	}
	return true
}

// AppendNumber appends the finite double f as serde_json prints an f64
// (the ryu crate's shortest round-trip form): always with a fraction or an
// exponent ("1.0", "-0.0", "0.001"), in exponent form "1e16", "1.5e-7"
// (no '+', no padding) when the decimal point would fall more than 16
// digits to the right or more than 4 zeros to the left of the digits.
func AppendNumber(dst []byte, f float64) []byte {
	if math.Signbit(f) {
		dst = append(dst, '-')
		f = -f
	}
	if f == 0 {
		return append(dst, '0', '.', '0')
	}
	var buf [32]byte
	// Shortest round-tripping digits in exponent form: d.ddddde±x.
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	mant, exp := e, 0
	for i, ch := range e {
		if ch == 'e' {
			mant = e[:i]
			exp, _ = strconv.Atoi(string(e[i+1:]))
			break
		}
	}
	var digits [24]byte
	k := 0
	for _, ch := range mant {
		if ch != '.' {
			digits[k] = ch
			k++
		}
	}
	ds := digits[:k]
	n := exp + 1 // 10^(n-1) <= f < 10^n: the point sits after n digits
	switch {
	case k <= n && n <= 16: // 1234e7 -> 12340000000.0
		dst = append(dst, ds...)
		for i := k; i < n; i++ {
			dst = append(dst, '0')
		}
		dst = append(dst, '.', '0')
	case 0 < n && n <= 16: // 1234e-2 -> 12.34
		dst = append(dst, ds[:n]...)
		dst = append(dst, '.')
		dst = append(dst, ds[n:]...)
	case -5 < n && n <= 0: // 1234e-6 -> 0.001234
		dst = append(dst, '0', '.')
		for i := 0; i < -n; i++ {
			dst = append(dst, '0')
		}
		dst = append(dst, ds...)
	default: // 1e30, 1234e30 -> 1.234e33
		dst = append(dst, ds[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, ds[1:]...)
		}
		dst = append(dst, 'e')
		dst = strconv.AppendInt(dst, int64(n-1), 10)
	}
	return dst
}

// JSONDepth returns how deeply the valid JSON text b nests: 0 for a
// scalar, 1 for an object or array of scalars, and so on. A signed
// document nests at most 256 levels (Canonicalize refuses deeper).
func JSONDepth(b []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++ // the escaped character, never a closing quote
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > deepest {
				deepest = depth
			}
		case '}', ']':
			depth--
		}
	}
	return deepest
}
