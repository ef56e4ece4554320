package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/registrytest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest/realfleet"
)

// Soak knobs.
const (
	// envSoakDuration (a Go duration) runs TestSoak for that long.
	envSoakDuration = "AIP_SOAK_DURATION"
	// envSoakRate is the offered load in requests per second (default
	// soakDefaultRate).
	envSoakRate = "AIP_SOAK_RATE"
	// envSoakReplaceEvery is the interval between a replica's drain and
	// replacement (default soakDefaultReplace).
	envSoakReplaceEvery = "AIP_SOAK_REPLACE_EVERY"
	// envSoakProfiles keeps the processes' profiles in that directory.
	envSoakProfiles = "AIP_SOAK_PROFILES"

	// soakDefaultRate is about half of what this two-core machine
	// sustains with this mix (scripts/bench.sh e2e: 700–900 echo
	// actions/s alone, and the mix's streams, notes and event reads cost
	// more each).
	soakDefaultRate    = 200
	soakDefaultReplace = 2 * time.Minute
	soakSampleEvery    = 10 * time.Second
	// soakWorkers bounds the requests in flight; a request the pacer
	// cannot hand to a free worker is counted as shed (the machine did
	// not keep up).
	soakWorkers = 48
	// soakNotesTitle marks the notes the soak creates.
	soakNotesTitle = "soak"
)

// soakOp is one kind of request in the soak's mix.
type soakOp int

const (
	opNew     soakOp = iota // echo.say with a fresh action ID
	opRetry                 // echo.say again with an answered action ID
	opStatus                // GET /aip/v1/actions/{id}
	opCancel                // a slow echo.say, cancelled once routed
	opStream                // echo.stream, streaming (NDJSON)
	opCatalog               // two catalog pages
	opNote                  // notes.create through the sidecar (emits a connector event)
	opNoteGet               // notes.get of a created note
	opEvents                // a page of the tenant's event log
	numSoakOps
)

func (o soakOp) String() string {
	return [...]string{"new action", "retry", "status", "cancel", "stream", "catalog", "note create", "note get", "events"}[o]
}

// soakMix weighs the ops (per mille). Notes are created at about one a
// second (at the default rate): the Python example rewrites its whole
// journal file on every write, so a create costs it time in proportion
// to the notes it holds, and at 3 % of the load (6 a second) it fell
// behind after five minutes — its requests queued in the sidecar (more
// goroutines, each waiting for Python) until the replica was at
// capacity. That is the example's design, not a leak of the sidecar.
var soakMix = [numSoakOps]int{opNew: 450, opRetry: 100, opStatus: 120, opCancel: 30, opStream: 100, opCatalog: 50,
	opNote: 5, opNoteGet: 45, opEvents: 100}

