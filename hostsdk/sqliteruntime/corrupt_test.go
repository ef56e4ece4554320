package sqliteruntime_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// TestRefusesCorruptDatabase: a journal whose pages were damaged, one
// truncated to nothing, or a file that is not an SQLite database at all,
// is refused at Open with ErrCorrupt and an error that names the file and
// says what to do, rather than opened (a damaged journal used to open,
// pass its Probe and fail actions one by one as storage_unavailable, or
// worse, misread them; an emptied one was taken for a new journal and
// given a fresh schema, forgetting the actions it had run); the refused
// Open releases the directory.
func TestRefusesCorruptDatabase(t *testing.T) {
	ctx := context.Background()
	filled := func(t *testing.T, dir string) string {
		j := open(t, sqliteruntime.Config{Dir: dir})
		t0 := time.Now()
		for range 200 {
			id := aip.NewActionID()
			if _, _, err := j.BeginAction(ctx, journal.Action{ActionID: id, InputDigest: strings.Repeat("d", 64), ReceivedAt: t0}); err != nil {
				t.Fatal(err)
			}
			if _, err := j.FinishAction(ctx, id, aip.StateCompleted, []byte(`{"ok":true}`), "", t0); err != nil {
				t.Fatal(err)
			}
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(dir, sqliteruntime.DatabaseFile)
	}
	damaged := func(t *testing.T, dir string) {
		path := filled(t, dir)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// Scramble the second and third pages (the first holds the header).
		for i := 4096; i < 3*4096 && i < len(b); i++ {
			b[i] ^= 0x5a
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	emptied := func(t *testing.T, dir string) {
		if err := os.Truncate(filled(t, dir), 0); err != nil {
			t.Fatal(err)
		}
	}
	// The journal file deleted while its log holds commits: the log must
	// not be replayed onto a new file.
	deleted := func(t *testing.T, dir string) {
		j := open(t, sqliteruntime.Config{Dir: dir})
		if _, err := j.PutState(ctx, "ns", "k", []byte(`1`), 0); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, sqliteruntime.DatabaseFile)
		log, err := os.ReadFile(path + "-wal")
		if err != nil || len(log) == 0 {
			t.Fatalf("read the log: %d bytes, %v", len(log), err)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path+"-wal", log, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	garbage := func(t *testing.T, dir string) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, sqliteruntime.DatabaseFile), []byte(strings.Repeat("not a database ", 100)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for name, spoil := range map[string]func(*testing.T, string){"damaged pages": damaged, "truncated to nothing": emptied, "deleted, its log kept": deleted, "not SQLite": garbage} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			spoil(t, dir)
			j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir})
			if err == nil {
				j.Close()
				t.Fatal("Open of a corrupt journal succeeded")
			}
			if !errors.Is(err, sqliteruntime.ErrCorrupt) {
				t.Fatalf("Open of a corrupt journal: %v, want ErrCorrupt", err)
			}
			for _, want := range []string{filepath.Join(dir, sqliteruntime.DatabaseFile), "backup", "new replica ID"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			// The directory is free again: the refusal held no lock.
			if _, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir}); errors.Is(err, sqliteruntime.ErrLocked) {
				t.Fatalf("a second Open found the directory locked: %v", err)
			}
		})
	}
}

// TestInterruptedCreationIsRedone: a new journal is built under a
// temporary name and renamed into place once its schema is in, so a
// creation a crash interrupted leaves no journal file (which the next
// start would refuse as emptied) but a file under the temporary name,
// which never held an action: the next Open discards it and creates the
// journal.
func TestInterruptedCreationIsRedone(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	left := filepath.Join(dir, sqliteruntime.DatabaseFile+".new")
	for _, p := range []string{left, left + "-journal"} {
		if err := os.WriteFile(p, []byte("half a journal"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	j := open(t, sqliteruntime.Config{Dir: dir})
	if _, err := j.PutState(ctx, "ns", "k", []byte(`1`), 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{left, left + "-journal"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v)", p, err)
		}
	}
}
