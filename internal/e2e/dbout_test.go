package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aipfleet/aipfleet/aip"
)

// Database outage tests: each central process reaches PostgreSQL through
// its own dbProxy, which the test cuts (refusing or black-holing new
// connections), freezes (open connections hang) and restores; the test
// also ends the processes' sessions with pg_terminate_backend, as a
// server restart or a failover does.
const (
	dboutSeed    = 20260501
	dboutClients = 8
	// dboutAttempts: a client resends an action ID for longer than the
	// longest outage (backoff up to 1 s), as the docs ask. One that gave
	// up during it would leave a route whose commit it never learnt of
	// (the answer lost with the connection) reserved until
	// reconciliation may settle it, 10 minutes after its hand-out (the
	// hosts' envelope window).
	dboutAttempts = 30
	// dispatchPoolMax and controlPoolMax are the processes' default pool
	// sizes (--max-connections).
	dispatchPoolMax = 32
	controlPoolMax  = 16
)

// dboutFleet is a fleet whose central processes reach the database
// through proxies.
type dboutFleet struct {
	*fleet
	cpProxy, dispProxy *dbProxy
	// admin is a direct pool on the test database, for
	// pg_terminate_backend and pg_stat_activity.
	admin      *pgxpool.Pool
	controlURL string
	probe      *http.Client
}

func startDBOutFleet(t *testing.T) *dboutFleet {
	t.Helper()
	d := &dboutFleet{probe: &http.Client{Timeout: 15 * time.Second}}
	var dbURL string
	f := newFleet(t, fleetOptions{replicas: 3, dispatchArgs: []string{
		"--max-timeout", "3s", "--action-timeout", "3s", "--reconcile-after", "10s", "--reconcile-interval", "500ms"},
		databaseURL: func(process, url string) string {
			dbURL = url
			p := newDBProxy(t, process, url)
			if process == "dispatch" {
				d.dispProxy = p
			} else {
				d.cpProxy = p
			}
			return p.rewrite(url)
		}})
	d.fleet, d.controlURL = f, f.rf.ControlURL()
	admin, err := pgxpool.New(context.Background(), dbURL)
	must(t, err)
	t.Cleanup(admin.Close)
	d.admin = admin
	return d
}