// TestSoak runs the real processes — control plane and dispatcher on
// PostgreSQL, three echo hosts and an aip-sidecar in front of
// examples/python-connector — under a steady moderate load for
// AIP_SOAK_DURATION, with a realistic mix (new actions, retries of
// answered action IDs, status queries, cancels, streams, catalog pages,
// connector events and event reads) and a replica drained and replaced
// every AIP_SOAK_REPLACE_EVERY. Every soakSampleEvery it samples each
// process's RSS, goroutines, open fds and heap in use, each central
// process's PostgreSQL sessions (pg_stat_activity, by client port), the
// sessions per application and user, the journals' and the database's
// sizes. At the end it logs a table of first, last and second-half slope
// per process and figure, and fails when a figure grows without bound
// (growthRule). The processes' goroutine and heap profiles are taken half
// way and at the end (soakPprofBuild), into AIP_SOAK_PROFILES when set.
//
// It is the one test of the package that skips: without AIP_SOAK_DURATION
// it says so and does nothing, because a soak is minutes long by nature
// (scripts/bench.sh soak runs it).
func TestSoak(t *testing.T) {
	raw := os.Getenv(envSoakDuration)
	if raw == "" {
		t.Skipf("the soak runs only when %s is set (a Go duration, at least 2m; scripts/bench.sh soak)", envSoakDuration)
	}
	run, err := time.ParseDuration(raw)
	if err != nil || run < 2*time.Minute {
		t.Fatalf("%s=%q: want a Go duration of at least 2m (the growth rule needs a minute of samples in the second half)", envSoakDuration, raw)
	}
	rate := soakDefaultRate
	if s := os.Getenv(envSoakRate); s != "" {
		if rate, err = strconv.Atoi(s); err != nil || rate < 1 || rate > 5000 {
			t.Fatalf("%s=%q: want requests per second from 1 to 5000", envSoakRate, s)
		}
	}
	replaceEvery := soakDefaultReplace
	if s := os.Getenv(envSoakReplaceEvery); s != "" {
		if replaceEvery, err = time.ParseDuration(s); err != nil || replaceEvery < 20*time.Second {
			t.Fatalf("%s=%q: want a Go duration of at least 20s", envSoakReplaceEvery, s)
		}
	}
	serverURL := os.Getenv(pgtest.EnvDatabaseURL)
	if serverURL == "" {
		t.Fatalf("the soak needs %s (see internal/pgtest)", pgtest.EnvDatabaseURL)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("the soak runs examples/python-connector under aip-sidecar: install python3")
	}
	profiles := os.Getenv(envSoakProfiles)
	if profiles == "" {
		profiles = t.TempDir()
	} else {
		must(t, os.MkdirAll(profiles, 0o755))
	}
	addrs := soakPprofBuild(t, realfleet.AipfleetPackage, echoPackage, sidecartest.SidecarPackage)
	t.Logf("soak: %s at %d requests/s, a replica replaced every %s, samples every %s; profiles in %s",
		run, rate, replaceEvery, soakSampleEvery, profiles)

	f := newFleet(t, fleetOptions{replicas: 3, logLevel: "warn"})
	notes := startSoakNotes(t, f, python)
	probe := newSoakProbe(t, serverURL)
	probe.add(&soakTarget{name: "dispatcher", proc: f.disp, metricsURL: f.apiURL + dispatch.PathMetrics, pg: true})
	probe.add(&soakTarget{name: "control-plane", proc: f.cp, metricsURL: f.rf.ControlURL() + "/metrics", pg: true})
	hostTarget := func(r *replica, name string) {
		probe.add(&soakTarget{name: name, proc: r.proc, metricsURL: "http://" + r.addr + "/metrics", stateDir: r.stateDir})
	}
	reps := f.replicaList()
	// host-0 is never replaced (it runs through the whole soak); the
	// other two slots are drained and replaced in turn.
	for i, r := range reps {
		hostTarget(r, fmt.Sprintf("host-%d", i))
	}
	probe.add(&soakTarget{name: "sidecar", proc: notes.proc, metricsURL: notes.r.Base + "/metrics",
		stateDir: filepath.Join(notes.r.Dir, "state")})

	load := &soakLoad{f: f, tok: f.token(tenantID), notes: notes, rate: rate}
	load.start(t)
	defer load.halt()

	probe.sample()
	sampling := make(chan struct{})
	var samplerDone sync.WaitGroup
	samplerDone.Go(func() {
		tick := time.NewTicker(soakSampleEvery)
		defer tick.Stop()
		midway := time.After(run / 2)
		for {
			select {
			case <-sampling:
				return
			case <-midway:
				probe.saveProfiles(addrs, profiles, "mid")
			case <-tick.C:
				probe.sample()
			}
		}
	})

	end := time.After(run)
	replace := time.NewTicker(replaceEvery)
	defer replace.Stop()
	slot, generation := 1, 0
	for done := false; !done; {
		select {
		case <-end:
			done = true
		case <-replace.C:
			old := reps[slot]
			fresh := f.addReplica()
			load.drain(old.id)
			generation++
			hostTarget(fresh, fmt.Sprintf("host-%d.%d", slot, generation))
			if err := old.proc.Term(t); err != nil {
				t.Errorf("replica %s did not drain cleanly: %v", old.id, err)
			}
			reps[slot] = fresh
			t.Logf("soak %s: drained %s, replaced by %s; %s", time.Since(probe.start).Round(time.Second), old.id, fresh.id, load.summary())
			slot = 3 - slot // 1, 2, 1, …
		}
	}
	probe.saveProfiles(addrs, profiles, "end")
	close(sampling)
	samplerDone.Wait()
	probe.sample()
	load.halt()

	elapsed := time.Since(probe.start)
	verdicts := probe.verdicts(elapsed)
	t.Logf("soak over %s: %s\n%s", elapsed.Round(time.Second), load.summary(), soakTable(verdicts))
	if f.disp.Exited() || f.cp.Exited() || notes.proc.Exited() {
		t.Errorf("a process exited by itself: dispatcher %v, control plane %v, sidecar %v", f.disp.Exited(), f.cp.Exited(), notes.proc.Exited())
	}
	for _, v := range verdicts {
		if v.grows {
			t.Errorf("%s: %s grows without bound: %+.3g a minute over the second half, %+.3g over the run (limit %.3g, level %.3g)",
				v.s.proc, v.s.metric, v.slope, v.projected, v.limit, v.level)
		}
	}
	load.check(t)
}

