package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
)

func TestOpenJournalDefaultsToEmbedded(t *testing.T) {
	if open := journalOpener(hostsdk.Config{}); open != nil {
		t.Fatal("journalOpener without a URL file is not nil; want nil (the host opens SQLite)")
	}
}

// TestOpenJournalNamesTheFlag: errors of the URL file (pgruntime.OpenURLFile,
// tested in pgruntime) name the flag that set it and its variable.
func TestOpenJournalNamesTheFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "db-url")
	if err := os.WriteFile(file, []byte("postgres://u@127.0.0.1:1/db\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err := journalOpener(hostsdk.Config{DatabaseURLFile: file, ReplicaID: "crepl_x"})(context.Background())
	if err == nil || !strings.Contains(err.Error(), "--database-url-file") || !strings.Contains(err.Error(), "AIP_CONNECTOR_HOST_DATABASE_URL_FILE") || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable URL file: err = %v", err)
	}
}
