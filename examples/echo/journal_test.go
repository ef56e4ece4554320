package main

import (
	"context"
	"errors"
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
// tested in pgruntime) name the flag that set it and its variable, and
// match hostsdk.ErrSetting (they exited 1, as a database that cannot be
// reached).
func TestOpenJournalNamesTheFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "db-url")
	if err := os.WriteFile(file, []byte("postgres://u@127.0.0.1:1/db\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err := journalOpener(hostsdk.Config{DatabaseURLFile: file, ReplicaID: "crepl_x"})(context.Background())
	if err == nil || !strings.Contains(err.Error(), "--database-url-file") || !strings.Contains(err.Error(), "AIP_CONNECTOR_HOST_DATABASE_URL_FILE") || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable URL file: err = %v", err)
	}
	// A file to fix is a setting to fix (exit status 2).
	if !errors.Is(err, hostsdk.ErrSetting) || exitCode(err) != 2 {
		t.Errorf("group-readable URL file: %v (exit status %d); want it to match hostsdk.ErrSetting, exit status 2", err, exitCode(err))
	}
}
