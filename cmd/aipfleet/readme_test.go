package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
)

// The README test keeps the README's tour honest: it starts `aipfleet dev`
// as a process in a temporary working directory (so ./.aipfleet is a fresh
// state directory), waits for its "ready" banner, and runs every ```sh
// block of the "## Tour" section, in order and as written, with sh -c in
// that directory. It checks each block's exit status and its `# expect:`
// lines, and across the whole tour that every action ID is always printed
// with the same replica and fence. A block that is exactly
// `go run ./cmd/aipfleet dev` is the restart of step 5: the test stops dev
// with SIGINT (exit status 0, every replica offline) and starts it again. At
// the end dev is stopped with SIGINT the same way.
//
// Two things differ from a newcomer's terminal, neither in the commands:
// `go run ./cmd/aipfleet` runs the aipfleet binary this test builds once (a
// `go` shim first in PATH, so the commands need no module checkout in the
// working directory), and dev listens on free ports (AIP_DEV_PORT_BASE),
// which the commands find on their own, in .aipfleet/dev.json.

// tourBlock is one ```sh block of the tour.
type tourBlock struct {
	line        int // of the opening fence, for messages
	script      string
	expects     []tourExpect
	restartsDev bool
}

// tourExpect is one `# expect: TEXT` (the output contains TEXT) or
// `# expect Nx: TEXT` (exactly N times) line.
type tourExpect struct {
	text  string
	times int // 0: at least once
}

var expectLine = regexp.MustCompile(`^# expect(?: (\d+)x)?: (.+)$`)

// readTour returns the ```sh blocks of the "## Tour" section of the README.
func readTour(t *testing.T, path string) []tourBlock {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks  []tourBlock
		inTour  bool
		current *tourBlock
		script  []string
	)
	for i, line := range strings.Split(string(raw), "\n") {
		switch {
		case current != nil && strings.TrimSpace(line) == "```":
			current.script = strings.Join(script, "\n")
			current.restartsDev = strings.TrimSpace(current.script) == "go run ./cmd/aipfleet dev"
			blocks = append(blocks, *current)
			current, script = nil, nil
		case current != nil:
			if m := expectLine.FindStringSubmatch(line); m != nil {
				n, _ := strconv.Atoi(m[1])
				current.expects = append(current.expects, tourExpect{text: m[2], times: n})
				continue
			}
			script = append(script, line)
		case strings.HasPrefix(line, "## "):
			inTour = strings.TrimSpace(line) == "## Tour"
		case inTour && strings.TrimSpace(line) == "```sh":
			current = &tourBlock{line: i + 1}
		}
	}
	if current != nil {
		t.Fatalf("%s: the code block opened at line %d is not closed", path, current.line)
	}
	return blocks
}

func TestReadTour(t *testing.T) {
	dir := t.TempDir()
	readme := filepath.Join(dir, "README.md")
	os.WriteFile(readme, []byte("# x\n```sh\nnot the tour\n```\n## Tour\ntext\n```sh\necho a\n# expect: a\n# expect 2x: b c\n```\n"+
		"```go\nignored\n```\n```sh\ngo run ./cmd/aipfleet dev\n```\n## Next\n```sh\nafter\n```\n"), 0o644)
	got := readTour(t, readme)
	if len(got) != 2 || got[0].script != "echo a" || len(got[0].expects) != 2 || got[0].expects[1] != (tourExpect{"b c", 2}) ||
		got[0].restartsDev || !got[1].restartsDev {
		t.Fatalf("blocks = %+v", got)
	}
}

// devProc is a running `aipfleet dev`.
type devProc struct {
	cmd            *exec.Cmd
	stdout, stderr lockedBuffer
	done           chan struct{}
	err            error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startDev(t *testing.T, bin, dir string, env, args []string) *devProc {
	t.Helper()
	p := &devProc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Dir, p.cmd.Env = dir, env
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- aipfleet dev stdout:\n%s\n--- stderr (last lines):\n%s", p.stdout.String(), lastLines(p.stderr.String(), 60))
		}
	})
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitFor polls cond until it holds; it fails when dev exits or a minute
// passes.
func (p *devProc) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		select {
		case <-p.done:
			t.Fatalf("aipfleet dev exited (%v) while waiting for %s", p.err, what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling another process's output
	}
}

