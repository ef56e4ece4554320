package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// envChild makes the test binary run as a fake local connector: the child
// process of the supervision tests.
const (
	envChild          = "SIDECAR_TEST_CHILD"
	envChildSignalLog = "SIDECAR_TEST_SIGNAL_LOG"
	// envChildGate names a file: while it is missing the child reports
	// itself unhealthy.
	envChildGate = "SIDECAR_TEST_GATE"
	// envChildManifest names a file: when it exists at start-up, its
	// content is appended to the capability names (a changed manifest).
	envChildManifest = "SIDECAR_TEST_MANIFEST_FILE"
	// envChildIgnoreTerm makes the child ignore SIGTERM.
	envChildIgnoreTerm = "SIDECAR_TEST_IGNORE_TERM"
	// envChildHang names a file: while it exists, the child's
	// GET /aip/health never answers (a hung connector).
	envChildHang = "SIDECAR_TEST_HANG_FILE"
	// envChildExitCode is the status the child exits with after SIGTERM
	// (0 when unset).
	envChildExitCode = "SIDECAR_TEST_EXIT_CODE"
	// envChildReadOnly names, comma-separated, the capabilities whose
	// side effects the child declares as read and external_network.
	envChildReadOnly = "SIDECAR_TEST_READ_ONLY"
	// envSupervisorHelper makes the test binary a sidecar that supervises
	// a child ignoring SIGTERM, writes the child's pid to the named file,
	// and waits to be killed.
	envSupervisorHelper = "SIDECAR_TEST_SUPERVISOR"
	// envOrphanHelper makes the test binary a sidecar of replica
	// envOrphanReplica that supervises a shell child which starts a worker
	// ignoring SIGTERM, writes the worker's pid to the named file, and
	// waits to be killed.
	envOrphanHelper  = "SIDECAR_TEST_ORPHAN_HELPER"
	envOrphanReplica = "SIDECAR_TEST_ORPHAN_REPLICA"
	// envChildWatch names a pid: the fake connector writes to the file
	// envChildWatchOut, before it listens, whether that process runs.
	envChildWatch    = "SIDECAR_TEST_WATCH_PID"
	envChildWatchOut = "SIDECAR_TEST_WATCH_OUT"
	// envSubreaperHelper makes the test binary a sidecar that is a child
	// subreaper (as PID 1 of a container is init), supervises a child
	// with a worker in its process group, kills the child and, once the
	// crash is recorded, writes its own zombie children to the named
	// file (runSubreaperHelper).
	envSubreaperHelper = "SIDECAR_TEST_SUBREAPER"
)

// runHelperSupervisor is the process of envSupervisorHelper and
// envOrphanHelper: a supervisor of script (which writes a pid to $OUT)
// whose children carry childOf's marker, running until it is killed.
func runHelperSupervisor(name, script, out, childOf string) int {
	s := newSupervisor(superviseConfig{
		Command: []string{"/bin/sh", "-c", script},
		Env:     []string{"OUT=" + out}, ChildOf: childOf,
		Ready: func(context.Context) error {
			_, err := os.Stat(out)
			return err
		},
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: time.Minute,
		RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: slog.New(slog.DiscardHandler),
	})
	if err := s.start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 3
	}
	select {} // until killed
}

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" {
		os.Exit(runChild())
	}
	if os.Getenv(envMCPChild) == "1" {
		os.Exit(runMCPChild())
	}
	if out := os.Getenv(envSupervisorHelper); out != "" {
		// A child ignoring SIGTERM that writes its own pid.
		os.Exit(runHelperSupervisor("supervisor helper", `trap '' TERM; echo $$ > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; exec sleep 300`, out, ""))
	}
	if out := os.Getenv(envOrphanHelper); out != "" {
		// A child that starts a worker ignoring SIGTERM and writes its pid.
		os.Exit(runHelperSupervisor("orphan helper", `trap '' TERM; sleep 300 & echo $! > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; wait`, out, os.Getenv(envOrphanReplica)))
	}
	if out := os.Getenv(envSubreaperHelper); out != "" {
		os.Exit(runSubreaperHelper(out))
	}
	goleak.VerifyTestMain(m)
}

