package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/hostrun"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// Settings of the development fleet.
const (
	DefaultDevStateDir  = ".aipfleet"
	DefaultDevPortBase  = 8080
	DefaultDevReplicas  = 3
	DevTenant           = "tenant-dev"
	devTrustDomain      = "aipfleet-dev"
	devIssuer           = "aipfleet-dev"
	devTokenTTL         = 24 * time.Hour
	devLeaseTTL         = 15 * time.Second
	devHeartbeat        = 3 * time.Second
	devDrainTimeout     = 5 * time.Second
	devReplicaCapacity  = 32
	maxDevReplicas      = 16
	devStateFormat      = "aipfleet.dev/v1"
	controlPortOffset   = 10
	firstReplicaOffset  = 11
	devStopGrace        = 30 * time.Second
	devReadyPollEvery   = 50 * time.Millisecond
	devSecretProviderOf = "secret://aipfleet-dev/"
)

func devCommand() *command {
	return &command{
		name:      "dev",
		summary:   "run a whole fleet on this machine: registry, control plane, dispatcher, N replicas",
		usage:     "[--replicas N] [--port-base P] [--state-dir DIR] [--connector NAME] [--fleet-file FILE] [flags]",
		envPrefix: "AIP_DEV_",
		long: `Starts an embedded fleet in one command, with no database and no setup: an
in-memory registry, the control plane, the dispatcher, and --replicas
replicas of a built-in connector, each a child process (aipfleet host)
with its own SQLite journal. Everything listens on 127.0.0.1 only:

  dispatcher      --port-base           (8080)   POST /aip/v1/actions
  control plane   --port-base + 10      (8090)   fleet status, lifecycle
  replica N       --port-base + 10 + N  (8091, 8092, ...)

State lives in --state-dir and survives a restart: the signing keys
(keys/, created on first run with mode 0600), dev.json (the fleet's IDs
and its port base, where aipfleet action, events and fleet find it),
fleet.yaml (the fleet file dev applies at every start), registry.json (the
registry, written atomically: every route is on disk before its action is
sent), each replica's journal (replica-N/) and pid (replica-N.pid), and
dev-token, a bearer token for tenant tenant-dev that aipfleet action uses
by default. A running dev holds dev.lock: a second dev on the same
directory (even with --reset) stops before it changes anything.

Your own connector: aipfleet dev --fleet-file FILE applies a fleet file of
yours (docs/fleet-file.md) after dev's own fleet, at every start, checked as
aipfleet registry apply checks it (an error names the file, the entry and
its line): its types, versions, instances, bindings and replicas join dev's
registry and catalog, and dev's dispatcher routes to them. dev does not
start those replicas: run each one's host yourself (your hostsdk program,
or aip-sidecar). The ready banner prints each one's command line, also in
host-commands.txt; host.env holds the fleet's side (control plane endpoint
and DID, dispatcher principal and DID, event endpoint) as the
AIP_CONNECTOR_HOST_* variables every host reads. The dev token is for
tenant-dev; the banner prints how to send as your file's tenants (a token
of dev's issuer key, keys/issuer.key). The registry keeps what the file
applied: the same file again changes nothing, a changed one is applied as
registry apply would (a changed version is refused: versions are
immutable), and entries removed from it stay until --reset.

A replica that exits is reported (clean drain or crash) and restarted
after a pause (after a crash, once the lease it left has expired), so you
can SIGTERM one and watch it drain, go offline and register again while
the others keep serving. Ctrl-C (or SIGTERM) stops
the dispatcher, drains every replica, then stops the control plane; the
exit status is 0 only if every replica drained cleanly.`,
		examples: []string{
			"aipfleet dev",
			"aipfleet dev --replicas 5 --port-base 9000",
			"aipfleet dev --state-dir /tmp/fleet --log-format json",
			"aipfleet dev --reset   # forget the previous state (keys, registry, journals)",
			"aipfleet dev --fleet-file notes-fleet.yaml   # and your own connector's replicas, whose hosts you run",
		},
		run: runDev,
	}
}

// devState is dev.json: the identities of a dev fleet, created on first
// run and kept, so keys, registry records and journals stay consistent.
type devState struct {
	Format         string   `json:"format"`
	Connector      string   `json:"connector"`
	PortBase       int      `json:"port_base"`
	TypeID         string   `json:"connector_type_id"`
	VersionID      string   `json:"version_id"`
	InstanceID     string   `json:"instance_id"`
	ManifestDigest string   `json:"manifest_digest"`
	ReplicaIDs     []string `json:"replica_ids"`
}