// pollUntil polls cond until it holds or a minute passes.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling another process
	}
}

// stop sends SIGINT (a terminal's Ctrl-C) and requires exit status 0 after
// every replica drained and went offline.
func (p *devProc) stop(t *testing.T, stateDir string, replicas int) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("aipfleet dev did not exit within a minute of SIGINT")
	}
	if p.err != nil {
		t.Fatalf("aipfleet dev exited with %v after SIGINT, want status 0", p.err)
	}
	log := p.stderr.String()
	for i := range replicas {
		if want := fmt.Sprintf("replica-%d drained and went offline cleanly", i+1); !strings.Contains(log, want) {
			t.Errorf("dev's log lacks %q", want)
		}
	}
	if want := countIs(replicas, "replica") + " offline"; !strings.Contains(log, want) {
		t.Errorf("dev's log lacks %q", want)
	}
	// The registry dev saved last says so too.
	raw, err := os.ReadFile(filepath.Join(stateDir, "registry.json"))
	if err != nil {
		t.Fatal(err)
	}
	var snap struct {
		Replicas []registry.ConnectorReplica `json:"replicas"`
	}
	if err := json.Unmarshal(raw, &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.Replicas) != replicas {
		t.Errorf("the saved registry holds %d replicas, want %d", len(snap.Replicas), replicas)
	}
	for _, r := range snap.Replicas {
		if r.Status != "offline" || r.ActiveAssignments != 0 {
			t.Errorf("after dev stopped, replica %s is %s with %d active assignments", r.ID, r.Status, r.ActiveAssignments)
		}
	}
}

// freePortBase returns a port base whose dev ports (base, base+10 and the
// replicas') are free now.
func freePortBase(t *testing.T, replicas int) int {
	t.Helper()
	for range 50 {
		// Below Linux's ephemeral ports (32768 and up): a base among them
		// was free when checked, then taken as the source port of another
		// test's connection between two dev runs of one test ("port ...
		// (dispatcher) is in use").
		base := 20000 + rand.IntN(1250)*10
		free := true
		for _, port := range append([]int{base, base + controlPortOffset}, replicaPorts(base, replicas)...) {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				free = false
				break
			}
			ln.Close()
		}
		if free {
			return base
		}
	}
	t.Fatal("no free port base found")
	return 0
}

func replicaPorts(base, replicas int) []int {
	var ports []int
	for i := range replicas {
		ports = append(ports, base+firstReplicaOffset+i)
	}
	return ports
}

var (
	// An action's route as `action send` prints it, and as `action get`
	// prints it.
	sentRoute = regexp.MustCompile(`action (act_[0-9a-f]{32}) [a-z_ ]+ on replica (crepl_[0-9a-f]{32}) \(fence (route_[0-9a-f]{32})`)
	gotRoute  = regexp.MustCompile(`action (act_[0-9a-f]{32}) \([^)]*\)\nroute:\s+replica (crepl_[0-9a-f]{32}), fence (route_[0-9a-f]{32})`)
	// A block that sends SIGTERM to a replica.
	killsReplica = regexp.MustCompile(`kill -TERM .*(replica-\d+)\.pid`)
)

