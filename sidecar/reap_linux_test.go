//go:build linux

package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runSubreaperHelper is the process of envSubreaperHelper: a sidecar that
// inherits orphans as PID 1 of a container does (a child subreaper here),
// whose child crashes and leaves a worker of its process group, orphaned
// to the sidecar. Once the crash is recorded (the worker stopped), it
// writes "zombies:" and the pids of its children that are zombies to out.
func runSubreaperHelper(out string) int {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		fmt.Fprintln(os.Stderr, "subreaper helper: prctl:", errno)
		return 3
	}
	workerPID := out + ".worker"
	s := newSupervisor(superviseConfig{
		Command: []string{"/bin/sh", "-c", `sleep 300 & echo $! > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; exec sleep 300`},
		Env:     []string{"OUT=" + workerPID},
		Ready: func(context.Context) error {
			_, err := os.Stat(workerPID)
			return err
		},
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: 10 * time.Second,
		RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: slog.New(slog.DiscardHandler),
	})
	if err := s.start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "subreaper helper:", err)
		return 3
	}
	defer s.stop()
	syscall.Kill(s.snapshot().PID, syscall.SIGKILL)
	deadline := time.Now().Add(time.Minute)
	for s.snapshot().Restarts == 0 {
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "subreaper helper: the crash was not recorded")
			return 3
		}
		time.Sleep(5 * time.Millisecond) // polling for the supervisor to record the crash
	}
	var zombies []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(pid); len(f) > 1 && f[0] == "Z" && parentPID(pid) == os.Getpid() {
			zombies = append(zombies, e.Name())
		}
	}
	if err := os.WriteFile(out, []byte(strings.TrimSpace("zombies: "+strings.Join(zombies, " "))), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "subreaper helper:", err)
		return 3
	}
	return 0
}

// TestOrphanedWorkersAreReaped: a sidecar that is PID 1 of a container
// (or a child subreaper) inherits the workers of a crashed connector's
// process group, which it then stops; nothing else waits for them, so
// each crash left them as zombies for the sidecar's life, filling the
// process table of a crash-looping pre-fork connector. They are reaped
// before the crash counts.
func TestOrphanedWorkersAreReaped(t *testing.T) {
	out := filepath.Join(t.TempDir(), "zombies")
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), envSubreaperHelper+"="+out)
	helper.Stderr = os.Stderr
	if err := helper.Run(); err != nil {
		t.Fatalf("the helper sidecar: %v", err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(raw); got != "zombies:" {
		t.Fatalf("after the crash was recorded the sidecar still had zombie children: %q", got)
	}
}