// devFleet is a dev fleet's configuration, resolved from the flags and the
// state directory.
type devFleet struct {
	dir       string
	replicas  int
	connector string
	state     devState
	manifest  aip.Manifest // bound to the trust domain, as the hosts serve it
	artifact  string
	keys      devKeys
	logLevel  string
	fresh     bool      // the state directory was created by this run
	own       *ownFleet // --fleet-file; nil without
}

type devKeys struct {
	control, dispatcher, issuer *aip.SigningKey
	replicas                    []string // seed files
	replicaDIDs                 []string
}

func (f *devFleet) path(elem ...string) string {
	return filepath.Join(append([]string{f.dir}, elem...)...)
}
func (f *devFleet) dispatchAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(f.state.PortBase))
}
func (f *devFleet) controlAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(f.state.PortBase+controlPortOffset))
}
func (f *devFleet) replicaAddr(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(f.state.PortBase+firstReplicaOffset+i))
}
func replicaName(i int) string { return "replica-" + strconv.Itoa(i+1) }

func runDev(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	replicas := fs.Int("replicas", DefaultDevReplicas, fmt.Sprintf("replicas of the connector to run (1 to %d)", maxDevReplicas))
	portBase := fs.Int("port-base", 0, "first port: dispatcher on it, control plane on +10, replicas on +11... (default 8080, or the one the state directory was created with)")
	stateDir := fs.String("state-dir", DefaultDevStateDir, "directory of the fleet's keys, registry and journals")
	connector := fs.String("connector", "echo", "the built-in connector the replicas run: "+strings.Join(connectorNames(), ", "))
	reset := fs.Bool("reset", false, "delete dev's state (keys, registry, journals) first and start from scratch; other files in --state-dir stay")
	logLevel := fs.String("log-level", "info", "log level of dev and its replicas: debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text (one readable line per event) or json")
	fleetFile := fs.String("fleet-file", "", "a fleet file of yours (docs/fleet-file.md) applied after dev's own at every start: your connector's records and replicas, whose hosts you run")
	fs.NoEnv("reset")
	if err := fs.parse(args, e.stdout); err != nil {
		return err
	}
	if len(fs.args()) > 0 {
		return usagef("dev: unexpected argument %q; every setting is a flag", fs.args()[0])
	}
	switch {
	case *replicas < 1 || *replicas > maxDevReplicas:
		return usagef("dev: --replicas %d is outside 1..%d", *replicas, maxDevReplicas)
	case fs.isSet("port-base") && (*portBase < 1024 || *portBase > 65535-firstReplicaOffset-maxDevReplicas):
		// 0 stands for "not given" below (the default, or the state
		// directory's port base), so a 0 given is refused here rather
		// than quietly taken for 8080.
		return usagef("dev: --port-base %d is outside 1024..%d", *portBase, 65535-firstReplicaOffset-maxDevReplicas)
	case *stateDir == "":
		return usagef("dev: --state-dir is empty")
	}
	if _, ok := builtinConnectors[*connector]; !ok {
		return usagef("dev: --connector %q is not a built-in connector; choose one of %s", *connector, strings.Join(connectorNames(), ", "))
	}
	if err := checkLogFormat(fs, "dev", *logFormat); err != nil {
		return err
	}
	level, err := parseLogLevel(*logLevel)
	if err != nil {
		return usagef("dev: %v", err)
	}
	var own *ownFleet
	if *fleetFile != "" {
		if own, err = loadOwnFleet(*fleetFile); err != nil {
			return err
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program to start the replicas: %w", err)
	}
	log := &devLog{w: e.stderr, json: *logFormat == "json", debug: level <= slog.LevelDebug}
	if *reset {
		if err := checkResettable(*stateDir); err != nil {
			return err
		}
	}
	unlock, err := lockStateDir(*stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	if *reset {
		if err := resetStateDir(*stateDir); err != nil {
			return err
		}
		log.event("dev", "removed the previous state", "dir", *stateDir)
	}
	f := &devFleet{dir: *stateDir, replicas: *replicas, connector: *connector, logLevel: *logLevel, own: own}
	if err := f.prepare(ctx, *portBase); err != nil {
		return err
	}
	return f.run(ctx, e, log, level, exe)
}

// devLockFile is the lock file in the state directory that a running dev
// holds (see lockStateDir); --reset keeps it.
const devLockFile = "dev.lock"

func devLockPath(dir string) string { return filepath.Join(dir, devLockFile) }

// checkResettable refuses to reset anything that does not look like a dev
// state directory.
func checkResettable(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "dev.json")); err != nil && slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() != devLockFile }) {
		return usagef("dev: --reset: %s does not look like an aipfleet dev state directory (it has no dev.json); remove it yourself if you mean it, or give --state-dir the directory of a dev fleet", dir)
	}
	return nil
}

