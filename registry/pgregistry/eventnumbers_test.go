package pgregistry_test

import (
	"context"
	"testing"

	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestEventDataNumbersAreJSONB holds registrytest.EventDataNumbers (the
// edges registry.EventBatch.Validate draws for numbers in event data) to
// the server: jsonb takes every number listed as fitting and refuses every
// one listed as refused with "value overflows numeric format" (22003), so
// Validate refuses exactly what the event log could not store.
func TestEventDataNumbersAreJSONB(t *testing.T) {
	t.Parallel()
	conn := connect(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	for _, n := range registrytest.EventDataNumbers.Fit {
		if _, err := conn.Exec(ctx, `SELECT $1::jsonb`, `{"n":`+n+`}`); err != nil {
			t.Errorf("jsonb refuses %.40s (%d characters), which the list says fits: %v", n, len(n), err)
		}
	}
	for _, n := range registrytest.EventDataNumbers.Refused {
		if _, err := conn.Exec(ctx, `SELECT $1::jsonb`, `{"n":`+n+`}`); sqlState(err) != "22003" {
			t.Errorf("jsonb answers %.40s (%d characters) with %v, want 22003 (value overflows numeric format)", n, len(n), err)
		}
	}
}