// soakNotes is the sidecar replica running the Python notes connector.
type soakNotes struct {
	r    *sidecartest.Replica
	proc *process
}

// startSoakNotes admits examples/python-connector as a second connector
// type of the fleet's tenant (its own type, version, instance and
// bindings, through the registry's control pool, as realfleet.Admit does
// for echo) and starts one aip-sidecar replica of it, delivering its
// connector events to the dispatcher.
func startSoakNotes(t *testing.T, f *fleet, python string) *soakNotes {
	t.Helper()
	script := filepath.Join(pkgDir(t, "github.com/aipfleet/aipfleet/examples/python-connector"), "notes_connector.py")
	dir := t.TempDir()
	const noBytecode = "PYTHONDONTWRITEBYTECODE=1"
	m, _ := sidecartest.Describe(t, trustDomain, []string{"NOTES_STATE=" + filepath.Join(dir, "describe.json"), noBytecode},
		"--local-socket", sidecartest.SocketPath(t, "describe.sock"), "--exec", python, script)

	ctx := context.Background()
	typeID, instanceID := aip.NewID(aip.PrefixType), aip.NewID(aip.PrefixInstance)
	const secretRef = "secret://soak-notes"
	must(t, f.reg.PutConnectorType(ctx, registry.ConnectorType{ID: typeID, Name: "notes", Owner: "team-soak", Enabled: true}))
	v := registrytest.Version(aip.NewID(aip.PrefixVersion), typeID, "1.0.0", "team-soak", registry.VersionActive, *m)
	must(t, f.reg.AdmitVersion(ctx, v))
	must(t, f.reg.PutInstance(ctx, registry.ConnectorInstance{ID: instanceID, ConnectorTypeID: typeID, VersionID: v.ID,
		TenantID: tenantID, ConfigRevision: 1, SecretProviderRef: secretRef, Status: registry.InstanceEnabled}))
	for _, c := range m.Capabilities {
		if c.Kind != aip.KindResource {
			must(t, f.reg.PutBinding(ctx, registry.CapabilityBinding{TenantID: tenantID, CapabilityID: c.ID, InstanceID: instanceID,
				PolicyRevision: 1, Enabled: true}))
		}
	}
	// The fleet's keys, as the echo replicas are configured with them.
	envOf := func(key string) string {
		for _, kv := range f.replicaList()[0].env {
			if v, ok := strings.CutPrefix(kv, key+"="); ok {
				return v
			}
		}
		t.Fatalf("soak: the echo replicas' environment has no %s", key)
		return ""
	}
	r := sidecartest.NewReplicaEnv(t, sidecartest.HostEnv{
		ControlEndpoint: f.rf.ControlURL() + aip.ControlPath, ControlDID: envOf("AIP_CONNECTOR_HOST_CONTROL_DID"),
		GatewayPrincipalID: realfleet.GatewayPrincipalID, GatewayDID: envOf("AIP_CONNECTOR_HOST_GATEWAY_DID"),
		TypeID: typeID, VersionID: v.ID, InstanceID: instanceID, TenantID: tenantID, TrustDomain: trustDomain,
		ArtifactDigest: v.Attestation.ArtifactDigest, SecretProviderRef: secretRef, MaxInFlight: 16,
		EventEndpoint: f.apiURL + aip.EventsPath,
	}, sidecartest.ReplicaOptions{HeartbeatInterval: time.Second, LeaseTTL: leaseTTL})
	must(t, f.reg.PutReplica(ctx, registry.ConnectorReplica{
		ID: r.ID, InstanceID: instanceID, VersionID: v.ID, Endpoint: r.Endpoint,
		PeerPrincipalID: v.Manifest.Agent.ID, PeerPrincipalKind: v.Manifest.Agent.Kind, PeerDID: r.Key.DID(),
		TrustDomain: trustDomain, TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
		Status: aip.ReplicaOffline, Capacity: 16,
	}))
	tokenFile := filepath.Join(dir, "token")
	must(t, os.WriteFile(tokenFile, []byte("soak-local-token\n"), 0o600))
	env := append(slices.Clone(r.Env), "NOTES_STATE="+filepath.Join(r.Dir, "notes-journal.json"),
		"AIP_SIDECAR_LOCAL_TOKEN_FILE="+tokenFile, "AIP_SIDECAR_LOG_LEVEL=warn", noBytecode)
	p := startProcess(t, "sidecar "+r.ID, sidecartest.Sidecar(t), env, "--local-socket", sidecartest.SocketPath(t, "notes.sock"),
		"--exec", python, script)
	waitFor(t, "the notes sidecar "+r.ID+" to be ready", []*process{p, f.cp}, func() bool {
		rep, err := f.reg.ConnectorReplica(f.ctx, r.ID)
		return err == nil && rep.Status == aip.ReplicaReady && rep.LeaseValid(time.Now())
	})
	return &soakNotes{r: r, proc: p}
}

