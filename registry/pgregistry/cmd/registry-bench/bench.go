package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

const usage = `registry-bench measures the PostgreSQL registry at the reference scale profile.

Usage:
  registry-bench -database-url URL [flags]

It creates a scratch database on the server URL names (the URL's role needs
CREATEDB), seeds the scale profile in one transaction through the registry's
Batch administrator (the same rules as single writes) with a progress line,
runs VACUUM (ANALYZE) and a CHECKPOINT, then measures for -duration each
after an unmeasured -warmup (the routing tables, empty until then, are
analyzed after it):
  - resolve+settle: -workers goroutines, each resolving a fresh action for a
    routable tenant and capability and settling it as completed;
  - catalog pages: -readers goroutines, each reading 50-item pages of one
    tenant's catalog, following cursors to the end and moving to the next
    tenant.
The database is dropped at the end unless -keep is given. Run it against a
server with its default durability (fsync on).

Environment:
  AIP_BENCH_DATABASE_URL  default for -database-url

Flags:
`

type options struct {
	databaseURL string
	workers     int
	readers     int
	duration    time.Duration
	pageSize    int
	keep        bool
	profile     string
	reuse       string
	noCache     bool
	explain     bool
	warmup      time.Duration
	hbWorkers   int
	hbBatch     int
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("registry-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.databaseURL, "database-url", getenv("AIP_BENCH_DATABASE_URL"), "PostgreSQL server URL (a role that may CREATE DATABASE)")
	fs.IntVar(&o.workers, "workers", 32, "concurrent resolve+settle workers")
	fs.IntVar(&o.readers, "readers", 32, "parallel tenant catalog readers")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long each measurement runs")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured run before each measurement (fills connection pools and statement caches)")
	fs.IntVar(&o.pageSize, "page-size", 50, "catalog page size")
	fs.BoolVar(&o.keep, "keep", false, "keep the scratch database (its URL is printed)")
	fs.StringVar(&o.profile, "profile", "reference", `scale profile: "reference" (the issue's) or "small" (a quick smoke run)`)
	fs.StringVar(&o.reuse, "reuse", "", "skip seeding and measure this database, seeded earlier with -keep and the same -profile within its leases (24h; 5 minutes after a heartbeat measurement)")
	fs.BoolVar(&o.explain, "explain", false, "print EXPLAIN ANALYZE of the registry's hot queries for one routable target before measuring")
	fs.IntVar(&o.hbWorkers, "heartbeat-workers", 0, "also measure lifecycle heartbeats: this many concurrent ApplyLifecycle callers (0: skip)")
	fs.IntVar(&o.hbBatch, "heartbeat-batch", 64, "heartbeat commands per ApplyLifecycle call")
	fs.BoolVar(&o.noCache, "no-catalog-cache", false, "disable the registry's revision-keyed catalog view cache (measure the SQL path)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q; see -help", fs.Args())
	case o.databaseURL == "":
		return o, errors.New("-database-url is required (or set AIP_BENCH_DATABASE_URL)")
	case o.workers < 1 || o.workers > 512:
		return o, fmt.Errorf("-workers %d must be 1..512", o.workers)
	case o.readers < 1 || o.readers > 512:
		return o, fmt.Errorf("-readers %d must be 1..512", o.readers)
	case o.duration < time.Second || o.duration > time.Hour:
		return o, fmt.Errorf("-duration %s must be 1s..1h", o.duration)
	case o.hbWorkers < 0 || o.hbWorkers > 256:
		return o, fmt.Errorf("-heartbeat-workers %d must be 0..256", o.hbWorkers)
	case o.hbBatch < 1 || o.hbBatch > registry.MaxLifecycleBatch:
		return o, fmt.Errorf("-heartbeat-batch %d must be 1..%d", o.hbBatch, registry.MaxLifecycleBatch)
	case o.warmup < 0 || o.warmup > time.Hour:
		return o, fmt.Errorf("-warmup %s must be 0..1h", o.warmup)
	case o.pageSize < 1 || o.pageSize > registry.DefaultMaxPageSize:
		return o, fmt.Errorf("-page-size %d must be 1..%d", o.pageSize, registry.DefaultMaxPageSize)
	case o.profile != "reference" && o.profile != "small":
		return o, fmt.Errorf(`-profile %q must be "reference" or "small"`, o.profile)
	}
	return o, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	dbURL, drop := o.reuse, func() error { return nil }
	if dbURL == "" {
		dbURL, drop, err = scratchDatabase(ctx, o.databaseURL)
		if err != nil {
			return err
		}
	}
	if o.keep {
		fmt.Fprintf(stdout, "scratch database: %s\n", dbURL)
	} else {
		defer func() {
			if err := drop(); err != nil {
				fmt.Fprintf(stderr, "registry-bench: drop the scratch database: %v\n", err)
			}
		}()
	}
	reg, err := pgregistry.Open(ctx, pgregistry.Config{
		ControlURL: dbURL, DataURL: dbURL, ControlMaxConns: 2, DataMaxConns: int32(max(o.workers, o.readers) + 2),
		DisableCatalogCache: o.noCache,
	})
	if err != nil {
		return err
	}
	defer reg.Close()
	var fsync string
	if err := withConn(ctx, dbURL, func(c *pgx.Conn) error { return c.QueryRow(ctx, "SHOW fsync").Scan(&fsync) }); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "server fsync=%s; %d resolve+settle workers, %d catalog readers, %s per measurement\n", fsync, o.workers, o.readers, o.duration)

	profile := registrytest.DefaultScaleProfile(time.Now().Add(24 * time.Hour))
	if o.profile == "small" {
		profile.ConnectorTypes, profile.Capabilities, profile.CapabilitiesPerVersion = 50, 200, 20
		profile.Instances, profile.Tenants, profile.BindingsPerInstance = 500, 10, 5
	}
	var fleet *registrytest.ScaleFleet
	if o.reuse != "" {
		// The fleet's shape is a function of the profile: derive it in memory.
		mem, err := memregistry.New(memregistry.Config{})
		if err != nil {
			return err
		}
		if fleet, err = registrytest.SeedScale(ctx, mem, profile); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "reusing %s\n", dbURL)
	} else {
		fl, seedTime, analyzeTime, err := seed(ctx, reg, dbURL, profile, stdout)
		if err != nil {
			return err
		}
		fleet = fl
		fmt.Fprintf(stdout, "seed: %d types, %d capabilities, %d instances, %d replicas, %d tenants, %d bindings in %s (+ VACUUM ANALYZE and CHECKPOINT %s)\n",
			profile.ConnectorTypes, profile.Capabilities, profile.Instances, fleet.Replicas, len(fleet.Tenants), len(fleet.Bindings),
			seedTime.Round(time.Millisecond), analyzeTime.Round(time.Millisecond))
	}

	if o.explain {
		tg := fleet.Targets[len(fleet.Targets)/2]
		plans, err := reg.ExplainQueries(ctx, tg.TenantID, tg.CapabilityID, true)
		if err != nil {
			return err
		}
		for _, p := range plans {
			fmt.Fprintf(stdout, "== %s (tenant %s, capability %s): sequential scans %v\n%s\n\n", p.Name, tg.TenantID, tg.CapabilityID, p.SeqScans, p.Plan)
		}
	}
	if _, err := resolveSettle(ctx, reg, fleet, o.workers, o.warmup); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	// The routing tables were empty until the warm-up: give the planner
	// their statistics now, as autovacuum would within its next minute.
	if err := withConn(ctx, dbURL, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, "ANALYZE aip_registry.route_assignments, aip_registry.admission_counters, aip_registry.connector_replicas")
		return err
	}); err != nil {
		return fmt.Errorf("analyze after the warm-up: %w", err)
	}
	rs, err := resolveSettle(ctx, reg, fleet, o.workers, o.duration)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "resolve+settle: %d in %s = %.0f/s at %d workers; route (resolve) p50 %s p99 %s; resolve+settle p50 %s p99 %s\n",
		rs.n, rs.elapsed.Round(time.Millisecond), float64(rs.n)/rs.elapsed.Seconds(), o.workers,
		pct(rs.route, 50), pct(rs.route, 99), pct(rs.both, 50), pct(rs.both, 99))

	if _, err := catalogPages(ctx, reg, fleet, o.readers, o.pageSize, o.warmup); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	cs, err := catalogPages(ctx, reg, fleet, o.readers, o.pageSize, o.duration)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "catalog pages (%d items): %d in %s = %.0f/s at %d readers; p50 %s p99 %s\n",
		o.pageSize, len(cs.lat), cs.elapsed.Round(time.Millisecond), float64(len(cs.lat))/cs.elapsed.Seconds(), o.readers,
		pct(cs.lat, 50), pct(cs.lat, 99))
	if o.hbWorkers > 0 {
		if o.hbWorkers*o.hbBatch > fleet.Replicas {
			return fmt.Errorf("-heartbeat-workers × -heartbeat-batch (%d) exceeds the %d replicas", o.hbWorkers*o.hbBatch, fleet.Replicas)
		}
		hs, err := heartbeats(ctx, reg, fleet, o.hbWorkers, o.hbBatch, o.duration)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "heartbeats: %d in %s = %.0f/s, %d callers × %d per ApplyLifecycle call; call p50 %s p99 %s\n",
			hs.n, hs.elapsed.Round(time.Millisecond), float64(hs.n)/hs.elapsed.Seconds(), o.hbWorkers, o.hbBatch, pct(hs.lat, 50), pct(hs.lat, 99))
	}
	return nil
}

