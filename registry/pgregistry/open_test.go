package pgregistry_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgsession"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestDataPlaneHoldsNoControlPool opens a data-plane registry beside a full
// one: it serves reads, routing, settlement, replica writes and lifecycle
// commands, and refuses every catalog or admission write, naming the
// missing control pool.
func TestDataPlaneHoldsNoControlPool(t *testing.T) {
	ctx := t.Context()
	full, dbURL, clock := openClock(t, pgregistry.Config{})
	w := seedWorld(t, full, clock, registry.FleetPolicy("quota:f"), 1, 1, 1, 4)

	dp, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL, Now: clock.Now})
	must(t, err)
	defer dp.Close()
	if !dp.DataPlaneOnly() || full.DataPlaneOnly() {
		t.Fatalf("DataPlaneOnly: data plane %v, full %v", dp.DataPlaneOnly(), full.DataPlaneOnly())
	}
	if s := dp.PoolStats(); s.ControlMax != 0 || s.DataMax != pgregistry.DefaultDataMaxConns {
		t.Fatalf("data-plane pool stats %+v, want no control pool and the default data pool", s)
	}
	if s := full.PoolStats(); s.ControlMax == 0 {
		t.Fatalf("full registry pool stats %+v, want a control pool", s)
	}

	a, err := dp.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantName(0), CapabilityID: "alpha.read"})
	must(t, err)
	must(t, dp.Settle(ctx, a, registry.SettlementCompleted))
	rep := w.replicas[0]
	rep.LeaseExpiresAt, rep.HealthRevision = clock.Now().Add(2*time.Hour), rep.HealthRevision+1
	must(t, dp.PutReplica(ctx, rep))
	if _, err := dp.QueryCapabilities(ctx, registry.CatalogQuery{Limit: 10}, registry.ForTenant(tenantName(0))); err != nil {
		t.Fatal(err)
	}
	rd, err := dp.Readiness(ctx)
	must(t, err)
	if !rd.Ready() || rd.Pool == nil || rd.Pool.ControlMax != 0 || rd.SchemaVersion != pgregistry.SchemaVersion {
		t.Fatalf("data-plane readiness %+v", rd)
	}

	writes := map[string]func() error{
		"PutAdmissionPolicy": func() error { return dp.PutAdmissionPolicy(ctx, registry.FleetPolicy("quota:new")) },
		"PutConnectorType": func() error {
			return dp.PutConnectorType(ctx, registry.ConnectorType{ID: "ctype_b", Name: "b", Owner: "o", Enabled: true})
		},
		"SetConnectorTypeEnabled": func() error { return dp.SetConnectorTypeEnabled(ctx, "ctype_alpha", false) },
		"AdmitVersion":            func() error { return dp.AdmitVersion(ctx, w.version) },
		"SetVersionStatus":        func() error { return dp.SetVersionStatus(ctx, w.version.ID, registry.VersionRevoked) },
		"PutInstance": func() error {
			i, err := dp.ConnectorInstance(ctx, rep.InstanceID)
			if err != nil {
				return err
			}
			i.ConfigRevision++
			return dp.PutInstance(ctx, i)
		},
		"PutBinding": func() error {
			return dp.PutBinding(ctx, registry.CapabilityBinding{TenantID: tenantName(0), CapabilityID: "alpha.read", InstanceID: rep.InstanceID, PolicyRevision: 9, Enabled: true})
		},
		"Batch": func() error { return dp.Batch(ctx, func(registry.Administrator) error { return nil }) },
	}
	rev, err := dp.CatalogRevision(ctx)
	must(t, err)
	for name, write := range writes {
		err := write()
		if !errors.Is(err, pgregistry.ErrNoControlPool) || !strings.Contains(err.Error(), "OpenDataPlane") {
			t.Errorf("%s on a data-plane registry: %v, want ErrNoControlPool naming OpenDataPlane", name, err)
		}
	}
	if got, _ := dp.CatalogRevision(ctx); got != rev {
		t.Fatalf("refused writes moved the catalog revision from %d to %d", rev, got)
	}
}

