package onchange

import (
	"sync"
	"testing"
)

func TestTextReportsChangesOnce(t *testing.T) {
	var x Text
	steps := []struct {
		now  string
		want bool
	}{
		{"", false}, // healthy from the start: nothing to report
		{"db: down", true},
		{"db: down", false},
		{"db: slow", true},
		{"", true}, // ready again
		{"", false},
		{"db: down", true},
	}
	for i, s := range steps {
		if got := x.Changed(s.now); got != s.want {
			t.Fatalf("step %d: Changed(%q) = %v, want %v", i, s.now, got, s.want)
		}
	}
}

func TestTextConcurrentCallersReportOnce(t *testing.T) {
	var x Text
	var wg sync.WaitGroup
	var mu sync.Mutex
	reported := 0
	for range 16 {
		wg.Go(func() {
			if x.Changed("failing") {
				mu.Lock()
				reported++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if reported != 1 {
		t.Fatalf("%d callers reported the same change, want 1", reported)
	}
}
