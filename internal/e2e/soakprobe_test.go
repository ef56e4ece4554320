package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/internal/procstat"
)

// The soak's probes: what TestSoak samples from every process every
// soakSampleEvery, how it decides that a figure grows without bound, and
// how it takes profiles from processes that serve no pprof.

// soakMetric is one sampled figure; growth is the rule that fails the
// soak when the figure keeps growing (nil: informational only).
type soakMetric struct {
	name   string
	growth *growthRule
}

// growthRule fails a figure whose linear fit over the run's second half
// (after the warm-up: pools filled, caches and the GC's heap target at
// their steady level), projected over the whole run's length, grows by
// more than max(rel × the second half's median, abs). In words: if the
// growth seen while the load was steady went on for as long again as the
// run took, the figure would grow by more than rel of its level. A leak of
// one goroutine, one fd or a few KiB per request at the soak's rate
// crosses it within minutes; the noise of a steady process does not,
// because the fit averages over a few dozen samples: goroutines move
// with the requests in flight (a few dozen either way at the soak's
// concurrency, hence abs 25), the heap in use moves with the GC cycle
// (abs 8 MiB), RSS only moves up while the heap finds its level, which
// happens in the first half (abs 16 MiB), and fds move with the
// keep-alive connections in use (abs 16). PostgreSQL sessions are bounded
// by each pool's size; more than 4 new ones that stay is a leak.
type growthRule struct {
	rel, abs float64
}

var (
	metricRSS        = soakMetric{"rss_mib", &growthRule{0.25, 16}}
	metricHeap       = soakMetric{"heap_inuse_mib", &growthRule{0.30, 8}}
	metricGoroutines = soakMetric{"goroutines", &growthRule{0.25, 25}}
	metricFDs        = soakMetric{"open_fds", &growthRule{0.25, 16}}
	metricPGConns    = soakMetric{"pg_sessions", &growthRule{0, 4}}
	// Journal and database sizes grow by design: hosts keep finished
	// actions for 30 days (hostsdk.DefaultActionRetention) and the
	// registry keeps routes and events; they are reported per action, not
	// judged.
	metricJournal = soakMetric{"journal_mib", nil}
	metricDB      = soakMetric{"database_mib", nil}
)

// soakTarget is one sampled process.
type soakTarget struct {
	name string
	proc *process
	// metricsURL is its Prometheus endpoint.
	metricsURL string
	// stateDir is its journal directory ("" for central processes).
	stateDir string
	// pg says to count its PostgreSQL sessions.
	pg bool
}

// soakPoint is one sample of a figure.
type soakPoint struct {
	at time.Duration // since the soak began
	v  float64
}

// soakSeries is one process's figure over time.
type soakSeries struct {
	proc, metric string
	rule         *growthRule
	points       []soakPoint
}

// soakProbe samples targets and PostgreSQL.
type soakProbe struct {
	t     testing.TB
	start time.Time
	// pg is a session on the test server's maintenance database, for
	// pg_stat_activity and pg_database_size; pgPort is the server's port.
	pg     *pgx.Conn
	pgPort int
	client *http.Client

	mu      sync.Mutex
	targets []*soakTarget
	series  map[string]*soakSeries // by proc + "\x00" + metric
	order   []string
}

