package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// groupMCP connects to a stdio MCP server run through a shell wrapper that
// first starts a helper in the server's process group, ignoring SIGTERM,
// and then execs the server (this test binary, exiting at once on
// SIGTERM). With holdsOutput the helper keeps the server's standard
// output open, as a helper started without redirecting it does. It
// returns the connector, the server's pid and a function that returns the
// pids of the helpers started so far, one per start of the server.
func groupMCP(t *testing.T, holdsOutput bool, logs *logWatch) (*MCP, int, func() []int) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("process groups are supervised on Linux")
	}
	out := filepath.Join(t.TempDir(), "helpers")
	redirect := ">/dev/null"
	if holdsOutput {
		redirect = ""
	}
	helpers := func() []int {
		raw, _ := os.ReadFile(out)
		var pids []int
		for _, line := range strings.Fields(string(raw)) {
			if pid, err := strconv.Atoi(line); err == nil {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	t.Cleanup(func() { // the helpers leaked, when the test fails
		for _, pid := range helpers() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	m, err := NewMCP(MCPConfig{
		Command: []string{"/bin/sh", "-c",
			`/bin/sh -c "trap '' TERM; exec sleep 300" ` + redirect + ` & echo $! >> "$OUT"; exec "$0" -test.run=^$`, os.Args[0]},
		Env: []string{envMCPChild + "=1", "OUT=" + out,
			"GORACE=atexit_sleep_ms=0"}, // with -race, exiting would take a second: more than StopTimeout
		StopTimeout: 200 * time.Millisecond, RestartBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		Logger: logs.logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Connect(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	pid := m.snapshot().PID
	if hs := helpers(); len(hs) != 1 || !running(hs[0]) || pid == 0 {
		m.Close()
		t.Fatalf("helpers %v, server %d: not running", hs, pid)
	}
	return m, pid, helpers
}

// TestMCPCrashedServerLeavesNoProcessBehind: when a stdio MCP server dies
// (here SIGKILL, as the OOM killer sends) the rest of its process group —
// a helper it started, ignoring SIGTERM — is stopped (SIGKILL after
// StopTimeout) before the server is started again. The SDK reaped the
// server itself and only the server was watched: the helper ran on beside
// the restarted server, and one holding the server's output kept the
// session from ever seeing the crash.
func TestMCPCrashedServerLeavesNoProcessBehind(t *testing.T) {
	for _, holdsOutput := range []bool{false, true} {
		t.Run(fmt.Sprintf("helper_holds_output=%v", holdsOutput), func(t *testing.T) {
			logs := newLogWatch()
			m, pid, helpers := groupMCP(t, holdsOutput, logs)
			defer m.Close()
			first := helpers()[0]
			syscall.Kill(pid, syscall.SIGKILL)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for m.snapshot().Starts < 2 {
				if ctx.Err() != nil {
					t.Fatalf("the MCP server was not restarted after its crash (helper %d alive: %v)", first, running(first))
				}
				time.Sleep(5 * time.Millisecond) // polling for the restart
			}
			if running(first) {
				t.Fatalf("the crashed MCP server's helper %d still runs beside the restarted server", first)
			}
			if _, err := m.Manifest(ctx, hostsdk.TenantContext{}); err != nil {
				t.Errorf("the restarted server: %v", err)
			}
		})
	}
}

// TestMCPCloseLeavesNoProcessBehind: Close ends the stdio MCP server's
// whole process group. A server that exits at once on SIGTERM while a
// helper of its group ignores it does not leave the helper running after
// the sidecar: it is killed after StopTimeout and Close reports the kill.
func TestMCPCloseLeavesNoProcessBehind(t *testing.T) {
	logs := newLogWatch()
	m, _, helpers := groupMCP(t, false, logs)
	err := m.Close()
	if h := helpers()[0]; running(h) {
		t.Fatalf("the MCP server's helper %d still runs after Close returned (%v)", h, err)
	}
	if err == nil || !strings.Contains(err.Error(), "did not stop within") {
		t.Errorf("Close = %v; want the kill of the group reported", err)
	}
}

// TestMCPCloseEndsTheServerThroughItsInput: the sidecar's orderly stop of
// a stdio MCP server is MCP's stdio shutdown — its input is closed first,
// and a server that then exits on its own gets no SIGTERM. Close used to
// send SIGTERM together with closing the input, so a server that finishes
// its work (flushes its state) when its input ends, as the MCP
// specification has servers shut down, was terminated instead.
func TestMCPCloseEndsTheServerThroughItsInput(t *testing.T) {
	stopLog := filepath.Join(t.TempDir(), "stop.log")
	m, err := NewMCP(MCPConfig{
		Command: []string{os.Args[0], "-test.run=^$"},
		Env: []string{envMCPChild + "=1", envMCPStopLog + "=" + stopLog,
			"GORACE=atexit_sleep_ms=0"},
		// Half of it is the time the server has to exit once its input
		// ended: more than the 2 s the server lingers after the end.
		StopTimeout: 30 * time.Second, Logger: newLogWatch().logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Connect(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	raw, err := os.ReadFile(stopLog)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(raw)); !slices.Equal(got, []string{"eof"}) {
		t.Errorf("the server saw %v; want its input's end only, no SIGTERM", got)
	}
}

// TestMCPServerCrashingAtItsStopIsUnclean: a stdio server whose stop
// (its input closed, MCP's stdio shutdown) ends in its death by a signal
// the sidecar did not send (a segfault, an abort, the OOM killer; here a
// self-sent SIGTERM or SIGKILL) did not stop cleanly, so Close, and the
// sidecar's exit status, report it; a death by a SIGTERM the sidecar did
// not send counted as a clean stop, and the sidecar exited 0. A failure
// status of its own once its input ended is a stop, logged (several
// servers exit 1 then).
func TestMCPServerCrashingAtItsStopIsUnclean(t *testing.T) {
	for _, tc := range []struct {
		env, exit string
		clean     bool
	}{
		// An exit status of its own once its input ended is a stop
		// (several servers exit 1 then), logged.
		{envMCPEOFStatus + "=3", "exit status 3", true},
		{envMCPEOFSignal + "=TERM", "signal: terminated", false},
		{envMCPEOFSignal + "=KILL", "signal: killed", false},
	} {
		t.Run(tc.exit, func(t *testing.T) {
			logs := newLogWatch()
			m, err := NewMCP(MCPConfig{
				Command:     []string{os.Args[0], "-test.run=^$"},
				Env:         []string{envMCPChild + "=1", tc.env, "GORACE=atexit_sleep_ms=0"},
				StopTimeout: 30 * time.Second, Logger: logs.logger(),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Connect(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			err = m.Close()
			if tc.clean {
				if err != nil {
					t.Errorf("Close of a server that exited with %s once its input was closed: %v; want a stop", tc.exit, err)
				}
				logs.await(t, func(r slog.Record) bool {
					return strings.HasPrefix(r.Message, "the MCP server exited with an error status once its input was closed") && attr(r, "exit") == tc.exit
				})
				return
			}
			if err == nil || !strings.Contains(err.Error(), "did not stop cleanly: it exited once its input was closed") || !strings.Contains(err.Error(), tc.exit) {
				t.Errorf("Close of a server that ended with %s once its input was closed: %v; want an unclean stop naming it", tc.exit, err)
			}
			logs.await(t, func(r slog.Record) bool {
				return strings.HasPrefix(r.Message, "the MCP server did not stop cleanly") && attr(r, "exit") == tc.exit
			})
		})
	}
}

// TestMCPCloseGivesUpOnAServerThatDoesNotExitAfterSIGKILL: a stdio server
// that does not exit after SIGKILL (uninterruptible sleep on a dead NFS
// mount; here a reaper that does not see its exit, and a process outside
// its group that holds its output open, as the sleeping server would) does
// not hang Close, and so the sidecar's shutdown, for ever: it is given up
// on KillWait after SIGKILL, logged, its session ended, and Close returns
// an error saying so. Close waited for its exit without limit.
func TestMCPCloseGivesUpOnAServerThatDoesNotExitAfterSIGKILL(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("process groups are supervised on Linux")
	}
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	holder := filepath.Join(t.TempDir(), "holder")
	t.Cleanup(func() {
		if raw, err := os.ReadFile(holder); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	logs := newLogWatch()
	m, err := NewMCP(MCPConfig{
		// The holder leaves the server's process group (setsid) with the
		// server's output.
		Command:     []string{"/bin/sh", "-c", `setsid sleep 300 & echo $! > "$HOLDER"; exec "$0" -test.run=^$`, os.Args[0]},
		Env:         []string{envMCPChild + "=1", "HOLDER=" + holder, "GORACE=atexit_sleep_ms=0"},
		StopTimeout: 200 * time.Millisecond, killWait: 300 * time.Millisecond,
		Logger: logs.logger(),
		// The server's exit is not seen until the test releases it.
		awaitExit: func(pid int) error {
			<-release
			return awaitExitUnreaped(pid)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Connect(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	srv := m.srv
	m.mu.Unlock()

	closed := make(chan error, 1)
	t0 := time.Now()
	go func() { closed <- m.Close() }()
	select {
	case err = <-closed:
	case <-time.After(10 * time.Second):
		unblock()
		<-closed
		t.Fatal("Close waited for a server that did not exit after SIGKILL")
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("Close took %s; want about StopTimeout + 2 KillWait", took)
	}
	if err == nil || !strings.Contains(err.Error(), "did not exit within 300ms after SIGKILL") {
		t.Errorf("Close = %v; want it to say the server did not exit after SIGKILL", err)
	}
	logs.await(t, func(r slog.Record) bool {
		return strings.HasPrefix(r.Message, "the MCP server did not exit after SIGKILL") && attr(r, "pid") == strconv.Itoa(srv.cmd.Process.Pid)
	})
	// The reaper still reaps the server once its exit is seen.
	unblock()
	select {
	case <-srv.exited:
	case <-time.After(time.Minute):
		t.Fatal("the server was not reaped once its exit was seen")
	}
}

// TestMCPServerExitingAtStartIsNamed: a stdio server that exits at once
// (a missing script: python3 prints why and exits 2) failed the start
// with "calling \"initialize\": client is closing: EOF" alone; the error
// now says the server process exited and how. An attempt the start's
// deadline cut off does not replace that with "context deadline exceeded"
// (a server slow to fail, python3 on a loaded machine). A server that
// runs but does not speak MCP is stopped by the sidecar: its SIGTERM is
// not reported as the server's exit.
func TestMCPServerExitingAtStartIsNamed(t *testing.T) {
	const exited = "(the MCP server process exited: exit status 7; its standard error, above, says why)"
	for _, c := range []struct {
		name, script, want string
		timeout            time.Duration
	}{
		{"exits", "echo cannot open the script >&2; exit 7", exited, 300 * time.Millisecond},
		{"exits slowly", "sleep 0.4; exit 7", exited, 2 * time.Second},
		{"runs without MCP", "echo not-json; exec sleep 60", "", 300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := NewMCP(MCPConfig{
				Command: []string{"/bin/sh", "-c", c.script}, Stderr: io.Discard,
				ConnectTimeout: c.timeout, StopTimeout: 2 * time.Second, RestartBackoff: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
				Logger: slog.New(slog.DiscardHandler),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			err = m.Connect(ctxT(t))
			if !errors.Is(err, ErrStartTimeout) || c.want != "" && !strings.Contains(err.Error(), c.want) ||
				c.want == "" && strings.Contains(err.Error(), "process exited") {
				t.Fatalf("Connect = %v; want ErrStartTimeout with %q", err, c.want)
			}
		})
	}
}

// TestMCPServerFoundDeadAtCloseIsUnclean: a stdio server that exited on
// its own (a crash, or an exit with status 0) and was not restarted yet
// when Close began was found dead, not stopped: Close, and so the
// sidecar's exit status, report it with the server's pid and exit. When
// the reconnect loop had noticed the exit first (it took the session down
// and waits to restart the server), the crash was dropped and Close
// returned nil; a server that exited 0 before Close was a clean stop.
func TestMCPServerFoundDeadAtCloseIsUnclean(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		exit string
	}{
		{"crash", syscall.SIGKILL, "signal: killed"},
		// The test server exits 0 on a SIGTERM the sidecar did not send.
		{"exit_0", syscall.SIGTERM, "exit status 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := newLogWatch()
			m, err := NewMCP(MCPConfig{
				Command:        []string{os.Args[0], "-test.run=^$"},
				Env:            []string{envMCPChild + "=1", "GORACE=atexit_sleep_ms=0"},
				StopTimeout:    30 * time.Second,
				RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour,
				Logger: logs.logger(),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Connect(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			m.mu.Lock()
			pid := m.srv.cmd.Process.Pid
			m.mu.Unlock()
			syscall.Kill(pid, tc.sig)
			// The loop notices first, takes the session down and waits an
			// hour to restart the server.
			logs.await(t, func(r slog.Record) bool { return r.Message == "reconnecting to the MCP server" })
			err = m.Close()
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the MCP server %d did not stop cleanly: it exited before the sidecar stopped it, and had not been restarted", pid)) ||
				!strings.Contains(err.Error(), tc.exit) {
				t.Errorf("Close after the server exited with %s, not restarted: %v; want an unclean stop naming it", tc.exit, err)
			}
			logs.await(t, func(r slog.Record) bool {
				return strings.HasPrefix(r.Message, "the MCP server did not stop cleanly") && attr(r, "exit") == tc.exit
			})
		})
	}
}
