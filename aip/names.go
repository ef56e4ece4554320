package aip

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
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

var (
	rawMessageType   = reflect.TypeFor[json.RawMessage]()
	unmarshalerType  = reflect.TypeFor[json.Unmarshaler]()
	namesCheckerType = reflect.TypeFor[memberNamesChecker]()
)

// checkMemberNames refuses a JSON document (valid, without duplicate
// members: canonical form) that, decoded into a value of type t by
// encoding/json, would have a member bound to a struct field whose name it
// matches only case-insensitively. Members that match no field are left
// alone: encoding/json and serde_json both ignore them.
func checkMemberNames(data []byte, t reflect.Type) error {
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
		return checkStructMemberNames(data, t)
	case reflect.Map:
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) != nil {
			return nil // not an object: the decoder reports it
		}
		for _, v := range m {
			if err := checkMemberNames(v, t.Elem()); err != nil {
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
			if err := checkMemberNames(v, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStructMemberNames checks an object decoded into struct type t,
// ignoring any UnmarshalJSON of t.
func checkStructMemberNames(data []byte, t reflect.Type) error {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return nil // not an object: the decoder reports it
	}
	fields := jsonFields(t)
	for name, v := range m {
		if ft, ok := fields[name]; ok {
			if err := checkMemberNames(v, ft); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			continue
		}
		for field := range fields {
			if strings.EqualFold(name, field) {
				return fmt.Errorf("%w: %q is not %q; member names are case-sensitive", ErrCaseVariantMember, name, field)
			}
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
