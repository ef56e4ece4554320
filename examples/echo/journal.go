package main

import (
	"context"
	"errors"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// openJournal returns the journal the host should use: nil (the host opens
// the embedded SQLite journal in --state-dir) unless --database-url-file
// asks for PostgreSQL.
func openJournal(ctx context.Context, cfg hostsdk.Config) (journal.Journal, func(), error) {
	if cfg.DatabaseURLFile != "" {
		return nil, func() {}, errors.New("--database-url-file: this build of echo has no PostgreSQL journal; use --state-dir")
	}
	return nil, func() {}, nil
}
