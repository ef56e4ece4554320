package sidecar

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// TestOrphansOfAKilledSidecarDieBeforeTheNewChild: a sidecar killed with
// SIGKILL takes its child with it (Pdeathsig), but not the worker the
// child started, which ignores SIGTERM and would keep running beside the
// next sidecar's child. The next sidecar of the same replica kills it once
// it holds the journal, before it starts its own child (which sees it
// gone and carries the replica's marker itself); a process marked with
// another replica's ID survives.
func TestOrphansOfAKilledSidecarDieBeforeTheNewChild(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the orphans of a killed sidecar are looked for on Linux only")
	}
	dir := t.TempDir()
	watch := filepath.Join(dir, "watch")
	var worker, other int
	r := execReplica(t, nil, func(c *Config) {
		replica := c.Host.ReplicaID
		worker = orphanOfKilledHelper(t, replica, filepath.Join(dir, "worker.pid"))
		// Another replica's process, its ID extending this one's.
		sleeper := exec.Command("sleep", "300")
		sleeper.Env = append(os.Environ(), EnvChildOf+"="+replica+"x")
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
		other = sleeper.Process.Pid
		c.ExecEnv = append(c.ExecEnv, envChildWatch+"="+strconv.Itoa(worker), envChildWatchOut+"="+watch)
	})
	raw, err := os.ReadFile(watch)
	if err != nil {
		t.Fatal(err)
	}
	want := "gone " + r.host.ReplicaID
	if string(raw) != want {
		t.Errorf("the new child saw %q (the left worker's state and its own %s); want %q", raw, EnvChildOf, want)
	}
	if running(worker) {
		t.Errorf("the worker %d left by the killed sidecar still runs", worker)
	}
	if !running(other) {
		t.Errorf("the process %d of another replica was killed", other)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// orphanOfKilledHelper runs a sidecar process of replica (the test binary)
// whose child starts a worker ignoring SIGTERM, kills the sidecar with
// SIGKILL, waits until the kernel killed its child, and returns the
// worker's pid, still running.
func orphanOfKilledHelper(t *testing.T, replica, out string) int {
	t.Helper()
	helper, worker := startHelperSidecar(t, out, envOrphanHelper+"="+out, envOrphanReplica+"="+replica)
	ctx := ctxT(t)
	shell := parentPID(worker)
	if shell == 0 {
		t.Fatalf("the parent of the worker %d cannot be read", worker)
	}
	helper.Process.Kill()
	helper.Wait()
	for running(shell) {
		if ctx.Err() != nil {
			t.Fatalf("the helper's child %d still runs after the helper was killed", shell)
		}
		time.Sleep(10 * time.Millisecond) // polling for the kernel's signal to take effect
	}
	if !running(worker) {
		t.Fatalf("the worker %d did not outlive its sidecar; the test proves nothing", worker)
	}
	return worker
}

// secondSidecar runs another sidecar of r's replica (state directory
// stateDir, or r's when empty) with ctx, and checks that the live child
// pid of r's sidecar survived it; it returns the second sidecar's error.
func secondSidecar(t *testing.T, ctx context.Context, r *replica, stateDir string) error {
	t.Helper()
	pid := r.status(t).Process.PID
	host := r.host
	host.Listener, host.Bind = nil, "127.0.0.1:0"
	if stateDir != "" {
		host.StateDir = stateDir
	}
	s, err := New(Config{Host: host, Local: LocalConfig{Socket: socketPath(t)},
		Exec: []string{os.Args[0], "-test.run=^$"}, ExecEnv: []string{envChild + "=1"}, ExecStderr: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	runErr := s.Run(ctx)
	if !running(pid) {
		t.Fatalf("the live sidecar's child %d was killed by a second sidecar of its replica ID (%v)", pid, runErr)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return runErr
}

// TestSecondSidecarOfALiveReplicaKillsNothing: a sidecar started for a
// replica whose sidecar is alive fails to take the journal and kills none
// of the live sidecar's processes (which carry the same marker).
func TestSecondSidecarOfALiveReplicaKillsNothing(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the orphans of a killed sidecar are looked for on Linux only")
	}
	if err := secondSidecar(t, ctxT(t), execReplica(t, nil, nil), ""); !errors.Is(err, sqliteruntime.ErrLocked) {
		t.Fatalf("Run of a second sidecar of a live replica: %v; want ErrLocked", err)
	}
}

// TestSidecarOfTheSameReplicaElsewhereKillsNothing: a second sidecar given
// the same replica ID but another state directory (a misconfiguration the
// journal lock cannot catch: it locks the directory) takes its own lock,
// but the marked processes it finds belong to a live sidecar — their
// nearest unmarked ancestor runs the sidecar's own executable — and are
// not killed.
func TestSidecarOfTheSameReplicaElsewhereKillsNothing(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the orphans of a killed sidecar are looked for on Linux only")
	}
	// It holds its own journal and looks for orphans at once; whether its
	// registration is refused or retried, a few seconds of it are enough.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	secondSidecar(t, ctx, execReplica(t, nil, nil), filepath.Join(t.TempDir(), "elsewhere"))
}
