package main

import (
	"context"
	"fmt"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
)

// journalOpener returns the host's Config.OpenJournal: nil (the host opens
// the embedded SQLite journal in --state-dir) unless --database-url-file
// names a PostgreSQL runtime database, which replicas may share: each keeps
// its own namespace, its replica ID. The host calls it at bootstrap step 2,
// after it checked its settings and files, so a bad setting is refused
// before the database is touched; the host closes the journal when it
// stops.
func journalOpener(cfg hostsdk.Config) func(context.Context) (journal.Journal, error) {
	if cfg.DatabaseURLFile == "" {
		return nil
	}
	return func(ctx context.Context) (journal.Journal, error) {
		j, err := pgruntime.OpenURLFile(ctx, cfg.DatabaseURLFile, pgruntime.Config{Namespace: cfg.ReplicaID})
		if err != nil {
			return nil, fmt.Errorf("--database-url-file (AIP_CONNECTOR_HOST_DATABASE_URL_FILE): %w", err)
		}
		return j, nil
	}
}
