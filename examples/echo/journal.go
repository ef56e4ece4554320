package main

import (
	"context"
	"fmt"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
)

// openJournal returns the journal the host should use: nil (the host opens
// the embedded SQLite journal in --state-dir) unless --database-url-file
// names a PostgreSQL runtime database, which replicas may share: each keeps
// its own namespace, its replica ID. The returned func closes what was
// opened; call it after the host stopped.
func openJournal(ctx context.Context, cfg hostsdk.Config) (journal.Journal, func(), error) {
	if cfg.DatabaseURLFile == "" {
		return nil, func() {}, nil
	}
	j, err := pgruntime.OpenURLFile(ctx, cfg.DatabaseURLFile, pgruntime.Config{Namespace: cfg.ReplicaID})
	if err != nil {
		return nil, nil, fmt.Errorf("--database-url-file: %w", err)
	}
	return j, func() { j.Close() }, nil
}
