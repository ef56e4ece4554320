package pgruntime_test

import (
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// BenchmarkActionLifecycle: the host's AcceptAction + FinishAction per op
// (two statements, two commits) from 32 concurrent clients, pool of 32
// connections.
//
//	AIP_TEST_DATABASE_URL=... go test -run '^$' -bench ActionLifecycle -benchtime 20000x ./hostsdk/pgruntime/
func BenchmarkActionLifecycle(b *testing.B) {
	j := open(b, pgruntime.Config{DatabaseURL: pgtest.NewDatabase(b), Namespace: aip.NewID(aip.PrefixReplica), MaxConns: 32})
	journaltest.BenchmarkLifecycle(b, j, 32)
}
