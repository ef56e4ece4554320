package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Restart pauses of a replica process that exited while dev runs: after a
// clean drain (someone sent it SIGTERM) it comes back after restartClean;
// after a failure the pause doubles from restartClean up to restartMax, and
// starts over once the replica ran for stableAfter.
const (
	restartClean = time.Second
	restartMax   = 15 * time.Second
	stableAfter  = 30 * time.Second
)

// replicaProcess supervises one replica of aipfleet dev: it runs
// `aipfleet host` as a child process, records its pid in pidFile, relays
// its log lines with the replica's name, reports each exit (a clean drain,
// a failure or a kill) and restarts it after a pause until dev stops.
type replicaProcess struct {
	name    string   // replica-N
	exe     string   // this binary
	args    []string // the host command line
	env     []string
	pidFile string
	log     *devLog
	// stopGrace bounds the wait for a drain after dev's SIGTERM before the
	// process is killed.
	stopGrace time.Duration
	// before, when set, runs before the first start (first true) and
	// before each restart after a failed exit; the replica is not started
	// if it fails (dev is stopping). dev's waits there until a lease the
	// replica's previous process left has run out.
	before func(ctx context.Context, first bool) error

	mu  sync.Mutex
	cmd *exec.Cmd
}

// run supervises the replica until ctx ends, then sends the running
// process SIGTERM and waits for its drain (up to stopGrace, then SIGKILL).
// It returns nil only when that last exit was clean (status 0).
func (p *replicaProcess) run(ctx context.Context) error {
	if p.before != nil {
		if err := p.before(ctx, true); err != nil {
			return nil // stopped before anything ran
		}
	}
	pause := restartClean
	for {
		started := time.Now()
		err := p.once(ctx)
		if ctx.Err() != nil {
			return err // the exit dev asked for (or a failure just before it), reported by once
		}
		switch {
		case err == nil:
			pause = restartClean
			p.log.event("dev", p.name+" drained and went offline (exit status 0); restarting it", "in", pause.String())
		default:
			if time.Since(started) >= stableAfter {
				pause = restartClean
			}
			p.log.event("dev", p.name+" stopped: "+err.Error()+"; restarting it", "in", pause.String())
		}
		if !sleepCtx(ctx, pause) {
			return err // nothing runs; its last exit stands (nil after a clean drain)
		}
		if err != nil {
			pause = min(2*pause, restartMax)
			if p.before != nil {
				if berr := p.before(ctx, false); berr != nil {
					return err // dev stopped while the old lease ran; the failed exit stands
				}
			}
		}
	}
}

// once runs the process until it exits. When ctx ends first, it drains the
// process (SIGTERM, then SIGKILL after stopGrace) and reports how it ended.
func (p *replicaProcess) once(ctx context.Context) error {
	// A process started with Pdeathsig is signalled when the OS thread that
	// started it exits; keep this goroutine on one thread for its lifetime.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(p.exe, p.args...)
	cmd.Env = p.env
	cmd.SysProcAttr = replicaProcAttr()
	cmd.Stdin = nil
	out, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = cmd.Stderr // one pipe for both
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	pid := cmd.Process.Pid
	if err := os.WriteFile(p.pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		p.log.event("dev", "could not write "+p.pidFile, "error", err)
	}
	p.log.event("dev", "started "+p.name, "pid", pid)
	relayed := make(chan struct{})
	go func() {
		defer close(relayed)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			p.log.relay(p.name, sc.Bytes())
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	exited := make(chan error, 1)
	go func() {
		<-relayed // Wait closes the pipe: read everything first
		exited <- cmd.Wait()
	}()
	var werr error
	select {
	case werr = <-exited:
	case <-ctx.Done():
		p.log.event("dev", "draining "+p.name+" (SIGTERM)", "pid", pid)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(p.stopGrace)
		select {
		case werr = <-exited:
			t.Stop()
		case <-t.C:
			p.log.event("dev", p.name+" did not finish its drain within "+p.stopGrace.String()+"; killing it", "pid", pid)
			_ = cmd.Process.Kill()
			werr = <-exited
		}
	}
	_ = os.Remove(p.pidFile)
	p.mu.Lock()
	p.cmd = nil
	p.mu.Unlock()
	err = exitText(werr)
	if ctx.Err() != nil {
		if err == nil {
			p.log.event("dev", p.name+" drained and went offline cleanly", "pid", pid)
		} else {
			p.log.event("dev", p.name+" did not stop cleanly: "+err.Error(), "pid", pid)
		}
	}
	return err
}

// exitText turns a Wait error into what an operator needs to know.
func exitText(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Errorf("killed by signal %d (%s; a crash: it did not drain; it recovers its journal when it starts again and re-registers once its old lease expires)", int(ws.Signal()), ws.Signal())
	}
	return fmt.Errorf("exit status %d (its log above says why)", ee.ExitCode())
}

// pid returns the running process's pid, 0 when none runs.
func (p *replicaProcess) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// childEnv is the environment of replica processes: dev's own, without
// any AIP_CONNECTOR_HOST_* variable (dev passes every setting as a flag and
// an inherited variable must not change a replica, e.g. its journal).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIP_CONNECTOR_HOST_") {
			env = append(env, kv)
		}
	}
	return env
}