type hbResult struct {
	n       int
	elapsed time.Duration
	lat     []time.Duration
}

// heartbeats sends healthy heartbeats for the fleet's replicas: each worker
// owns a disjoint slice of replicas and heartbeats batch of them per
// ApplyLifecycle call, each with the sequence its last lease returned.
func heartbeats(ctx context.Context, reg *pgregistry.Registry, fleet *registrytest.ScaleFleet, workers, batch int, d time.Duration) (hbResult, error) {
	ids := make([]string, 0, fleet.Replicas)
	for k := range fleet.Profile.Instances {
		for n := range fleet.Profile.ReplicasPerInstance {
			ids = append(ids, fmt.Sprintf("crepl_scale%05d_%d", k, n))
		}
	}
	seq := make(map[string]uint64, len(ids))
	for _, id := range ids {
		r, err := reg.LifecycleReplica(ctx, id)
		if err != nil {
			return hbResult{}, err
		}
		seq[id] = r.HealthRevision
	}
	var (
		mu    sync.Mutex
		res   hbResult
		first error
		wg    sync.WaitGroup
	)
	per := len(ids) / workers
	deadline := time.Now().Add(d)
	start := time.Now()
	for w := range workers {
		mine := ids[w*per : (w+1)*per]
		local := make(map[string]uint64, len(mine))
		for _, id := range mine {
			local[id] = seq[id]
		}
		wg.Go(func() {
			var lat []time.Duration
			n, next := 0, 0
			for time.Now().Before(deadline) && ctx.Err() == nil {
				cmds := make([]registry.LifecycleCommand, batch)
				now := time.Now()
				for i := range cmds {
					id := mine[next%len(mine)]
					next++
					cmds[i] = registrytest.LifecycleCommand(now, aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, PreviousSequence: local[id], InFlight: 1, ConnectorReady: true}))
					cmds[i].LeaseTTL = registry.MaxLeaseTTL
				}
				t0 := time.Now()
				out, err := reg.ApplyLifecycle(ctx, cmds)
				if err == nil {
					for i, r := range out {
						if r.Err != nil {
							err = fmt.Errorf("heartbeat %s: %w", cmds[i].ReplicaID(), r.Err)
							break
						}
						local[cmds[i].ReplicaID()] = r.Outcome.Lease.Sequence
					}
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				lat = append(lat, time.Since(t0))
				n += len(cmds)
			}
			mu.Lock()
			res.n += n
			res.lat = append(res.lat, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res, first
}

// scratchDatabase creates a fresh database on the server and returns its URL
// and a function that drops it.
func scratchDatabase(ctx context.Context, serverURL string) (string, func() error, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", nil, fmt.Errorf("-database-url: %v", err)
	}
	var b [6]byte
	_, _ = crand.Read(b[:])
	name := "aip_registry_bench_" + hex.EncodeToString(b[:])
	if err := withConn(ctx, serverURL, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		return err
	}); err != nil {
		return "", nil, fmt.Errorf("create scratch database %s: %w", name, err)
	}
	u.Path = "/" + name
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return withConn(ctx, serverURL, func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			return err
		})
	}
	return u.String(), drop, nil
}

