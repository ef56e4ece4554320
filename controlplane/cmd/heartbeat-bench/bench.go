package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

type config struct {
	backend     string
	databaseURL string
	replicas    int
	clients     int
	duration    time.Duration
	warmup      time.Duration
	maxBatch    int
	workers     int
	verify      bool
	cpuProfile  string
	dataConns   int
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("heartbeat-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.backend, "backend", "memory", "registry backend: memory or postgres")
	fs.StringVar(&c.databaseURL, "database-url", getenv("AIP_BENCH_DATABASE_URL"), "PostgreSQL URL of an empty database (backend postgres; env AIP_BENCH_DATABASE_URL)")
	fs.IntVar(&c.replicas, "replicas", 10_000, "replicas to pre-provision and register")
	fs.IntVar(&c.clients, "clients", 64, "concurrent clients")
	fs.DurationVar(&c.duration, "duration", 20*time.Second, "measured duration")
	fs.DurationVar(&c.warmup, "warmup", 3*time.Second, "unmeasured warm-up before the measurement")
	fs.IntVar(&c.maxBatch, "max-batch", 0, "controlplane Config.MaxBatch (0: default)")
	fs.IntVar(&c.workers, "batch-workers", 0, "controlplane Config.BatchWorkers (0: default)")
	fs.BoolVar(&c.verify, "verify", true, "verify every answer's signature on the client side")
	fs.IntVar(&c.dataConns, "data-conns", 16, "PostgreSQL data pool size (backend postgres)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured phase to this file")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case c.backend != "memory" && c.backend != "postgres":
		return c, fmt.Errorf("-backend %q: want memory or postgres", c.backend)
	case c.backend == "postgres" && c.databaseURL == "":
		return c, errors.New("-backend postgres needs -database-url (an empty database)")
	case c.replicas < 1 || c.clients < 1 || c.clients > c.replicas:
		return c, fmt.Errorf("need 1 <= -clients (%d) <= -replicas (%d)", c.clients, c.replicas)
	}
	return c, nil
}

// store is what the bench needs of a backend: the service's store plus the
// administrator to provision.
type store interface {
	controlplane.Store
	registry.Administrator
}

// replica is one benchmarked replica and its lease sequence.
type replica struct {
	rep registry.ConnectorReplica
	key *aip.SigningKey
	seq uint64
}

