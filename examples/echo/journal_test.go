package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

func TestOpenJournalOnPostgreSQL(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	file := filepath.Join(t.TempDir(), "db-url")
	if err := os.WriteFile(file, []byte(dbURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := hostsdk.Config{DatabaseURLFile: file, ReplicaID: aip.NewID(aip.PrefixReplica)}
	j, closeJournal, err := openJournal(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeJournal()
	if j == nil || j.Durability() != journal.Durable {
		t.Fatalf("journal = %v, want a durable PostgreSQL journal", j)
	}
	if err := j.Probe(ctx); err != nil {
		t.Fatalf("Probe: %v", err)
	}

	// The URL file is a secret: a group-readable file is refused by name.
	if err := os.Chmod(file, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, _, err := openJournal(ctx, cfg); err == nil || !strings.Contains(err.Error(), "--database-url-file") || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable URL file: err = %v", err)
	}
}

func TestOpenJournalDefaultsToEmbedded(t *testing.T) {
	j, closeJournal, err := openJournal(context.Background(), hostsdk.Config{})
	if err != nil || j != nil {
		t.Fatalf("openJournal without a URL file = %v, %v; want nil (the host opens SQLite)", j, err)
	}
	closeJournal()
}