// soakLoad offers rate requests a second of the soak's mix, paced (open
// loop, not as fast as possible), from at most soakWorkers at a time.
type soakLoad struct {
	f     *fleet
	tok   string
	notes *soakNotes
	rate  int

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	ok, failed [numSoakOps]atomic.Int64
	shed       atomic.Int64

	mu sync.Mutex
	// answered is a ring of answered echo.say action IDs (for retries
	// and status queries); noteIDs of created notes.
	answered    []soakAnswered
	answeredPos int
	// drained are the replicas drained so far: a retry of an action
	// pinned to one cannot be answered, so retries skip them.
	drained     map[string]bool
	noteIDs     []string
	eventsAfter uint64
	// failures keeps the first few failures, for the report.
	failures []string
}

func (l *soakLoad) start(t *testing.T) {
	l.stop = make(chan struct{})
	work := make(chan soakOp)
	for c := range soakWorkers {
		rng := rand.New(rand.NewPCG(uint64(c), 0x50a4))
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				case op := <-work:
					if err := l.do(op, rng); err != nil {
						l.failed[op].Add(1)
						l.mu.Lock()
						if len(l.failures) < 20 {
							l.failures = append(l.failures, fmt.Sprintf("%s: %v", op, err))
						}
						l.mu.Unlock()
					} else {
						l.ok[op].Add(1)
					}
				}
			}
		})
	}
	l.wg.Go(func() {
		rng := rand.New(rand.NewPCG(20261201, 0))
		tick := time.NewTicker(time.Second / time.Duration(l.rate))
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			n, op := rng.IntN(1000), soakOp(0)
			for ; n >= soakMix[op]; op++ {
				n -= soakMix[op]
			}
			select {
			case work <- op:
			default:
				l.shed.Add(1)
			}
		}
	})
	t.Cleanup(l.halt)
}

func (l *soakLoad) halt() {
	l.stopOnce.Do(func() { close(l.stop); l.wg.Wait() })
}

func (l *soakLoad) pick(ids []string, rng *rand.Rand) string {
	if len(ids) == 0 {
		return ""
	}
	return ids[rng.IntN(len(ids))]
}

// soakAnswered is an answered echo.say and the replica it ran on.
type soakAnswered struct{ id, replica string }

// pickAnswered returns an answered action (ID "" when none yet), one
// whose replica still runs when live says so.
func (l *soakLoad) pickAnswered(rng *rand.Rand, live bool) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range 8 {
		if len(l.answered) == 0 {
			return ""
		}
		a := l.answered[rng.IntN(len(l.answered))]
		if !live || !l.drained[a.replica] {
			return a.id
		}
	}
	return ""
}

// drain records that replica was drained.
func (l *soakLoad) drain(replica string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drained == nil {
		l.drained = map[string]bool{}
	}
	l.drained[replica] = true
}

