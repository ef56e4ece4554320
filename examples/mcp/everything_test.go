package mcpexample_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/sidecar"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest/realfleet"
)

// EverythingVersion pins the reference MCP server the tests install from
// the npm registry. 2025.9.25 runs on Node 20 and has the echo, add and
// longRunningOperation tools (later versions renamed them). Its whole
// dependency tree is locked, with integrity hashes, in
// testdata/everything/package-lock.json, and installed with npm ci, so a
// new release of one of its dependencies cannot change what the tests run.
// To move to another version, change it here and in
// testdata/everything/package.json, then run
// `npm install --package-lock-only` in testdata/everything.
const EverythingVersion = "2025.9.25"

const everythingPackage = "@modelcontextprotocol/server-everything"

// tools exposes only what the tests use (the server also has printEnv,
// which would hand the environment to any caller).
const tools = "echo,add,longRunningOperation"

var (
	installOnce sync.Once
	installDir  string
	installErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	sidecartest.RemoveBuilds()
	if installDir != "" {
		os.RemoveAll(installDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// everything installs the pinned server once per test run into a temporary
// directory and returns the path of its entry point.
func everything(t *testing.T) (node, script string) {
	t.Helper()
	if testing.Short() {
		t.Skip("installs an MCP server from the npm registry and runs processes; skipped in -short mode")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("npm is not installed: the MCP example's tests install %s@%s from the npm registry; install Node.js and npm", everythingPackage, EverythingVersion)
	}
	node, err = exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: the MCP example's tests run the reference MCP server on Node.js")
	}
	installOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mcp-everything")
		if err != nil {
			installErr = err
			return
		}
		installDir = dir
		if installErr = lockedVersion(); installErr != nil {
			return
		}
		for _, name := range []string{"package.json", "package-lock.json"} {
			raw, err := os.ReadFile(filepath.Join("testdata", "everything", name))
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name), raw, 0o600)
			}
			if err != nil {
				installErr = err
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, "ci", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel=error")
		if out, err := cmd.CombinedOutput(); err != nil {
			installErr = fmt.Errorf("npm ci (%s@%s and its locked dependencies, testdata/everything): %v\n%s", everythingPackage, EverythingVersion, err, out)
		}
	})
	if installErr != nil {
		t.Fatal(installErr)
	}
	script = filepath.Join(installDir, "node_modules", everythingPackage, "dist", "index.js")
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("the installed server has no %s: %v", script, err)
	}
	return node, script
}

