package aip

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// ErrCaseVariantMember is returned (wrapped) when a signed document has a
// member whose name matches a field of the message only when case is
// ignored ("Tenant_ID" for "tenant_id").
//
// encoding/json matches member names to struct fields case-insensitively
// (and folds U+212A KELVIN SIGN to 'k' and U+017F LONG S to 's'), while the
// reference's serde_json matches them exactly and ignores the rest. A
// signed {"from": A, "From": B} would be read as A by one and B by the
// other, or by this package depending on member order; so verified
// documents with such members are refused rather than interpreted.
var ErrCaseVariantMember = errors.New("aip: member name differs from a field's only in case")

// memberNamesChecker is implemented by the types of this package whose
// UnmarshalJSON reads members through a struct of its own (and so
// case-insensitively): it checks data as that UnmarshalJSON reads it. Types
// whose UnmarshalJSON reads members by exact name (MessagePart,
// ProfileBinding) or reads no members (Timestamp) need not implement it.
type memberNamesChecker interface {
	checkMemberNames(data []byte) error
}

// ErrUnknownMember is returned (wrapped) by DecodeStrict for a member that
// matches no field of the value it decodes into.
var ErrUnknownMember = errors.New("aip: unknown member")

// DecodeStrict decodes data into the value v points to, for a reader that
// must understand everything it is sent (a request to an API, a local
// connector's answer): data is one I-JSON value and nothing after it (the
// errors of Canonicalize), an object where v is a struct without an
// UnmarshalJSON of its own (null is not one), and at every depth where a struct is decoded each member is one
// of its fields by its exact name — a member matching a field only when
// case is ignored is refused (ErrCaseVariantMember, naming the field) and
// so is one matching no field (ErrUnknownMember, listing the members).
// encoding/json alone binds "Capability_ID" to capability_id, takes the
// last of "capability_id" and "CAPABILITY_ID", and reads null as an empty
// struct, where every case-sensitive reader of the same bytes sees
// something else. A member of the wrong JSON type is a *MemberTypeError,
// which says where and what in JSON's terms (it unwraps to
// encoding/json's *json.UnmarshalTypeError).
func DecodeStrict(data []byte, v any) error {
	if _, err := Canonicalize(data); err != nil {
		return err
	}
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer {
		return fmt.Errorf("aip: DecodeStrict needs a pointer, not %v", t)
	}
	if et := t.Elem(); et.Kind() == reflect.Struct && !t.Implements(unmarshalerType) {
		if v := bytes.TrimLeft(data, " \t\r\n"); !bytes.HasPrefix(v, []byte("{")) {
			return fmt.Errorf("want one JSON object ({\"member\": value, ...}), not %s", jsonKind(v))
		}
	}
	if err := checkNames(data, t, true); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var ute *json.UnmarshalTypeError
	if !errors.As(err, &ute) {
		return err
	}
	te := &MemberTypeError{Member: ute.Field, Got: ute.Value, Want: jsonTypeOf(ute.Type), Err: err}
	if err != error(ute) {
		// An UnmarshalJSON of a field's own type wrapped encoding/json's
		// error in its words ("aip: message part text: ..."), and its
		// Field and Offset count from that type's input: keep the words,
		// say the types in JSON's terms.
		te.Err = ute
		if prefix, ok := strings.CutSuffix(err.Error(), ute.Error()); ok {
			return &wrappedTypeError{prefix: prefix, te: te, err: err}
		}
		return err
	}
	if path, got, ok := memberAt(data, ute); ok {
		te.Member, te.Got = path, got
	}
	return te
}

// MemberTypeError is DecodeStrict's error for a member whose JSON type is
// not the one its field takes. It names the member and both types in
// JSON's terms (encoding/json names Go's: "Go struct field .timeout_ms of
// type uint64").
type MemberTypeError struct {
	// Member is the member's path from the top, with each array element's
	// index ("timeout_ms", "input.items", "events[3].id"); empty for the
	// top-level value. For an error an UnmarshalJSON of a field's type
	// wrapped in its own words, the path within what that UnmarshalJSON
	// read.
	Member string
	// Got is what the JSON held: "string", "number -1", "array", "bool",
	// "member name \"abc\"" (a map's member name that is not a number
	// its keys take), ...
	Got string
	// Want says what the member takes: "a whole number from 0 to 255".
	Want string
	// Err is encoding/json's error (a *json.UnmarshalTypeError).
	Err error
}