// do runs one request and says what went wrong with it.
func (l *soakLoad) do(op soakOp, rng *rand.Rand) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := l.f
	switch op {
	case opNew, opRetry:
		id := aip.NewActionID()
		if op == opRetry {
			if id = l.pickAnswered(rng, true); id == "" {
				id = aip.NewActionID()
			}
		}
		// A retry sends the same input (a different one is an
		// idempotency conflict): the hold is derived from the ID.
		status, resp, err := f.send(ctx, l.tok, id, "soak", fmt.Sprintf(`,"hold_ms":%d`, soakHold(id)))
		if err != nil {
			return err
		}
		if status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCompleted {
			return fmt.Errorf("HTTP %d: %+v", status, resp.Error)
		}
		if o, err := outputOf(&resp); err != nil || o.SideEffects != 1 {
			return fmt.Errorf("output %s (%v): want one side effect", resp.Result.Output, err)
		}
		if op == opNew {
			a := soakAnswered{id: id}
			if resp.Route != nil {
				a.replica = resp.Route.ReplicaID
			}
			l.mu.Lock()
			if len(l.answered) < 4096 {
				l.answered = append(l.answered, a)
			} else {
				l.answered[l.answeredPos] = a
				l.answeredPos = (l.answeredPos + 1) % len(l.answered)
			}
			l.mu.Unlock()
		}
		return nil
	case opStatus:
		id := l.pickAnswered(rng, false)
		if id == "" {
			return nil
		}
		var st dispatch.ActionStatusResponse
		code, body, err := l.get(ctx, dispatch.PathActions+"/"+id, &st)
		if err != nil {
			return err
		}
		// A drained replica is unreachable; its routes stay.
		if code != http.StatusOK || st.Route == nil {
			return fmt.Errorf("status HTTP %d: %s", code, body)
		}
		return nil
	case opCancel:
		id := aip.NewActionID()
		answered := make(chan error, 1)
		go func() {
			status, resp, err := f.send(ctx, l.tok, id, "soak-cancel", `,"delay_ms":2000`)
			if err == nil && (resp.Result == nil || (resp.Result.Status != aip.ResultCancelled && resp.Result.Status != aip.ResultCompleted)) {
				err = fmt.Errorf("cancelled action answered HTTP %d: %+v %+v", status, resp.Result, resp.Error)
			}
			answered <- err
		}()
		// Cancel once the action is routed (its status answers 200).
		for routed := false; !routed; {
			code, _, err := l.get(ctx, dispatch.PathActions+"/"+id, nil)
			if err != nil {
				return err
			}
			if routed = code == http.StatusOK; !routed {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(20 * time.Millisecond): // polling for the route
				}
			}
		}
		code, body, err := f.post(ctx, dispatch.PathActions+"/"+id+"/cancel", l.tok, []byte(`{"reason":"soak"}`))
		if err != nil {
			return err
		}
		if code >= 500 {
			return fmt.Errorf("cancel HTTP %d: %s", code, body)
		}
		return <-answered
	case opStream:
		raw := fmt.Sprintf(`{"capability_id":%q,"mode":"streaming","input":{"message":"soak stream","chunks":%d}}`, capStream, 1+rng.IntN(8))
		return l.stream(ctx, raw)
	case opCatalog:
		var page dispatch.CapabilitiesResponse
		code, body, err := l.get(ctx, dispatch.PathCapabilities+"?limit=2", &page)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("catalog HTTP %d %s: %v", code, body, err)
		}
		if page.NextCursor != "" {
			code, body, err = l.get(ctx, dispatch.PathCapabilities+"?limit=2&cursor="+page.NextCursor, &page)
			if err != nil || code != http.StatusOK {
				return fmt.Errorf("catalog page 2 HTTP %d %s: %v", code, body, err)
			}
		}
		return nil
	case opNote:
		raw := fmt.Sprintf(`{"capability_id":"notes.create","idempotency_key":%q,"input":{"title":%q,"body":"soak"}}`,
			aip.NewActionID(), soakNotesTitle)
		code, body, err := f.post(ctx, dispatch.PathActions, l.tok, []byte(raw))
		if err != nil {
			return err
		}
		var resp dispatch.ActionResponse
		if json.Unmarshal(body, &resp) != nil || code != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCompleted {
			return fmt.Errorf("notes.create HTTP %d: %s", code, body)
		}
		var out struct {
			Note struct {
				ID string `json:"id"`
			} `json:"note"`
		}
		if err := json.Unmarshal(resp.Result.Output, &out); err != nil || out.Note.ID == "" {
			return fmt.Errorf("notes.create output %s", resp.Result.Output)
		}
		l.mu.Lock()
		l.noteIDs = append(l.noteIDs, out.Note.ID)
		l.mu.Unlock()
		return nil
	case opNoteGet:
		l.mu.Lock()
		id := l.pick(l.noteIDs, rng)
		l.mu.Unlock()
		if id == "" {
			return nil
		}
		code, body, err := f.post(ctx, dispatch.PathActions, l.tok, fmt.Appendf(nil, `{"capability_id":"notes.get","input":{"id":%q}}`, id))
		if err != nil {
			return err
		}
		var resp dispatch.ActionResponse
		if json.Unmarshal(body, &resp) != nil || code != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCompleted {
			return fmt.Errorf("notes.get HTTP %d: %s", code, body)
		}
		return nil
	case opEvents:
		l.mu.Lock()
		after := l.eventsAfter
		l.mu.Unlock()
		var page dispatch.EventsResponse
		code, body, err := l.get(ctx, fmt.Sprintf("%s?after=%d&limit=50", dispatch.PathEvents, after), &page)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("events HTTP %d %s: %v", code, body, err)
		}
		l.mu.Lock()
		// Read on from the last page's end, but keep reading a recent
		// stretch (not only the empty tail).
		if page.NextAfter > 25 {
			l.eventsAfter = max(l.eventsAfter, page.NextAfter-25)
		}
		l.mu.Unlock()
		return nil
	}
	return fmt.Errorf("unknown op %d", op)
}

