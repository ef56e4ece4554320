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
	j, closeJournal, err := openJournal(context.Background(), hostsdk.Config{})
	if err != nil || j != nil {
		t.Fatalf("openJournal without a URL file = %v, %v; want nil (the host opens SQLite)", j, err)
	}
	closeJournal()
}

// TestOpenJournalNamesTheFlag: errors of the URL file (pgruntime.OpenURLFile,
// tested in pgruntime) name the flag that set it.
func TestOpenJournalNamesTheFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "db-url")
	if err := os.WriteFile(file, []byte("postgres://u@127.0.0.1:1/db\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	_, _, err := openJournal(context.Background(), hostsdk.Config{DatabaseURLFile: file, ReplicaID: "crepl_x"})
	if err == nil || !strings.Contains(err.Error(), "--database-url-file") || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable URL file: err = %v", err)
	}
}