func TestOpenValidatesConfig(t *testing.T) {
	ctx := t.Context()
	for _, c := range []struct {
		name string
		open func() error
	}{
		{"Open without ControlURL", func() error { _, err := pgregistry.Open(ctx, pgregistry.Config{DataURL: "postgres://x/y"}); return err }},
		{"OpenDataPlane with ControlURL", func() error {
			_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{ControlURL: "postgres://x/y", DataURL: "postgres://x/y"})
			return err
		}},
		{"OpenDataPlane without DataURL", func() error { _, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{}); return err }},
		{"negative pool", func() error {
			_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: "postgres://x/y", DataMaxConns: -1})
			return err
		}},
		{"acquire timeout too long", func() error {
			_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: "postgres://x/y", AcquireTimeout: time.Hour})
			return err
		}},
		{"negative tenant route concurrency", func() error {
			_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: "postgres://x/y", TenantRouteConcurrency: -1})
			return err
		}},
		{"tenant route concurrency too high", func() error {
			_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: "postgres://x/y", TenantRouteConcurrency: 257})
			return err
		}},
		{"bad limits", func() error {
			_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: "postgres://x/y", Limits: registry.Limits{MaxPageSize: -1}})
			return err
		}},
		{"malformed URL", func() error {
			_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: "::not a url"})
			return err
		}},
	} {
		if err := c.open(); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", c.name, err)
		}
	}
}

// TestSchemaVerification: a data-plane registry refuses a database without
// the schema, or with a newer one; start-up stops on a changed or unknown
// migration and says which.
func TestSchemaVerification(t *testing.T) {
	ctx := t.Context()
	dbURL := pgtest.NewDatabase(t)
	_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL})
	if !errors.Is(err, pgregistry.ErrSchemaMismatch) || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("OpenDataPlane on an empty database: %v, want ErrSchemaMismatch (not installed)", err)
	}
	must(t, pgregistry.Migrate(ctx, dbURL))
	must(t, pgregistry.Migrate(ctx, dbURL)) // idempotent
	dp, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL})
	must(t, err)
	dp.Close()
	admin := connect(t, dbURL)
	var n int
	must(t, admin.QueryRow(ctx, `SELECT count(*) FROM aip_registry.schema_migrations`).Scan(&n))
	if n != pgregistry.SchemaVersion {
		t.Fatalf("%d migrations recorded after two Migrate calls, want %d", n, pgregistry.SchemaVersion)
	}

	// A newer build migrated the database.
	_, err = admin.Exec(ctx, `INSERT INTO aip_registry.schema_migrations (version, name, checksum, applied_at_ms) VALUES ($1, 'from_the_future', 'abc', 0)`, pgregistry.SchemaVersion+1)
	must(t, err)
	_, err = pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL})
	if !errors.Is(err, pgregistry.ErrSchemaMismatch) || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("OpenDataPlane on a newer schema: %v, want ErrSchemaMismatch (newer)", err)
	}
	_, err = pgregistry.Open(ctx, pgregistry.Config{ControlURL: dbURL})
	if !errors.Is(err, pgregistry.ErrUnknownMigration) || !strings.Contains(err.Error(), "from_the_future") {
		t.Fatalf("Open on a newer schema: %v, want ErrUnknownMigration naming it", err)
	}
	_, err = admin.Exec(ctx, `DELETE FROM aip_registry.schema_migrations WHERE version > $1`, pgregistry.SchemaVersion)
	must(t, err)

	// An applied migration was edited.
	_, err = admin.Exec(ctx, `UPDATE aip_registry.schema_migrations SET checksum = 'edited' WHERE version = 1`)
	must(t, err)
	for name, open := range map[string]func() error{
		"Open":          func() error { _, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: dbURL}); return err },
		"OpenDataPlane": func() error { _, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL}); return err },
		"Migrate":       func() error { return pgregistry.Migrate(ctx, dbURL) },
	} {
		if err := open(); !errors.Is(err, pgregistry.ErrMigrationChanged) || !strings.Contains(err.Error(), "0001_registry") {
			t.Errorf("%s with an edited migration: %v, want ErrMigrationChanged naming 0001_registry", name, err)
		}
	}
}

// TestConcurrentMigrations: concurrent installers serialise on the
// migration lock and the schema is installed once.
func TestConcurrentMigrations(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- pgregistry.Migrate(context.Background(), dbURL) }()
	}
	for range 4 {
		must(t, <-errs)
	}
	var n int
	must(t, connect(t, dbURL).QueryRow(t.Context(), `SELECT count(*) FROM aip_registry.schema_migrations`).Scan(&n))
	if n != pgregistry.SchemaVersion {
		t.Fatalf("%d migrations recorded, want %d", n, pgregistry.SchemaVersion)
	}
}