// soakHold is an echo.say's hold_ms, 0–19 ms, derived from its action ID.
func soakHold(id string) int {
	h := 0
	for _, c := range id {
		h = (h*31 + int(c)) % 1000003
	}
	return h % 20
}

// get sends GET path and decodes a 200 answer into v (when not nil).
func (l *soakLoad) get(ctx context.Context, path string, v any) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.f.apiURL+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+l.tok)
	resp, err := l.f.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && v != nil && resp.StatusCode == http.StatusOK {
		err = json.Unmarshal(body, v)
	}
	return resp.StatusCode, body, err
}

// stream sends a streaming action and reads its NDJSON to the final
// answer.
func (l *soakLoad) stream(ctx context.Context, raw string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.f.apiURL+dispatch.PathActions, strings.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+l.tok)
	resp, err := l.f.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), dispatch.ContentTypeNDJSON) {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("stream HTTP %d (%s): %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), aip.MaxMessageBytes)
	chunks := 0
	var final *dispatch.ActionResponse
	for sc.Scan() {
		var line dispatch.StreamLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("stream line %q: %w", sc.Bytes(), err)
		}
		if line.Chunk != nil {
			chunks++
		} else if line.ActionResponse != nil {
			final = line.ActionResponse
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if final == nil || final.Result == nil || final.Result.Status != aip.ResultCompleted || chunks == 0 {
		return fmt.Errorf("stream ended with %d chunks and %+v", chunks, final)
	}
	return nil
}

// summary counts the requests answered, failed and shed.
func (l *soakLoad) summary() string {
	var parts []string
	var total int64
	for op := range numSoakOps {
		ok, bad := l.ok[op].Load(), l.failed[op].Load()
		total += ok + bad
		parts = append(parts, fmt.Sprintf("%s %d/%d", op, ok, ok+bad))
	}
	return fmt.Sprintf("%d requests (%s), %d shed", total, strings.Join(parts, ", "), l.shed.Load())
}

// check fails the soak when the fleet did not serve it: a leak check of
// a fleet that answered errors measures nothing. Drains make a few
// requests fail (an action whose replica drained answers
// outcome_unknown); more than 2 % of one kind is not that.
func (l *soakLoad) check(t *testing.T) {
	t.Helper()
	for op := range numSoakOps {
		ok, bad := l.ok[op].Load(), l.failed[op].Load()
		if ok == 0 || float64(bad) > 0.02*float64(ok+bad) {
			t.Errorf("%s: %d of %d requests failed", op, bad, ok+bad)
		}
	}
	if shed, total := l.shed.Load(), l.ok[opNew].Load(); float64(shed) > 0.05*float64(total) {
		t.Errorf("%d requests shed: the machine did not sustain %d requests/s (lower %s)", shed, l.rate, envSoakRate)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failures) > 0 {
		t.Logf("first failures:\n%s", strings.Join(l.failures, "\n"))
	}
}
