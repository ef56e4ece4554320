// Package sidecartest runs connectors under the aip-sidecar binary in
// tests, as an operator would: it builds the binary once per test process,
// describes and admits the connector version (aip-sidecar
// --print-manifest), pre-provisions replicas in a fleet, starts the
// sidecar with the common AIP_CONNECTOR_HOST_* environment, follows its
// JSON log, and checks local-contract messages against the contract's JSON
// Schemas (Validator).
//
// Tests talk to the central side only through the Fleet interface. Two
// fleets implement it: FakeFleet, hostsdktest's in-process control plane
// and dispatcher (the real signed wire over loopback HTTP, no database),
// and package realfleet, the aipfleet control-plane and dispatch processes
// on PostgreSQL. realfleet.New picks the real one whenever a test database
// is configured.
//
// A test:
//
//	func TestMain(m *testing.M) { code := m.Run(); sidecartest.RemoveBuilds(); os.Exit(code) }
//
//	fleet := realfleet.New(t)
//	m, _ := sidecartest.Describe(t, fleet.TrustDomain(), nil, "--local-socket", sock, "--exec", "python3", "connector.py")
//	fleet.Admit(t, m)
//	r := fleet.NewReplica(t, sidecartest.ReplicaOptions{})
//	p := sidecartest.Start(t, sidecartest.Sidecar(t), r.Env, "--local-socket", sock, "--exec", "python3", "connector.py")
//	p.Await(t, "serving")
//	res := fleet.Act(t, r, action).Must(t, aip.ResultCompleted)
package sidecartest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SidecarPackage is the import path of the aip-sidecar command.
const SidecarPackage = "github.com/aipfleet/aipfleet/cmd/aip-sidecar"

var (
	buildMu  sync.Mutex
	builds   = map[string]string{}
	buildDir string
)

// Build builds a main package once per test process and returns the
// binary's path. Call RemoveBuilds from TestMain when the tests are done.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := builds[pkg]; ok {
		return bin
	}
	if buildDir == "" {
		dir, err := os.MkdirTemp("", "sidecartest-bin")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = dir
	}
	bin := filepath.Join(buildDir, filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	builds[pkg] = bin
	return bin
}

// Sidecar builds (once) and returns the aip-sidecar binary.
func Sidecar(t testing.TB) string { return Build(t, SidecarPackage) }

// RemoveBuilds deletes the binaries Build made.
func RemoveBuilds() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		os.RemoveAll(buildDir)
		buildDir, builds = "", map[string]string{}
	}
}

// Process is a running binary whose JSON log lines (stderr) are followed.
type Process struct {
	Cmd     *exec.Cmd
	name    string
	done    chan struct{}
	err     error
	mu      sync.Mutex
	log     strings.Builder
	records []map[string]any
	// awaited is how many records Await has consumed; changed is closed
	// (and replaced) when a record is added.
	awaited int
	changed chan struct{}
	stdout  lockedBuffer
}

// Records returns every JSON log line the process wrote so far.
func (p *Process) Records() []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.records...)
}

// lockedBuffer is a bytes.Buffer safe for the process's writer and the
// test.
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

// Stdout returns what the process wrote to its standard output so far.
func (p *Process) Stdout() string { return p.stdout.String() }

// Start runs bin with the inherited environment plus env and args; it is
// killed when the test ends if still running, and its log is printed if
// the test failed.
func Start(t testing.TB, bin string, env []string, args ...string) *Process {
	t.Helper()
	return StartWith(t, bin, StartOptions{Env: env}, args...)
}

// StartOptions tune StartWith.
type StartOptions struct {
	// Name labels the process in failure messages (default: the binary's
	// base name).
	Name string
	// Env is added to the inherited environment.
	Env []string
	// KillWithTest: on Linux the process is sent SIGKILL when the test
	// binary dies (Pdeathsig), so a crashed or killed run leaves nothing
	// behind. Elsewhere only the test's cleanup stops it.
	KillWithTest bool
	// LogTail, when positive, prints only the last LogTail lines of the
	// log when the test failed (default: the whole log).
	LogTail int
}