// lockedVersion checks that the lock file installs EverythingVersion.
func lockedVersion() error {
	raw, err := os.ReadFile(filepath.Join("testdata", "everything", "package-lock.json"))
	if err != nil {
		return err
	}
	var lock struct {
		Packages map[string]struct {
			Version string `json:"version"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(raw, &lock); err != nil {
		return fmt.Errorf("testdata/everything/package-lock.json: %v", err)
	}
	if got := lock.Packages["node_modules/"+everythingPackage].Version; got != EverythingVersion {
		return fmt.Errorf("testdata/everything/package-lock.json installs %s@%q, the tests pin %s: run `npm install --package-lock-only` in testdata/everything after changing the version in package.json",
			everythingPackage, got, EverythingVersion)
	}
	return nil
}

func action(capability, input string) *aip.Action {
	return &aip.Action{ID: aip.NewActionID(), CapabilityID: capability, Input: json.RawMessage(input)}
}

func text(t *testing.T, res *aip.ActionResult) string {
	t.Helper()
	var parts []string
	for _, p := range res.Message {
		parts = append(parts, p.Text)
	}
	return strings.Join(parts, "\n")
}

// TestEverythingOverStdio runs the reference server as the sidecar's stdio
// child: its tools are the capabilities, calls go through the fleet, a
// tool's progress notifications stream as chunks, a cancel reaches the
// server, and SIGTERM stops the server after offline.
func TestEverythingOverStdio(t *testing.T) {
	node, script := everything(t)
	fleet := realfleet.New(t)
	args := []string{"--capability-prefix", "everything.", "--mcp-tools", tools, "--mcp-command", node, script}

	// What an operator admits: the manifest and its digest.
	m, digest := sidecartest.Describe(t, fleet.TrustDomain(), nil, args...)
	fleet.Admit(t, m)
	r := fleet.NewReplica(t, sidecartest.ReplicaOptions{})
	p := sidecartest.Start(t, sidecartest.Sidecar(t), r.Env, args...)
	p.Await(t, "serving")
	r.AwaitReady(t)
	var served aip.Manifest
	sidecartest.GetJSON(t, r.Base+hostsdk.PathManifest, &served)
	if got, _ := aip.ManifestDigest(&served); got != digest || len(m.Capabilities) != 3 {
		t.Errorf("the running replica serves digest %s, --print-manifest said %s (%d capabilities)", got, digest, len(m.Capabilities))
	}
	if m.Agent.ID != "agent:mcp:example-servers/everything" {
		t.Errorf("agent %+v", m.Agent)
	}
	add, ok := m.Capability("everything.add")
	if !ok || add.Contract == nil || add.Contract.Execution.RetrySafety != aip.RetryUnsafe || !strings.Contains(string(add.InputSchema), `"a"`) {
		t.Errorf("everything.add %+v", add)
	}
	if _, ok := m.Capability("everything.printEnv"); ok {
		t.Error("a tool outside --mcp-tools became a capability")
	}

	res := fleet.Act(t, r, action("everything.echo", `{"message":"hello, fleet"}`)).Must(t, aip.ResultCompleted)
	if text(t, res) != "Echo: hello, fleet" {
		t.Fatalf("echo: %+v", res)
	}
	res = fleet.Act(t, r, action("everything.add", `{"a":2,"b":40}`)).Must(t, aip.ResultCompleted)
	if text(t, res) != "The sum of 2 and 40 is 42." {
		t.Fatalf("add: %+v", res)
	}

	// A tool that reports progress, as a streaming action.
	long := action("everything.longRunningOperation", `{"duration":1,"steps":4}`)
	long.Mode = aip.ModeStreaming
	ans := fleet.Act(t, r, long)
	if res := ans.Must(t, aip.ResultCompleted); !strings.Contains(text(t, res), "Long running operation completed") {
		t.Fatalf("longRunningOperation: %+v", res)
	}
	if len(ans.Chunks) != 4 {
		t.Fatalf("%d chunks, want 4: %s", len(ans.Chunks), ans.Raw)
	}
	for i, c := range ans.Chunks {
		var pr struct{ Progress, Total float64 }
		json.Unmarshal(c.Data, &pr)
		if c.Kind != aip.ChunkProgress || c.Sequence != uint64(i) || pr.Progress != float64(i+1) || pr.Total != 4 {
			t.Errorf("chunk %d: %+v %s", i, c, c.Data)
		}
	}

	// A cancel becomes an MCP cancel; the tool is not read-only, so its
	// outcome is unknown.
	slow := action("everything.longRunningOperation", `{"duration":60,"steps":2}`)
	done := make(chan *sidecartest.Answer, 1)
	go func() { done <- fleet.Act(t, r, slow) }()
	deadline := time.Now().Add(time.Minute)
	for fleet.State(t, r, slow.ID, slow.CapabilityID) != aip.StateRunning {
		if time.Now().After(deadline) {
			t.Fatal("the long operation did not start")
		}
		time.Sleep(10 * time.Millisecond) // polling a real process for a state change
	}
	fleet.Cancel(t, r, slow.ID, slow.CapabilityID, "not needed")
	if ans := <-done; !ans.OutcomeUnknown || ans.Error == nil || !strings.Contains(ans.Error.Message, "notifications/cancelled") {
		t.Errorf("the cancelled call did not end outcome_unknown: %+v %s", ans.Error, ans.Raw)
	}

	var st sidecar.Status
	sidecartest.GetJSON(t, r.Base+sidecar.PathStatus, &st)
	if st.Mode != "mcp" || st.Process == nil || st.Process.PID == 0 || !st.Healthy {
		t.Fatalf("status %+v", st)
	}
	p.Signal(t, syscall.SIGTERM)
	if err := p.Wait(t); err != nil {
		t.Fatalf("the sidecar exited with %v after SIGTERM", err)
	}
	tr := fleet.Transitions(t)
	if last := tr[len(tr)-1]; last.Op != aip.OpOffline || last.ReplicaID != r.ID {
		t.Errorf("last transition %+v", last)
	}
	if !sidecartest.Exited(st.Process.PID) {
		t.Errorf("the MCP server %d outlived the sidecar", st.Process.PID)
	}
}

// TestEverythingOverStreamableHTTP attaches to the reference server
// running its Streamable HTTP transport.
func TestEverythingOverStreamableHTTP(t *testing.T) {
	node, script := everything(t)
	addr := sidecartest.FreeAddr(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	sidecartest.Start(t, node, []string{"PORT=" + port}, script, "streamableHttp")
	env := []string{"AIP_SIDECAR_MCP_URL=http://" + addr + "/mcp", "AIP_SIDECAR_MCP_TOOLS=" + tools, "AIP_SIDECAR_START_TIMEOUT_MS=60000"}
	fleet := realfleet.New(t)
	m, _ := sidecartest.Describe(t, fleet.TrustDomain(), env)
	fleet.Admit(t, m)
	r := fleet.NewReplica(t, sidecartest.ReplicaOptions{})
	p := sidecartest.Start(t, sidecartest.Sidecar(t), append(r.Env, env...))
	p.Await(t, "serving")
	r.AwaitReady(t)
	res := fleet.Act(t, r, action("mcp.add", `{"a":1.5,"b":2}`)).Must(t, aip.ResultCompleted)
	if text(t, res) != "The sum of 1.5 and 2 is 3.5." {
		t.Fatalf("add: %+v", res)
	}
	long := action("mcp.longRunningOperation", `{"duration":0.3,"steps":3}`)
	long.Mode = aip.ModeStreaming
	ans := fleet.Act(t, r, long)
	if ans.Must(t, aip.ResultCompleted); len(ans.Chunks) != 3 {
		t.Fatalf("longRunningOperation over HTTP: %d chunks: %s", len(ans.Chunks), ans.Raw)
	}
	p.Signal(t, syscall.SIGTERM)
	if err := p.Wait(t); err != nil {
		t.Fatalf("exit: %v", err)
	}
}