// devStateEntry matches what dev keeps in its state directory (and the
// temporary files of writeFileAtomic), the lock file aside.
var devStateEntry = regexp.MustCompile(`^\.?(dev\.json|keys|fleet\.yaml|registry\.json|dev-token|host\.env|host-commands\.txt|replica-[0-9]+|replica-[0-9]+\.pid)(\..*\.tmp)?$`)

// resetStateDir removes dev's state from a directory this dev holds the
// lock of (checkResettable passed): only what dev keeps there, so the
// lock file, and anything else, stays. The directory is also the default
// root of a standalone host's journal (.aipfleet/host-<replica ID>),
// which is not dev's to delete.
func resetStateDir(dir string) error {
	if err := checkResettable(dir); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !devStateEntry.MatchString(e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// prepare creates or loads the state directory: identities, keys, the
// bound manifest, the fleet file. A state directory that does not fit the
// flags (another connector, another --port-base, a dev.json of another
// build, a connector whose manifest changed) is a setting to fix, which
// starting dev again cannot: a usage error (exit status 2) starting with
// "dev:" and saying which flag to give or to pass --reset. They exited 1
// without the command.
func (f *devFleet) prepare(ctx context.Context, portBase int) error {
	if err := os.MkdirAll(f.path("keys"), 0o700); err != nil {
		return stateDirError(f.dir, err)
	}
	if err := os.Chmod(f.dir, 0o700); err != nil {
		return err
	}
	st, fresh, err := loadDevState(f.path("dev.json"))
	if err != nil {
		return err
	}
	switch {
	case fresh:
		st = devState{Format: devStateFormat, Connector: f.connector, PortBase: cmp.Or(portBase, DefaultDevPortBase),
			TypeID: aip.NewID(aip.PrefixType), VersionID: aip.NewID(aip.PrefixVersion), InstanceID: aip.NewID(aip.PrefixInstance)}
	case st.Connector != f.connector:
		return usagef("dev: %s was created for connector %s, not %s; run with --connector %s, use another --state-dir, or pass --reset to start from scratch", f.dir, st.Connector, f.connector, st.Connector)
	case portBase != 0 && portBase != st.PortBase && !f.ranBefore():
		// No fleet ever ran on this state (the first start failed, e.g. on
		// a taken port): no replica endpoint is registered yet.
		st.PortBase = portBase
	case portBase != 0 && portBase != st.PortBase:
		return usagef("dev: %s was created with --port-base %d and its replicas' endpoints are part of their registered identity; run with --port-base %d, use another --state-dir, or pass --reset", f.dir, st.PortBase, st.PortBase)
	}
	// The manifest the hosts serve, bound as hostsdk binds it: the agent in
	// the fleet's trust domain, without a DID (each replica has its own).
	conn := builtinConnectors[f.connector]()
	m, err := conn.Manifest(ctx, hostsdk.TenantContext{TenantID: DevTenant, ConnectorTypeID: st.TypeID, VersionID: st.VersionID,
		InstanceID: st.InstanceID, ConfigRevision: 1, SecretProviderRef: devSecretProviderOf + f.connector, TrustDomain: devTrustDomain})
	if err != nil {
		return fmt.Errorf("the %s connector's manifest: %w", f.connector, err)
	}
	bound, digest, err := hostsdk.BindManifest(m, devTrustDomain)
	if err != nil {
		return fmt.Errorf("the %s connector's manifest: %w", f.connector, err)
	}
	f.manifest = *bound
	if !fresh && st.ManifestDigest != digest {
		return usagef("dev: the %s connector's manifest changed since %s was created (its admitted version is immutable); pass --reset to start from scratch with the new manifest, or use another --state-dir", f.connector, f.dir)
	}
	st.ManifestDigest = digest
	for len(st.ReplicaIDs) < f.replicas {
		st.ReplicaIDs = append(st.ReplicaIDs, aip.NewID(aip.PrefixReplica))
	}
	if err := writeFileAtomic(f.path("dev.json"), 0o600, writeBytes(mustJSON(st))); err != nil {
		return err
	}
	f.state, f.fresh = st, fresh
	f.artifact = aip.DigestBytes([]byte("aipfleet dev artifact " + f.connector + " " + digest))

	if f.keys.control, err = loadOrCreateKey(f.dir, f.path("keys", "control-plane.key")); err != nil {
		return err
	}
	if f.keys.dispatcher, err = loadOrCreateKey(f.dir, f.path("keys", "dispatcher.key")); err != nil {
		return err
	}
	if f.keys.issuer, err = loadOrCreateKey(f.dir, f.path("keys", "issuer.key")); err != nil {
		return err
	}
	for i := range st.ReplicaIDs {
		file := f.path("keys", replicaName(i)+".key")
		k, err := loadOrCreateKey(f.dir, file)
		if err != nil {
			return err
		}
		f.keys.replicas = append(f.keys.replicas, file)
		f.keys.replicaDIDs = append(f.keys.replicaDIDs, k.DID())
	}
	return nil
}

// ranBefore reports whether a fleet ran on the state directory: its
// registry, which holds the replicas' registered endpoints, was written.
func (f *devFleet) ranBefore() bool {
	_, err := os.Lstat(f.path("registry.json"))
	return !errors.Is(err, os.ErrNotExist)
}

func loadDevState(path string) (devState, bool, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return devState{}, true, nil
	}
	if err != nil {
		return devState{}, false, err
	}
	var st devState
	if err := json.Unmarshal(raw, &st); err != nil || st.Format != devStateFormat {
		return devState{}, false, usagef("dev: %s is not a dev state file of this build (%v); pass --reset to start from scratch, or use another --state-dir", path, err)
	}
	return st, false, nil
}

// loadOrCreateKey loads a key file of the state directory stateDir,
// creating it (mode 0600) on first use. Only a key that does not exist is
// created: one that aip refuses — also a missing one, when a directory on
// its path is another user's or writable by others (aip checks the path
// before it looks for the file) — is an error, since the replicas dev
// starts would refuse it too: a setting to fix (flagFileError of
// --state-dir), the directory or the file in it, which the error says how.
// A key file that cannot be read for another reason (an I/O error) is a
// failure at run time. The errors start with "dev: --state-dir DIR:";
// aip's error that follows names the file. They said "key file FILE:
// signing key file FILE: ...", without the command or what to do about
// a key that is not one.
func loadOrCreateKey(stateDir, path string) (*aip.SigningKey, error) {
	k, err := aip.LoadSigningKey(path)
	if err == nil {
		return k, nil
	}
	const flag = "--state-dir"
	switch {
	case errors.Is(err, aip.ErrUnsafeFile):
		return nil, flagFileError("dev", flag+" "+stateDir, fmt.Errorf("%w (when that directory is not yours to change, run aipfleet dev as the user who owns it, or pass --state-dir with a directory of this user's that others cannot write to, nor the directories above it)", err))
	case errors.Is(err, aip.ErrInvalidKey), errors.Is(err, aip.ErrEmptyFile):
		return nil, flagFileError("dev", flag+" "+stateDir, fmt.Errorf("%w: it is not the key aipfleet dev wrote there; put that key back, or pass --reset to start from scratch with new keys (the fleet gets new identities)", err))
	case errors.Is(err, os.ErrPermission):
		return nil, flagFileError("dev", flag+" "+stateDir, fmt.Errorf("%w: make it readable by this user (chmod 600 it), or run aipfleet dev as the user who owns it", err))
	}
	if _, statErr := os.Lstat(path); !errors.Is(err, os.ErrNotExist) || !errors.Is(statErr, os.ErrNotExist) {
		if errors.Is(err, os.ErrNotExist) {
			// A dangling symlink, or a file gone since it was found.
			return nil, flagFileError("dev", flag+" "+stateDir, fmt.Errorf("%w: remove %s, or pass --reset to start from scratch", err, path))
		}
		return nil, fmt.Errorf("dev: --state-dir %s: %w", stateDir, err)
	}
	if k, err = aip.GenerateSigningKey(); err != nil {
		return nil, err
	}
	if err := aip.WriteSeedFile(path, k); err != nil {
		return nil, err
	}
	return k, nil
}

func mustJSON(v any) []byte {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic("aipfleet: " + err.Error())
	}
	return append(raw, '\n')
}

