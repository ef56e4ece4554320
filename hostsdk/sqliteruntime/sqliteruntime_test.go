package sqliteruntime_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(childMain(role))
	}
	goleak.VerifyTestMain(m)
}

func open(t *testing.T, cfg sqliteruntime.Config) *sqliteruntime.Journal {
	t.Helper()
	j, err := sqliteruntime.Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", cfg.Dir, err)
	}
	t.Cleanup(func() {
		if err := j.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return j
}

func TestConformance(t *testing.T) {
	for _, mode := range []sqliteruntime.SyncMode{sqliteruntime.SyncFull, sqliteruntime.SyncNormal} {
		t.Run(string(mode), func(t *testing.T) {
			journaltest.Run(t, journaltest.Factory{
				Open: func(t *testing.T) journal.Journal {
					return open(t, sqliteruntime.Config{Dir: t.TempDir(), Sync: mode})
				},
				Reopen: func(t *testing.T, closed journal.Journal) journal.Journal {
					return open(t, sqliteruntime.Config{Dir: closed.(*sqliteruntime.Journal).Dir(), Sync: mode})
				},
			})
		})
	}
}

func TestOpenCreatesPrivateFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "nested")
	j := open(t, sqliteruntime.Config{Dir: dir})
	if j.Dir() != dir {
		t.Fatalf("Dir() = %s, want %s", j.Dir(), dir)
	}
	if err := j.Probe(context.Background()); err != nil { // makes sure the log exists
		t.Fatal(err)
	}
	want := map[string]os.FileMode{
		dir: 0o700 | os.ModeDir,
		filepath.Join(dir, sqliteruntime.DatabaseFile):        0o600,
		filepath.Join(dir, sqliteruntime.DatabaseFile+"-wal"): 0o600,
		filepath.Join(dir, sqliteruntime.DatabaseFile+"-shm"): 0o600,
		filepath.Join(dir, sqliteruntime.LockFile):            0o600,
	}
	for path, mode := range want {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("stat %s: %v", path, err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s has mode %v, want %v", path, fi.Mode(), mode)
		}
	}
	var journalMode string
	db := rawDB(t, dir)
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&journalMode); err != nil || journalMode != "wal" {
		t.Fatalf("journal_mode = %q (%v), want wal", journalMode, err)
	}
}

// TestOpenRefusesASharedStateDirectory: an existing state directory that
// others may write to (a sticky shared one like /tmp, or a group-writable
// one) is refused before anything is created in it: another user could
// plant a link or a file under the journal's name. The directory's owner
// alone writing it (0700, 0755) is accepted.
func TestOpenRefusesASharedStateDirectory(t *testing.T) {
	ctx := context.Background()
	// The mode is named as ls and chmod write it (1777 for /tmp or a
	// fresh tmpfs mount), never as Go's FileMode bits (4000777).
	for _, c := range []struct {
		mode os.FileMode
		want string
	}{{0o777 | os.ModeSticky, "(mode 1777)"}, {0o770, "(mode 0770)"}, {0o757, "(mode 0757)"}} {
		mode := c.mode
		dir := filepath.Join(t.TempDir(), "state")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir})
		if err == nil {
			j.Close()
			t.Fatalf("Open in a directory of mode %v succeeded", mode)
		}
		if !strings.Contains(err.Error(), "writable by its group or by others") || !strings.Contains(err.Error(), "chmod go-w") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("mode %v: %v (want it to name %s)", mode, err, c.want)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("mode %v: the refused directory holds %d entries", mode, len(entries))
		}
	}
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	open(t, sqliteruntime.Config{Dir: dir})
}

// TestOpenRefusesAStateDirectoryOfAnotherUser: a state directory owned by
// another user is refused before anything is created in it, whatever its
// mode: that user may write to it (a 0755 directory they made under /tmp
// at the path given as --state-dir, before the host created it) and plant
// a link under the journal's name. Needs root to give a directory away.
func TestOpenRefusesAStateDirectoryOfAnotherUser(t *testing.T) {
	if runtime.GOOS == "windows" || os.Geteuid() != 0 {
		t.Skip("needs root (to chown a directory to another user) on a Unix system")
	}
	const nobody = 65534
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: dir})
	if err == nil {
		j.Close()
		t.Fatal("Open in a directory of another user succeeded")
	}
	if !strings.Contains(err.Error(), "is owned by uid 65534") || !strings.Contains(err.Error(), "chown") {
		t.Errorf("Open: %v; want the owner named and what to do", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the refused directory holds %d entries", len(entries))
	}
}

