package sqliteruntime

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/aipfleet/aipfleet/aip"
)

// newSuffix names the file a new journal is built in before it is renamed
// to DatabaseFile.
const newSuffix = ".new"

// createDatabase makes the journal file at path when there is none: it
// builds it under a temporary name (mode 0600; SQLite gives the -wal and
// -shm files the database file's mode), installs the schema, syncs it and
// renames it into place. A journal file that exists has therefore always
// held a journal, so one that holds no schema (emptied, truncated to
// nothing) is refused as damaged rather than taken for a new journal: that
// would forget every action the replica ran and run them again when they
// are delivered again. What an interrupted creation left under the
// temporary name never held an action and is removed. The caller holds the
// state directory's lock.
func createDatabase(ctx context.Context, path string) error {
	if _, err := os.Lstat(path); err == nil {
		return checkFiles(path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sqliteruntime: database: %w", err)
	}
	// A log without its database: the file was deleted or moved away, and
	// the log would be replayed onto a new one.
	if fi, err := os.Lstat(path + "-wal"); err == nil && fi.Size() > 0 {
		return corruptError(path, "the file is missing but its write-ahead log "+filepath.Base(path)+"-wal is there (the journal file was deleted or moved)")
	}
	tmp := path + newSuffix
	for _, p := range []string{tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sqliteruntime: remove what an interrupted creation left: %w", err)
		}
	}
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("sqliteruntime: create database: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("sqliteruntime: create database: %w", err)
	}
	if err := installNew(ctx, tmp); err != nil {
		return err
	}
	if err := syncFile(tmp); err != nil {
		return fmt.Errorf("sqliteruntime: create database: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("sqliteruntime: create database: %w", err)
	}
	if err := syncFile(filepath.Dir(path)); err != nil {
		return fmt.Errorf("sqliteruntime: create database: %w", err)
	}
	return nil
}

// installNew installs the schema in the empty database file at path and
// closes it, so all of it is in that file.
func installNew(ctx context.Context, path string) (err error) {
	db, err := sql.Open("sqlite", dsn(path, "mode=rw", "_pragma=synchronous(FULL)", "_pragma=fullfsync(1)"))
	if err != nil {
		return fmt.Errorf("sqliteruntime: create database %s: %w", path, err)
	}
	defer func() {
		if cerr := db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("sqliteruntime: create database %s: %w", path, cerr)
		}
	}()
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqliteruntime: create database %s: %w", path, err)
	}
	defer conn.Close()
	return installSchema(ctx, conn, path, true)
}

// syncFile flushes the file or directory at path to stable storage.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// checkFiles refuses an existing journal file, or its -wal or -shm file,
// that users other than its owner may write to, or that another user than
// this process's or root owns (aip.FileOwnerOK): one of them could delete the record of actions
// that ran, which would then run again. The host creates them 0600; a
// journal restored from a backup with another mode or owner is the usual
// cause. It also refuses one that is not a regular file of the directory
// itself, a symbolic link, or a file with other hard links (see
// checkFileLinks): another state directory reaching the same file is not
// covered by this directory's lock, so two hosts would open one journal
// (and recover each other's running actions); through a hard link each
// also keeps its own -wal beside the one database.
func checkFiles(path string) error {
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) && p != path {
			continue
		}
		if err != nil {
			return fmt.Errorf("sqliteruntime: database: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("sqliteruntime: %s is not a regular file (a symbolic link, or another kind): the journal must be a file of the state directory itself, which the directory's lock covers; give each host its own state directory, and move this one away", p)
		}
		if err := checkFileLinks(p, fi); err != nil {
			return err
		}
		if perm := fi.Mode().Perm(); perm&0o022 != 0 {
			return fmt.Errorf("sqliteruntime: %s is writable by its group or by others (mode %04o): another user could change the record of the actions this replica ran; run chmod go-w on it",
				p, aip.OctalMode(fi.Mode()))
		}
		if uid, ok := aip.FileOwnerOK(fi); !ok {
			euid := os.Geteuid()
			return fmt.Errorf("sqliteruntime: %s is owned by uid %d, not by this process's user (uid %d): that user could change the record of the actions this replica ran; chown it to uid %d",
				p, uid, euid, euid)
		}
	}
	return nil
}
