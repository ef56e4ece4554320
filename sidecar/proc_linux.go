package sidecar

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// childProcAttr puts the child in its own process group (a terminal's
// Ctrl-C reaches only the sidecar, which stops the child after its own
// drain) and asks the kernel to kill it if the sidecar dies. SIGKILL, not
// SIGTERM: the dead sidecar's in-flight actions are reconciled by the
// restarted sidecar with a new child, and an old child that went on
// finishing them after a SIGTERM (a graceful server does) could complete
// an action the new child already answered not_found for. An orderly stop
// is the sidecar's own (terminate), after its drain.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroupOf sends sig to the process group of the child cmd (a shell
// wrapper's children, a server's workers stop too). Use child.signal,
// which knows whether the pid is still the child's.
func signalGroupOf(cmd *exec.Cmd, sig syscall.Signal) error {
	return syscall.Kill(-cmd.Process.Pid, sig)
}

// stoppedCleanly reports an exit with status 0 or by SIGTERM.
func stoppedCleanly(ps *os.ProcessState) bool {
	if ps.Success() {
		return true
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}

// awaitExitUnreaped blocks until the child pid exits without reaping it
// (waitid with WNOWAIT): while it is an unreaped zombie its pid, which is
// also its process group's ID, cannot be reused, so the rest of the group
// can be signalled and looked for safely.
func awaitExitUnreaped(pid int) error {
	const pPID = 1
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		}
		return errno
	}
}

// groupRemains reports whether a process other than leader that has not
// exited is in process group pgid (read from /proc).
func groupRemains(pgid, leader int) bool {
	found := false
	groupMembers(pgid, leader, func(_ int, state byte, _ int) bool {
		found = state != 'Z' && state != 'X'
		return !found
	})
	return found
}

// groupMembers calls fn with the pid, state and parent of each process in
// process group pgid other than leader (read from /proc), until fn
// returns false.
func groupMembers(pgid, leader int, fn func(pid int, state byte, ppid int) bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == leader {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and ')'.
		i := bytes.LastIndexByte(raw, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(raw[i+1:])
		if len(f) < 3 {
			continue
		}
		g, err := strconv.Atoi(string(f[2]))
		if err != nil || g != pgid {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		if !fn(pid, f[0][0], ppid) {
			return
		}
	}
}

// reapGroupOrphans reaps the zombies of process group pgid, other than
// its leader, whose parent is this process: processes of an exited
// child's group that were orphaned to the sidecar — PID 1 of a container,
// or a child subreaper, inherits them — and then exited or were stopped
// (stopGroupRest). Nothing else waits for them (os/exec waits only for
// the processes it started, each the leader of its own group), so each
// would stay a zombie for the sidecar's life, and a crash-looping
// pre-fork connector would fill the process table.
func reapGroupOrphans(pgid, leader int) {
	self := os.Getpid()
	groupMembers(pgid, leader, func(pid int, state byte, ppid int) bool {
		if state == 'Z' && ppid == self {
			var ws syscall.WaitStatus
			syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		return true
	})
}

// stopOrphans kills the processes of this user, other than this one,
// whose environment holds exactly EnvChildOf=replicaID, and waits until
// they are gone, for at most wait. Call it only while holding the
// replica's journal, which proves that no live sidecar of the replica
// exists: what it finds is what a killed sidecar's child left behind. The
// kernel kills (Pdeathsig) only the direct child of a sidecar that dies;
// the processes the child started (a pre-fork server's workers, the
// program behind a shell wrapper that does not exec) keep running, hold
// the connector's socket or port and may complete an action the new
// sidecar reconciles with its new child — a second run. A process that
// cleared or replaced its environment escapes (it is not recognised). Each
// process is signalled through a pidfd opened before its environment is
// read, so a pid reused meanwhile is never signalled.
func stopOrphans(replicaID string, wait time.Duration, log *slog.Logger) {
	if replicaID == "" {
		return
	}
	marker := []byte(EnvChildOf + "=" + replicaID)
	self, uid := os.Getpid(), uint32(os.Getuid())
	selfExe, _ := os.Stat("/proc/self/exe")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		log.Warn("cannot look for processes a previous sidecar of this replica left running", "error", err)
		return
	}
	var killed []*os.Process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		dir := "/proc/" + e.Name()
		fi, err := os.Stat(dir)
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != uid {
			continue
		}
		p, err := os.FindProcess(pid) // a pidfd (Linux 5.3+): the signal reaches this process or none
		if err != nil {
			continue
		}
		if !hasEnv(pid, marker) || ownedByLiveSidecar(pid, marker, selfExe) {
			p.Release()
			continue
		}
		cmdline, _ := os.ReadFile(dir + "/cmdline")
		if err := p.Signal(syscall.SIGKILL); err != nil {
			p.Release() // gone meanwhile
			continue
		}
		log.Warn("killed a process that a killed sidecar of this replica left running", "pid", pid,
			"command", strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))), "signal", "SIGKILL")
		killed = append(killed, p)
	}
	deadline := time.Now().Add(wait)
	for _, p := range killed {
		for !processGone(p) {
			if time.Now().After(deadline) {
				log.Error("a process killed as left running by a killed sidecar of this replica has not exited (uninterruptible?); it runs no more code, going on", "pid", p.Pid, "waited_ms", wait.Milliseconds())
				break
			}
			time.Sleep(groupPollInterval)
		}
		p.Release()
	}
}

// hasEnv reports whether process pid's environment holds the entry kv
// exactly.
func hasEnv(pid int, kv []byte) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	return err == nil && slices.ContainsFunc(bytes.Split(env, []byte{0}), func(e []byte) bool { return bytes.Equal(e, kv) })
}

// ownedByLiveSidecar reports whether the marked process pid still belongs
// to a live sidecar: its nearest ancestor without the marker runs this
// sidecar's own executable. An orphan's line of marked ancestors ends at
// init or a subreaper instead, which it was handed to when its sidecar
// died. (The journal lock rules out a live sidecar of the replica that
// keeps its journal where this one does; this rules out one given the same
// replica ID with another state directory or database, a
// misconfiguration whose children must not be killed.)
func ownedByLiveSidecar(pid int, marker []byte, selfExe os.FileInfo) bool {
	for range 64 { // a deeper line of marked processes is not followed
		ppid := parentPID(pid)
		if ppid <= 1 {
			return false
		}
		if hasEnv(ppid, marker) {
			pid = ppid
			continue
		}
		exe, err := os.Stat("/proc/" + strconv.Itoa(ppid) + "/exe")
		return err == nil && selfExe != nil && os.SameFile(exe, selfExe)
	}
	return true // not judged: kill nothing
}

// processGone reports whether p exited: it is gone, or a zombie waiting
// for its parent (which, reparented, is init or a subreaper).
func processGone(p *os.Process) bool {
	if errors.Is(p.Signal(syscall.Signal(0)), os.ErrProcessDone) {
		return true
	}
	return !running(p.Pid)
}
