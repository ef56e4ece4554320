package hostsdk

import (
	"context"
	"errors"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// openDefaultJournal opens the embedded journal in dir.
func openDefaultJournal(ctx context.Context, dir string) (journal.Journal, error) {
	return nil, errors.New("the embedded SQLite journal is not available in this build; pass Config.Journal")
}