func (e *MemberTypeError) Error() string {
	got := e.Got
	if n, ok := strings.CutPrefix(got, "number "); ok {
		got = "the number " + n
	} else if strings.HasPrefix(got, "member name ") {
		got = "the " + got
	} else if got == "bool" {
		got = "a JSON boolean"
	} else {
		got = "a JSON " + got
	}
	if e.Member == "" {
		return fmt.Sprintf("%s where %s is expected", got, e.Want)
	}
	return fmt.Sprintf("member %q: %s where %s is expected", e.Member, got, e.Want)
}

func (e *MemberTypeError) Unwrap() error { return e.Err }

// wrappedTypeError is a MemberTypeError that an UnmarshalJSON wrapped in
// its own words (prefix); it unwraps to both the MemberTypeError and the
// error the UnmarshalJSON returned.
type wrappedTypeError struct {
	prefix string
	te     *MemberTypeError
	err    error
}

func (e *wrappedTypeError) Error() string   { return e.prefix + e.te.Error() }
func (e *wrappedTypeError) Unwrap() []error { return []error{e.te, e.err} }

// memberAt finds in data the value (or member name) at which encoding/json
// reported ute, and returns its path with array indexes and map members
// ("events[3].id", "counts.a"; encoding/json's Field names only struct
// fields, and an embedded struct's by its Go name) and what it holds. ok
// is false unless a value of the kind ute names is exactly there: an
// UnmarshalJSON that returned encoding/json's error for its own input
// gives an Offset in that input.
func memberAt(data []byte, ute *json.UnmarshalTypeError) (path, got string, ok bool) {
	type frame struct {
		array   bool
		n       int    // array: the current element's index
		key     string // object: the current member's name
		haveKey bool
	}
	var st []frame
	pathOf := func(st []frame) string {
		var b strings.Builder
		for i, f := range st {
			switch {
			case f.array:
				fmt.Fprintf(&b, "[%d]", f.n)
			case i > 0:
				b.WriteString("." + f.key)
			default:
				b.WriteString(f.key)
			}
		}
		return b.String()
	}
	done := func() { // the value at the top frame's position ended
		if len(st) > 0 {
			if top := &st[len(st)-1]; top.array {
				top.n++
			} else {
				top.haveKey = false
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		before := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return "", "", false
		}
		end := dec.InputOffset()
		if d, isDelim := tok.(json.Delim); isDelim && (d == '}' || d == ']') {
			st = st[:len(st)-1]
			done()
			continue
		}
		if n := len(st); n > 0 && !st[n-1].array && !st[n-1].haveKey {
			key := tok.(string)
			st[n-1].key, st[n-1].haveKey = key, true
			if ute.Offset > before && ute.Offset < end {
				// A map's member name its key type does not take:
				// encoding/json reports "number NAME" at its first byte.
				if ute.Value != "number "+key || data[ute.Offset-1] != '"' {
					return "", "", false
				}
				return pathOf(st[:n-1]), fmt.Sprintf("member name %q", key), true
			}
			continue
		}
		if end >= ute.Offset {
			if end != ute.Offset {
				return "", "", false
			}
			got = ute.Value
			switch v := tok.(type) {
			case json.Delim:
				ok = (v == '[' && got == "array") || (v == '{' && got == "object")
			case string:
				ok = got == "string"
			case bool:
				ok = got == "bool"
			case nil:
				ok = got == "null"
			case json.Number:
				if got == "number" {
					got = "number " + v.String()
				}
				ok = got == "number "+v.String()
			}
			return pathOf(st), got, ok
		}
		if d, isDelim := tok.(json.Delim); isDelim {
			st = append(st, frame{array: d == '['})
			continue
		}
		done()
	}
}

// jsonTypeOf says in JSON's terms what values a Go type decodes from.
func jsonTypeOf(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == nil:
		return "another value"
	case t == numberType:
		return "a number"
	case reflect.PointerTo(t).Implements(textUnmarshalerType):
		return "a string"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		return "a base64 string"
	}
	switch t.Kind() {
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return fmt.Sprintf("a whole number from 0 to %d", ^uint64(0)>>(64-t.Bits()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("a whole number from %d to %d", -(int64(1) << (t.Bits() - 1)), int64(1)<<(t.Bits()-1)-1)
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another value"
}

var (
	rawMessageType      = reflect.TypeFor[json.RawMessage]()
	numberType          = reflect.TypeFor[json.Number]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	namesCheckerType    = reflect.TypeFor[memberNamesChecker]()
)

// checkMemberNames refuses a JSON document (valid, without duplicate
// members: canonical form) that, decoded into a value of type t by
// encoding/json, would have a member bound to a struct field whose name it
// matches only case-insensitively. Members that match no field are left
// alone: encoding/json and serde_json both ignore them.
func checkMemberNames(data []byte, t reflect.Type) error {
	return checkNames(data, t, false)
}

// checkNames is checkMemberNames that, when strict, also refuses members
// matching no field (ErrUnknownMember). Types with their own
// UnmarshalJSON are checked as checkMemberNames checks them.
func checkNames(data []byte, t reflect.Type, strict bool) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType || t.Kind() == reflect.Interface {
		return nil // kept or decoded generically: names are map keys, exact
	}
	if reflect.PointerTo(t).Implements(namesCheckerType) {
		return reflect.New(t).Interface().(memberNamesChecker).checkMemberNames(data)
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) || t.Implements(unmarshalerType) {
		return nil // reads its own members (see memberNamesChecker)
	}
	switch t.Kind() {
	case reflect.Struct:
		return checkStructNames(data, t, strict)
	case reflect.Map:
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) != nil {
			return nil // not an object: the decoder reports it
		}
		for _, v := range m {
			if err := checkNames(v, t.Elem(), strict); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil // base64 string
		}
		var a []json.RawMessage
		if json.Unmarshal(data, &a) != nil {
			return nil
		}
		for _, v := range a {
			if err := checkNames(v, t.Elem(), strict); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStructMemberNames checks an object decoded into struct type t,
// ignoring any UnmarshalJSON of t.
func checkStructMemberNames(data []byte, t reflect.Type) error {
	return checkStructNames(data, t, false)
}

func checkStructNames(data []byte, t reflect.Type, strict bool) error {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return nil // not an object: the decoder reports it
	}
	fields := jsonFields(t)
	// In member order is not available from a map: check the names sorted,
	// so the error is the same for the same document.
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if ft, ok := fields[name]; ok {
			if err := checkNames(m[name], ft, strict); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			continue
		}
		for field := range fields {
			if strings.EqualFold(name, field) {
				return fmt.Errorf("%w: %q is not %q; member names are case-sensitive", ErrCaseVariantMember, name, field)
			}
		}
		if strict {
			return fmt.Errorf("%w %q (the members are %s)", ErrUnknownMember, TruncateUTF8(name, 64), strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
		}
	}
	return nil
}

var jsonFieldsCache sync.Map // reflect.Type -> map[string]reflect.Type

// jsonFields returns the member names encoding/json binds to fields of the
// struct type t, with the fields' types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := jsonFieldsCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	fields := make(map[string]reflect.Type)
	addJSONFields(fields, t, 0)
	jsonFieldsCache.Store(t, fields)
	return fields
}

func addJSONFields(fields map[string]reflect.Type, t reflect.Type, depth int) {
	if depth > 8 {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				addJSONFields(fields, et, depth+1) // promoted
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if _, dup := fields[name]; !dup || depth == 0 {
			fields[name] = f.Type
		}
	}
}

func (*Body) checkMemberNames(data []byte) error {
	return checkStructMemberNames(data, reflect.TypeFor[Body]())
}

func (*ControlCommand) checkMemberNames(data []byte) error {
	var w struct {
		Operation Operation       `json:"operation"`
		Payload   json.RawMessage `json:"payload"`
	}
	if err := checkStructMemberNames(data, reflect.TypeOf(w)); err != nil {
		return err
	}
	if json.Unmarshal(data, &w) != nil {
		return nil
	}
	switch w.Operation {
	case OpRegister:
		return checkMemberNames(w.Payload, reflect.TypeFor[Registration]())
	case OpHeartbeat:
		return checkMemberNames(w.Payload, reflect.TypeFor[Heartbeat]())
	case OpDrain, OpOffline:
		return checkMemberNames(w.Payload, reflect.TypeFor[Transition]())
	}
	return nil
}

func (*ControlOutcome) checkMemberNames(data []byte) error {
	return checkStructMemberNames(data, reflect.TypeFor[controlOutcomeWire]())
}

// jsonKind names the kind of the JSON value text v starts.
func jsonKind(v []byte) string {
	switch {
	case len(v) == 0:
		return "an empty body"
	case v[0] == '[':
		return "an array"
	case v[0] == '"':
		return "a string"
	case v[0] == 'n':
		return "null"
	case v[0] == 't' || v[0] == 'f':
		return "a boolean"
	default:
		return "a number"
	}
}