func newSoakProbe(t testing.TB, serverURL string) *soakProbe {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), serverURL)
	if err != nil {
		t.Fatalf("soak: connect to the test server for pg_stat_activity: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	u, err := url.Parse(serverURL)
	must(t, err)
	port := 5432
	if p := u.Port(); p != "" {
		port, err = strconv.Atoi(p)
		must(t, err)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return &soakProbe{t: t, start: time.Now(), pg: conn, pgPort: port, client: c, series: map[string]*soakSeries{}}
}

func (p *soakProbe) add(tg *soakTarget) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.targets = append(p.targets, tg)
}

func (p *soakProbe) record(proc string, m soakMetric, at time.Duration, v float64) {
	key := proc + "\x00" + m.name
	s, ok := p.series[key]
	if !ok {
		s = &soakSeries{proc: proc, metric: m.name, rule: m.growth}
		p.series[key] = s
		p.order = append(p.order, key)
	}
	s.points = append(s.points, soakPoint{at, v})
}

// sample takes one sample of every running target and of the database.
func (p *soakProbe) sample() {
	at := time.Since(p.start)
	p.mu.Lock()
	targets := slices.Clone(p.targets)
	p.mu.Unlock()
	sessions, datname := p.pgSessions()
	var out []func()
	for _, tg := range targets {
		if tg.proc.Exited() {
			continue
		}
		pid := tg.proc.Cmd.Process.Pid
		rssKiB, rssErr := procstat.RSS(pid)
		prom := p.scrape(tg.metricsURL)
		var pgCount float64
		if tg.pg {
			for _, port := range pgClientPorts(pid, p.pgPort) {
				if _, ok := sessions[port]; ok {
					pgCount++
				}
			}
		}
		var journal float64
		if tg.stateDir != "" {
			journal = dirBytes(tg.stateDir)
		}
		out = append(out, func() {
			if rssErr == nil {
				p.record(tg.name, metricRSS, at, float64(rssKiB)/1024)
			}
			if v, ok := prom["go_memstats_heap_inuse_bytes"]; ok {
				p.record(tg.name, metricHeap, at, v/(1<<20))
			}
			if v, ok := prom["go_goroutines"]; ok {
				p.record(tg.name, metricGoroutines, at, v)
			}
			if v, ok := prom["process_open_fds"]; ok {
				p.record(tg.name, metricFDs, at, v)
			} else if n, ok := procFDs(pid); ok {
				p.record(tg.name, metricFDs, at, n)
			}
			if tg.pg {
				p.record(tg.name, metricPGConns, at, pgCount)
			}
			if tg.stateDir != "" {
				p.record(tg.name, metricJournal, at, journal/(1<<20))
			}
		})
	}
	dbSize, dbOK := p.databaseSize(datname)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range out {
		f()
	}
	if dbOK {
		p.record("postgres", metricDB, at, dbSize/(1<<20))
	}
	// Sessions per application and user, over the fleet's database.
	byApp := map[string]float64{}
	for _, s := range sessions {
		if s.datname == datname {
			byApp[s.app+"/"+s.user]++
		}
	}
	for app, n := range byApp {
		p.record("postgres", soakMetric{"sessions " + app, nil}, at, n)
	}
}

// pgSession is a row of pg_stat_activity.
type pgSession struct{ app, user, datname string }

// pgSessions returns the server's client sessions by client port, and the
// fleet's database (the one the aipfleet processes' pools use).
func (p *soakProbe) pgSessions() (map[int]pgSession, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := p.pg.Query(ctx, `SELECT client_port, coalesce(application_name, ''), coalesce(usename, ''), coalesce(datname, '')
		FROM pg_stat_activity WHERE client_port IS NOT NULL AND pid <> pg_backend_pid()`)
	if err != nil {
		p.t.Logf("soak: pg_stat_activity: %v", err)
		return nil, ""
	}
	defer rows.Close()
	out := map[int]pgSession{}
	dbs := map[string]int{}
	for rows.Next() {
		var port int32
		var s pgSession
		if err := rows.Scan(&port, &s.app, &s.user, &s.datname); err != nil {
			p.t.Logf("soak: pg_stat_activity: %v", err)
			return nil, ""
		}
		out[int(port)] = s
		if strings.HasPrefix(s.app, "aipfleet-registry-") {
			dbs[s.datname]++
		}
	}
	datname := ""
	for db, n := range dbs { // the busiest database the registry pools use
		if n > dbs[datname] {
			datname = db
		}
	}
	return out, datname
}

func (p *soakProbe) databaseSize(datname string) (float64, bool) {
	if datname == "" {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int64
	if err := p.pg.QueryRow(ctx, `SELECT pg_database_size($1)`, datname).Scan(&n); err != nil {
		return 0, false
	}
	return float64(n), true
}

// scrape reads a Prometheus text page's unlabelled samples.
func (p *soakProbe) scrape(u string) map[string]float64 {
	out := map[string]float64{}
	if u == "" {
		return out
	}
	resp, err := p.client.Get(u)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// procFDs counts a process's open file descriptors.
func procFDs(pid int) (float64, bool) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return float64(len(ents)), err == nil
}

// pgClientPorts returns the local ports of pid's TCP sockets connected to
// port pgPort: the client_port of its sessions in pg_stat_activity.
func pgClientPorts(pid, pgPort int) []int {
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil
	}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []int
	for _, table := range []string{"tcp", "tcp6"} {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(raw)) {
			f := strings.Fields(line)
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if len(f) < 10 || !inodes[f[9]] {
				continue
			}
			local, remote := hexPort(f[1]), hexPort(f[2])
			if remote == pgPort && local > 0 {
				out = append(out, local)
			}
		}
	}
	return out
}