// runChild serves the fake connector on the socket the sidecar names and
// records SIGTERM (time and pid) in the signal log before exiting 0.
func runChild() int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if os.Getenv(envChildIgnoreTerm) == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	if pid, err := strconv.Atoi(os.Getenv(envChildWatch)); err == nil {
		state := "gone"
		if running(pid) {
			state = "running"
		}
		out := os.Getenv(envChildWatchOut)
		os.WriteFile(out+".tmp", []byte(state+" "+os.Getenv(EnvChildOf)), 0o600)
		os.Rename(out+".tmp", out)
	}
	var (
		l   net.Listener
		err error
	)
	if u := os.Getenv(EnvLocalURL); u != "" {
		l, err = net.Listen("tcp", strings.TrimPrefix(u, "http://"))
	} else {
		path := os.Getenv(EnvLocalSocket)
		os.Remove(path)
		l, err = net.Listen("unix", path)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 3
	}
	f := newFakeConnector()
	f.token = os.Getenv(EnvLocalToken)
	f.eventsURL, f.eventsToken = os.Getenv(EnvEventsURL), os.Getenv(EnvEventsToken)
	if p := os.Getenv(envChildManifest); p != "" {
		if suffix, err := os.ReadFile(p); err == nil {
			f.manifest.Store(fakeManifest(string(suffix)))
		}
	}
	if ids := os.Getenv(envChildReadOnly); ids != "" {
		m := f.manifest.Load()
		for i := range m.Capabilities {
			if slices.Contains(strings.Split(ids, ","), m.Capabilities[i].ID) {
				m.Capabilities[i].Contract.SideEffects = []aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}
			}
		}
	}
	var h http.Handler = f
	if gate := os.Getenv(envChildGate); gate != "" {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := os.Stat(gate)
			f.healthy.Store(err == nil)
			f.ServeHTTP(w, r)
		})
	}
	if hang := os.Getenv(envChildHang); hang != "" {
		next := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := os.Stat(hang); err == nil && r.URL.Path == PathLocalHealth {
				<-r.Context().Done()
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	sig := <-sigs
	if p := os.Getenv(envChildSignalLog); p != "" {
		line, _ := json.Marshal(map[string]any{"signal": sig.String(), "time_unix_ns": time.Now().UnixNano(), "pid": os.Getpid()})
		os.WriteFile(p, append(line, '\n'), 0o600)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	if code, err := strconv.Atoi(os.Getenv(envChildExitCode)); err == nil {
		fmt.Fprintf(os.Stderr, "child: exiting with status %d after %s\n", code, sig)
		return code
	}
	return 0
}

// replica is a sidecar running in this process against the fake fleet
// (hostsdktest's control plane and dispatcher, over the real transport).
type replica struct {
	cp     *hostsdktest.ControlPlane
	d      *hostsdktest.Dispatcher
	host   hostsdk.Config
	s      *Sidecar
	target hostsdktest.Target
	errc   chan error
	cancel context.CancelFunc
	done   bool
	err    error
}

// startReplica starts a sidecar built from cfg (its Host is filled in) and
// waits until it registered.
func startReplica(t testing.TB, edit func(*Config)) *replica {
	t.Helper()
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	return startReplicaIn(t, cp, d, edit)
}

// startReplicaIn is startReplica with the given control plane and
// dispatcher.
func startReplicaIn(t testing.TB, cp *hostsdktest.ControlPlane, d *hostsdktest.Dispatcher, edit func(*Config)) *replica {
	t.Helper()
	r := &replica{cp: cp, d: d, host: hostsdktest.HostConfig(t, cp, d, nil), errc: make(chan error, 1)}
	cfg := Config{Host: r.host}
	if edit != nil {
		edit(&cfg)
	}
	r.host = cfg.Host
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.errc <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })

	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	registered := make(chan error, 1)
	go func() {
		registered <- cp.Await(wctx, func(o []hostsdktest.Operation) bool {
			return len(o) > 0 && o[0].Op == aip.OpRegister && o[0].Outcome == aip.OutcomeLease
		})
	}()
	select {
	case err := <-r.errc:
		r.done, r.err = true, err
		wcancel()
		<-registered
		t.Fatalf("the sidecar stopped before registering: %v", err)
	case err := <-registered:
		if err != nil {
			t.Fatal(err)
		}
	}
	r.target = hostsdktest.TargetOf(s.Host(), r.host)
	return r
}

// stop cancels Run (SIGTERM) and returns its result.
func (r *replica) stop(t testing.TB) error {
	t.Helper()
	if r.done {
		return r.err
	}
	r.cancel()
	select {
	case r.err = <-r.errc:
	case <-time.After(2 * time.Minute):
		t.Fatal("the sidecar did not stop")
	}
	r.done = true
	return r.err
}

// noKeepAlive leaves no idle connections behind for goleak.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// getJSON GETs url and decodes its JSON body into v.
func getJSON(t testing.TB, url string, v any) int {
	t.Helper()
	resp, err := noKeepAlive.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

func (r *replica) status(t testing.TB) Status {
	t.Helper()
	var st Status
	getJSON(t, "http://"+r.s.Host().Addr().String()+PathStatus, &st)
	return st
}

func (r *replica) ready(t testing.TB) (int, hostsdk.ReadyDocument) {
	t.Helper()
	var doc hostsdk.ReadyDocument
	code := getJSON(t, "http://"+r.s.Host().Addr().String()+hostsdk.PathReady, &doc)
	return code, doc
}

func act(capability, input string) *aip.Action {
	return &aip.Action{ID: aip.NewActionID(), CapabilityID: capability, Input: json.RawMessage(input)}
}