func withConn(ctx context.Context, dbURL string, fn func(*pgx.Conn) error) error {
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	return fn(c)
}

// seed loads the profile through one Batch with a progress line.
func seed(ctx context.Context, reg *pgregistry.Registry, dbURL string, p registrytest.ScaleProfile, stdout io.Writer) (*registrytest.ScaleFleet, time.Duration, time.Duration, error) {
	total := int64(1 + p.ConnectorTypes*2 + p.Instances*(1+p.BindingsPerInstance+p.ReplicasPerInstance))
	var done atomic.Int64
	start := time.Now()
	stopProgress := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				n := done.Load()
				fmt.Fprintf(stdout, "seeding: %d/%d records (%.0f%%) after %s\n", n, total, 100*float64(n)/float64(total), time.Since(start).Round(time.Second))
			}
		}
	})
	var fleet *registrytest.ScaleFleet
	err := reg.Batch(ctx, func(admin registry.Administrator) error {
		var err error
		fleet, err = registrytest.SeedScale(ctx, counting{Administrator: admin, n: &done}, p)
		return err
	})
	close(stopProgress)
	wg.Wait()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("seed: %w", err)
	}
	seedTime := time.Since(start)
	fmt.Fprintf(stdout, "seeding: %d/%d records committed after %s\n", done.Load(), total, seedTime.Round(time.Millisecond))
	// Measure the steady state, not the aftermath of the load: statistics
	// and visibility maps of the new rows, and the checkpoint its WAL is
	// due (a role without the right to CHECKPOINT skips it).
	start = time.Now()
	if err := withConn(ctx, dbURL, func(c *pgx.Conn) error {
		if _, err := c.Exec(ctx, "VACUUM (ANALYZE)"); err != nil {
			return err
		}
		if _, err := c.Exec(ctx, "CHECKPOINT"); err != nil {
			fmt.Fprintf(stdout, "seeding: CHECKPOINT skipped: %v\n", err)
		}
		return nil
	}); err != nil {
		return nil, 0, 0, fmt.Errorf("vacuum after seeding: %w", err)
	}
	return fleet, seedTime, time.Since(start), nil
}