// hexPort reads the port of a /proc/net/tcp address ("0100007F:1F90").
func hexPort(addr string) int {
	_, h, ok := strings.Cut(addr, ":")
	if !ok {
		return -1
	}
	n, err := strconv.ParseUint(h, 16, 32)
	if err != nil {
		return -1
	}
	return int(n)
}

// dirBytes sums the sizes of the files under dir.
func dirBytes(dir string) float64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return float64(n)
}

// soakVerdict is one series' figures.
type soakVerdict struct {
	s                  *soakSeries
	first, last, level float64
	// slope is the second half's fitted growth per minute; projected is
	// slope × the run's length; limit what the rule allows.
	slope, projected, limit float64
	judged, grows           bool
}

// verdicts judges every series. A series is judged when its process ran
// through the whole second half (at least soakMinJudged samples there).
func (p *soakProbe) verdicts(run time.Duration) []soakVerdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []soakVerdict
	half := run / 2
	for _, key := range p.order {
		s := p.series[key]
		if len(s.points) == 0 {
			continue
		}
		v := soakVerdict{s: s, first: s.points[0].v, last: s.points[len(s.points)-1].v}
		var second []soakPoint
		for _, pt := range s.points {
			if pt.at >= half {
				second = append(second, pt)
			}
		}
		if len(second) >= 3 {
			v.slope = fitSlope(second) * float64(time.Minute)
			vals := make([]float64, len(second))
			for i, pt := range second {
				vals[i] = pt.v
			}
			slices.Sort(vals)
			v.level = vals[len(vals)/2]
			v.projected = v.slope / float64(time.Minute) * float64(run)
		}
		// Judged only when the process lived through the second half:
		// its first second-half sample near the half, its last near the
		// end.
		if s.rule != nil && len(second) >= soakMinJudged && second[0].at < half+2*soakSampleEvery &&
			second[len(second)-1].at > run-2*soakSampleEvery {
			v.judged = true
			v.limit = math.Max(s.rule.rel*v.level, s.rule.abs)
			v.grows = v.projected > v.limit
		}
		out = append(out, v)
	}
	return out
}

// soakMinJudged is the fewest second-half samples a verdict needs (a
// minute of samples).
const soakMinJudged = 6