// StartWith runs bin with args as opts say; it is killed when the test ends
// if still running, and its log is printed if the test failed.
func StartWith(t testing.TB, bin string, opts StartOptions, args ...string) *Process {
	t.Helper()
	name := opts.Name
	if name == "" {
		name = filepath.Base(bin)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), opts.Env...)
	if opts.KillWithTest {
		cmd.SysProcAttr = killWithParent()
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &Process{Cmd: cmd, name: name, done: make(chan struct{}), changed: make(chan struct{})}
	cmd.Stdout = &p.stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.mu.Lock()
				p.records = append(p.records, m)
				close(p.changed)
				p.changed = make(chan struct{})
				p.mu.Unlock()
			}
		}
		io.Copy(io.Discard, stderr) // past an overlong line: never block the process
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			log := p.Log()
			if opts.LogTail > 0 {
				t.Logf("%s log (last %d lines):\n%s", name, opts.LogTail, tail(log, opts.LogTail))
			} else {
				t.Logf("%s log:\n%s", name, log)
			}
		}
	})
	return p
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Name is the process's label (StartOptions.Name, or the binary's name).
func (p *Process) Name() string { return p.name }

// Exited reports whether the process has exited (and its log is complete).
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL, unless the process already exited, and waits for the
// exit.
func (p *Process) Kill() {
	if !p.Exited() {
		p.Cmd.Process.Kill()
		<-p.done
	}
}

// Term sends SIGTERM and waits up to a minute for the exit; it returns
// cmd.Wait's result (nil: the process exited 0).
func (p *Process) Term(t testing.TB) error {
	t.Helper()
	if !p.Exited() {
		if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Fatalf("SIGTERM %s: %v", p.name, err)
		}
	}
	select {
	case <-p.done:
		return p.err
	case <-time.After(time.Minute):
		t.Fatalf("%s did not exit within a minute of SIGTERM", p.name)
		return nil
	}
}

// WaitUntil polls cond every 20 ms until it holds; it fails the test if one
// of watch exits first (with that process's log) or a minute passes.
func WaitUntil(t testing.TB, what string, watch []*Process, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		for _, p := range watch {
			if p.Exited() {
				t.Fatalf("%s exited while waiting for %s: %v\n%s", p.name, what, p.err, p.Log())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling processes for a condition
	}
}

// Log returns everything the process wrote to stderr so far.
func (p *Process) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Await reads log lines until one has msg and every attr=value pair given
// (as alternating strings), and returns it. Each call continues after the
// line the previous one returned (or the last line it read).
func (p *Process) Await(t testing.TB, msg string, attrs ...string) map[string]any {
	t.Helper()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	matches := func(m map[string]any) bool {
		if m["msg"] != msg {
			return false
		}
		for i := 0; i+1 < len(attrs); i += 2 {
			if fmt.Sprint(m[attrs[i]]) != attrs[i+1] {
				return false
			}
		}
		return true
	}
	for {
		exited := p.Exited() // every record is in before done closes
		p.mu.Lock()
		for p.awaited < len(p.records) {
			m := p.records[p.awaited]
			p.awaited++
			if matches(m) {
				p.mu.Unlock()
				return m
			}
		}
		changed := p.changed
		p.mu.Unlock()
		if exited {
			t.Fatalf("the process exited before logging %q", msg)
		}
		select {
		case <-changed:
		case <-p.done:
		case <-timeout.C:
			t.Fatalf("the process did not log %q", msg)
		}
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Wait waits for the process to exit and returns cmd.Wait's result.
func (p *Process) Wait(t testing.TB) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(2 * time.Minute):
		t.Fatal("the process did not exit")
		return nil
	}
}

// Exited reports whether a process ID no longer exists.
func Exited(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}
