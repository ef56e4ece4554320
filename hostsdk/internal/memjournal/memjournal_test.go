package memjournal_test

import (
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
)

// The in-memory double passes the same conformance suite as the real
// backends (the durability subtests do not apply to an ephemeral journal).
func TestConformance(t *testing.T) {
	journaltest.Run(t, journaltest.Factory{
		Open: func(t *testing.T) journal.Journal { return memjournal.New() },
	})
}