// counting counts the writes that pass through an Administrator.
type counting struct {
	registry.Administrator
	n *atomic.Int64
}

func (c counting) PutAdmissionPolicy(ctx context.Context, p registry.AdmissionPolicy) error {
	c.n.Add(1)
	return c.Administrator.PutAdmissionPolicy(ctx, p)
}

func (c counting) PutConnectorType(ctx context.Context, t registry.ConnectorType) error {
	c.n.Add(1)
	return c.Administrator.PutConnectorType(ctx, t)
}

func (c counting) AdmitVersion(ctx context.Context, v registry.ConnectorVersion) error {
	c.n.Add(1)
	return c.Administrator.AdmitVersion(ctx, v)
}

func (c counting) PutInstance(ctx context.Context, i registry.ConnectorInstance) error {
	c.n.Add(1)
	return c.Administrator.PutInstance(ctx, i)
}

func (c counting) PutBinding(ctx context.Context, b registry.CapabilityBinding) error {
	c.n.Add(1)
	return c.Administrator.PutBinding(ctx, b)
}

func (c counting) PutReplica(ctx context.Context, r registry.ConnectorReplica) error {
	c.n.Add(1)
	return c.Administrator.PutReplica(ctx, r)
}

type rsResult struct {
	n           int
	elapsed     time.Duration
	route, both []time.Duration
}

func resolveSettle(ctx context.Context, reg *pgregistry.Registry, fleet *registrytest.ScaleFleet, workers int, d time.Duration) (rsResult, error) {
	var (
		mu           sync.Mutex
		res          rsResult
		first        error
		wg           sync.WaitGroup
		cctx, cancel = context.WithCancel(ctx)
	)
	defer cancel()
	deadline := time.Now().Add(d)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			// Each worker draws routable targets uniformly at random, so the
			// workers spread over tenants as independent callers do.
			rng := rand.New(rand.NewPCG(uint64(w), 0xbe7c4))
			var route, both []time.Duration
			for time.Now().Before(deadline) && cctx.Err() == nil {
				tg := fleet.Targets[rng.IntN(len(fleet.Targets))]
				t0 := time.Now()
				a, err := reg.Resolve(cctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tg.TenantID, CapabilityID: tg.CapabilityID})
				t1 := time.Now()
				if err == nil {
					err = reg.Settle(cctx, a, registry.SettlementCompleted)
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("resolve+settle %s/%s: %w", tg.TenantID, tg.CapabilityID, err)
					}
					mu.Unlock()
					cancel()
					return
				}
				route, both = append(route, t1.Sub(t0)), append(both, time.Since(t0))
			}
			mu.Lock()
			res.route, res.both = append(res.route, route...), append(res.both, both...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed, res.n = time.Since(start), len(res.both)
	return res, first
}

type pageResult struct {
	elapsed time.Duration
	lat     []time.Duration
}

func catalogPages(ctx context.Context, reg *pgregistry.Registry, fleet *registrytest.ScaleFleet, readers, pageSize int, d time.Duration) (pageResult, error) {
	var (
		mu    sync.Mutex
		res   pageResult
		first error
		wg    sync.WaitGroup
	)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.Now().Add(d)
	start := time.Now()
	for w := range readers {
		wg.Go(func() {
			var lat []time.Duration
			tenant := w % len(fleet.Tenants)
			q := registry.CatalogQuery{Limit: pageSize}
			for time.Now().Before(deadline) && cctx.Err() == nil {
				t0 := time.Now()
				p, err := reg.QueryCapabilities(cctx, q, registry.ForTenant(fleet.Tenants[tenant]))
				if err == nil && len(p.Capabilities) == 0 {
					err = errors.New("empty page")
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("catalog page of %s: %w", fleet.Tenants[tenant], err)
					}
					mu.Unlock()
					cancel()
					return
				}
				lat = append(lat, time.Since(t0))
				q.Cursor = p.NextCursor
				if q.Cursor == "" {
					tenant = (tenant + readers) % len(fleet.Tenants)
				}
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res, first
}

// pct returns the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)].Round(10 * time.Microsecond)
}