// TestAssignmentSurvivesReopen: routes, reservations and settlement state
// are durable across closing and reopening the pools.
func TestAssignmentSurvivesReopen(t *testing.T) {
	ctx := t.Context()
	r1, dbURL, clock := openClock(t, pgregistry.Config{})
	seedWorld(t, r1, clock, registry.ConservativePolicy("quota:c"), 1, 1, 1, 4)
	req := registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantName(0), CapabilityID: "alpha.read"}
	a, err := r1.Resolve(ctx, req)
	must(t, err)
	settled, err := r1.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantName(0), CapabilityID: "alpha.write"})
	must(t, err)
	must(t, r1.Settle(ctx, settled, registry.SettlementOutcomeUnknown))
	r1.Close()
	r1.Close() // idempotent
	if _, err := r1.Assignment(ctx, req.ActionID); err == nil {
		t.Fatal("a closed registry still answers")
	}

	r2, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: dbURL, Now: clock.Now})
	must(t, err)
	defer r2.Close()
	got, err := r2.Assignment(ctx, req.ActionID)
	must(t, err)
	if !got.Equal(&a) {
		t.Fatalf("after reopening: %+v, want %+v", got, a)
	}
	if res, err := r2.Reservation(ctx, req.ActionID); err != nil || !res.Reserved {
		t.Fatalf("reservation after reopening: %+v, %v", res, err)
	}
	if res, err := r2.Reservation(ctx, settled.ActionID); err != nil || res.Reserved || res.LastSettlement != registry.SettlementOutcomeUnknown {
		t.Fatalf("settled reservation after reopening: %+v, %v", res, err)
	}
	again, err := r2.Resolve(ctx, req)
	must(t, err)
	if !again.Equal(&a) {
		t.Fatal("resolving again after reopening moved the route")
	}
	rep, err := r2.ConnectorReplica(ctx, a.ReplicaID)
	must(t, err)
	if rep.ActiveAssignments != 1 || rep.Circuit.ConsecutiveFailures != 1 {
		t.Fatalf("replica after reopening: %d active, %d failures, want 1 and 1", rep.ActiveAssignments, rep.Circuit.ConsecutiveFailures)
	}
	must(t, r2.Settle(ctx, a, registry.SettlementCompleted))
	l, err := r2.Ledger(ctx)
	must(t, err)
	registrytest.CheckLedger(t, l)
	if len(l.Reservations) != 0 || len(l.Counters) != 0 {
		t.Fatalf("ledger after settling everything: %+v", l)
	}
}

// TestSilentServerConnectGivesUp: a server that accepts connections and
// never answers them (a hung server, a partition that drops packets, the
// old address after a failover). The pool builds connections in the
// background, beyond the deadline of the acquire that asked: the attempt
// must give up by itself (within AcquireTimeout but not below
// MinConnectTimeout, unless the URL sets connect_timeout) and close its
// socket, instead of holding a pool slot until TCP gives up, many minutes
// after the database is back.
func TestSilentServerConnectGivesUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	url := "postgres://aip@" + ln.Addr().String() + "/aip?sslmode=disable"
	pool, err := pgregistry.NewDataPool(t.Context(), pgregistry.Config{DataURL: url, AcquireTimeout: 200 * time.Millisecond})
	must(t, err)
	defer pool.Close()
	actx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	if _, err := pool.Acquire(actx); err == nil {
		t.Fatal("acquired a connection from a silent server")
	}
	cancel()
	c := <-accepted
	defer c.Close()
	// The attempt must close its connection while the pool stays open; a
	// generous bound only decides when to report that it never does.
	must(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the connection attempt to a silent server was not given up: %v", err)
	}
	// The pool frees the slot just after the attempt closed its socket:
	// wait for that, with the same generous bound.
	for deadline := time.Now().Add(20 * time.Second); pool.Stat().TotalConns() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the pool still counts %d connections after the attempt gave up", pool.Stat().TotalConns())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSlowHandshakeConnectsDespiteShortAcquireTimeout: a database whose
// connection handshake takes longer than a short AcquireTimeout (a remote
// server with TLS and password authentication, a loaded one) still gets
// connections: a call that cannot wait fails, but the connection it asked
// for is finished in the background for the next. Bounding the
// establishment by AcquireTimeout alone (--acquire-timeout is 1ms to 60s)
// made every attempt give up half-way, so the registry never had a
// connection again.
func TestSlowHandshakeConnectsDespiteShortAcquireTimeout(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	must(t, err)
	const latency = 300 * time.Millisecond
	proxy := newLatencyProxy(t, u.Host, latency)
	u.Host = proxy
	pool, err := pgregistry.NewDataPool(t.Context(), pgregistry.Config{DataURL: u.String(), AcquireTimeout: 20 * time.Millisecond})
	must(t, err)
	defer pool.Close()
	// The pool's own wait is not AcquireTimeout (the registry bounds its
	// calls with it); this acquire waits as long as the handshake takes.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("no connection through a handshake of %s with AcquireTimeout 20ms: %v", latency, err)
	}
	c.Release()
}

