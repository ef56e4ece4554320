package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
)

// The rules every EventLog backend applies, so they answer alike.

// Record names of the event log, used in FieldError.
const (
	RecordEventBatch = "event_batch"
	RecordEvent      = "event"
)

// MaxEventKindBytes bounds an event's kind.
const MaxEventKindBytes = aip.MaxEventKindBytes

// MaxEventDataDepth bounds how deeply an event's data nests: as deep as a
// signed delivery can carry it (aip.MaxEventDataDepth). Deeper data
// reaches the log only through a library caller; refusing it keeps every
// event storable and prunable (PostgreSQL walks it recursively).
const MaxEventDataDepth = aip.MaxEventDataDepth

// EventProvenance is the member of an event's data the dispatcher stamps
// with the delivery's provenance (aip_connector: instance_id, replica_id,
// version_id, channel_id, lease_sequence).
const EventProvenance = "aip_connector"

// redeliveryProvenance are the members of data.aip_connector that differ
// between deliveries of the same event (another replica, version or lease
// of the same instance) and so do not count when comparing a redelivery.
var redeliveryProvenance = []string{"replica_id", "version_id", "lease_sequence"}

// Validate checks a batch before anything is stored: tenant, instance,
// replica and channel set (and the version when given) as identifiers, 1 to
// aip.MaxEventsPerDelivery events, each with an ID, a kind of 1 to
// MaxEventKindBytes bytes, an occurred_at in years 0000 to 9999 (RFC
// 3339's) and data that is absent or a JSON object nesting at most
// MaxEventDataDepth levels, without NUL characters or \u escapes of lone
// UTF-16 surrogates, whose numbers fit
// PostgreSQL's numeric (written out, at most 131072 digits before the
// decimal point and 16383 after it; a number beyond is named by its path,
// data.a.b[2]), and no event ID twice. Failures are *FieldError values
// matching ErrInvalid.
func (b *EventBatch) Validate() error {
	return b.validate(nil)
}

// StoredRule names a rule Validate holds every new write to that events
// stored by an earlier build may break: the build that stored them did not
// have it. Each exists for PostgreSQL's storage (jsonb, numeric) or for the
// eyes of whoever reads an identifier; a backend that holds what it stored
// byte for byte (memregistry's snapshot) can keep such an event as it was
// stored and serve it (ValidateStored), while Validate still refuses every
// new write of it.
type StoredRule string

// The StoredRules.
const (
	// RuleFormatCharacter: an identifier (tenant, instance, replica,
	// version, channel, event ID) holds an invisible Unicode formatting
	// character (Cf: zero-width space or joiner, bidirectional control,
	// byte order mark, soft hyphen). Kept as stored, it names its record
	// byte for byte as before: it still prints like another identifier.
	// The rule holds catalog records' identifiers too (checkIdent); a
	// backend finds the character in a record an earlier build stored
	// with FormatCharacter. A capability definition, instance, binding or
	// route whose tenant or capability ID holds one is kept, but no route
	// request (nor any write) can name it, so it routes nothing.
	RuleFormatCharacter StoredRule = "identifier with an invisible formatting character"
	// RuleNumberRange: event data holds a number beyond PostgreSQL's
	// numeric.
	RuleNumberRange StoredRule = "event data number beyond PostgreSQL's numeric"
	// RuleLoneSurrogate: event data holds a \u escape of a lone UTF-16
	// surrogate, which PostgreSQL's jsonb refuses and Go's decoder reads
	// as U+FFFD.
	RuleLoneSurrogate StoredRule = "event data with a \\u escape of a lone UTF-16 surrogate"
	// RuleDataDepth: event data nests deeper than MaxEventDataDepth.
	RuleDataDepth StoredRule = "event data nested deeper than a signed delivery carries it"
	// RuleNUL: an event's data, actor, kind, session, action or
	// correlation holds a NUL character, which PostgreSQL cannot store.
	RuleNUL StoredRule = "event with a NUL character"
)

// StoredBreak is a break of a StoredRule ValidateStored found: the rule,
// and the error Validate answers for it (a *FieldError naming the event
// and the field).
type StoredBreak struct {
	Rule StoredRule
	Err  error
}