func TestREADMETour(t *testing.T) {
	if testing.Short() {
		t.Skip("builds aipfleet and runs the README's tour against aipfleet dev")
	}
	const replicas = DefaultDevReplicas
	blocks := readTour(t, filepath.Join("..", "..", "README.md"))
	expects := 0
	for _, b := range blocks {
		expects += len(b.expects)
	}
	if len(blocks) < 5 || expects < 5 {
		t.Fatalf("the README's tour has %d code blocks and %d expectations; is the \"## Tour\" section there?", len(blocks), expects)
	}

	bin := buildCLI(t)
	shim := t.TempDir()
	if err := os.WriteFile(filepath.Join(shim, "go"), []byte(`#!/bin/sh
# The README's "go run ./cmd/aipfleet ARGS" runs the binary the test built.
if [ "$1" = run ] && [ "$2" = ./cmd/aipfleet ]; then
	shift 2
	exec "$AIPFLEET_README_BINARY" "$@"
fi
echo "README test: the tour may only run go as 'go run ./cmd/aipfleet', not: go $*" >&2
exit 127
`), 0o755); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	stateDir := filepath.Join(work, DefaultDevStateDir)
	base := freePortBase(t, replicas)
	controlURL := "http://127.0.0.1:" + strconv.Itoa(base+controlPortOffset)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIP_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+shim+string(os.PathListSeparator)+os.Getenv("PATH"), "AIPFLEET_README_BINARY="+bin,
		"AIP_DEV_PORT_BASE="+strconv.Itoa(base))

	startReady := func() *devProc {
		t.Helper()
		p := startDev(t, bin, work, env, []string{"dev"})
		p.waitFor(t, "dev's ready banner", func() bool { return strings.Contains(p.stdout.String(), "aipfleet dev is ready") })
		return p
	}
	dev := startReady()
	routes := map[string]string{} // action ID -> "replica X fence Y", as first printed
	for _, b := range blocks {
		if b.restartsDev {
			dev.stop(t, stateDir, replicas)
			dev = startReady()
			if log := dev.stderr.String(); !strings.Contains(log, "restored from registry.json") || !strings.Contains(log, "unchanged=8") {
				t.Errorf("README line %d: the restarted dev did not restore its registry or reapply the same fleet file:\n%s", b.line, lastLines(log, 40))
			}
			continue
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.Command("sh", "-c", b.script)
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = work, env, &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("README line %d: %s\nfailed: %v\nstdout:\n%s\nstderr:\n%s", b.line, b.script, err, stdout.String(), stderr.String())
		}
		out := stdout.String()
		for _, x := range b.expects {
			n := strings.Count(out, x.text)
			if (x.times == 0 && n == 0) || (x.times > 0 && n != x.times) {
				t.Errorf("README line %d: the output shows %q %d times, want %s:\n%s", b.line, x.text, n, timesText(x.times), out)
			}
		}
		// Every action keeps the route it was first given.
		for _, re := range []*regexp.Regexp{sentRoute, gotRoute} {
			for _, m := range re.FindAllStringSubmatch(out, -1) {
				route := "replica " + m[2] + " fence " + m[3]
				if first, seen := routes[m[1]]; seen && first != route {
					t.Errorf("README line %d: action %s moved from %s to %s", b.line, m[1], first, route)
				}
				routes[m[1]] = route
			}
		}
		// A replica sent SIGTERM drains, goes offline and comes back.
		if m := killsReplica.FindStringSubmatch(b.script); m != nil {
			dev.waitFor(t, m[1]+"'s drain", func() bool {
				return strings.Contains(dev.stderr.String(), m[1]+" drained and went offline (exit status 0); restarting it")
			})
			dev.waitFor(t, m[1]+" to register again", func() bool {
				var st registry.FleetStatusSummary
				return fetchJSON(controlURL+controlplane.PathFleetStatus, devOperatorToken(t, stateDir), &st) == nil && st.ReadyReplicas == replicas
			})
		}
	}
	if t.Failed() {
		return
	}
	if len(routes) < 5 {
		t.Errorf("the tour printed routes for %d actions; want at least 5", len(routes))
	}
	checkDocsDevPaths(t, stateDir)
	dev.stop(t, stateDir, replicas)
}

// devPath is a file of dev's state directory as the docs and the commands'
// help name it: .aipfleet/keys/issuer.key, .aipfleet/replica-2.pid.
var devPath = regexp.MustCompile(`(?:^|[\s"'(\x60])\.aipfleet/([A-Za-z0-9_.\-/]*[A-Za-z0-9_-])`)

// checkDocsDevPaths checks that every file of dev's state directory the
// README, the guides and the commands' help name exists in the state
// directory of a running dev (replica-N stands for replica-1).
func checkDocsDevPaths(t *testing.T, stateDir string) {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{}
	for _, doc := range append(docs, filepath.Join("..", "..", "README.md")) {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		texts[filepath.Base(doc)] = string(raw)
	}
	for _, c := range commandList() {
		help, _, _ := runCLI(t, nil, c.name, "--help")
		texts["aipfleet "+c.name+" --help"] = help
	}
	checked := 0
	for source, text := range texts {
		for _, m := range devPath.FindAllStringSubmatchIndex(text, -1) {
			if strings.HasPrefix(text[m[1]:], "<") { // .aipfleet/host-<replica-id>: aipfleet host's default, not dev's
				continue
			}
			name := text[m[2]:m[3]]
			if _, err := os.Stat(filepath.Join(stateDir, filepath.FromSlash(strings.ReplaceAll(name, "replica-N", "replica-1")))); err != nil {
				t.Errorf("%s names .aipfleet/%s, which a running aipfleet dev does not have: %v", source, name, err)
			}
			checked++
		}
	}
	if checked < 3 {
		t.Errorf("found %d names of dev's files in the docs and help texts; is the pattern right?", checked)
	}
}

