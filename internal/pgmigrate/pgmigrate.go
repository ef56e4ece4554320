// Package pgmigrate applies and verifies the embedded, numbered SQL
// migrations of a PostgreSQL backend (hostsdk/pgruntime, registry/pgregistry).
//
// A backend embeds files named NNNN_name.sql, numbered 1, 2, 3, ... without
// gaps; Load reads them and checksums each (SHA-256 of the file). Apply, in
// the caller's transaction, takes the backend's advisory lock, creates its
// migrations table when missing, checks what the table records against the
// files and applies what is missing in order, recording each. Verify checks
// without changing anything that the database holds exactly this build's
// migrations, for processes that must never migrate.
//
// The table (its name, columns and creation statement) belongs to the
// backend and is described by a Ledger, so each backend keeps its schema.
//
// Every error is an *Error. Its Kind is one of the sentinels below (matchable
// with errors.Is) or nil for a failed database call (then Err is the cause).
// A backend re-labels them with Wrap so its callers see the backend's own
// error kinds and prefix.
package pgmigrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/internal/pgsession"
)

// Error kinds.
var (
	// ErrFileName: an embedded file is not named NNNN_name.sql.
	ErrFileName = errors.New("pgmigrate: migration file is not named NNNN_name.sql")
	// ErrGap: the embedded files are not numbered 1, 2, 3, ... (a number is
	// missing or used twice).
	ErrGap = errors.New("pgmigrate: migrations are not numbered 1, 2, 3, ... without gaps")
	// ErrChanged: an applied migration's recorded checksum differs from the
	// embedded file of the same version.
	ErrChanged = errors.New("pgmigrate: applied migration changed")
	// ErrUnknown: the database records a migration past this build's last
	// one (a newer build migrated it).
	ErrUnknown = errors.New("pgmigrate: unknown applied migration")
	// ErrRecordGap: the migrations table skips a version this build has, or
	// records one below 1; no build writes such a table.
	ErrRecordGap = errors.New("pgmigrate: the migrations table records a gap")
	// ErrNotInstalled (Verify): the migrations table does not exist.
	ErrNotInstalled = errors.New("pgmigrate: schema not installed")
	// ErrTooOld (Verify): the database lacks some of this build's migrations.
	ErrTooOld = errors.New("pgmigrate: schema older than this build")
	// ErrTooNew (Verify): the database has migrations this build does not
	// know.
	ErrTooNew = errors.New("pgmigrate: schema newer than this build")
)

// Error is every error of this package.
type Error struct {
	// Kind is one of the package's sentinels, or nil for a failed database
	// or file call.
	Kind error
	// Migration names the migration concerned (e.g. 0001_runtime.sql), if
	// any.
	Migration string
	// Detail says what happened and, where a person must act, what to do.
	Detail string
	// Err is the cause, if any.
	Err error
}

func (e *Error) Error() string {
	prefix := "pgmigrate"
	if e.Kind != nil {
		prefix = e.Kind.Error()
	}
	return e.message(prefix)
}

