package registry_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

func TestCutPage(t *testing.T) {
	type item struct {
		id   string
		size int
	}
	seq := func(items ...item) func(func(*registry.CapabilityDefinition, int) bool) {
		return func(yield func(*registry.CapabilityDefinition, int) bool) {
			for _, it := range items {
				d := registry.CapabilityDefinition{Capability: aip.Capability{ID: it.id}}
				if !yield(&d, it.size) {
					return
				}
			}
		}
	}
	ids := func(p *registry.CapabilityPage) []string {
		var out []string
		for _, d := range p.Capabilities {
			out = append(out, d.Capability.ID)
		}
		return out
	}
	for _, c := range []struct {
		name       string
		limit, max int
		items      []item
		want       []string
		cursor     string
	}{
		{"all fit", 5, 100, []item{{"a", 10}, {"b", 10}}, []string{"a", "b"}, ""},
		{"cut by count", 2, 100, []item{{"a", 10}, {"b", 10}, {"c", 10}}, []string{"a", "b"}, "7:b"},
		{"exactly full by count", 2, 100, []item{{"a", 10}, {"b", 10}}, []string{"a", "b"}, ""},
		{"cut by bytes", 5, 25, []item{{"a", 10}, {"b", 10}, {"c", 10}}, []string{"a", "b"}, "7:b"},
		{"exactly full by bytes", 5, 20, []item{{"a", 10}, {"b", 10}}, []string{"a", "b"}, ""},
		{"empty", 5, 20, nil, nil, ""},
	} {
		var p registry.CapabilityPage
		if err := registry.CutPage(&p, 7, c.limit, c.max, seq(c.items...)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.Equal(ids(&p), c.want) || p.NextCursor != c.cursor {
			t.Errorf("%s: page %v cursor %q, want %v cursor %q", c.name, ids(&p), p.NextCursor, c.want, c.cursor)
		}
	}
	var p registry.CapabilityPage
	err := registry.CutPage(&p, 7, 5, 20, seq(item{"huge", 21}, item{"b", 1}))
	if !errors.Is(err, registry.ErrStorage) || len(p.Capabilities) != 0 {
		t.Fatalf("a definition larger than a page: %v, page %v", err, ids(&p))
	}
}