func bench(ctx context.Context, c config, stdout io.Writer) error {
	st, closeStore, err := openStore(ctx, c)
	if err != nil {
		return err
	}
	defer closeStore()
	fmt.Fprintf(stdout, "backend %s, %d replicas, %d clients, GOMAXPROCS %d, verify responses %v\n", c.backend, c.replicas, c.clients, runtime.GOMAXPROCS(0), c.verify)
	w, err := registrytest.NewLifecycleWorld(ctx, st)
	if err != nil {
		return err
	}
	t0 := time.Now()
	reps := make([]*replica, c.replicas)
	for i := range reps {
		id := fmt.Sprintf("crepl_bench%06d", i)
		r := w.ProvisionedReplica(id, time.Now())
		r.Capacity = 64
		if err := st.PutReplica(ctx, r); err != nil {
			return fmt.Errorf("provision %s: %w", id, err)
		}
		reps[i] = &replica{rep: r, key: registrytest.Key(id)}
	}
	fmt.Fprintf(stdout, "provisioned %d replicas in %s\n", c.replicas, time.Since(t0).Round(time.Millisecond))

	key := registrytest.Key("bench control plane")
	metrics := prometheus.NewRegistry()
	svc, err := controlplane.New(key, st, controlplane.Config{
		Metrics: metrics, MaxBatch: c.maxBatch, BatchWorkers: c.workers,
		// Leases outlive the run: the measurement is heartbeats, not expiry.
		LeaseTTL: registry.MaxLeaseTTL,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srvCtx, stopSrv := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- svc.Serve(srvCtx, ln, controlplane.ServeConfig{}) }()
	defer func() {
		stopSrv()
		<-served
	}()
	<-svc.Started()
	cl := &client{
		url:    "http://" + ln.Addr().String() + controlplane.PathControl,
		pinned: key,
		verify: c.verify,
		http: &http.Client{Transport: &http.Transport{
			MaxIdleConns: c.clients * 2, MaxIdleConnsPerHost: c.clients * 2, IdleConnTimeout: time.Minute,
		}, Timeout: 30 * time.Second},
	}

	// Register every replica, c.clients at a time.
	t0 = time.Now()
	if err := forShards(c.clients, reps, func(r *replica) error {
		reg := w.Registration(&r.rep)
		out, err := cl.do(r, aip.RegisterCommand(reg))
		if err != nil {
			return fmt.Errorf("register %s: %w", r.rep.ID, err)
		}
		r.seq = out.Lease.Sequence
		return nil
	}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "registered %d replicas in %s\n", c.replicas, time.Since(t0).Round(time.Millisecond))
	if c.backend == "postgres" {
		// The tables were empty a moment ago: without statistics the
		// planner may pick plans for empty tables, and a run measures
		// them instead of the heartbeats (autovacuum would analyze them
		// within a minute or so). Analyze the freshly loaded database, as
		// registry-bench does after seeding.
		t0 = time.Now()
		if err := analyze(ctx, c.databaseURL); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "analyzed the loaded tables in %s\n", time.Since(t0).Round(time.Millisecond))
	}

	// Heartbeats: each client cycles over its own replicas.
	var (
		measuring atomic.Bool
		stopAt    = time.Now().Add(c.warmup + c.duration)
		mu        sync.Mutex
		lat       []time.Duration
		failures  atomic.Int64
		firstErr  atomic.Pointer[error]
	)
	batch0 := batchCount(metrics)
	dur0 := histogram(metrics, controlplane.MetricBatchDuration)
	var measureStart time.Time
	var cpuStart time.Duration
	go func() {
		time.Sleep(c.warmup)
		mu.Lock()
		measureStart = time.Now()
		cpuStart = processCPU()
		mu.Unlock()
		measuring.Store(true)
	}()
	if c.cpuProfile != "" {
		stopProfile, err := startProfile(c.cpuProfile, c.warmup)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	shards := shard(reps, c.clients)
	var wg sync.WaitGroup
	for _, sh := range shards {
		wg.Go(func() {
			local := make([]time.Duration, 0, 1<<14)
			for i := 0; time.Now().Before(stopAt) && ctx.Err() == nil; i++ {
				r := sh[i%len(sh)]
				start := time.Now()
				out, err := cl.do(r, aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: r.rep.ID, PreviousSequence: r.seq, InFlight: 1, ConnectorReady: true}))
				d := time.Since(start)
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				r.seq = out.Lease.Sequence
				if measuring.Load() {
					local = append(local, d)
				}
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		})
	}
	wg.Wait()
	mu.Lock()
	elapsed := time.Since(measureStart) - time.Since(stopAt)
	cpu := processCPU() - cpuStart
	mu.Unlock()
	if elapsed <= 0 || len(lat) == 0 {
		return errors.New("no heartbeat was measured; raise -duration")
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	batches := batchCount(metrics).minus(batch0)
	durs := histogram(metrics, controlplane.MetricBatchDuration).minus(dur0)
	fmt.Fprintf(stdout, "heartbeats: %d in %s = %.0f/s\n", len(lat), elapsed.Round(time.Millisecond), float64(len(lat))/elapsed.Seconds())
	fmt.Fprintf(stdout, "latency: p50 %s  p90 %s  p99 %s  max %s\n",
		pct(.50).Round(10*time.Microsecond), pct(.90).Round(10*time.Microsecond), pct(.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
	fmt.Fprintf(stdout, "CPU of this process (clients and server): %s per heartbeat, %.2f cores busy\n",
		(cpu / time.Duration(len(lat))).Round(time.Microsecond), cpu.Seconds()/elapsed.Seconds())
	if batches.count > 0 {
		fmt.Fprintf(stdout, "registry calls: %d, mean %.1f commands and %s per call\n", int64(batches.count), batches.sum/batches.count,
			time.Duration(durs.sum/durs.count*float64(time.Second)).Round(10*time.Microsecond))
	}
	if n := failures.Load(); n > 0 {
		fmt.Fprintf(stdout, "failures: %d (first: %v)\n", n, *firstErr.Load())
		return fmt.Errorf("%d heartbeats failed", n)
	}
	return nil
}

// processCPU returns the user and system CPU time of this process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startProfile starts a CPU profile after delay; the returned func stops it.
func startProfile(path string, delay time.Duration) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	started := make(chan bool, 1)
	go func() {
		time.Sleep(delay)
		started <- pprof.StartCPUProfile(f) == nil
	}()
	return func() {
		if <-started {
			pprof.StopCPUProfile()
		}
		f.Close()
	}, nil
}

type counts struct{ count, sum float64 }

func (a counts) minus(b counts) counts { return counts{a.count - b.count, a.sum - b.sum} }

func batchCount(reg *prometheus.Registry) counts {
	return histogram(reg, controlplane.MetricBatchCommands)
}

func histogram(reg *prometheus.Registry, name string) counts {
	mfs, err := reg.Gather()
	if err != nil {
		return counts{}
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var h *dto.Histogram
			if m := mf.GetMetric(); len(m) > 0 {
				h = m[0].GetHistogram()
			}
			return counts{float64(h.GetSampleCount()), h.GetSampleSum()}
		}
	}
	return counts{}
}

func shard(reps []*replica, n int) [][]*replica {
	out := make([][]*replica, n)
	for i, r := range reps {
		out[i%n] = append(out[i%n], r)
	}
	return out
}

func forShards(n int, reps []*replica, fn func(*replica) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, sh := range shard(reps, n) {
		wg.Go(func() {
			for _, r := range sh {
				if err := fn(r); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// client signs requests with the replica's key and verifies answers.
type client struct {
	url    string
	http   *http.Client
	pinned *aip.SigningKey
	verify bool
}

func (c *client) do(r *replica, cmd aip.ControlCommand) (aip.ControlOutcome, error) {
	req := aip.NewControlRequest(time.Now(), r.key.DID(), cmd)
	body, err := aip.Seal(r.key, aip.SignedRequestField, req)
	if err != nil {
		return aip.ControlOutcome{}, err
	}
	resp, err := c.http.Post(c.url, "application/json", bytes.NewReader(body))
	if err != nil {
		return aip.ControlOutcome{}, err
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, aip.MaxControlBytes+1))
	resp.Body.Close()
	if err != nil {
		return aip.ControlOutcome{}, err
	}
	var out aip.ControlOutcome
	if c.verify {
		cr, err := aip.OpenControlResponse(raw, c.pinned.DID(), c.pinned.PublicKey(), req.RequestID, time.Now())
		if err != nil {
			return aip.ControlOutcome{}, err
		}
		out = cr.Outcome
	} else {
		s, err := aip.Open(raw, aip.SignedResponseField)
		if err != nil {
			return aip.ControlOutcome{}, err
		}
		var cr aip.ControlResponse
		if err := s.Decode(&cr); err != nil {
			return aip.ControlOutcome{}, err
		}
		out = cr.Outcome
	}
	if out.Status != aip.OutcomeLease || out.Lease == nil {
		return out, fmt.Errorf("HTTP %d %s %s: %s", resp.StatusCode, out.Status, out.Code, strings.TrimSpace(out.Message))
	}
	return out, nil
}