func (e *Error) message(prefix string) string {
	s := prefix + ": " + e.Detail
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Wrap re-labels err for a backend. An *Error whose Kind is a key of kinds
// reads "<kinds[Kind]>: <detail>" and also matches kinds[Kind] with
// errors.Is; any other *Error reads "<prefix>: <detail>". Either still
// matches its Kind and cause, and errors.As finds the *Error. Other errors
// (nil included) are returned unchanged.
func Wrap(err error, prefix string, kinds map[error]error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	if k, ok := kinds[e.Kind]; ok && k != nil {
		return &wrapped{msg: e.message(k.Error()), errs: []error{k, e}}
	}
	return &wrapped{msg: e.message(prefix), errs: []error{e}}
}

type wrapped struct {
	msg  string
	errs []error
}

func (w *wrapped) Error() string   { return w.msg }
func (w *wrapped) Unwrap() []error { return w.errs }

// Migration is one embedded schema change.
type Migration struct {
	Version  int    // 1, 2, 3, ...
	Name     string // the name part: "runtime" for 0001_runtime.sql
	File     string // the file name: 0001_runtime.sql
	SQL      string // the file's text
	Checksum string // lower-case hex SHA-256 of the file
}

// New returns the migration of version and name with text sql.
func New(version int, name, sql string) Migration {
	sum := sha256.Sum256([]byte(sql))
	return Migration{
		Version:  version,
		Name:     name,
		File:     fmt.Sprintf("%04d_%s.sql", version, name),
		SQL:      sql,
		Checksum: hex.EncodeToString(sum[:]),
	}
}

// fileName matches NNNN_name.sql.
var fileName = regexp.MustCompile(`^([0-9]{4})_([a-z0-9_]+)\.sql$`)

// Load reads every file of dir in fsys as a migration and returns them in
// version order. Every entry must be a file named NNNN_name.sql (name of
// lower-case letters, digits and underscores; ErrFileName), and the numbers
// must be 1, 2, 3, ... without gaps or repeats (ErrGap).
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, &Error{Detail: "read the migrations in " + dir, Err: err}
	}
	out := make([]Migration, 0, len(entries))
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil || e.IsDir() {
			return nil, &Error{Kind: ErrFileName, Migration: e.Name(),
				Detail: fmt.Sprintf("%s in %s: rename it NNNN_name.sql (four digits, then lower-case letters, digits and underscores)", e.Name(), dir)}
		}
		text, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, &Error{Migration: e.Name(), Detail: "read migration " + e.Name(), Err: err}
		}
		v, _ := strconv.Atoi(m[1])
		out = append(out, New(v, m[2], string(text)))
	}
	slices.SortStableFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, &Error{Kind: ErrGap, Migration: m.File,
				Detail: fmt.Sprintf("%s in %s has version %d where %d was expected", m.File, dir, m.Version, i+1)}
		}
	}
	return out, nil
}

