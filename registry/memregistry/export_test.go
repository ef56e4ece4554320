package memregistry

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/aipfleet/aipfleet/aip"
)

// UnsetStateFields names the fields of r's state (and of the structs it
// points to) that are empty: zero scalars, nil pointers, empty maps and
// slices. A populated registry and its restored copy must report none, so
// a state field that load does not rebuild is caught.
func UnsetStateFields(r *Registry) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var unset []string
	walkUnset(reflect.ValueOf(&r.state).Elem(), "state", &unset)
	slices.Sort(unset)
	return unset
}

func walkUnset(v reflect.Value, path string, unset *[]string) {
	switch v.Kind() {
	case reflect.Map, reflect.Slice:
		if v.Len() == 0 {
			*unset = append(*unset, path)
		}
	case reflect.Pointer:
		if v.IsNil() {
			*unset = append(*unset, path)
		} else if v.Elem().Kind() == reflect.Struct {
			walkUnset(v.Elem(), path, unset)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			walkUnset(v.Field(i), path+"."+v.Type().Field(i).Name, unset)
		}
	default:
		if v.IsZero() {
			*unset = append(*unset, path)
		}
	}
}

// CheckIndexes verifies the indexes the write methods keep and load
// rebuilds: each tenant's capabilities by ID and bindings by (priority,
// instance ID), each instance's replicas by ID and complete, and the live
// set exactly the replicas that are not offline.
func CheckIndexes(r *Registry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for tenant, te := range r.tenants {
		if len(te.order) != len(te.caps) {
			return fmt.Errorf("tenant %s: %d capabilities in order, %d indexed", tenant, len(te.order), len(te.caps))
		}
		for i, tc := range te.order {
			if i > 0 && te.order[i-1].def.def.Capability.ID >= tc.def.def.Capability.ID {
				return fmt.Errorf("tenant %s: capabilities out of order at %s", tenant, tc.def.def.Capability.ID)
			}
			for j := 1; j < len(tc.bindings); j++ {
				x, y := tc.bindings[j-1].rec, tc.bindings[j].rec
				if x.Priority > y.Priority || x.Priority == y.Priority && x.InstanceID >= y.InstanceID {
					return fmt.Errorf("tenant %s capability %s: binding of %s (priority %d) before %s (priority %d)",
						tenant, tc.def.def.Capability.ID, x.InstanceID, x.Priority, y.InstanceID, y.Priority)
				}
			}
		}
	}
	byInstance := map[string]int{}
	for id, e := range r.replicas {
		byInstance[e.inst.rec.ID]++
		if _, live := r.live[id]; live != (e.rec.Status != aip.ReplicaOffline) {
			return fmt.Errorf("replica %s (%s): live set says %t", id, e.rec.Status, live)
		}
	}
	if len(r.live) > len(r.replicas) {
		return fmt.Errorf("live set holds %d replicas of %d", len(r.live), len(r.replicas))
	}
	for id, inst := range r.instances {
		if len(inst.replicas) != byInstance[id] {
			return fmt.Errorf("instance %s lists %d replicas, %d belong to it", id, len(inst.replicas), byInstance[id])
		}
		for j := 1; j < len(inst.replicas); j++ {
			if inst.replicas[j-1].rec.ID >= inst.replicas[j].rec.ID {
				return fmt.Errorf("instance %s: replicas out of order at %s", id, inst.replicas[j].rec.ID)
			}
		}
	}
	return nil
}
