package memregistry

import (
	"reflect"
	"testing"
)

// TestRegistryStateIsGrouped keeps every mutable field of Registry inside
// state, which Restore replaces in one assignment: a field added beside
// state would be silently lost on restore.
func TestRegistryStateIsGrouped(t *testing.T) {
	// Configuration, fixed by New and kept by Restore, and the mutex.
	outside := map[string]bool{"now": true, "limits": true, "implicit": true, "log": true, "mu": true, "state": true}
	typ := reflect.TypeFor[Registry]()
	seen := map[string]bool{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		seen[f.Name] = true
		if !outside[f.Name] {
			t.Errorf("Registry.%s is outside state: move mutable state into the state struct so Restore carries it (and load rebuilds it), or list it here if it is configuration New sets", f.Name)
		}
	}
	for name := range outside {
		if !seen[name] {
			t.Errorf("Registry has no field %s; update this test", name)
		}
	}
	if f, ok := typ.FieldByName("state"); !ok || !f.Anonymous || f.Type != reflect.TypeFor[state]() {
		t.Errorf("Registry must embed state")
	}
}