// Latest is the version of the last of ms (0 when there is none).
func Latest(ms []Migration) int {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Lock is a transaction-level advisory lock key: one bigint, or two
// integers (see PostgreSQL's pg_advisory_xact_lock).
type Lock struct {
	args []any
}

// Lock64 is the advisory lock of the bigint key k.
func Lock64(k int64) Lock { return Lock{args: []any{k}} }

// Lock32 is the advisory lock of the integer pair (class, id).
func Lock32(class, id int32) Lock { return Lock{args: []any{class, id}} }

// Ledger describes a backend's migrations table. The table has an integer
// column version, a text column named by NameColumn and a text column
// checksum.
type Ledger struct {
	// Table is the table's name, schema-qualified when needed
	// (aip_registry.schema_migrations).
	Table string
	// Create creates the table (and what it needs) when missing; it must be
	// idempotent.
	Create string
	// NameColumn names the column recording the migration: "file" records
	// Migration.File (0001_runtime.sql), "name" records Migration.Name
	// (runtime).
	NameColumn string
	// ChecksumPrefix is written before the hex checksum ("sha256:" or "").
	ChecksumPrefix string
	// AppliedAtColumn, when set, is a column that records Now() for each
	// applied migration; when empty the table's default fills it.
	AppliedAtColumn string
	// Now is the value recorded in AppliedAtColumn.
	Now func() any
	// Lock serialises the appliers of the same schema.
	Lock Lock
}

func (l Ledger) check() error {
	switch {
	case l.Table == "" || l.Create == "":
		return errors.New("pgmigrate: Ledger.Table and Ledger.Create are required")
	case l.NameColumn != "file" && l.NameColumn != "name":
		return fmt.Errorf("pgmigrate: Ledger.NameColumn is %q; want \"file\" or \"name\"", l.NameColumn)
	case (l.AppliedAtColumn == "") != (l.Now == nil):
		return errors.New("pgmigrate: set Ledger.AppliedAtColumn and Ledger.Now together")
	case len(l.Lock.args) == 0:
		return errors.New("pgmigrate: Ledger.Lock is required (Lock64 or Lock32)")
	}
	return nil
}

// recorded is one row of the migrations table.
type recorded struct {
	version  int
	name     string // as stored in NameColumn
	checksum string
}

// label names a recorded migration in messages.
func (l Ledger) label(r recorded) string {
	if l.NameColumn == "file" {
		return r.name
	}
	return fmt.Sprintf("%04d_%s", r.version, r.name)
}

// Querier is what pgx.Tx, *pgx.Conn, *pgxpool.Conn and *pgxpool.Pool share.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Apply applies the migrations of ms the database lacks, in tx, and returns
// how many it applied; the caller commits. It first takes the ledger's
// advisory lock (held until tx ends, so concurrent appliers run one after
// the other and the later ones apply nothing) and creates the table when
// missing. It refuses, applying nothing, when an applied migration's
// checksum differs from ms (ErrChanged), when the table records a migration
// past the last of ms (ErrUnknown) or when it skips one (ErrRecordGap).
// Before anything it gives tx pgsession's idle-in-transaction timeout
// (when the session has none) and durable commit (pgsession.Transaction):
// a migration holds the lock and its tables' exclusive locks to the end,
// and a migrator cut off from the server mid-way would otherwise keep
// them, and every process waiting on them, until the server's TCP
// notices, hours by default; and a migration acknowledged under
// synchronous_commit off could be lost in a server crash after the
// migrator reported it done.
func Apply(ctx context.Context, tx pgx.Tx, l Ledger, ms []Migration) (applied int, err error) {
	if err := l.check(); err != nil {
		return 0, &Error{Detail: "invalid ledger", Err: err}
	}
	if err := pgsession.Transaction(ctx, tx); err != nil {
		return 0, &Error{Detail: "bound the migration's idle time", Err: err}
	}
	lock := `SELECT pg_advisory_xact_lock($1)`
	if len(l.Lock.args) == 2 {
		lock = `SELECT pg_advisory_xact_lock($1, $2)`
	}
	if _, err := tx.Exec(ctx, lock, l.Lock.args...); err != nil {
		return 0, &Error{Detail: "take the migration lock", Err: err}
	}
	if _, err := tx.Exec(ctx, l.Create); err != nil {
		return 0, &Error{Detail: "create the migrations table " + l.Table, Err: err}
	}
	rs, err := l.read(ctx, tx)
	if err != nil {
		return 0, err
	}
	if err := l.compare(rs, ms); err != nil {
		return 0, err
	}
	if len(rs) > len(ms) {
		r := rs[len(ms)]
		return 0, &Error{Kind: ErrUnknown, Migration: l.label(r),
			Detail: fmt.Sprintf("%s records migration %s (version %d), which this build (schema version %d) does not have; run a build of schema version %d or newer",
				l.Table, l.label(r), r.version, Latest(ms), rs[len(rs)-1].version)}
	}
	cols, params := "version, "+l.NameColumn+", checksum", "$1, $2, $3"
	if l.AppliedAtColumn != "" {
		cols, params = cols+", "+l.AppliedAtColumn, params+", $4"
	}
	insert := "INSERT INTO " + l.Table + " (" + cols + ") VALUES (" + params + ")"
	for _, m := range ms[len(rs):] {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return 0, &Error{Migration: m.File, Detail: "apply migration " + m.File, Err: err}
		}
		name := m.Name
		if l.NameColumn == "file" {
			name = m.File
		}
		args := []any{m.Version, name, l.ChecksumPrefix + m.Checksum}
		if l.AppliedAtColumn != "" {
			args = append(args, l.Now())
		}
		if _, err := tx.Exec(ctx, insert, args...); err != nil {
			return 0, &Error{Migration: m.File, Detail: "record migration " + m.File, Err: err}
		}
		applied++
	}
	return applied, nil
}

