package sqliteruntime_test

import (
	"context"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// BenchmarkActionLifecycle measures what the host costs the journal per
// action on its own path: AcceptAction + FinishAction (two commits), from 32
// concurrent clients. It reports lifecycles/s and the p50/p99 latency of one
// whole lifecycle.
//
//	go test -run '^$' -bench ActionLifecycle -benchtime 20000x ./hostsdk/sqliteruntime/
func BenchmarkActionLifecycle(b *testing.B) {
	for _, mode := range []sqliteruntime.SyncMode{sqliteruntime.SyncFull, sqliteruntime.SyncNormal} {
		b.Run("sync="+string(mode), func(b *testing.B) {
			j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: b.TempDir(), Sync: mode})
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			journaltest.BenchmarkLifecycle(b, j, 32)
		})
	}
}