// fitSlope is the least-squares slope of v over at, per nanosecond.
func fitSlope(pts []soakPoint) float64 {
	var sx, sy, sxx, sxy float64
	n := float64(len(pts))
	for _, p := range pts {
		x := float64(p.at)
		sx += x
		sy += p.v
		sxx += x * x
		sxy += x * p.v
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// table formats the verdicts: first, last, the second half's slope per
// minute and its projection over the run, and the verdict.
func soakTable(vs []soakVerdict) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| process | metric | first | last | slope/min (2nd half) | × run | limit | verdict |\n|---|---|---|---|---|---|---|---|\n")
	for _, v := range vs {
		verdict, limit := "info", "—"
		if v.judged {
			verdict, limit = "flat", fmtFig(v.limit)
			if v.grows {
				verdict = "GROWS"
			}
		} else if v.s.rule != nil {
			verdict = "not judged (did not run through the second half)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %+.3g | %+.3g | %s | %s |\n", v.s.proc, v.s.metric,
			fmtFig(v.first), fmtFig(v.last), v.slope, v.projected, limit, verdict)
	}
	return b.String()
}

func fmtFig(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// The soak's profiles. The dispatcher, the control plane, the hosts and
// the sidecar serve no pprof, and must not: an unauthenticated profile
// endpoint does not belong in a production build. The soak builds its
// binaries with a `go build -overlay` (through GOFLAGS, which
// sidecartest.Build's `go build` inherits) that adds one file to each main
// package: with AIP_SOAK_PPROF_DIR set, the process serves net/http/pprof
// on its own loopback listener and writes the address to
// $AIP_SOAK_PPROF_DIR/<pid>. Nothing in the tree changes; a plain build
// has no such file.

// envSoakPprofDir names the directory the soak build's processes write
// their pprof address to.
const envSoakPprofDir = "AIP_SOAK_PPROF_DIR"

// soakPprofSource is the overlay file.
const soakPprofSource = `package main

import (
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strconv"
)

// Added by internal/e2e's soak through go build -overlay; never in the tree.
func init() {
	dir := os.Getenv("` + envSoakPprofDir + `")
	if dir == "" {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	if os.WriteFile(filepath.Join(dir, strconv.Itoa(os.Getpid())), []byte(ln.Addr().String()), 0o600) != nil {
		ln.Close()
		return
	}
	go http.Serve(ln, mux)
}
`

// soakPprofBuild makes the builds of this test process (sidecartest.Build)
// add soakPprofSource to pkgs and their processes serve pprof; it returns
// the directory the processes write their addresses to.
func soakPprofBuild(t *testing.T, pkgs ...string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "soak_pprof.go")
	must(t, os.WriteFile(src, []byte(soakPprofSource), 0o600))
	replace := map[string]string{}
	for _, pkg := range pkgs {
		d := pkgDir(t, pkg)
		replace[filepath.Join(d, "zz_soak_pprof.go")] = src
	}
	raw, err := json.Marshal(map[string]any{"Replace": replace})
	must(t, err)
	overlay := filepath.Join(dir, "overlay.json")
	must(t, os.WriteFile(overlay, raw, 0o600))
	t.Setenv("GOFLAGS", strings.TrimSpace(os.Getenv("GOFLAGS")+" -overlay="+overlay))
	addrs := filepath.Join(dir, "addrs")
	must(t, os.Mkdir(addrs, 0o700))
	t.Setenv(envSoakPprofDir, addrs)
	return addrs
}

// pkgDir is the directory of a package of this module.
func pkgDir(t *testing.T, pkg string) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("soak: cannot locate the source tree")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	rel, ok := strings.CutPrefix(pkg, "github.com/aipfleet/aipfleet/")
	if !ok {
		t.Fatalf("soak: %s is not in this module", pkg)
	}
	return filepath.Clean(filepath.Join(root, rel))
}

// saveProfiles writes the goroutine (debug=1, grouped stacks) and heap
// profiles of every running target to dir/<name>.<profile>.
func (p *soakProbe) saveProfiles(addrDir, dir, suffix string) {
	p.mu.Lock()
	targets := slices.Clone(p.targets)
	p.mu.Unlock()
	for _, tg := range targets {
		if tg.proc.Exited() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(addrDir, strconv.Itoa(tg.proc.Cmd.Process.Pid)))
		if err != nil {
			p.t.Logf("soak: no pprof address for %s: %v", tg.name, err)
			continue
		}
		name := strings.NewReplacer(" ", "_", "/", "_").Replace(tg.name)
		for file, path := range map[string]string{"goroutines.txt": "goroutine?debug=1", "heap.pb.gz": "heap?gc=1"} {
			resp, err := p.client.Get("http://" + string(raw) + "/debug/pprof/" + path)
			if err != nil {
				p.t.Logf("soak: profile %s of %s: %v", path, tg.name, err)
				continue
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name+"."+suffix+"."+file), body, 0o644)
			}
			if err != nil {
				p.t.Logf("soak: profile %s of %s: %v", path, tg.name, err)
			}
		}
	}
}
