package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/aipfleet/aipfleet/aip"
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
// stops. A URL file it cannot use (missing, readable by others, empty, or
// holding a URL that does not parse: pgruntime.ErrInvalidURL) is a setting
// to fix: the error matches hostsdk.ErrSetting, and echo exits 2, as
// aip-host and aipfleet host do; a database it cannot reach or open exits
// 1.
func journalOpener(cfg hostsdk.Config) func(context.Context) (journal.Journal, error) {
	if cfg.DatabaseURLFile == "" {
		return nil
	}
	path, namespace := cfg.DatabaseURLFile, cfg.ReplicaID
	return func(ctx context.Context) (journal.Journal, error) {
		// The file's checks first, so that its faults are told from the
		// database's; OpenURLFile reads it again.
		raw, err := aip.ReadSecretFile(path, pgruntime.MaxURLFileBytes)
		if err != nil {
			return nil, settingError{fmt.Errorf("--database-url-file (AIP_CONNECTOR_HOST_DATABASE_URL_FILE): %w", err)}
		}
		clear(raw)
		j, err := pgruntime.OpenURLFile(ctx, path, pgruntime.Config{Namespace: namespace})
		if err != nil {
			err = fmt.Errorf("--database-url-file (AIP_CONNECTOR_HOST_DATABASE_URL_FILE): %w", err)
			if errors.Is(err, pgruntime.ErrInvalidURL) {
				return nil, settingError{err}
			}
			return nil, err
		}
		return j, nil
	}
}

// settingError is err, about a setting or a file a setting names, that
// matches hostsdk.ErrSetting too: the host's bootstrap error keeps it, and
// exitCode makes it exit status 2.
type settingError struct{ err error }

func (e settingError) Error() string   { return e.err.Error() }
func (e settingError) Unwrap() []error { return []error{e.err, hostsdk.ErrSetting} }