// ValidateStored checks a batch of events a backend stored itself and is
// loading back, as Validate does, except that the breaks of StoredRules
// do not fail it: it returns them, in the order it found them, so the
// backend keeps the events as they were stored and can say what it kept.
// Every other rule fails it as Validate does: an event stored by any
// build met those, so one that breaks them is damaged, not old (an
// identifier empty, too long or with control characters, no events,
// an event ID twice, a kind empty or too long, no occurred_at, data that
// is not a JSON object in UTF-8).
func (b *EventBatch) ValidateStored() ([]StoredBreak, error) {
	var kept []StoredBreak
	err := b.validate(func(rule StoredRule, err error) {
		kept = append(kept, StoredBreak{Rule: rule, Err: err})
	})
	return kept, err
}

// validate is Validate, or ValidateStored when keep is not nil: keep is
// given each break of a StoredRule, and validation goes on after it.
func (b *EventBatch) validate(keep func(StoredRule, error)) error {
	// broken returns err (nil when there is none) unless keep takes it.
	broken := func(rule StoredRule, err error) error {
		if err == nil || keep == nil {
			return err
		}
		keep(rule, err)
		return nil
	}
	ident := func(record, id, field, v string) error {
		if err := checkText(record, id, field, v); err != nil {
			return err
		}
		return broken(RuleFormatCharacter, checkFormatChars(record, id, field, v))
	}
	// A host holds the channels of its manifest, and every Publish, to
	// aip.CheckChannelID, which takes the channel IDs ident takes
	// (TestEventLogTakesTheChannelIDsAHostPublishes): change both or
	// neither.
	for _, f := range []struct{ name, v string }{
		{"tenant_id", b.TenantID}, {"instance_id", b.InstanceID}, {"replica_id", b.ReplicaID}, {"channel_id", b.ChannelID},
	} {
		if err := ident(RecordEventBatch, "", f.name, f.v); err != nil {
			return err
		}
	}
	if b.VersionID != "" {
		if err := ident(RecordEventBatch, "", "version_id", b.VersionID); err != nil {
			return err
		}
	}
	if n := len(b.Events); n == 0 || n > aip.MaxEventsPerDelivery {
		return invalid(RecordEventBatch, "", "events", "holds %d events; a batch holds 1 to %d", n, aip.MaxEventsPerDelivery)
	}
	seen := make(map[string]int, len(b.Events))
	for i := range b.Events {
		e := &b.Events[i]
		field := fmt.Sprintf("events[%d]", i)
		if err := ident(RecordEventBatch, "", field+".id", e.ID); err != nil {
			return err
		}
		if j, dup := seen[e.ID]; dup {
			return invalid(RecordEventBatch, "", field+".id", "event %s appears twice in the batch (also events[%d]); send each event once", truncate(e.ID), j)
		}
		seen[e.ID] = i
		if e.Kind == "" || len(e.Kind) > MaxEventKindBytes {
			return invalid(RecordEvent, e.ID, "kind", "must be 1 to %d bytes, got %d", MaxEventKindBytes, len(e.Kind))
		}
		if e.OccurredAt.IsZero() {
			return invalid(RecordEvent, e.ID, "occurred_at", "is missing")
		}
		if y := e.OccurredAt.UTC().Year(); y < 0 || y > 9999 {
			return invalid(RecordEvent, e.ID, "occurred_at", "is in year %d; RFC 3339 writes only years 0000 to 9999", y)
		}
		for _, f := range []struct{ name, v string }{
			{"kind", e.Kind}, {"session_id", e.SessionID}, {"action_id", e.ActionID}, {"correlation_id", e.CorrelationID},
		} {
			const reason = "must be UTF-8 without NUL characters"
			if !utf8.ValidString(f.v) {
				return invalid(RecordEvent, e.ID, f.name, reason)
			}
			if strings.ContainsRune(f.v, 0) {
				if err := broken(RuleNUL, invalid(RecordEvent, e.ID, f.name, reason)); err != nil {
					return err
				}
			}
		}
		if !utf8.Valid(e.Data) || !dataIsObject(e.Data) {
			return invalid(RecordEvent, e.ID, "data", "must be a JSON object in UTF-8")
		}
		if d := aip.JSONDepth(e.Data); d > MaxEventDataDepth {
			if err := broken(RuleDataDepth, invalid(RecordEvent, e.ID, "data", "nests %d levels deep; at most %d (a delivery envelope holds the data 5 levels down, and a signed document nests at most 256)", d, MaxEventDataDepth)); err != nil {
				return err
			}
		}
		if holdsNUL(e.Data) {
			if err := broken(RuleNUL, invalid(RecordEvent, e.ID, "data", "holds a NUL character (\\u0000), which the event log cannot store; drop or replace it")); err != nil {
				return err
			}
		}
		if holdsLoneSurrogate(e.Data) {
			if err := broken(RuleLoneSurrogate, invalid(RecordEvent, e.ID, "data", "holds a \\u escape of a lone UTF-16 surrogate (\\ud800 to \\udfff not in a high-low pair), which the event log cannot store; escape the character it stands for, or drop it")); err != nil {
				return err
			}
		}
		if field, reason := numberOutOfRange(e.Data); reason != "" {
			if err := broken(RuleNumberRange, invalid(RecordEvent, e.ID, field, "%s", reason)); err != nil {
				return err
			}
		}
		if e.Actor != nil {
			const reason = "must be a JSON principal without NUL characters"
			raw, err := json.Marshal(e.Actor)
			if err != nil {
				return invalid(RecordEvent, e.ID, "actor", reason)
			}
			if holdsNUL(raw) {
				if err := broken(RuleNUL, invalid(RecordEvent, e.ID, "actor", reason)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// The bounds of a number in an event's data: those of PostgreSQL's numeric,
// which jsonb keeps numbers in (PostgreSQL refuses a document with a number
// beyond them as "value overflows numeric format"). Every backend holds to
// them, so a batch one stores the other stores too.
const (
	// maxNumberIntegerDigits bounds the digits before the decimal point of
	// a number written out without an exponent (numeric's weight, 32767
	// base-10000 digits): 9.99e131071 fits, 1e131072 does not.
	maxNumberIntegerDigits = 131072
	// maxNumberFractionDigits bounds the digits after the decimal point as
	// written, less the exponent (numeric's display scale): trailing zeros
	// count, so 1.5e-16382 and 0e-16383 fit, 1.5e-16383 and 0.0e-16383 do
	// not.
	maxNumberFractionDigits = 16383
	// maxNumberExponent bounds an exponent whatever the digits (PostgreSQL
	// refuses INT_MAX/2 and beyond before it looks at them): 0e1073741822
	// fits, 0e1073741823 does not.
	maxNumberExponent = 1<<30 - 2
)

// numberOutOfRange returns the path (data.a.b[2]) of the first number, in
// document order, of the valid JSON document data that PostgreSQL's
// numeric cannot hold, and why; "" when every number fits. A scan of the
// raw bytes finds whether there is one; only then is data decoded to name
// it.
func numberOutOfRange(data []byte) (field, reason string) {
	found := false
	for i := 0; i < len(data) && !found; i++ {
		switch c := data[i]; {
		case c == '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++ // the escaped character, never a closing quote
				}
			}
		case c == '-' || '0' <= c && c <= '9':
			j := i
			for j < len(data) && isNumberByte(data[j]) {
				j++
			}
			found = numberProblem(data[i:j]) != ""
			i = j - 1
		}
	}
	if !found {
		return "", ""
	}
	return findNumber(data, func(num string) string {
		if p := numberProblem([]byte(num)); p != "" {
			return fmt.Sprintf("holds the number %s, which the event log cannot store (PostgreSQL's numeric): %s; send it as a string",
				truncateNumber(num), p)
		}
		return ""
	})
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// numberProblem says what puts the JSON number num beyond PostgreSQL's
// numeric (as its set_var_from_str and make_result decide), or "" when it
// fits.
func numberProblem(num []byte) string {
	i := 0
	if i < len(num) && num[i] == '-' {
		i++
	}
	start := i
	for i < len(num) && '0' <= num[i] && num[i] <= '9' {
		i++
	}
	intDigits := num[start:i]
	var fracDigits []byte
	if i < len(num) && num[i] == '.' {
		i++
		start = i
		for i < len(num) && '0' <= num[i] && num[i] <= '9' {
			i++
		}
		fracDigits = num[start:i]
	}
	var exp int64
	if i < len(num) && (num[i] == 'e' || num[i] == 'E') {
		i++
		neg := false
		if i < len(num) && (num[i] == '+' || num[i] == '-') {
			neg = num[i] == '-'
			i++
		}
		for ; i < len(num); i++ {
			// Saturates far beyond every bound below, and far below
			// overflow: the digits are at most a few MiB.
			exp = min(exp*10+int64(num[i]-'0'), 1<<40)
		}
		if neg {
			exp = -exp
		}
	}
	if exp > maxNumberExponent {
		return fmt.Sprintf("its exponent is above %d", maxNumberExponent)
	}
	if scale := int64(len(fracDigits)) - exp; scale > maxNumberFractionDigits {
		return fmt.Sprintf("written out it has more than %d digits after the decimal point", maxNumberFractionDigits)
	}
	// The position of the first significant digit: 0 for the units, 1 for
	// the tens, -1 for the tenths.
	for k, d := range intDigits {
		if d != '0' {
			if n := int64(len(intDigits)-k) + exp; n > maxNumberIntegerDigits {
				return tooManyIntegerDigits
			}
			return ""
		}
	}
	for k, d := range fracDigits {
		if d != '0' {
			if n := int64(-k) + exp; n > maxNumberIntegerDigits {
				return tooManyIntegerDigits
			}
			return ""
		}
	}
	return "" // zero
}

var tooManyIntegerDigits = fmt.Sprintf("written out it has more than %d digits before the decimal point", maxNumberIntegerDigits)

// truncateNumber shortens a long number for a message.
func truncateNumber(num string) string {
	if len(num) <= 40 {
		return num
	}
	return fmt.Sprintf("%s…%s (%d characters)", num[:24], num[len(num)-8:], len(num))
}

// findNumber walks the valid JSON document data in document order and
// returns the path of the first number bad says something about, with what
// it says; "" when there is none. The path starts at "data": object
// members are .name, or ["name"] for a name that is not a plain
// identifier, array elements [i].
func findNumber(data []byte, bad func(num string) string) (path, reason string) {
	type frame struct {
		object bool
		name   string // the member being read (object)
		index  int    // the element being read (array), -1 before the first
		key    bool   // a member name is next (object)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []frame
	where := func() string {
		var b strings.Builder
		b.WriteString("data")
		for _, f := range stack {
			if f.object {
				b.WriteString(aip.MemberPath(f.name))
			} else {
				fmt.Fprintf(&b, "[%d]", f.index)
			}
		}
		return b.String()
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", ""
		}
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			if top.object && top.key {
				if name, ok := tok.(string); ok {
					top.name, top.key = name, false
					continue
				}
			} else if !top.object {
				if d, ok := tok.(json.Delim); !ok || d != ']' {
					top.index++
				}
			}
		}
		switch x := tok.(type) {
		case json.Delim:
			switch x {
			case '{':
				stack = append(stack, frame{object: true, key: true})
				continue
			case '[':
				stack = append(stack, frame{index: -1})
				continue
			default:
				stack = stack[:len(stack)-1]
			}
		case json.Number:
			if r := bad(string(x)); r != "" {
				return where(), r
			}
		}
		// A value ended: an object's next member name follows.
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].key = true
		}
	}
}

// holdsNUL reports whether a JSON document has a NUL character in a string
// or key (PostgreSQL's jsonb cannot store one).
func holdsNUL(raw []byte) bool {
	if !bytes.Contains(raw, []byte(`\u0000`)) {
		return false
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return true
	}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch x := v.(type) {
		case string:
			return strings.ContainsRune(x, 0)
		case []any:
			for _, e := range x {
				if walk(e) {
					return true
				}
			}
		case map[string]any:
			for k, e := range x {
				if strings.ContainsRune(k, 0) || walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// holdsLoneSurrogate reports whether a JSON document has a \u escape of a
// UTF-16 surrogate that is not a high one followed by a low one
// (PostgreSQL's jsonb refuses it as invalid input; Go's decoder reads it as
// U+FFFD).
func holdsLoneSurrogate(raw []byte) bool {
	for i := 0; i < len(raw); {
		j := bytes.IndexByte(raw[i:], '\\')
		if j < 0 {
			return false
		}
		i += j
		r, ok := escapedRune(raw, i)
		switch {
		case !ok:
			i += 2 // another escape (\\, \", \n, ...)
		case 0xdc00 <= r && r <= 0xdfff:
			return true
		case 0xd800 <= r && r <= 0xdbff:
			if low, ok := escapedRune(raw, i+6); !ok || low < 0xdc00 || low > 0xdfff {
				return true
			}
			i += 12
		default:
			i += 6
		}
	}
	return false
}

// escapedRune returns the code unit of the \uXXXX escape at raw[i:], if
// there is one.
func escapedRune(raw []byte, i int) (rune, bool) {
	if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
	return rune(v), err == nil
}

// dataIsObject reports whether data is absent or one JSON object.
func dataIsObject(data json.RawMessage) bool {
	if len(data) == 0 {
		return true
	}
	t := bytes.TrimLeft(data, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(data)
}

// EventData returns the data an event is stored with: its data, or {} when
// it has none.
func EventData(e *aip.Event) json.RawMessage {
	if len(e.Data) == 0 {
		return json.RawMessage("{}")
	}
	return e.Data
}

// StoredForm returns e as every backend stores it: data {} when it has
// none, else byte for byte as given but for the JSON whitespace around it,
// occurred_at in UTC with millisecond precision (its wire form).
func StoredForm(e aip.Event) aip.Event {
	e.Data = bytes.Trim(EventData(&e), " \t\r\n")
	e.OccurredAt = aip.At(e.OccurredAt.Time)
	return e
}

// EventReceivedAt returns the time a batch is stored as received: its
// ReceivedAt, or now when unset, in UTC with millisecond precision like
// every registry time.
func EventReceivedAt(b *EventBatch, now time.Time) time.Time {
	t := b.ReceivedAt
	if t.IsZero() {
		t = now
	}
	return Millis(t)
}

// CheckRedelivery decides what an event whose ID the tenant's log already
// holds is: nil when it is a redelivery of stored (same channel, instance,
// kind, occurred_at (to the millisecond), session, action, correlation and
// data, where data is compared as JSON values and data.aip_connector's replica_id, version_id
// and lease_sequence are ignored, since a redelivery may come from another
// replica, version or lease of the same instance), else a *FieldError
// matching ErrConflict naming the event and the first field that differs.
func CheckRedelivery(stored *StoredEvent, b *EventBatch, e *aip.Event) error {
	var field string
	switch {
	case stored.ChannelID != b.ChannelID:
		field = "channel_id"
	case stored.InstanceID != b.InstanceID:
		field = "instance_id"
	case stored.Event.Kind != e.Kind:
		field = "kind"
	case !aip.At(stored.Event.OccurredAt.Time).Equal(aip.At(e.OccurredAt.Time).Time):
		field = "occurred_at"
	case stored.Event.SessionID != e.SessionID:
		field = "session_id"
	case stored.Event.ActionID != e.ActionID:
		field = "action_id"
	case stored.Event.CorrelationID != e.CorrelationID:
		field = "correlation_id"
	case !eventDataEqual(EventData(&stored.Event), EventData(e)):
		field = "data"
	default:
		return nil
	}
	return &FieldError{Err: ErrConflict, Record: RecordEvent, ID: e.ID, Field: field,
		Reason: fmt.Sprintf("the tenant's event log already holds event %s with a different %s; give a different event a new ID", truncate(e.ID), field)}
}

// RedeliveryDigest returns a SHA-256 digest of what CheckRedelivery
// compares of event e delivered on channelID by instanceID: channel,
// instance, kind, occurred_at to the millisecond, session, action,
// correlation and data as a JSON value without data.aip_connector's
// replica_id, version_id and lease_sequence. Two events have the same
// digest exactly when CheckRedelivery finds one a redelivery of the other.
// A backend keeps it for an event it prunes (EventPruner), so that a
// different event delivered later under the pruned ID is ErrConflict
// (PrunedConflict) rather than answered as stored.
//
// The event's actor is not part of it, as CheckRedelivery does not
// compare it: the ingress refuses events with an actor (a host moves the
// provider's actor to data.upstream_actor before its outbox, so every
// delivery of an event carries it in the same place).
func RedeliveryDigest(channelID, instanceID string, e *aip.Event) []byte {
	h := sha256.New()
	var n [8]byte
	str := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	for _, s := range []string{channelID, instanceID, e.Kind, strconv.FormatInt(aip.At(e.OccurredAt.Time).UnixMilli(), 10),
		e.SessionID, e.ActionID, e.CorrelationID} {
		str(s)
	}
	data := EventData(e)
	v, ok := redeliveryValue(data)
	if !ok {
		// Not a JSON object: compared byte by byte (eventDataEqual).
		h.Write([]byte{'r'})
		str(string(data))
		return h.Sum(nil)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case nil:
			h.Write([]byte{'z'})
		case bool:
			if x {
				h.Write([]byte{'t'})
			} else {
				h.Write([]byte{'f'})
			}
		case string:
			h.Write([]byte{'s'})
			str(x)
		case number:
			h.Write([]byte{'n'})
			str(string(x))
		case json.Number:
			h.Write([]byte{'N'})
			str(string(x))
		case []any:
			h.Write([]byte{'a'})
			str(strconv.Itoa(len(x)))
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			h.Write([]byte{'o'})
			str(strconv.Itoa(len(x)))
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				str(k)
				walk(x[k])
			}
		default:
			// Not produced by decoding JSON; keep the digest total.
			h.Write([]byte{'?'})
			str(fmt.Sprintf("%T %v", x, x))
		}
	}
	walk(v)
	return h.Sum(nil)
}

// PrunedConflict is the error of an event delivered under the ID of an
// event the tenant's log pruned, when its RedeliveryDigest differs from
// the pruned event's: a *FieldError matching ErrConflict naming the event.
// The pruned event's content is gone, so it cannot name the field that
// differs.
func PrunedConflict(id string) error {
	return &FieldError{Err: ErrConflict, Record: RecordEvent, ID: id,
		Reason: fmt.Sprintf("the tenant's event log held event %s with different content (pruned since, the log keeps only a digest of it); give a different event a new ID", truncate(id))}
}

// eventDataEqual compares two JSON objects as values, ignoring the
// redelivery provenance in their aip_connector member.
func eventDataEqual(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	va, oka := redeliveryValue(a)
	vb, okb := redeliveryValue(b)
	return oka && okb && reflect.DeepEqual(va, vb)
}

func redeliveryValue(data json.RawMessage) (map[string]any, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, false
	}
	if p, ok := m[EventProvenance].(map[string]any); ok {
		for _, k := range redeliveryProvenance {
			delete(p, k)
		}
	}
	normalizeNumbers(m)
	return m, true
}

// normalizeNumbers rewrites the numbers in v (decoded with UseNumber) to
// one form per value, so 100, 1e2 and 100.0 compare equal (a store may
// keep a number in another form than it was sent).
func normalizeNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalizeNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalizeNumbers(e)
		}
	case json.Number:
		if r, ok := new(big.Rat).SetString(string(x)); ok {
			return number(r.RatString())
		}
	}
	return v
}

// number is a normalised JSON number, distinct from a JSON string.
type number string

// ClampEventPage clamps an Events limit to 1..MaxEventPage.
func ClampEventPage(limit int) int { return min(max(limit, 1), MaxEventPage) }

// CheckPruneEvents applies PruneEvents' rules to its arguments.
func CheckPruneEvents(receivedBefore time.Time, limit int) error {
	return checkPruneArgs("event prune", receivedBefore, limit)
}

// CheckForgetPrunedEvents applies ForgetPrunedEvents' rules to its
// arguments.
func CheckForgetPrunedEvents(receivedBefore time.Time, limit int) error {
	return checkPruneArgs("forget pruned events", receivedBefore, limit)
}

func checkPruneArgs(what string, receivedBefore time.Time, limit int) error {
	if receivedBefore.IsZero() {
		return invalid(what, "", "received_before", "is the zero time")
	}
	if limit <= 0 {
		return invalid(what, "", "limit", "is %d; must be positive", limit)
	}
	return nil
}
