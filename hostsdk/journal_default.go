package hostsdk

import (
	"context"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// openDefaultJournal opens the embedded SQLite journal in dir.
func openDefaultJournal(ctx context.Context, dir string) (journal.Journal, error) {
	return sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir})
}
