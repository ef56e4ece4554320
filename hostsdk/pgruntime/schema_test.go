package pgruntime_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// TestRoleWithoutSchemaIsToldWhatToDo: a journal role that may create
// tables in no schema of its search_path (PostgreSQL 15 and later grant no
// CREATE on public) is refused at Open with what to do, not PostgreSQL's
// bare "permission denied for schema public"; given a schema named after
// it, as the operator guide says, the same role opens its journal.
func TestRoleWithoutSchemaIsToldWhatToDo(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	role := "aip_test_journal_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// Roles are the server's, not the database's: dropped at the end, after
	// the schema the role may come to own.
	if _, err := admin.Exec(t.Context(), "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dbURL)
		if err != nil {
			t.Errorf("connect to drop role %s: %v", role, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+role+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", role, err)
		}
		if _, err := conn.Exec(context.Background(), "DROP ROLE "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	var canCreate bool
	if err := admin.QueryRow(t.Context(), "SELECT has_schema_privilege($1, 'public', 'CREATE')", role).Scan(&canCreate); err != nil {
		t.Fatal(err)
	}
	if canCreate {
		t.Skip("this server lets every role create in public (PostgreSQL before 15)")
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	cfg := pgruntime.Config{DatabaseURL: u.String(), Namespace: aip.NewID(aip.PrefixReplica)}

	_, err = pgruntime.Open(t.Context(), cfg)
	if err == nil {
		t.Fatal("Open by a role that may create in no schema succeeded")
	}
	for _, want := range []string{
		"; role " + role + " may not create the journal's tables: the host creates them in the first schema of its search_path",
		"permission denied for schema public",
		"CREATE SCHEMA AUTHORIZATION " + role,
		"grant it CREATE on that schema",
		"operator guide, section 7",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}

	if _, err := admin.Exec(t.Context(), "CREATE SCHEMA AUTHORIZATION "+role); err != nil {
		t.Fatal(err)
	}
	j, err := pgruntime.Open(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Open after CREATE SCHEMA AUTHORIZATION %s: %v", role, err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}