// TestOpenRefusesAnUnsafeJournalFile: an existing journal file, or its
// write-ahead log, that its group or others may write to, or that another
// user owns, is refused (a journal restored from a backup with the wrong
// mode or owner): that user could delete the record of actions that ran,
// which would then run again. Such a file was opened and used. A journal
// file others may only read is accepted. Giving a file away needs root.
func TestOpenRefusesAnUnsafeJournalFile(t *testing.T) {
	ctx := context.Background()
	made := func(t *testing.T) (dir, path string) {
		dir = filepath.Join(t.TempDir(), "state")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		j := open(t, sqliteruntime.Config{Dir: dir})
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		return dir, filepath.Join(dir, sqliteruntime.DatabaseFile)
	}
	refused := func(t *testing.T, dir, file string, want ...string) {
		t.Helper()
		j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir})
		if err == nil {
			j.Close()
			t.Fatalf("Open with an unsafe %s succeeded", file)
		}
		for _, w := range append(want, file) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Open: %v; want it to say %q", err, w)
			}
		}
	}
	t.Run("group writable", func(t *testing.T) {
		dir, path := made(t)
		if err := os.Chmod(path, 0o664); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, path, "(mode 0664)", "chmod go-w")
	})
	t.Run("world writable log", func(t *testing.T) {
		dir, path := made(t)
		if err := os.WriteFile(path+"-wal", nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path+"-wal", 0o666); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, path+"-wal", "(mode 0666)", "chmod go-w")
	})
	t.Run("readable", func(t *testing.T) {
		dir, path := made(t)
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		open(t, sqliteruntime.Config{Dir: dir})
	})
	t.Run("another user's", func(t *testing.T) {
		if runtime.GOOS == "windows" || os.Geteuid() != 0 {
			t.Skip("needs root (to chown a file to another user) on a Unix system")
		}
		dir, path := made(t)
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, path, "is owned by uid 65534", "chown")
	})
}

// TestOpenRefusesAJournalFileOfAnotherDirectory: a journal.db that is a
// symbolic link or a hard link to the journal of another state directory
// is refused: that directory's lock does not cover it, so both used to
// open and write one journal (the second's receipts failed on the chain's
// sequence, and through a hard link, with a -wal of its own beside the
// same database, its writes failed with disk I/O errors); two hosts would
// also recover each other's running actions.
func TestOpenRefusesAJournalFileOfAnotherDirectory(t *testing.T) {
	ctx := context.Background()
	for name, link := range map[string]func(string, string) error{"symbolic link": os.Symlink, "hard link": os.Link} {
		t.Run(name, func(t *testing.T) {
			first, second := t.TempDir(), t.TempDir()
			open(t, sqliteruntime.Config{Dir: first})
			path := filepath.Join(second, sqliteruntime.DatabaseFile)
			if err := link(filepath.Join(first, sqliteruntime.DatabaseFile), path); err != nil {
				t.Fatal(err)
			}
			j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: second})
			if err == nil {
				j.Close()
				t.Fatalf("Open through a %s to another directory's journal succeeded", name)
			}
			for _, want := range []string{path, "own state directory"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Open: %v; want it to say %q", err, want)
				}
			}
		})
	}
}

// rawDB opens the journal's database file directly, bypassing the package.
func rawDB(t *testing.T, dir string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(dir, sqliteruntime.DatabaseFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestOpenConfigErrors(t *testing.T) {
	ctx := context.Background()
	for name, cfg := range map[string]sqliteruntime.Config{
		"no dir":         {},
		"bad sync":       {Dir: t.TempDir(), Sync: "sometimes"},
		"negative reads": {Dir: t.TempDir(), ReadConns: -1},
	} {
		if j, err := sqliteruntime.Open(ctx, cfg); err == nil {
			j.Close()
			t.Errorf("Open(%s) succeeded, want an error", name)
		} else {
			t.Logf("Open(%s): %v", name, err)
		}
	}
	// A state directory path that is a file.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: file}); err == nil {
		j.Close()
		t.Fatal("Open on a regular file succeeded")
	}
}

func TestSecondOpenInProcessIsLocked(t *testing.T) {
	dir := t.TempDir()
	open(t, sqliteruntime.Config{Dir: dir})
	_, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: dir})
	var le *sqliteruntime.LockedError
	if !errors.As(err, &le) || !errors.Is(err, sqliteruntime.ErrLocked) {
		t.Fatalf("second Open = %v, want a *LockedError", err)
	}
	if le.Dir != dir || le.PID != os.Getpid() {
		t.Fatalf("LockedError = %+v, want dir %s pid %d", le, dir, os.Getpid())
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), strconv.Itoa(os.Getpid())) {
		t.Fatalf("error %q does not name the directory and the holder", err)
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	dir := t.TempDir()
	j := open(t, sqliteruntime.Config{Dir: dir})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	db := rawDB(t, dir)
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", sqliteruntime.SchemaVersion+1)); err != nil {
		t.Fatal(err)
	}
	db.Close()

	_, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: dir})
	if !errors.Is(err, sqliteruntime.ErrSchemaTooNew) {
		t.Fatalf("Open on a newer schema = %v, want ErrSchemaTooNew", err)
	}
	for _, want := range []string{fmt.Sprintf("version %d", sqliteruntime.SchemaVersion+1), fmt.Sprintf("up to %d", sqliteruntime.SchemaVersion)} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
	}
	// The refused open released the directory.
	db = rawDB(t, dir)
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", sqliteruntime.SchemaVersion)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	open(t, sqliteruntime.Config{Dir: dir})
}

func TestRefusesForeignDatabase(t *testing.T) {
	dir := t.TempDir()
	db := rawDB(t, dir)
	if _, err := db.Exec("CREATE TABLE customers (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "not a runtime journal") {
		t.Fatalf("Open on another application's database = %v, want a refusal", err)
	}
}

// TestOddDirectoryName: characters that mean something in a URI are taken
// literally.
func TestOddDirectoryName(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state dir ?#%41&_pragma=x")
	j := open(t, sqliteruntime.Config{Dir: dir})
	if err := j.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, sqliteruntime.DatabaseFile)); err != nil {
		t.Fatalf("database not inside the state directory: %v", err)
	}
}
