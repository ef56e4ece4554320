package pgregistry

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestStripeShares: the stripes' shares of a limit add up to the limit, a
// stripe has a share exactly when it is usable for a scope of that limit,
// and the SQL settlement computes the same shares.
func TestStripeShares(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for limit := int64(1); limit <= 40; limit++ {
		var sum int64
		usable := usableStripes([]registry.AdmissionScope{{Kind: registry.ScopeGlobal, Limit: 10_000}, {Kind: registry.ScopeBinding, Limit: uint32(limit)}})
		for s := int16(0); s < counterStripes; s++ {
			share := stripeLimit(limit, s)
			sum += share
			if (share > 0) != (int(s) < usable) {
				t.Fatalf("limit %d: stripe %d has share %d but %d stripes are usable", limit, s, share, usable)
			}
			var inSQL int64
			err := conn.QueryRow(t.Context(), `SELECT `+stripeShareSQL+` FROM (SELECT $1::bigint AS lim) AS s, (SELECT $2::smallint AS stripe) AS st`, limit, s).Scan(&inSQL)
			if err != nil {
				t.Fatal(err)
			}
			if inSQL != share {
				t.Fatalf("limit %d, stripe %d: SQL share %d, Go share %d", limit, s, inSQL, share)
			}
		}
		if sum != limit {
			t.Fatalf("limit %d: the stripes' shares add up to %d", limit, sum)
		}
	}
}

// stripeWorld is one tenant with one binding of alpha.read under policy,
// on one replica with room for every route.
func stripeWorld(t *testing.T, policy registry.AdmissionPolicy) (*Registry, string) {
	t.Helper()
	ctx := t.Context()
	clock := registrytest.NewClock(registrytest.Epoch)
	dbURL := pgtest.NewDatabase(t)
	r, err := Open(ctx, Config{ControlURL: dbURL, Now: clock.Now, DataMaxConns: 8})
	must(t, err)
	t.Cleanup(r.Close)
	ct := registry.ConnectorType{ID: "ctype_alpha", Name: "alpha", Owner: "owner-alpha", Enabled: true}
	must(t, r.PutConnectorType(ctx, ct))
	v := registrytest.Version("cver_alpha1", ct.ID, "1.0.0", ct.Owner, registry.VersionActive,
		registrytest.Manifest("service:alpha", []aip.Capability{registrytest.Capability("alpha.read", "reads")}))
	must(t, r.AdmitVersion(ctx, v))
	must(t, r.PutAdmissionPolicy(ctx, policy))
	must(t, r.PutInstance(ctx, registry.ConnectorInstance{ID: "cinst_a", ConnectorTypeID: ct.ID, VersionID: v.ID, TenantID: "tenant-1",
		ConfigRevision: 1, SecretProviderRef: "secret://x", Status: registry.InstanceEnabled}))
	must(t, r.PutBinding(ctx, registry.CapabilityBinding{TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: "cinst_a",
		PolicyRevision: 1, QuotaPolicyRef: policy.PolicyRef, Enabled: true}))
	rep := registrytest.Replica("crepl_a", "cinst_a", v.ID, clock.Now().Add(time.Hour))
	rep.Capacity = 1000
	must(t, r.PutReplica(ctx, rep))
	return r, dbURL
}

// checkStripes checks every counter row: within its stripe's share of the
// limit it was reserved against, and the scope's stripes add up to want
// (when want is not negative).
func checkStripes(t *testing.T, r *Registry, kind registry.AdmissionScopeKind, limit int64, want int64) {
	t.Helper()
	rows, err := r.data.Query(t.Context(), `SELECT scope_kind, scope_key, stripe, active, reserve_limit FROM aip_registry.admission_counters`)
	must(t, err)
	var (
		k, key            string
		stripe            int16
		active, reserveAt int64
		sum               int64
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &key, &stripe, &active, &reserveAt}, func() error {
		if active > reserveAt {
			t.Errorf("counter %s %s stripe %d: %d active over its share %d", k, key, stripe, active, reserveAt)
		}
		if registry.AdmissionScopeKind(k) == kind {
			if reserveAt != stripeLimit(limit, stripe) {
				t.Errorf("counter %s %s stripe %d was reserved against %d, its share of %d is %d", k, key, stripe, reserveAt, limit, stripeLimit(limit, stripe))
			}
			sum += active
		}
		return nil
	})
	must(t, err)
	if want >= 0 && sum != want {
		t.Fatalf("the stripes of scope %s hold %d, want %d", kind, sum, want)
	}
}