// Verify checks, changing nothing, that the database holds exactly ms:
// ErrNotInstalled when the table is missing, ErrChanged or ErrRecordGap as
// Apply, ErrTooOld when migrations of ms are missing and ErrTooNew when the
// table records more.
func Verify(ctx context.Context, q Querier, l Ledger, ms []Migration) error {
	if err := l.check(); err != nil {
		return &Error{Detail: "invalid ledger", Err: err}
	}
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, l.Table).Scan(&exists); err != nil {
		return &Error{Detail: "look for the migrations table " + l.Table, Err: err}
	}
	if !exists {
		return &Error{Kind: ErrNotInstalled,
			Detail: fmt.Sprintf("the schema is not installed (%s does not exist; want version %d)", l.Table, Latest(ms))}
	}
	rs, err := l.read(ctx, q)
	if err != nil {
		return err
	}
	if err := l.compare(rs, ms); err != nil {
		return err
	}
	installed := 0
	if len(rs) > 0 {
		installed = rs[len(rs)-1].version
	}
	switch {
	case len(rs) < len(ms):
		return &Error{Kind: ErrTooOld, Migration: ms[len(rs)].File,
			Detail: fmt.Sprintf("the installed schema is version %d, older than version %d this build needs (%s and later are missing); apply the migrations first",
				installed, Latest(ms), ms[len(rs)].File)}
	case len(rs) > len(ms):
		r := rs[len(ms)]
		return &Error{Kind: ErrTooNew, Migration: l.label(r),
			Detail: fmt.Sprintf("the installed schema is version %d, newer than version %d this build knows (from %s on); run a build of schema version %d",
				installed, Latest(ms), l.label(r), installed)}
	}
	return nil
}

func (l Ledger) read(ctx context.Context, q Querier) ([]recorded, error) {
	rows, err := q.Query(ctx, "SELECT version, "+l.NameColumn+", checksum FROM "+l.Table+" ORDER BY version")
	if err != nil {
		return nil, &Error{Detail: "read applied migrations from " + l.Table, Err: err}
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (recorded, error) {
		var r recorded
		err := row.Scan(&r.version, &r.name, &r.checksum)
		return r, err
	})
	if err != nil {
		return nil, &Error{Detail: "read applied migrations from " + l.Table, Err: err}
	}
	return rs, nil
}

// compare checks the recorded migrations that overlap ms: the i-th must be
// version i+1 with the checksum of ms[i]. Recorded migrations past the last
// of ms are the caller's to judge.
func (l Ledger) compare(rs []recorded, ms []Migration) error {
	for i, r := range rs {
		if i >= len(ms) {
			break
		}
		m := ms[i]
		switch {
		case r.version > Latest(ms):
			return &Error{Kind: ErrUnknown, Migration: l.label(r),
				Detail: fmt.Sprintf("%s records migration %s (version %d), which this build (schema version %d) does not have, and lacks %s; run a build of schema version %d or newer",
					l.Table, l.label(r), r.version, Latest(ms), m.File, rs[len(rs)-1].version)}
		case r.version != m.Version:
			return &Error{Kind: ErrRecordGap, Migration: l.label(r),
				Detail: fmt.Sprintf("%s records migration %s (version %d) where version %d (%s) belongs; no build writes that: restore the table from a backup or remove the row",
					l.Table, l.label(r), r.version, m.Version, m.File)}
		case r.checksum != l.ChecksumPrefix+m.Checksum:
			return &Error{Kind: ErrChanged, Migration: m.File,
				Detail: fmt.Sprintf("migration %s was applied with checksum %s, but this build's file has %s; applied migrations are immutable: restore the original file and add a new migration instead",
					m.File, r.checksum, l.ChecksumPrefix+m.Checksum)}
		}
	}
	return nil
}