// writeFileAtomic replaces path with what write writes: a temporary file in
// the same directory, fsync, rename, fsync of the directory, so a crash
// leaves either the old file or the new one, and a completed call survives
// a crash.
func writeFileAtomic(path string, perm os.FileMode, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	w := bufio.NewWriterSize(tmp, 256<<10)
	err = write(w)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// writeBytes returns a writeFileAtomic writer for data.
func writeBytes(data []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
}

// listen binds one of dev's ports, with an error that says what to do when
// it is taken.
func (f *devFleet) listen(ctx context.Context, what, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		_, port, _ := net.SplitHostPort(addr)
		if errors.Is(err, syscall.EADDRINUSE) {
			hint := "pass --port-base to use other ports, e.g. --port-base 9000"
			if f.ranBefore() {
				hint = fmt.Sprintf("%s was created with --port-base %d, so pass --reset with another --port-base, or use another --state-dir", f.dir, f.state.PortBase)
			}
			return nil, fmt.Errorf("port %s (%s) is in use, perhaps by another aipfleet dev: stop it, or %s", port, what, hint)
		}
		return nil, fmt.Errorf("listen on %s for the %s: %w", addr, what, err)
	}
	return ln, nil
}

// run brings the fleet up, waits for Ctrl-C or SIGTERM, and shuts down.
func (f *devFleet) run(ctx context.Context, e *env, log *devLog, level slog.Level, exe string) error {
	// Bind every port first, so a taken one fails before anything starts.
	dispLn, err := f.listen(ctx, "dispatcher", f.dispatchAddr())
	if err != nil {
		return err
	}
	defer dispLn.Close()
	cpLn, err := f.listen(ctx, "control plane", f.controlAddr())
	if err != nil {
		return err
	}
	defer cpLn.Close()
	for i := range f.replicas {
		ln, err := f.listen(ctx, replicaName(i), f.replicaAddr(i))
		if err != nil {
			return err
		}
		ln.Close() // the replica binds it
	}

	// The registry: restored from its snapshot, then the fleet file applied.
	devSlog := slogFor(log, "dev", level)
	mem, err := memregistry.New(memregistry.Config{Logger: devSlog}) // Restore's warnings
	if err != nil {
		return err
	}
	store := newSnapshotStore(mem, f.path("registry.json"), devSlog)
	restored, err := store.load()
	if err != nil {
		return err
	}
	reg := newDevRegistry(mem, store)
	fleet, err := f.fleet()
	if err != nil {
		return err
	}
	if f.own != nil {
		if err := f.checkOwnFleet(f.own); err != nil {
			return err
		}
	}
	fleetYAML, err := f.fleetFile(fleet)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(f.path("fleet.yaml"), 0o644, writeBytes(fleetYAML)); err != nil {
		return err
	}
	rep, err := registry.Apply(ctx, reg, fleet)
	if err != nil {
		return fmt.Errorf("apply %s: %w (pass --reset to start from scratch)", f.path("fleet.yaml"), err)
	}
	routes := "a new registry"
	if restored {
		routes = "the registry restored from registry.json"
	}
	log.event("dev", "fleet file applied to "+routes, "file", f.path("fleet.yaml"), "created", rep.Count(registry.Created),
		"updated", rep.Count(registry.Updated), "unchanged", rep.Count(registry.Unchanged))
	var ownReps []ownReplica
	if f.own != nil {
		rep, err := applyOwnFleet(ctx, reg, f.own)
		if err != nil {
			// Nothing of this run is written: registry.json keeps the
			// registry of the last run that started.
			return err
		}
		log.event("dev", "your fleet file applied", "file", f.own.name, "created", rep.Count(registry.Created),
			"updated", rep.Count(registry.Updated), "unchanged", rep.Count(registry.Unchanged))
		if ownReps, err = f.ownReplicas(ctx, reg, f.own); err != nil {
			return err
		}
	}
	if err := f.writeHostFiles(ownReps); err != nil {
		return err
	}
	storeCtx, stopStore := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStore()
	storeTask := goTask(func() error { return store.run(storeCtx) })
	if err := store.sync(ctx); err != nil {
		stopStore()
		<-storeTask.done
		return fmt.Errorf("write %s: %w", store.path, err)
	}

	// The control plane and the dispatcher, in process.
	// The dev issuer's key signs the dev tenant's tokens and, for aipfleet
	// fleet status, operator tokens.
	devIssuers := []tenanttoken.Issuer{{Name: devIssuer, DIDs: []string{f.keys.issuer.DID()}}}
	operators, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: devIssuers, Operator: true})
	if err != nil {
		return err
	}
	svc, err := controlplane.New(f.keys.control, reg, controlplane.Config{LeaseTTL: devLeaseTTL, Logger: slogFor(log, "control", level),
		OperatorAuth: operatorAuth(operators)})
	if err != nil {
		return err
	}
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: devIssuers})
	if err != nil {
		return err
	}
	disp, err := dispatch.New(dispatch.Config{SigningKey: f.keys.dispatcher, PrincipalID: DefaultGatewayPrincipal, Listener: dispLn,
		Logger: slogFor(log, "dispatch", level)},
		dispatch.Deps{Resolver: reg, Catalog: reg, Rerouter: reg, Tokens: verifier, Ready: dispatch.ReadinessProbe(reg), Reservations: reg,
			Events: reg, Records: reg})
	if err != nil {
		return err
	}
	cpCtx, stopCP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCP()
	cpTask := goTask(func() error { return svc.Serve(cpCtx, cpLn, controlplane.ServeConfig{}) })
	dispCtx, stopDisp := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDisp()
	dispTask := goTask(func() error { return disp.Run(dispCtx) })

	token, expiry, err := f.writeToken()
	if err != nil {
		return err
	}

	// The replicas, each a child process. A replica still registered with
	// a live lease was left by a dev that did not stop cleanly (its process
	// is gone): the control plane refuses to register it again until the
	// lease expires, so it starts only once lease maintenance has taken it
	// offline.
	repCtx, stopReplicas := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReplicas()
	procs := make([]*replicaProcess, f.replicas)
	repDone := make(chan error, f.replicas)
	startRevisions := make([]uint64, f.replicas)
	for i := range f.replicas {
		procs[i] = &replicaProcess{name: replicaName(i), exe: exe, args: f.hostArgs(i), env: childEnv(),
			pidFile: f.path(replicaName(i) + ".pid"), log: log, stopGrace: devStopGrace}
		rec, err := reg.ConnectorReplica(ctx, f.state.ReplicaIDs[i])
		if err != nil {
			return err
		}
		startRevisions[i] = rec.HealthRevision
		procs[i].before = func(ctx context.Context, first bool) error {
			rec, err := reg.ConnectorReplica(ctx, f.state.ReplicaIDs[i])
			if err != nil || rec.Status == aip.ReplicaOffline || !rec.LeaseValid(time.Now()) {
				return nil
			}
			why := "is still registered from a run that did not stop cleanly"
			if !first {
				why = "is still registered with the lease of the process that failed"
			}
			log.event("dev", fmt.Sprintf("%s %s; it starts once its lease expires at %s",
				replicaName(i), why, rec.LeaseExpiresAt.Local().Format("15:04:05")))
			return waitOffline(ctx, reg, rec.ID)
		}
		go func(p *replicaProcess) {
			err := p.run(repCtx)
			if err != nil {
				err = fmt.Errorf("%s: %w", p.name, err)
			}
			repDone <- err
		}(procs[i])
	}

	var fatal error
	ready := f.awaitReady(ctx, reg, startRevisions)
	for waiting := true; waiting; {
		select {
		case <-ready:
			f.banner(e.stdout, procs, token, expiry)
			if f.own != nil {
				f.ownBanner(e.stdout, f.own, ownReps)
				fmt.Fprintln(e.stdout)
			}
			ready = nil
		case <-cpTask.done:
			fatal, waiting = fmt.Errorf("the control plane stopped: %v", cpTask.err), false
		case <-dispTask.done:
			fatal, waiting = fmt.Errorf("the dispatcher stopped: %v", dispTask.err), false
		case <-ctx.Done():
			waiting = false
		}
	}

	// Shutdown, in this order (Ctrl-C, SIGTERM, or a server that failed):
	//  1. the dispatcher stops taking actions; those in flight finish on
	//     their replicas and settle;
	//  2. every replica gets SIGTERM and drains (signed drain, in-flight
	//     actions finish, signed offline); dev waits for each exit and
	//     reports it, killing one that outlasts devStopGrace;
	//  3. the control plane stops: it served the replicas' drain and
	//     offline, so it goes after them;
	//  4. the registry's last snapshot is written.
	// The exit status is 0 only when every step was clean.
	log.event("dev", "stopping: the dispatcher first, then every replica drains, then the control plane")
	var errs []error
	if fatal != nil {
		errs = append(errs, fatal)
	}
	stopDisp()
	if err := dispTask.wait("the dispatcher"); err != nil {
		errs = append(errs, err)
	}
	stopReplicas()
	for range procs {
		if err := <-repDone; err != nil {
			errs = append(errs, err)
		}
	}
	if n, err := offlineCount(reg, f.state.ReplicaIDs); err == nil {
		if total := len(f.state.ReplicaIDs); n == total {
			log.event("dev", fmt.Sprintf("%s offline", countIs(n, "replica")))
		} else {
			// A replica that was still waiting for the lease of a process
			// that failed never ran, so it could not drain: its record
			// stays registered until that lease expires.
			verb := "are"
			if n == 1 {
				verb = "is"
			}
			log.event("dev", fmt.Sprintf("%d of %s %s offline", n, plural(total, "replica"), verb))
			errs = append(errs, fmt.Errorf("%d of %s did not go offline: still registered until the lease expires", total-n, plural(total, "replica")))
		}
	}
	stopCP()
	if err := cpTask.wait("the control plane"); err != nil {
		errs = append(errs, err)
	}
	stopStore()
	if err := storeTask.wait("the registry's last snapshot"); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("dev stopped, not cleanly: %w", errors.Join(errs...))
	}
	log.event("dev", "stopped cleanly: every replica drained and went offline; the state is kept in "+f.dir)
	return nil
}