// TestStripedLimitIsExact: a scope is refused only when every usable
// stripe is full, so one caller routes exactly the limit (walking from its
// lane's stripe to the others), gets the scope's own limit in the refusal,
// and routes again once one route settles; both settlements release the
// route's stripe, and the ledger adds the stripes up.
func TestStripedLimitIsExact(t *testing.T) {
	for _, c := range []struct {
		name  string
		kind  registry.AdmissionScopeKind
		limit uint32
	}{
		{"limit below the stripes", registry.ScopeBinding, 3},
		{"uneven shares", registry.ScopeGlobal, 11},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			pol := registry.ConservativePolicy("quota:small")
			if c.kind == registry.ScopeBinding {
				pol.MaxBindingInFlight = c.limit
			} else {
				pol.MaxGlobalInFlight = c.limit
			}
			r, _ := stripeWorld(t, pol)
			var routes []registry.RouteAssignment
			resolve := func() error {
				a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"})
				if err == nil {
					routes = append(routes, a)
				}
				return err
			}
			var err error
			for range c.limit + 5 {
				if err = resolve(); err != nil {
					break
				}
			}
			var full *registry.CapacityExceededError
			if !errors.As(err, &full) || full.Scope != c.kind || full.Limit != c.limit {
				t.Fatalf("after %d routes: %v, want the %s scope full at %d", len(routes), err, c.kind, c.limit)
			}
			if len(routes) != int(c.limit) {
				t.Fatalf("%d routes before the %s scope was full, want its limit %d", len(routes), c.kind, c.limit)
			}
			checkStripes(t, r, c.kind, int64(c.limit), int64(c.limit))
			l, err := r.Ledger(ctx)
			must(t, err)
			registrytest.CheckLedger(t, l)

			must(t, r.Settle(ctx, routes[0], registry.SettlementCompleted))
			checkStripes(t, r, c.kind, int64(c.limit), int64(c.limit)-1)
			if err := resolve(); err != nil {
				t.Fatalf("after a settlement freed a slot: %v", err)
			}
			if err := resolve(); !errors.As(err, &full) {
				t.Fatalf("past the limit again: %v, want the scope full", err)
			}
			for i, a := range routes[1:] {
				if i%2 == 0 {
					// The settlement that compares in Go releases the
					// route's stripe too.
					must(t, r.settleRead(ctx, a, registry.SettlementCompleted, 0))
				} else {
					must(t, r.Settle(ctx, a, registry.SettlementCompleted))
				}
			}
			checkStripes(t, r, c.kind, int64(c.limit), 0)
			l, err = r.Ledger(ctx)
			must(t, err)
			if len(l.Counters) != 0 || len(l.Reservations) != 0 {
				t.Fatalf("after every settlement the ledger holds %+v", l)
			}
		})
	}
}