// ready GETs url's /ready and returns its status and body; err is set when
// no answer came within the probe's 15 s (a path without a deadline).
func (d *dboutFleet) ready(base string) (int, string, error) {
	resp, err := d.probe.Get(base + "/ready")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// awaitReady waits until both central processes' /ready answer want,
// failing if one does not answer at all.
func (d *dboutFleet) awaitReady(t *testing.T, what string, procs []*process, bases []string, want bool) {
	t.Helper()
	for _, base := range bases {
		waitFor(t, what, procs, func() bool {
			code, body, err := d.ready(base)
			if err != nil {
				t.Fatalf("%s/ready did not answer: %v", base, err)
			}
			if !want && code != http.StatusOK && !strings.Contains(body, "registry") && !strings.Contains(body, "storage") &&
				!strings.Contains(body, "schema") && !strings.Contains(body, "catalog") && !strings.Contains(body, "maintenance") {
				t.Fatalf("%s/ready is %d without naming the database: %s", base, code, body)
			}
			return (code == http.StatusOK) == want
		})
	}
}

// replicasRoutable waits until every running replica is ready with a
// valid lease in the registry.
func (d *dboutFleet) replicasRoutable(t *testing.T, what string) {
	t.Helper()
	for _, r := range d.runningReplicas() {
		waitFor(t, what+": replica "+r.id+" ready again", []*process{r.proc, d.cp, d.disp}, func() bool {
			rep, err := d.reg.ConnectorReplica(d.ctx, r.id)
			return err == nil && rep.Status == aip.ReplicaReady && rep.LeaseValid(time.Now())
		})
	}
}

// checkAfter checks what an outage must not leave behind: no pile-up of
// database connections (each process's open connections within its pool,
// and no session of theirs busy or stuck in a transaction once idle) and
// log lines about the outage once per change, not once per request.
func (d *dboutFleet) checkAfter(t *testing.T, requests int) {
	t.Helper()
	for _, c := range []struct {
		p   *dbProxy
		max int
	}{{d.dispProxy, dispatchPoolMax}, {d.cpProxy, controlPoolMax}} {
		// The connections frozen by the outage are not the process's any
		// more: it gave up on them, but the proxy keeps each one that had a
		// statement waiting at its gate open, as a partition would keep the
		// server's end (those sessions are idle, not in a transaction, and
		// only TCP keepalive ends them). The process's own are the live ones.
		if n := c.p.liveOpen(); n > c.max {
			t.Errorf("%s holds %d database connections after the outage; its pool has %d", c.p.name, n, c.max)
		}
		// A transaction between two of its statements is idle in it for
		// a moment (the control plane's heartbeat batches and lease
		// maintenance go on after the load stops); one left open by the
		// outage stays so. A session idle in a transaction now that is
		// still idle in the same transaction 2 s later is stuck. Only the
		// sessions the process can reach count: one frozen between two
		// batches of a transaction stays idle in it until the server's
		// idle_in_transaction_session_timeout ends it (the registry sets
		// one on every session; TestSessionsEndAbandonedTransactions).
		idle := `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND client_port = ANY($1) AND state LIKE 'idle in transaction%'`
		var stuck int
		must(t, d.admin.QueryRow(d.ctx, idle, c.p.livePorts()).Scan(&stuck))
		if stuck > 0 {
			since := time.Now()
			time.Sleep(2 * time.Second)
			must(t, d.admin.QueryRow(d.ctx, idle+` AND state_change < $2`, c.p.livePorts(), since).Scan(&stuck))
		}
		if stuck > 0 {
			t.Errorf("%s has %d sessions idle in a transaction for more than 2 s after the outage", c.p.name, stuck)
		}
		t.Logf("%s: %d database connections open (%d of them live), %d accepted over the test", c.p.name, c.p.open(), c.p.liveOpen(), c.p.acceptedCount())
	}
	for _, p := range []*process{d.disp, d.cp} {
		msgs := map[string]int{}
		for _, rec := range p.Records() {
			if lvl, _ := rec["level"].(string); lvl == "WARN" || lvl == "ERROR" {
				m, _ := rec["msg"].(string)
				msgs[m]++
			}
		}
		var lines []string
		for m, n := range msgs {
			lines = append(lines, fmt.Sprintf("%q ×%d", m, n))
			// Changes of state are a handful per outage; a line per
			// request (or per failed heartbeat) is a flood. A settlement
			// that failed is logged per action, with its ID (its
			// reservation stays held while it is retried): those are at
			// most the actions in flight when the database went away.
			perAction := m == "settle failed; retrying in the background" && n <= dboutClients*4
			if n > 12 && !perAction {
				t.Errorf("%s logged %q %d times for %d requests: log a failure when it starts and when it ends, not per request", p.Name(), m, n, requests)
			}
		}
		sort.Strings(lines)
		t.Logf("%s warnings and errors: %s", p.Name(), strings.Join(lines, ", "))
	}
}

// TestDatabaseOutage: while careful clients send actions, the
// dispatcher's database is refused for 3 s, then the control plane's for
// 3 s (both shorter than the 10 s lease), then both are frozen for 15 s
// (open connections hang, new ones are never answered; longer than the
// lease). During each, /ready of the process cut off goes false naming the
// registry, every request and probe is answered (no path waits without a
// deadline) and every error is a documented retryable one; after each,
// without restarting anything, /ready is true again, every replica is
// routable and actions complete. Once settled: nothing ran twice, every
// action's status agrees with its side effects, nothing is left reserved,
// connections did not pile up, and the logs name each change once.
func TestDatabaseOutage(t *testing.T) {
	d := startDBOutFleet(t)
	central := []*process{d.disp, d.cp}
	load := startCareful(d.fleet, dboutSeed, dboutClients, dboutAttempts)
	load.usable(t, "the first answers", central...)
	var plan []string

	for _, o := range []struct {
		name  string
		proxy *dbProxy
		base  string
	}{{"dispatcher", d.dispProxy, d.apiURL}, {"control plane", d.cpProxy, d.controlURL}} {
		what := "short outage (refused) of the " + o.name + "'s database"
		plan = append(plan, what)
		start := time.Now()
		o.proxy.cut(proxyRefuse)
		d.awaitReady(t, what+": /ready false", central, []string{o.base}, false)
		time.Sleep(3*time.Second - time.Since(start)) // the fault itself: the outage lasts this long
		o.proxy.restore()
		d.awaitReady(t, "after the "+what+": /ready true", central, []string{d.apiURL, d.controlURL}, true)
		load.usable(t, "actions after the "+what, central...)
		t.Logf("%s: recovered (%d answers so far; errors %s)", what, load.answered.Load(), load.errorCodes())
	}

	what := fmt.Sprintf("long outage (frozen, %s) of both processes' databases", leaseTTL+5*time.Second)
	plan = append(plan, what)
	start := time.Now()
	d.dispProxy.freeze()
	d.cpProxy.freeze()
	d.awaitReady(t, what+": /ready false", central, []string{d.apiURL, d.controlURL}, false)
	time.Sleep(leaseTTL + 5*time.Second - time.Since(start)) // the fault itself
	d.dispProxy.restore()
	d.cpProxy.restore()
	d.awaitReady(t, "after the "+what+": /ready true", central, []string{d.apiURL, d.controlURL}, true)
	// Connection attempts made during the outage were never answered:
	// each must give up at its deadline, or it holds a pool slot (and a
	// socket) for as long as TCP takes to notice, many minutes.
	for _, p := range []*dbProxy{d.dispProxy, d.cpProxy} {
		t.Logf("%s: %d connection attempts of the outage still waiting after it", p.name, p.held())
		waitFor(t, p.name+"'s unanswered connection attempts to give up", central, func() bool { return p.held() == 0 })
	}
	d.replicasRoutable(t, "after the "+what)
	load.usable(t, "actions after the "+what, central...)
	t.Logf("%s: recovered (%d answers so far; errors %s)", what, load.answered.Load(), load.errorCodes())

	load.halt()
	all := load.all()
	if len(load.undocumented) > 0 {
		t.Errorf("%d answers a client cannot act on, e.g. %v", len(load.undocumented), load.undocumented[:min(5, len(load.undocumented))])
	}
	if n := load.noAnswer.Load(); n > 0 {
		t.Errorf("%d requests got no answer within 10 s (a path without a deadline)", n)
	}
	d.checkAfter(t, len(all))
	verifySettled(t, d.fleet, d.token(tenantID), all, strings.Join(plan, "; "))
}

// TestDatabaseSessionsKilled: while careful clients send actions, the
// processes' database sessions are ended with pg_terminate_backend at
// seeded random moments for 14 s — the dispatcher's (routes, settlements,
// reconciliation) and the control plane's (heartbeat batches, lease
// maintenance, which has a killed replica's lease to expire meanwhile),
// busy ones, ones idle in a transaction, or all. Nothing may run twice or
// stay reserved, every error is a documented retryable one, and the fleet
// serves again without a restart.
func TestDatabaseSessionsKilled(t *testing.T) {
	d := startDBOutFleet(t)
	central := []*process{d.disp, d.cp}
	load := startCareful(d.fleet, dboutSeed+1, dboutClients, dboutAttempts)
	load.usable(t, "the first answers", central...)

	// A replica killed: its lease expires during the kills, so lease
	// maintenance has reservations to release while its sessions die.
	victim := d.replicaList()[0]
	victim.proc.Kill()
	rng := rand.New(rand.NewPCG(dboutSeed, 7))
	kills := map[string]int{}
	for end := time.Now().Add(leaseTTL + 4*time.Second); time.Now().Before(end); {
		p := d.dispProxy
		if rng.IntN(2) == 0 {
			p = d.cpProxy
		}
		states := [][]string{{"active"}, {"idle in transaction"}, nil}[rng.IntN(3)]
		n, err := p.terminate(d.ctx, d.admin, states...)
		must(t, err)
		kills[fmt.Sprintf("%s %v", p.name, states)] += n
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond) // load between kills
	}
	t.Logf("sessions ended: %v", kills)
	waitFor(t, "the killed replica to go offline", central, func() bool {
		rep, err := d.reg.ConnectorReplica(d.ctx, victim.id)
		return err == nil && rep.Status == aip.ReplicaOffline
	})
	d.awaitReady(t, "after the kills: /ready true", central, []string{d.apiURL, d.controlURL}, true)
	d.replicasRoutable(t, "after the kills")
	load.usable(t, "actions after the kills", central...)
	load.halt()
	all := load.all()
	t.Logf("errors: %s", load.errorCodes())
	if len(load.undocumented) > 0 {
		t.Errorf("%d answers a client cannot act on, e.g. %v", len(load.undocumented), load.undocumented[:min(5, len(load.undocumented))])
	}
	if n := load.noAnswer.Load(); n > 0 {
		t.Errorf("%d requests got no answer within 10 s (a path without a deadline)", n)
	}
	d.checkAfter(t, len(all))
	verifySettled(t, d.fleet, d.token(tenantID), all, "sessions killed")
}