// newLatencyProxy forwards connections to target, holding the server's
// first answer on each connection for latency; it returns its address.
func newLatencyProxy(t *testing.T, target string, latency time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			track(client)
			track(server)
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(server, client)
				server.Close()
			}()
			go func() {
				defer wg.Done()
				first := make([]byte, 1)
				if _, err := io.ReadFull(server, first); err != nil {
					client.Close()
					return
				}
				time.Sleep(latency) // the simulated network, not synchronisation
				if _, err := client.Write(first); err == nil {
					_, _ = io.Copy(client, server)
				}
				client.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestSessionsEndAbandonedTransactions: the registry's sessions carry an
// idle_in_transaction_session_timeout when the role has none, so one a
// dispatcher or control plane was cut off from mid-transaction does not
// hold admission counters and replica rows until TCP notices (the e2e
// TestDatabaseOutage freezes such sessions).
func TestSessionsEndAbandonedTransactions(t *testing.T) {
	pool, err := pgregistry.NewDataPool(t.Context(), pgregistry.Config{DataURL: pgtest.NewDatabase(t)})
	must(t, err)
	defer pool.Close()
	var v string
	must(t, pool.QueryRow(t.Context(), "SHOW idle_in_transaction_session_timeout").Scan(&v))
	if v != "1min" {
		t.Errorf("the registry's sessions show idle_in_transaction_session_timeout %q, want 1min", v)
	}
}

// TestSessionsCommitDurably: the registry's sessions never commit
// asynchronously. With synchronous_commit off (as the server, the role,
// the database or the URL may set it) PostgreSQL acknowledges a commit
// before its WAL is flushed, and a server crash loses it: a route
// assignment or settlement the dispatcher acted on would be gone, and a
// retry of the same action ID could be routed to another replica and run
// twice. Every pool's session where it is off gets local; a stronger
// value is kept.
func TestSessionsCommitDurably(t *testing.T) {
	ctx := t.Context()
	dbURL := pgtest.NewDatabase(t)
	conn := connect(t, dbURL)
	_, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{conn.Config().Database}.Sanitize()+" SET synchronous_commit = off")
	must(t, err)

	r, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: dbURL})
	must(t, err)
	defer r.Close()
	for _, pool := range []string{"control", "data"} {
		if v, err := r.PoolSetting(ctx, pool, "synchronous_commit"); err != nil || v != "local" {
			t.Errorf("synchronous_commit off for the database: the %s pool's session has %q (%v), want local", pool, v, err)
		}
	}
	dp, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL})
	must(t, err)
	defer dp.Close()
	if v, err := dp.PoolSetting(ctx, "data", "synchronous_commit"); err != nil || v != "local" {
		t.Errorf("synchronous_commit off for the database: a data plane's session has %q (%v), want local", v, err)
	}

	u, err := url.Parse(dbURL)
	must(t, err)
	q := u.Query()
	q.Set("synchronous_commit", "remote_apply")
	u.RawQuery = q.Encode()
	kept, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: u.String()})
	must(t, err)
	defer kept.Close()
	if v, err := kept.PoolSetting(ctx, "data", "synchronous_commit"); err != nil || v != "remote_apply" {
		t.Errorf("synchronous_commit remote_apply in the URL: the session has %q (%v), want it kept", v, err)
	}
}

// TestSessionsDetectDeadPeers: the registry's sessions, and the apply
// lock's, carry server-side TCP keepalives and tcp_user_timeout, so the
// server ends the sessions of a process whose machine died within minutes
// instead of the system's 2 hours (15 minutes with data unacknowledged):
// its connection slots come back, and an apply lock it held is released
// for the next apply.
func TestSessionsDetectDeadPeers(t *testing.T) {
	ctx := t.Context()
	dbURL := pgtest.NewDatabase(t)
	want := map[string]string{
		"tcp_keepalives_idle":     strconv.Itoa(pgsession.KeepalivesIdle),
		"tcp_keepalives_interval": strconv.Itoa(pgsession.KeepalivesInterval),
		"tcp_keepalives_count":    strconv.Itoa(pgsession.KeepalivesCount),
		"tcp_user_timeout":        strconv.Itoa(pgsession.UserTimeoutMillis),
	}
	r, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: dbURL})
	must(t, err)
	defer r.Close()
	lock, err := pgregistry.ConnectApplyLock(ctx, dbURL)
	must(t, err)
	defer lock.Close(context.Background())
	for name, w := range want {
		for _, pool := range []string{"control", "data"} {
			if v, err := r.PoolSetting(ctx, pool, name); err != nil || v != w {
				t.Errorf("the %s pool's session has %s %q (%v), want %s", pool, name, v, err, w)
			}
		}
		var v string
		if err := lock.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil || v != w {
			t.Errorf("the apply lock's session has %s %q (%v), want %s", name, v, err, w)
		}
	}
}