func timesText(n int) string {
	if n == 0 {
		return "at least once"
	}
	return "exactly " + strconv.Itoa(n)
}

// devOperatorToken mints an operator token with the issuer key of the dev
// state in stateDir, as aipfleet fleet status does.
func devOperatorToken(t *testing.T, stateDir string) string {
	t.Helper()
	bearer, err := operatorBearer("", "", "", stateDir)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := bearer.token()
	if err != nil || tok == "" {
		t.Fatalf("no operator token from %s: %v", stateDir, err)
	}
	return tok
}

// fetchJSON GETs url with the bearer token and decodes its 200 answer.
func fetchJSON(url, token string, into any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return json.NewDecoder(bufio.NewReader(resp.Body)).Decode(into)
}

// TestDevRestartsAfterAKill kills dev with SIGKILL: its replicas go too (they
// drain on their own when their parent dies), the registry file keeps them
// registered with live leases, and the next dev waits for those leases to
// expire before starting them, then serves and stops cleanly.
func TestDevRestartsAfterAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs aipfleet dev twice and waits for a lease to expire")
	}
	bin := buildCLI(t)
	work := t.TempDir()
	stateDir := filepath.Join(work, DefaultDevStateDir)
	base := freePortBase(t, 1)
	env := environWithoutAIP()
	args := []string{"dev", "--replicas", "1", "--port-base", strconv.Itoa(base)}
	dev := startDev(t, bin, work, env, args)
	dev.waitFor(t, "dev's ready banner", func() bool { return strings.Contains(dev.stdout.String(), "aipfleet dev is ready") })
	pid := func() int {
		raw, _ := os.ReadFile(filepath.Join(stateDir, "replica-1.pid"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
		return n
	}
	replicaPID := pid()
	// Let the registration reach registry.json (written within a second).
	dev.waitFor(t, "the registration on disk", func() bool {
		raw, _ := os.ReadFile(filepath.Join(stateDir, "registry.json"))
		return strings.Contains(string(raw), `"status":"ready"`)
	})
	dev.cmd.Process.Kill()
	<-dev.done
	if runtime.GOOS == "linux" { // the replica follows its parent (Pdeathsig)
		pollUntil(t, "the orphaned replica to exit", func() bool { return syscall.Kill(replicaPID, 0) != nil })
	} else {
		syscall.Kill(replicaPID, syscall.SIGTERM)
	}

	again := startDev(t, bin, work, env, args)
	again.waitFor(t, "dev's ready banner after the kill", func() bool { return strings.Contains(again.stdout.String(), "aipfleet dev is ready") })
	if log := again.stderr.String(); !strings.Contains(log, "replica-1 is still registered from a run that did not stop cleanly") || strings.Contains(log, "rejected") {
		t.Errorf("the restarted dev did not wait for the old lease:\n%s", lastLines(log, 30))
	}
	again.stop(t, stateDir, 1)
}

// TestDevRefusesAStateDirInUse starts a second dev, with --reset and
// other ports, on the state directory a running dev uses: it must stop
// before it changes anything, and the first dev must go on and stop
// cleanly with its state intact.
func TestDevRefusesAStateDirInUse(t *testing.T) {
	if testing.Short() {
		t.Skip("runs aipfleet dev twice")
	}
	bin := buildCLI(t)
	work := t.TempDir()
	stateDir := filepath.Join(work, DefaultDevStateDir)
	env := environWithoutAIP()
	first := startDev(t, bin, work, env, []string{"dev", "--replicas", "1", "--port-base", strconv.Itoa(freePortBase(t, 1))})
	first.waitFor(t, "dev's ready banner", func() bool { return strings.Contains(first.stdout.String(), "aipfleet dev is ready") })
	devJSON, err := os.ReadFile(filepath.Join(stateDir, "dev.json"))
	if err != nil {
		t.Fatal(err)
	}

	second := startDev(t, bin, work, env, []string{"dev", "--reset", "--replicas", "1", "--port-base", strconv.Itoa(freePortBase(t, 1))})
	pollUntil(t, "the second dev to exit", func() bool {
		select {
		case <-second.done:
			return true
		default:
		}
		if strings.Contains(second.stdout.String(), "aipfleet dev is ready") {
			t.Fatalf("a second dev --reset started on the state directory of a running dev:\n%s", lastLines(second.stderr.String(), 10))
		}
		return false
	})
	if second.err == nil || !strings.Contains(second.stderr.String(), "is in use by another aipfleet dev") {
		t.Fatalf("second dev: %v\n%s", second.err, second.stderr.String())
	}
	if now, err := os.ReadFile(filepath.Join(stateDir, "dev.json")); err != nil || !bytes.Equal(now, devJSON) {
		t.Fatalf("the second dev changed the running dev's dev.json (%v):\n%s", err, now)
	}
	first.stop(t, stateDir, 1)
}

// devWithAKilledReplica builds aipfleet, runs dev with one replica until
// it is ready, and kills the replica with SIGKILL; its lease stays live.
func devWithAKilledReplica(t *testing.T) (*devProc, string) {
	t.Helper()
	bin := buildCLI(t)
	work := t.TempDir()
	stateDir := filepath.Join(work, DefaultDevStateDir)
	env := environWithoutAIP()
	dev := startDev(t, bin, work, env, []string{"dev", "--replicas", "1", "--port-base", strconv.Itoa(freePortBase(t, 1))})
	dev.waitFor(t, "dev's ready banner", func() bool { return strings.Contains(dev.stdout.String(), "aipfleet dev is ready") })
	raw, _ := os.ReadFile(filepath.Join(stateDir, "replica-1.pid"))
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return dev, stateDir
}

// TestDevRestartsAKilledReplicaAfterItsLease kills a replica with SIGKILL
// while dev runs: its lease stays live, so dev starts it again only once
// the lease has expired, instead of restarting it into register refusals.
func TestDevRestartsAKilledReplicaAfterItsLease(t *testing.T) {
	if testing.Short() {
		t.Skip("runs aipfleet dev and waits for a lease to expire")
	}
	dev, stateDir := devWithAKilledReplica(t)
	dev.waitFor(t, "the killed replica to serve again", func() bool {
		return strings.Count(dev.stderr.String(), "replica-1  INFO  serving") >= 2
	})
	log := dev.stderr.String()
	if !strings.Contains(log, "replica-1 is still registered with the lease of the process that failed") || strings.Contains(log, "rejected") {
		t.Errorf("dev restarted the killed replica before its lease expired:\n%s", lastLines(log, 30))
	}
	dev.stop(t, stateDir, 1)
}

// TestDevStoppedWhileAReplicaWaitsIsNotClean: Ctrl-C while a killed
// replica waits for the lease its process left: that replica never drained
// and stays registered, so dev does not report a clean stop, and says
// which replica stayed registered and by what signal it was killed.
func TestDevStoppedWhileAReplicaWaitsIsNotClean(t *testing.T) {
	if testing.Short() {
		t.Skip("runs aipfleet dev")
	}
	dev, _ := devWithAKilledReplica(t)
	dev.waitFor(t, "dev to wait for the killed replica's lease", func() bool {
		return strings.Contains(dev.stderr.String(), "replica-1 is still registered with the lease of the process that failed")
	})
	if err := dev.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dev.done:
	case <-time.After(time.Minute):
		t.Fatal("aipfleet dev did not exit within a minute of SIGINT")
	}
	log := dev.stderr.String()
	if dev.err == nil || strings.Contains(log, "stopped cleanly") || !strings.Contains(log, "did not go offline") ||
		!strings.Contains(log, "replica-1 stopped: killed by signal 9 (killed;") {
		t.Errorf("dev exited with %v after a stop that left a replica registered:\n%s", dev.err, lastLines(log, 20))
	}
}

// buildCLI builds aipfleet into a temporary directory.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "aipfleet")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// environWithoutAIP is this process's environment without AIP_ variables,
// so a child aipfleet sees only the flags a test gives it.
func environWithoutAIP() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIP_") {
			env = append(env, kv)
		}
	}
	return env
}