// task is a goroutine running one of dev's components.
type task struct {
	done chan struct{}
	err  error // set before done closes
}

func goTask(fn func() error) *task {
	t := &task{done: make(chan struct{})}
	go func() {
		defer close(t.done)
		t.err = fn()
	}()
	return t
}

// wait waits for the component to return after its context was
// cancelled.
func (t *task) wait(what string) error {
	select {
	case <-t.done:
		if t.err != nil {
			return fmt.Errorf("%s: %w", what, t.err)
		}
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("%s did not stop within a minute", what)
	}
}

// offlineCount counts the replicas of ids (dev's own; the hosts of a
// --fleet-file's replicas are not dev's) the registry has offline.
func offlineCount(reg *devRegistry, ids []string) (int, error) {
	n := 0
	for _, id := range ids {
		r, err := reg.ConnectorReplica(context.Background(), id)
		if err != nil {
			return 0, err
		}
		if r.Status == aip.ReplicaOffline {
			n++
		}
	}
	return n, nil
}

// waitOffline waits until the registry has the replica offline.
func waitOffline(ctx context.Context, reg *devRegistry, id string) error {
	t := time.NewTicker(devReadyPollEvery)
	defer t.Stop()
	for {
		r, err := reg.ConnectorReplica(ctx, id)
		if err == nil && r.Status == aip.ReplicaOffline {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// awaitReady closes its channel once every replica this run starts has
// registered in this run (its health revision moved past startRevisions)
// and is ready with a valid lease.
func (f *devFleet) awaitReady(ctx context.Context, reg *devRegistry, startRevisions []uint64) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		t := time.NewTicker(devReadyPollEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ready := 0
			for i, id := range f.state.ReplicaIDs[:f.replicas] {
				r, err := reg.ConnectorReplica(ctx, id)
				if err == nil && r.Status == aip.ReplicaReady && r.LeaseValid(time.Now()) && r.HealthRevision > startRevisions[i] {
					ready++
				}
			}
			if ready == f.replicas {
				close(out)
				return
			}
		}
	}()
	return out
}

// writeToken mints a token for the dev tenant and writes it to dev-token.
func (f *devFleet) writeToken() (string, time.Time, error) {
	now := time.Now()
	exp := now.Add(devTokenTTL)
	tok, err := tenanttoken.Mint(f.keys.issuer, tenanttoken.Claims{Issuer: devIssuer, Audience: tenanttoken.DefaultAudience,
		TenantID: DevTenant, Subject: "aipfleet-dev", IssuedAt: now, Expiry: exp})
	if err != nil {
		return "", time.Time{}, err
	}
	if err := writeFileAtomic(f.path(devTokenFile), 0o600, writeBytes([]byte(tok+"\n"))); err != nil {
		return "", time.Time{}, err
	}
	return tok, exp, nil
}

// devTokenFile is the dev token's file name in the state directory; the
// action command reads it by default.
const devTokenFile = "dev-token"

// hostArgs is replica i's command line: aipfleet host with the common
// host flags.
func (f *devFleet) hostArgs(i int) []string {
	addr := f.replicaAddr(i)
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	return []string{"host",
		"--connector", f.connector,
		"--bind", addr,
		"--allow-insecure-loopback-http",
		"--public-endpoint", "http://" + addr + aip.MessagesPath,
		"--control-plane-endpoint", "http://" + f.controlAddr() + aip.ControlPath,
		"--control-plane-did", f.keys.control.DID(),
		"--event-endpoint", "http://" + f.dispatchAddr() + aip.EventsPath,
		"--signing-seed-file", f.keys.replicas[i],
		"--connector-type-id", f.state.TypeID,
		"--version-id", f.state.VersionID,
		"--instance-id", f.state.InstanceID,
		"--replica-id", f.state.ReplicaIDs[i],
		"--tenant-id", DevTenant,
		"--gateway-principal-id", DefaultGatewayPrincipal,
		"--gateway-did", f.keys.dispatcher.DID(),
		"--trust-domain", devTrustDomain,
		"--artifact-digest", f.artifact,
		"--secret-provider-ref", devSecretProviderOf + f.connector,
		"--max-in-flight", strconv.Itoa(devReplicaCapacity),
		"--lease-ttl-ms", ms(devLeaseTTL),
		"--heartbeat-interval-ms", ms(devHeartbeat),
		"--drain-timeout-ms", ms(devDrainTimeout),
		"--state-dir", f.path(replicaName(i)),
		"--log-level", f.logLevel,
		// dev reads its replicas' JSON lines into its own stream.
		"--log-format", hostrun.LogJSON,
	}
}

// cliName is how the banner spells this program: go run from a checkout,
// aipfleet elsewhere.
func cliName() string {
	if fi, err := os.Stat(filepath.Join("cmd", "aipfleet")); err == nil && fi.IsDir() {
		return "go run ./cmd/aipfleet"
	}
	return "aipfleet"
}

// banner prints where everything listens and what to try.
func (f *devFleet) banner(w io.Writer, procs []*replicaProcess, token string, expiry time.Time) {
	cli := cliName()
	fmt.Fprintf(w, "\naipfleet dev is ready: %s serving tenant %s\n\n", plural(f.replicas, f.connector+" replica"), DevTenant)
	fmt.Fprintf(w, "  dispatcher     http://%s   POST /aip/v1/actions\n", f.dispatchAddr())
	fmt.Fprintf(w, "  control plane  http://%s   GET /aip/v1/fleet/replicas (operator token: aipfleet fleet status)\n", f.controlAddr())
	for i, p := range procs {
		fmt.Fprintf(w, "  %-13s  http://%s   %s  pid %d (%s)\n", p.name, f.replicaAddr(i), f.state.ReplicaIDs[i], p.pid(), p.pidFile)
	}
	fmt.Fprintf(w, "  state          %s   keys, fleet.yaml, registry.json, journals\n", f.dir)
	fmt.Fprintf(w, "\nDev token for tenant %s (valid until %s, also in %s):\n  %s\n",
		DevTenant, expiry.Local().Format("2006-01-02 15:04"), f.path(devTokenFile), token)
	// The commands find the dispatcher and the control plane at the ports
	// recorded in the state directory, on any --port-base.
	var clientFlags, fleetFlags string
	if filepath.Clean(f.dir) != DefaultDevStateDir {
		clientFlags += " --dev-state-dir " + shellQuote(f.dir)
		fleetFlags += " --dev-state-dir " + shellQuote(f.dir)
	}
	fmt.Fprintf(w, "\nTry, in another terminal:\n")
	fmt.Fprintf(w, "  %s capability list%s   # what the tenant can call\n", cli, clientFlags)
	fmt.Fprintf(w, "  %s action send%s --capability echo.say --input '{\"message\":\"hello\"}'\n", cli, clientFlags)
	fmt.Fprintf(w, "  %s fleet status%s --watch\n", cli, fleetFlags)
	fmt.Fprintf(w, "  %s events list%s --follow   # provider events of connectors that declare channels\n", cli, clientFlags)
	victim := replicaName(min(1, f.replicas-1))
	fmt.Fprintf(w, "  kill -TERM \"$(cat %s)\"   # %s drains, goes offline, comes back\n", shellQuote(f.path(victim+".pid")), victim)
	fmt.Fprintf(w, "\nCtrl-C drains every replica and stops the fleet.\n\n")
}

// shellQuote quotes s for a POSIX shell when it holds anything but
// letters, digits and _ . / - (a state directory with a space in its
// path), so the commands the banner prints run as printed.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_./-", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// slogFor returns a logger writing source's lines to the dev log.
func slogFor(l *devLog, source string, level slog.Level) *slog.Logger {
	return slog.New(l.handler(source, level))
}