// TestRefusedConnectionSaysSo: a database that refuses the connection is
// reported as one the registry cannot connect to, at once; the error said
// "no database connection within 5s", a wait that never happened.
func TestRefusedConnectionSaysSo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	_, err = pgregistry.Open(t.Context(), pgregistry.Config{ControlURL: "postgres://aip@" + addr + "/aip?sslmode=disable", AcquireTimeout: time.Minute})
	if !errors.Is(err, registry.ErrStorage) || !strings.Contains(err.Error(), "cannot connect to the database") || strings.Contains(err.Error(), "within") {
		t.Fatalf("Open of a database refusing connections: %v; want ErrStorage saying it cannot connect, not a wait", err)
	}
}

// TestConnectFailureSaysWhereAndWhy: a connection that cannot be made
// read "registry: storage failure: verify schema: cannot connect to the
// database: failed to connect to `user=aip database=aip`:" and then one
// indented line per attempt, the same refusal twice under sslmode=prefer
// (TLS, then plain). It is now the address and the reason, once, from
// Open, OpenDataPlane, MigrateSchema and LockApply alike, and it still
// matches ErrStorage (not LockApply's) and pgx's *pgconn.ConnectError,
// which commands look for to add their hint.
func TestConnectFailureSaysWhereAndWhy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	u := "postgres://aip:secret@" + addr + "/aip?sslmode=prefer"
	ctx := t.Context()
	calls := []struct {
		name    string
		storage bool
		call    func() error
	}{
		{"Open", true, func() error { _, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: u}); return err }},
		{"OpenDataPlane", true, func() error { _, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: u}); return err }},
		{"MigrateSchema", true, func() error { _, err := pgregistry.MigrateSchema(ctx, u); return err }},
		{"LockApply", false, func() error { _, err := pgregistry.LockApply(ctx, u, nil); return err }},
	}
	want := "cannot connect to the database at " + addr + ": connection refused"
	for _, c := range calls {
		err := c.call()
		var ce *pgconn.ConnectError
		if err == nil || err.Error() != want || !errors.As(err, &ce) || errors.Is(err, registry.ErrStorage) != c.storage {
			t.Errorf("%s: err = %v, want %q matching *pgconn.ConnectError (and ErrStorage: %v)", c.name, err, want, c.storage)
		}
	}
}

// TestURLThatDoesNotParseIsNamedAsTheCallerKnowsIt: a URL that does not
// parse was named by the pool it was for, "pgregistry: data pool URL (...)
// does not parse", also when it was the only URL given (registry status
// opens the data plane with the admin role's URL). One URL is "the
// database URL"; only when Open is given two different ones does the
// error say which Config field holds it.
func TestURLThatDoesNotParseIsNamedAsTheCallerKnowsIt(t *testing.T) {
	ctx := t.Context()
	const bad = "not a url"
	const good = "postgres://aip@127.0.0.1:1/aip"
	const reason = " (not a postgres:// URL; not shown) does not parse: failed to parse as keyword/value (invalid keyword/value); write it as postgres://USER:PASSWORD@HOST:PORT/DATABASE"
	calls := []struct {
		name string
		call func() error
		want string
	}{
		{"OpenDataPlane", func() error { _, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: bad}); return err }, "the database URL" + reason},
		{"Open", func() error { _, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: bad}); return err }, "the database URL" + reason},
		{"Open with the same URL twice", func() error {
			_, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: bad, DataURL: bad})
			return err
		}, "the database URL" + reason},
		{"Open with a bad data URL", func() error {
			_, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: good, DataURL: bad})
			return err
		}, "Config.DataURL" + reason},
		{"Open with a bad control URL", func() error {
			_, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: bad, DataURL: good})
			return err
		}, "Config.ControlURL" + reason},
		{"MigrateSchema", func() error { _, err := pgregistry.MigrateSchema(ctx, bad); return err }, "the database URL" + reason},
		{"LockApply", func() error { _, err := pgregistry.LockApply(ctx, bad, nil); return err }, "the database URL" + reason},
	}
	for _, c := range calls {
		if err := c.call(); err == nil || err.Error() != c.want || !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("%s: err = %v, want %q matching ErrInvalid", c.name, err, c.want)
		}
	}
}