// TestStripedLimitUnderConcurrency: two registries (starting their lanes at
// different stripes) route at once until refused; together they route
// exactly the limit, as every stripe is full before any caller is refused.
func TestStripedLimitUnderConcurrency(t *testing.T) {
	ctx := t.Context()
	const limit = 29
	pol := registry.ConservativePolicy("quota:small")
	pol.MaxTenantInFlight = limit
	a, dbURL := stripeWorld(t, pol)
	b, err := OpenDataPlane(ctx, Config{DataURL: dbURL, DataMaxConns: 8, Now: a.now})
	must(t, err)
	defer b.Close()
	a.stripeBase, b.stripeBase = 0, 5
	var (
		mu     sync.Mutex
		routed int
		wg     sync.WaitGroup
	)
	for k := range 12 {
		reg := []*Registry{a, b}[k%2]
		wg.Go(func() {
			for {
				_, err := reg.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"})
				var full *registry.CapacityExceededError
				switch {
				case errors.As(err, &full) && full.Scope == registry.ScopeTenant:
					return
				case errors.Is(err, registry.ErrReplicaUnavailable):
					continue // the one replica stayed locked by the others: try again
				case err != nil:
					t.Error(err)
					return
				}
				mu.Lock()
				routed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if routed != limit {
		t.Fatalf("%d routes through two registries, want exactly the tenant limit %d", routed, limit)
	}
	checkStripes(t, a, registry.ScopeTenant, limit, limit)
}

// TestStripeMigrationKeepsLimits: migration 0004 moves the counters of a
// version-3 registry to stripe 0, which is exact only while each holds no
// more than stripe 0's share; otherwise it stops, naming the scope and
// what to do, and commits nothing.
func TestStripeMigrationKeepsLimits(t *testing.T) {
	ctx := t.Context()
	ms, err := embeddedMigrations()
	must(t, err)
	if ms[3].Name != "counter_stripes" {
		t.Fatalf("migration 4 is %s", ms[3].File)
	}
	dbURL := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dbURL)
	must(t, err)
	defer conn.Close(context.Background())
	must(t, applyMigrations(ctx, conn, ms[:3], func() int64 { return 1 }))
	// Limit 20: stripe 0's share is 3.
	_, err = conn.Exec(ctx, `INSERT INTO aip_registry.admission_counters (scope_kind, scope_key, active, reserve_limit)
VALUES ('tenant', 'tenant-1', 4, 20), ('global', 'global', 2, 20)`)
	must(t, err)
	_, err = Open(ctx, Config{ControlURL: dbURL})
	if err == nil || !strings.Contains(err.Error(), "admission scope tenant tenant-1 has 4 reservations in flight") ||
		!strings.Contains(err.Error(), "stop the dispatchers gracefully") || !strings.Contains(err.Error(), "0004_counter_stripes.sql") {
		t.Fatalf("migrating counters over stripe 0's share: %v", err)
	}
	var version int
	must(t, conn.QueryRow(ctx, `SELECT max(version) FROM aip_registry.schema_migrations`).Scan(&version))
	if version != 3 {
		t.Fatalf("a refused migration left the schema at version %d", version)
	}
	_, err = conn.Exec(ctx, `UPDATE aip_registry.admission_counters SET active = 3 WHERE scope_kind = 'tenant'`)
	must(t, err)
	r, err := Open(ctx, Config{ControlURL: dbURL})
	must(t, err)
	defer r.Close()
	l, err := r.Ledger(ctx)
	must(t, err)
	got := map[string]uint32{}
	for _, c := range l.Counters {
		got[string(c.Kind)+"/"+c.Key] = c.Active
	}
	if len(got) != 2 || got["tenant/tenant-1"] != 3 || got["global/global"] != 2 {
		t.Fatalf("counters after the migration: %v", got)
	}
	var stripes int
	must(t, conn.QueryRow(ctx, `SELECT count(*) FROM aip_registry.admission_counters WHERE stripe <> 0`).Scan(&stripes))
	if stripes != 0 {
		t.Fatalf("%d migrated counters are not in stripe 0", stripes)
	}
}

// TestScopeStripes: with a tenant limit of 6 and a binding limit of 5
// (the global, type and instance limits large), a route's tenant and
// binding walk their stripes while its other scopes stay in the lane's
// stripe, so the route records a stripe per scope (counter_stripe -1 and
// scope_stripes). Statements of builds that know only counter_stripe
// cannot release or reroute such a route (migration 0011's
// constraints), and may still retry a released one. Every
// release path of this build releases each scope in its own stripe:
// Settle, the settlement that compares in Go, a retry's reservation
// again, the release of an unsent hand-out, and lease expiry; the counters then hold nothing, and the
// released routes are marked -2.
func TestScopeStripes(t *testing.T) {
	ctx := t.Context()
	pol := registry.ConservativePolicy("quota:small")
	pol.MaxTenantInFlight, pol.MaxBindingInFlight = 6, 5
	r, dbURL := stripeWorld(t, pol)
	r.stripeBase = 0
	base := r.now()
	var offset time.Duration
	r.now = func() time.Time { return base.Add(offset) }
	var routes []registry.RouteAssignment
	for range 5 {
		a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"})
		must(t, err)
		routes = append(routes, a)
	}
	_, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"})
	var full *registry.CapacityExceededError
	if !errors.As(err, &full) || full.Scope != registry.ScopeBinding || full.Limit != 5 {
		t.Fatalf("a sixth route: %v, want the binding full at 5", err)
	}
	checkStripes(t, r, registry.ScopeTenant, 6, 5)
	checkStripes(t, r, registry.ScopeBinding, 5, 5)

	stripesOfRoute := func(actionID string) (int16, []int16) {
		t.Helper()
		var (
			stripe int16
			per    []int16
		)
		must(t, r.data.QueryRow(ctx, `SELECT counter_stripe, scope_stripes FROM aip_registry.route_assignments WHERE action_id = $1`, actionID).Scan(&stripe, &per))
		return stripe, per
	}
	// Route k (k from 0) holds the tenant and the binding in stripe k, the
	// global, type and instance scopes in stripe 0.
	for k, a := range routes {
		stripe, per := stripesOfRoute(a.ActionID)
		want := []int16{0, int16(k), 0, 0, int16(k)}
		switch {
		case k == 0 && (stripe != 0 || per != nil):
			t.Fatalf("route 0 holds counter_stripe %d, scope_stripes %v; want 0 and NULL", stripe, per)
		case k > 0 && (stripe != -1 || !slices.Equal(per, want)):
			t.Fatalf("route %d holds counter_stripe %d, scope_stripes %v; want -1 and %v", k, stripe, per, want)
		}
	}

	// What builds of schema version 10 send to release a route: they
	// neither mark the row nor know its stripes. Their reroute releases
	// the counters of stripe -1 (none) and replaces the route with one in
	// a stripe of its own, leaving scope_stripes as it was: it would leak
	// the reservation, so it too must be refused.
	super, err := pgx.Connect(ctx, dbURL)
	must(t, err)
	defer super.Close(context.Background())
	for _, sql := range []string{
		`UPDATE aip_registry.route_assignments SET reserved = false, last_settlement = 'completed' WHERE action_id = '` + routes[1].ActionID + `'`,
		`INSERT INTO aip_registry.admission_counters (scope_kind, scope_key, stripe, active, reserve_limit) VALUES ('tenant', 'tenant-1', -1, 0, 1)`,
		`UPDATE aip_registry.route_assignments SET reserved = true, retry = false, last_settlement = NULL, resolved_again = false,
			counter_stripe = 0, hand_out = hand_out + 1, reserved_hand_out = hand_out + 1 WHERE action_id = '` + routes[3].ActionID + `'`,
	} {
		var pgErr *pgconn.PgError
		if _, err := super.Exec(ctx, sql); !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Fatalf("%s: %v, want a check violation", sql, err)
		}
	}

	must(t, r.Settle(ctx, routes[1], registry.SettlementCompleted))
	must(t, r.settleRead(ctx, routes[2], registry.SettlementCompleted, 0))
	// Their retry of a released route reserves every scope in one stripe
	// and leaves scope_stripes as it was, which is not read: allowed (in a
	// transaction rolled back, as they would have reserved the counters).
	tx, err := super.Begin(ctx)
	must(t, err)
	if _, err := tx.Exec(ctx, `UPDATE aip_registry.route_assignments SET reserved = true, retry = true, last_settlement = NULL,
		resolved_again = true, counter_stripe = 1, hand_out = hand_out + 1, reserved_hand_out = hand_out + 1
		WHERE action_id = $1 AND NOT reserved`, routes[1].ActionID); err != nil {
		t.Fatalf("a schema-10 retry of a released route with a stripe per scope: %v", err)
	}
	must(t, tx.Rollback(ctx))
	checkStripes(t, r, registry.ScopeTenant, 6, 3)
	checkStripes(t, r, registry.ScopeBinding, 5, 3)
	for _, a := range routes[1:3] {
		if stripe, _ := stripesOfRoute(a.ActionID); stripe != -2 {
			t.Fatalf("a released route with a stripe per scope holds counter_stripe %d, want -2", stripe)
		}
	}
	// A retry reserves route 1 again (as a retry: its retry scope too).
	again, err := r.Resolve(ctx, registry.RouteRequest{ActionID: routes[1].ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"})
	must(t, err)
	if res, err := r.Reservation(ctx, again.ActionID); err != nil || !res.Reserved || !res.Retry {
		t.Fatalf("the retried route: %+v, %v", res, err)
	}
	checkStripes(t, r, registry.ScopeTenant, 6, 4)
	checkStripes(t, r, registry.ScopeBinding, 5, 4)
	checkStripes(t, r, registry.ScopeTenantRetry, int64(pol.MaxTenantRetryInFlight), 1)
	l, err := r.Ledger(ctx)
	must(t, err)
	registrytest.CheckLedger(t, l)

	// A retry of route 2 whose answer was lost (its claim) is released
	// again, each scope in its stripe.
	again, err = r.Resolve(ctx, registry.RouteRequest{ActionID: routes[2].ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read", Claim: "claim-2"})
	must(t, err)
	if stripe, _ := stripesOfRoute(again.ActionID); stripe != -1 {
		t.Fatalf("route 2 reserved again holds counter_stripe %d, want -1", stripe)
	}
	checkStripes(t, r, registry.ScopeTenant, 6, 5)
	if ok, err := r.ReleaseUnsent(ctx, again.ActionID, "claim-2"); err != nil || !ok {
		t.Fatalf("ReleaseUnsent of route 2's retry: %t, %v", ok, err)
	}
	checkStripes(t, r, registry.ScopeTenant, 6, 4)
	checkStripes(t, r, registry.ScopeBinding, 5, 4)
	checkStripes(t, r, registry.ScopeTenantRetry, int64(pol.MaxTenantRetryInFlight), 1)
	l, err = r.Ledger(ctx)
	must(t, err)
	registrytest.CheckLedger(t, l)

	// Lease expiry releases the four reservations left, each scope in its
	// stripe.
	offset = 2 * time.Hour
	if n, err := r.ExpireStaleReplicas(ctx, 10); err != nil || n != 1 {
		t.Fatalf("ExpireStaleReplicas: %d, %v; want 1", n, err)
	}
	var left int64
	must(t, super.QueryRow(ctx, `SELECT count(*) FROM aip_registry.admission_counters WHERE active <> 0`).Scan(&left))
	if left != 0 {
		t.Fatalf("%d counter rows hold reservations after every route was released", left)
	}
	must(t, super.QueryRow(ctx, `SELECT count(*) FROM aip_registry.route_assignments WHERE counter_stripe = -1`).Scan(&left))
	if left != 0 {
		t.Fatalf("%d released routes keep counter_stripe -1", left)
	}
}
