package registrytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// LeaseTTL is the lease the lifecycle suite asks for.
const LeaseTTL = 30 * time.Second

func runLifecycle(t *testing.T, nb NewBackend) {
	t.Run("HappyPath", func(t *testing.T) { testLifecycleHappyPath(t, nb) })
	t.Run("NotProvisioned", func(t *testing.T) { testLifecycleNotProvisioned(t, nb) })
	t.Run("Malformed", func(t *testing.T) { testLifecycleMalformed(t, nb) })
	t.Run("Replay", func(t *testing.T) { testLifecycleReplay(t, nb) })
	t.Run("RejectionBurnsID", func(t *testing.T) { testLifecycleRejectionBurns(t, nb) })
	t.Run("FailedCallCommitsNothing", func(t *testing.T) { testLifecycleFailedCall(t, nb) })
	t.Run("RegistrationRules", func(t *testing.T) { testLifecycleRegistrationRules(t, nb) })
	t.Run("Reregistration", func(t *testing.T) { testLifecycleReregistration(t, nb) })
	t.Run("HeartbeatRules", func(t *testing.T) { testLifecycleHeartbeatRules(t, nb) })
	t.Run("UnhealthyHeartbeat", func(t *testing.T) { testLifecycleUnhealthy(t, nb) })
	t.Run("DrainAndOffline", func(t *testing.T) { testLifecycleDrainOffline(t, nb) })
	t.Run("LeaseExpiry", func(t *testing.T) { testLifecycleLeaseExpiry(t, nb) })
	t.Run("OfflineReason", func(t *testing.T) { testLifecycleOfflineReason(t, nb) })
	t.Run("Batch", func(t *testing.T) { testLifecycleBatch(t, nb) })
	t.Run("BatchRegistersSeveralVersions", func(t *testing.T) { testLifecycleBatchVersions(t, nb) })
	t.Run("ConcurrentHeartbeats", func(t *testing.T) { testLifecycleConcurrent(t, nb) })
	t.Run("ClaimsExpire", func(t *testing.T) { testLifecycleClaimsExpire(t, nb) })
	t.Run("ListReplicas", func(t *testing.T) { testLifecycleList(t, nb) })
	t.Run("Readiness", func(t *testing.T) { testLifecycleReadiness(t, nb) })
}

// LifecycleWorld is a minimal fleet for lifecycle tests: an enabled type,
// an active version offering two capabilities, an enabled instance of
// tenant-1 with a binding of alpha.read, and helpers to pre-provision
// replicas and build their registrations. Replica keys are Key(replicaID).
type LifecycleWorld struct {
	Type     registry.ConnectorType
	Version  registry.ConnectorVersion
	Instance registry.ConnectorInstance
	Binding  registry.CapabilityBinding
}

// NewLifecycleWorld creates the world's records through admin.
func NewLifecycleWorld(ctx context.Context, admin registry.Administrator) (*LifecycleWorld, error) {
	w := &LifecycleWorld{Type: registry.ConnectorType{ID: "ctype_alpha", Name: "alpha", Owner: "owner-alpha", Enabled: true}}
	caps := []aip.Capability{Capability("alpha.read", "reads alpha"), Capability("alpha.write", "writes alpha")}
	w.Version = Version("cver_alpha1", w.Type.ID, "1.0.0", w.Type.Owner, registry.VersionActive, Manifest("service:alpha", caps))
	w.Instance = registry.ConnectorInstance{
		ID: "cinst_a", ConnectorTypeID: w.Type.ID, VersionID: w.Version.ID, TenantID: "tenant-1",
		ConfigRevision: 3, SecretProviderRef: "secret://alpha/a", Status: registry.InstanceEnabled,
	}
	w.Binding = registry.CapabilityBinding{
		TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: w.Instance.ID, Priority: 0, PolicyRevision: 1, Enabled: true,
	}
	for _, step := range []func() error{
		func() error { return admin.PutConnectorType(ctx, w.Type) },
		func() error { return admin.AdmitVersion(ctx, w.Version) },
		func() error { return admin.PutInstance(ctx, w.Instance) },
		func() error { return admin.PutBinding(ctx, w.Binding) },
	} {
		if err := step(); err != nil {
			return nil, fmt.Errorf("lifecycle world: %w", err)
		}
	}
	return w, nil
}

// ProvisionedReplica returns replica id of the world's instance as an
// operator pre-provisions it: offline, lease ended at leaseEnded, health
// revision 0, capacity 4, the manifest agent as peer principal and
// DID(id) as its DID.
func (w *LifecycleWorld) ProvisionedReplica(id string, leaseEnded time.Time) registry.ConnectorReplica {
	r := Replica(id, w.Instance.ID, w.Version.ID, leaseEnded)
	r.Status = aip.ReplicaOffline
	r.HealthRevision = 0
	r.PeerPrincipalID, r.PeerPrincipalKind = w.Version.Manifest.Agent.ID, w.Version.Manifest.Agent.Kind
	return r
}

// Registration returns the registration a healthy host of rep sends.
func (w *LifecycleWorld) Registration(rep *registry.ConnectorReplica) aip.Registration {
	p := rep.Wire()
	p.Status, p.ActiveAssignments, p.HealthRevision = aip.ReplicaReady, 0, 0
	p.LastControlRequestID, p.LastControlRequestDigest = "", ""
	return aip.Registration{
		Replica: p, ManifestDigest: w.Version.ManifestDigest, ArtifactDigest: w.Version.Attestation.ArtifactDigest,
		TenantID: w.Instance.TenantID, ConfigRevision: w.Instance.ConfigRevision, SecretProviderRef: w.Instance.SecretProviderRef,
		CapabilityCount: uint32(len(w.Version.Manifest.Capabilities)),
	}
}

// LifecycleCommand builds the command for a request with a fresh ID issued
// at now, as the service does after verifying it.
func LifecycleCommand(now time.Time, cmd aip.ControlCommand) registry.LifecycleCommand {
	req := aip.NewControlRequest(now, "", cmd)
	digest, err := aip.ControlRequestDigest(req)
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	return registry.LifecycleCommand{RequestID: req.RequestID, Digest: digest, ExpiresAt: req.ExpiresAt.Time, Command: cmd, LeaseTTL: LeaseTTL}
}

// lfx is a lifecycle test's fixture.
type lfx struct {
	*fx
	lc registry.Lifecycle
	w  *LifecycleWorld
}

func newLfx(t *testing.T, nb NewBackend) *lfx {
	t.Helper()
	f := newFx(t, nb)
	if f.b.Lifecycle == nil {
		t.Fatal("Backend.Lifecycle is nil: the backend must implement registry.Lifecycle")
	}
	w, err := NewLifecycleWorld(f.ctx, f.b.Admin)
	f.must(err)
	return &lfx{fx: f, lc: f.b.Lifecycle, w: w}
}

// with returns the fixture bound to a subtest: same backend and world,
// failures reported to t.
func (f *lfx) with(t *testing.T) *lfx {
	inner := *f.fx
	inner.t = t
	return &lfx{fx: &inner, lc: f.lc, w: f.w}
}

// provision pre-provisions an offline replica crepl_<name>.
func (f *lfx) provision(name string, mods ...func(*registry.ConnectorReplica)) registry.ConnectorReplica {
	f.t.Helper()
	r := f.w.ProvisionedReplica("crepl_"+name, f.clock.Now())
	for _, m := range mods {
		m(&r)
	}
	f.must(f.b.Admin.PutReplica(f.ctx, r))
	return f.getReplica(r.ID)
}

func (f *lfx) cmd(c aip.ControlCommand) registry.LifecycleCommand {
	return LifecycleCommand(f.clock.Now(), c)
}

func (f *lfx) registerCmd(rep registry.ConnectorReplica, mods ...func(*aip.Registration)) registry.LifecycleCommand {
	reg := f.w.Registration(&rep)
	for _, m := range mods {
		m(&reg)
	}
	return f.cmd(aip.RegisterCommand(reg))
}

func (f *lfx) heartbeatCmd(id string, prev uint64) registry.LifecycleCommand {
	return f.cmd(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, PreviousSequence: prev, InFlight: 1, ConnectorReady: true}))
}

func (f *lfx) transitionCmd(op aip.Operation, id string, prev uint64) registry.LifecycleCommand {
	return f.cmd(aip.TransitionCommand(op, aip.Transition{ReplicaID: id, PreviousSequence: prev}))
}

// apply applies commands in one call and fails the test on a call error.
func (f *lfx) apply(cmds ...registry.LifecycleCommand) []registry.LifecycleResult {
	f.t.Helper()
	res, err := f.lc.ApplyLifecycle(f.ctx, cmds)
	f.must(err)
	if len(res) != len(cmds) {
		f.t.Fatalf("ApplyLifecycle returned %d results for %d commands", len(res), len(cmds))
	}
	return res
}

// ok applies one command and requires success; it returns the result.
func (f *lfx) ok(c registry.LifecycleCommand) registry.LifecycleResult {
	f.t.Helper()
	r := f.apply(c)[0]
	if r.Err != nil {
		f.t.Fatalf("%s %s: %v", c.Command.Operation, c.RequestID, r.Err)
	}
	return r
}

// rejected applies one command and requires a rejection by rule matching
// sentinel.
func (f *lfx) rejected(c registry.LifecycleCommand, rule registry.LifecycleRule, sentinel error) *registry.LifecycleRejection {
	f.t.Helper()
	return wantRejection(f.t, f.apply(c)[0], rule, sentinel)
}

func wantRejection(t testing.TB, r registry.LifecycleResult, rule registry.LifecycleRule, sentinel error) *registry.LifecycleRejection {
	t.Helper()
	var rej *registry.LifecycleRejection
	if !errors.As(r.Err, &rej) {
		t.Fatalf("got result %+v (error %v), want a %s rejection", r.Outcome, r.Err, rule)
	}
	if rej.Rule != rule || !errors.Is(r.Err, sentinel) {
		t.Fatalf("got rejection %v, want rule %s matching %v", r.Err, rule, sentinel)
	}
	return rej
}

// wantLease checks a lease outcome.
func (f *lfx) wantLease(r registry.LifecycleResult, seq uint64, expires time.Time) {
	f.t.Helper()
	if r.Outcome.Status != aip.OutcomeLease || r.Outcome.Lease == nil {
		f.t.Fatalf("outcome %+v, want a lease", r.Outcome)
	}
	if got := r.Outcome.Lease; got.Sequence != seq || !got.ExpiresAt.Equal(registry.Millis(expires)) {
		f.t.Fatalf("lease %d until %s, want %d until %s", got.Sequence, got.ExpiresAt, seq, aip.At(expires))
	}
}

// wantState checks the stored replica's status, health revision and lease.
func (f *lfx) wantState(id string, status aip.ReplicaStatus, rev uint64, lease time.Time) registry.ConnectorReplica {
	f.t.Helper()
	r := f.getReplica(id)
	if r.Status != status || r.HealthRevision != rev || !r.LeaseExpiresAt.Equal(registry.Millis(lease)) {
		f.t.Fatalf("replica %s is %s at revision %d with lease %s, want %s at %d with lease %s",
			id, r.Status, r.HealthRevision, aip.At(r.LeaseExpiresAt), status, rev, aip.At(lease))
	}
	return r
}

func testLifecycleHappyPath(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	got, err := f.lc.LifecycleReplica(f.ctx, rep.ID)
	f.must(err)
	if got.PeerDID != DID(rep.ID) {
		t.Fatalf("LifecycleReplica peer DID %s, want %s", got.PeerDID, DID(rep.ID))
	}
	f.clock.Advance(time.Second)
	reg := f.registerCmd(rep, func(r *aip.Registration) { r.Replica.Capacity = 8 })
	res := f.ok(reg)
	now := f.clock.Now()
	f.wantLease(res, 1, now.Add(LeaseTTL))
	if res.Replayed {
		t.Fatal("a first registration is reported as replayed")
	}
	r := f.wantState(rep.ID, aip.ReplicaReady, 1, now.Add(LeaseTTL))
	if r.Capacity != 8 || r.LastControlRequestID != reg.RequestID || r.LastControlRequestDigest != reg.Digest {
		t.Fatalf("registered replica: capacity %d, last request %s %s", r.Capacity, r.LastControlRequestID, r.LastControlRequestDigest)
	}
	if res.Replica.HealthRevision != 1 || res.Replica.Status != aip.ReplicaReady {
		t.Fatalf("result replica %+v", res.Replica)
	}
	// The replica is routable now.
	f.resolve(request("tenant-1", "alpha.read"))

	seq := uint64(1)
	for range 3 {
		f.clock.Advance(10 * time.Second)
		res := f.ok(f.heartbeatCmd(rep.ID, seq))
		seq++
		f.wantLease(res, seq, f.clock.Now().Add(LeaseTTL))
		f.wantState(rep.ID, aip.ReplicaReady, seq, f.clock.Now().Add(LeaseTTL))
	}
	f.clock.Advance(time.Second)
	res = f.ok(f.transitionCmd(aip.OpDrain, rep.ID, seq))
	seq++
	f.wantLease(res, seq, f.clock.Now().Add(LeaseTTL))
	f.wantState(rep.ID, aip.ReplicaDraining, seq, f.clock.Now().Add(LeaseTTL))
	// Draining takes no new routes.
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantErr(err, registry.ErrReplicaUnavailable, "resolve while draining")

	f.clock.Advance(time.Second)
	off := f.transitionCmd(aip.OpOffline, rep.ID, seq)
	res = f.ok(off)
	seq++
	if res.Outcome.Status != aip.OutcomeOffline {
		t.Fatalf("offline outcome %+v", res.Outcome)
	}
	r = f.wantState(rep.ID, aip.ReplicaOffline, seq, f.clock.Now())
	if r.LastControlRequestID != off.RequestID || r.ActiveAssignments != 1 {
		t.Fatalf("offline replica: last request %s, active %d (the route's reservation is kept)", r.LastControlRequestID, r.ActiveAssignments)
	}
}

func testLifecycleNotProvisioned(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	_, err := f.lc.LifecycleReplica(f.ctx, "crepl_ghost")
	f.wantErr(err, registry.ErrNotFound, "LifecycleReplica of an unknown replica")
	ghost := f.w.ProvisionedReplica("crepl_ghost", f.clock.Now())
	f.rejected(f.registerCmd(ghost), registry.RuleNotProvisioned, registry.ErrNotFound)
	f.rejected(f.heartbeatCmd("crepl_ghost", 0), registry.RuleNotProvisioned, registry.ErrNotFound)
	if _, err := f.lc.LifecycleReplica(f.ctx, "crepl_ghost"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("a rejected registration created the replica: %v", err)
	}
}

func testLifecycleMalformed(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	_, err := f.lc.ApplyLifecycle(f.ctx, nil)
	f.wantErr(err, registry.ErrInvalid, "an empty call")
	_, err = f.lc.ApplyLifecycle(f.ctx, make([]registry.LifecycleCommand, registry.MaxLifecycleBatch+1))
	f.wantErr(err, registry.ErrInvalid, "an oversized call")
	good := f.registerCmd(rep)
	for name, mod := range map[string]func(*registry.LifecycleCommand){
		"no request ID":     func(c *registry.LifecycleCommand) { c.RequestID = "" },
		"bad digest":        func(c *registry.LifecycleCommand) { c.Digest = "sha256:nope" },
		"lease TTL too low": func(c *registry.LifecycleCommand) { c.LeaseTTL = time.Millisecond },
		"lease TTL too high": func(c *registry.LifecycleCommand) {
			c.LeaseTTL = registry.MaxLeaseTTL + time.Second
		},
		"payload mismatch": func(c *registry.LifecycleCommand) { c.Command.Operation = aip.OpHeartbeat },
		"no expiry":        func(c *registry.LifecycleCommand) { c.ExpiresAt = time.Time{} },
		// A database cannot store or look up these keys: they must be the
		// command's rejection, not a failure of the whole call.
		"request ID with NUL":  func(c *registry.LifecycleCommand) { c.RequestID = "msg_\x00a" },
		"request ID not UTF-8": func(c *registry.LifecycleCommand) { c.RequestID = "msg_\xffa" },
		"replica ID with NUL": func(c *registry.LifecycleCommand) {
			reg := *c.Command.Register
			reg.Replica.ID = rep.ID + "\x00"
			c.Command = aip.RegisterCommand(reg)
		},
		"heartbeat replica not UTF-8": func(c *registry.LifecycleCommand) { *c = f.heartbeatCmd("crepl_\xff", 1) },
	} {
		t.Run(name, func(t *testing.T) {
			c := good
			mod(&c)
			// A malformed command does not affect the command beside it.
			res := f.apply(c, f.heartbeatCmd(rep.ID, 0))
			wantRejection(t, res[0], registry.RuleMalformed, registry.ErrInvalid)
			wantRejection(t, res[1], registry.RuleState, registry.ErrConflict)
		})
	}
	// Malformed commands claim nothing: the good command still registers.
	f.ok(good)
}

func testLifecycleReplay(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	reg := f.registerCmd(rep)
	first := f.ok(reg)
	// A lost response: the identical request returns the identical lease.
	f.clock.Advance(2 * time.Second)
	again := f.ok(reg)
	if !again.Replayed || again.Outcome.Lease == nil || *again.Outcome.Lease != *first.Outcome.Lease {
		t.Fatalf("replay gave %+v (replayed %v), want lease %+v", again.Outcome.Lease, again.Replayed, *first.Outcome.Lease)
	}
	f.wantState(rep.ID, aip.ReplicaReady, 1, first.Outcome.Lease.ExpiresAt.Time)
	// The same ID with another payload is refused.
	forged := reg
	forged.Command = aip.RegisterCommand(f.w.Registration(&rep))
	forged.Command.Register.Replica.Capacity = 2
	forged.Digest = digestOf(forged.RequestID, forged.Command)
	f.rejected(forged, registry.RuleReplay, registry.ErrConflict)

	// After a heartbeat the registration is history: replaying it is refused.
	hb := f.heartbeatCmd(rep.ID, 1)
	hbRes := f.ok(hb)
	f.rejected(reg, registry.RuleReplay, registry.ErrConflict)
	// The heartbeat itself replays, offline replays as offline.
	if r := f.ok(hb); !r.Replayed || *r.Outcome.Lease != *hbRes.Outcome.Lease {
		t.Fatalf("heartbeat replay %+v", r)
	}
	off := f.transitionCmd(aip.OpOffline, rep.ID, 2)
	f.ok(off)
	if r := f.ok(off); !r.Replayed || r.Outcome.Status != aip.OutcomeOffline {
		t.Fatalf("offline replay %+v", r)
	}
	f.wantState(rep.ID, aip.ReplicaOffline, 3, f.clock.Now())

	// A replay answers the committed outcome only while the replica is
	// still in the state that request committed (the reference's rule):
	// a write that moved it on without clearing the last request (an
	// administrator's read-modify-write taking it offline) must not turn
	// the old heartbeat into a lease at the new sequence, from which the
	// host's next beat would pass the fence and undo that write.
	b := f.provision("b1")
	f.ok(f.registerCmd(b))
	bhb := f.heartbeatCmd(b.ID, 1)
	f.ok(bhb)
	moved := f.getReplica(b.ID)
	moved.Status, moved.LeaseExpiresAt, moved.HealthRevision = aip.ReplicaOffline, f.clock.Now(), moved.HealthRevision+1
	f.must(f.b.Admin.PutReplica(f.ctx, moved))
	if got := f.getReplica(b.ID); got.LastControlRequestID != bhb.RequestID {
		t.Fatalf("the administrator's write kept last request %q, want %q", got.LastControlRequestID, bhb.RequestID)
	}
	f.rejected(bhb, registry.RuleReplay, registry.ErrConflict)
	f.wantState(b.ID, aip.ReplicaOffline, 3, f.clock.Now())
}

func digestOf(requestID string, cmd aip.ControlCommand) string {
	d, err := aip.ControlRequestDigest(&aip.ControlRequest{RequestID: requestID, Command: cmd})
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	return d
}

func testLifecycleRejectionBurns(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	f.ok(f.registerCmd(rep))
	stale := f.heartbeatCmd(rep.ID, 0)
	f.rejected(stale, registry.RuleSequence, registry.ErrConflict)
	// The decided ID is consumed: the same bytes get the replay rejection,
	// never a different answer later.
	f.rejected(stale, registry.RuleReplay, registry.ErrConflict)
	f.wantState(rep.ID, aip.ReplicaReady, 1, f.clock.Now().Add(LeaseTTL))
}

func testLifecycleFailedCall(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	reg := f.registerCmd(rep)
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	if res, err := f.lc.ApplyLifecycle(ctx, []registry.LifecycleCommand{reg}); err == nil || res != nil {
		t.Fatalf("ApplyLifecycle with a cancelled context = %v, %v; want nil results and an error", res, err)
	}
	f.wantState(rep.ID, aip.ReplicaOffline, 0, rep.LeaseExpiresAt)
	// Nothing was claimed: the byte-identical retry succeeds.
	f.wantLease(f.ok(reg), 1, f.clock.Now().Add(LeaseTTL))
}

func testLifecycleRegistrationRules(t *testing.T, nb NewBackend) {
	type rc struct {
		name     string
		rule     registry.LifecycleRule
		sentinel error
		reg      func(*aip.Registration)
		setup    func(f *lfx)
	}
	cases := []rc{
		{name: "status not ready", rule: registry.RuleProposal, sentinel: registry.ErrInvalid, reg: func(r *aip.Registration) { r.Replica.Status = aip.ReplicaDraining }},
		{name: "active assignments", rule: registry.RuleProposal, sentinel: registry.ErrInvalid, reg: func(r *aip.Registration) { r.Replica.ActiveAssignments = 1 }},
		{name: "health revision", rule: registry.RuleProposal, sentinel: registry.ErrInvalid, reg: func(r *aip.Registration) { r.Replica.HealthRevision = 5 }},
		{name: "previous request", rule: registry.RuleProposal, sentinel: registry.ErrInvalid, reg: func(r *aip.Registration) {
			r.Replica.LastControlRequestID, r.Replica.LastControlRequestDigest = "msg_old", Digest("old")
		}},
		{name: "zero capacity", rule: registry.RuleProposal, sentinel: registry.ErrInvalid, reg: func(r *aip.Registration) { r.Replica.Capacity = 0 }},
		{name: "endpoint", rule: registry.RuleIdentity, sentinel: registry.ErrConflict, reg: func(r *aip.Registration) { r.Replica.Endpoint = "https://elsewhere.test" }},
		{name: "peer did", rule: registry.RuleIdentity, sentinel: registry.ErrConflict, reg: func(r *aip.Registration) { r.Replica.PeerDID = DID("other") }},
		{name: "instance", rule: registry.RuleIdentity, sentinel: registry.ErrConflict, reg: func(r *aip.Registration) { r.Replica.InstanceID = "cinst_other" }},
		{name: "topology", rule: registry.RuleIdentity, sentinel: registry.ErrConflict, reg: func(r *aip.Registration) { r.Replica.Topology.Zone = "z9" }},
		{name: "trust domain", rule: registry.RuleIdentity, sentinel: registry.ErrConflict, reg: func(r *aip.Registration) { r.Replica.TrustDomain = "other.test" }},
		{name: "manifest digest", rule: registry.RuleDigest, sentinel: registry.ErrAdmission, reg: func(r *aip.Registration) { r.ManifestDigest = Digest("other manifest") }},
		{name: "artifact digest", rule: registry.RuleDigest, sentinel: registry.ErrAdmission, reg: func(r *aip.Registration) { r.ArtifactDigest = Digest("other artifact") }},
		{name: "tenant", rule: registry.RuleInstance, sentinel: registry.ErrAdmission, reg: func(r *aip.Registration) { r.TenantID = "tenant-2" }},
		{name: "config revision", rule: registry.RuleInstance, sentinel: registry.ErrAdmission, reg: func(r *aip.Registration) { r.ConfigRevision = 2 }},
		{name: "secret reference", rule: registry.RuleInstance, sentinel: registry.ErrAdmission, reg: func(r *aip.Registration) { r.SecretProviderRef = "secret://other" }},
		{name: "capability count", rule: registry.RuleCapabilityCount, sentinel: registry.ErrAdmission, reg: func(r *aip.Registration) { r.CapabilityCount = 1 }},
		{name: "disabled instance", rule: registry.RuleInstance, sentinel: registry.ErrAdmission, setup: func(f *lfx) {
			i := f.w.Instance
			i.Status, i.ConfigRevision = registry.InstanceDisabled, i.ConfigRevision+1
			f.must(f.b.Admin.PutInstance(f.ctx, i))
		}},
		{name: "revoked version", rule: registry.RuleVersion, sentinel: registry.ErrAdmission, setup: func(f *lfx) {
			f.must(f.b.Admin.SetVersionStatus(f.ctx, f.w.Version.ID, registry.VersionRevoked))
		}},
		{name: "admitted version", rule: registry.RuleVersion, sentinel: registry.ErrAdmission, setup: func(f *lfx) {
			f.must(f.b.Admin.SetVersionStatus(f.ctx, f.w.Version.ID, registry.VersionAdmitted))
		}},
		{name: "instance moved to another version", rule: registry.RuleVersion, sentinel: registry.ErrAdmission, setup: func(f *lfx) {
			caps := []aip.Capability{Capability("alpha.read", "reads alpha"), Capability("alpha.write", "writes alpha")}
			v2 := Version("cver_alpha2", f.w.Type.ID, "2.0.0", f.w.Type.Owner, registry.VersionActive, Manifest("service:alpha", caps))
			f.must(f.b.Admin.AdmitVersion(f.ctx, v2))
			i := f.w.Instance
			i.VersionID, i.ConfigRevision = v2.ID, i.ConfigRevision+1
			f.must(f.b.Admin.PutInstance(f.ctx, i))
		}},
	}
	// Cases that change only the registration share one backend, each with
	// its own replica; cases that change records get their own backend.
	shared := newLfx(t, nb)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := shared.with(t)
			if c.setup != nil {
				f = newLfx(t, nb)
			}
			rep := f.provision(fmt.Sprintf("r%d", i))
			if c.setup != nil {
				c.setup(f)
			}
			var mods []func(*aip.Registration)
			if c.reg != nil {
				mods = append(mods, c.reg)
			}
			rej := wantRejection(t, f.apply(f.registerCmd(rep, mods...))[0], c.rule, c.sentinel)
			if rej.ReplicaID != rep.ID || rej.Operation != aip.OpRegister || rej.Reason == "" {
				t.Fatalf("rejection %+v", rej)
			}
			f.wantState(rep.ID, aip.ReplicaOffline, 0, rep.LeaseExpiresAt)
		})
	}
	t.Run("peer principal is not the manifest agent", func(t *testing.T) {
		f := newLfx(t, nb)
		rep := f.provision("a1", func(r *registry.ConnectorReplica) { r.PeerPrincipalID = "service:someone-else" })
		f.rejected(f.registerCmd(rep), registry.RuleIdentity, registry.ErrConflict)
	})
}

func testLifecycleReregistration(t *testing.T, nb NewBackend) {
	t.Run("while the lease is live", func(t *testing.T) {
		f := newLfx(t, nb)
		rep := f.provision("a1")
		f.ok(f.registerCmd(rep))
		f.clock.Advance(LeaseTTL - time.Millisecond)
		f.rejected(f.registerCmd(rep), registry.RuleLeaseLive, registry.ErrConflict)
		// Draining keeps the lease live too.
		f.ok(f.transitionCmd(aip.OpDrain, rep.ID, 1))
		f.rejected(f.registerCmd(rep), registry.RuleLeaseLive, registry.ErrConflict)
		f.wantState(rep.ID, aip.ReplicaDraining, 2, f.clock.Now().Add(LeaseTTL))
	})
	t.Run("after a clean offline", func(t *testing.T) {
		f := newLfx(t, nb)
		rep := f.provision("a1")
		f.ok(f.registerCmd(rep))
		f.ok(f.transitionCmd(aip.OpOffline, rep.ID, 1))
		f.wantLease(f.ok(f.registerCmd(rep)), 3, f.clock.Now().Add(LeaseTTL))
	})
	t.Run("after lease expiry, preserving active assignments", func(t *testing.T) {
		f := newLfx(t, nb)
		rep := f.provision("a1")
		f.ok(f.registerCmd(rep))
		a := f.resolve(request("tenant-1", "alpha.read"))
		f.resolve(request("tenant-1", "alpha.read"))
		f.clock.Advance(LeaseTTL)
		// Lease expired, maintenance has not run: too little capacity for
		// the two retained assignments is refused.
		f.rejected(f.registerCmd(rep, func(r *aip.Registration) { r.Replica.Capacity = 1 }), registry.RuleCapacity, registry.ErrAdmission)
		res := f.ok(f.registerCmd(rep, func(r *aip.Registration) { r.Replica.Capacity = 2 }))
		f.wantLease(res, 2, f.clock.Now().Add(LeaseTTL))
		r := f.wantState(rep.ID, aip.ReplicaReady, 2, f.clock.Now().Add(LeaseTTL))
		if r.ActiveAssignments != 2 || r.Capacity != 2 {
			t.Fatalf("re-registered replica: active %d capacity %d, want 2 and 2", r.ActiveAssignments, r.Capacity)
		}
		// The retained route settles normally afterwards.
		f.settle(a, registry.SettlementCompleted)
		if got := f.getReplica(rep.ID).ActiveAssignments; got != 1 {
			t.Fatalf("after settlement active %d, want 1", got)
		}
		f.checkLedger(rep.ID)
	})
	t.Run("offline with active assignments once its lease ended", func(t *testing.T) {
		f := newLfx(t, nb)
		rep := f.provision("a1")
		f.ok(f.registerCmd(rep))
		f.resolve(request("tenant-1", "alpha.read"))
		f.ok(f.heartbeatCmd(rep.ID, 1))
		// An unhealthy heartbeat ends the lease now; assignments remain.
		f.clock.Advance(time.Second)
		f.ok(f.cmd(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 2, ConnectorReady: false})))
		r := f.getReplica(rep.ID)
		if r.Status != aip.ReplicaOffline || r.ActiveAssignments != 1 {
			t.Fatalf("after an unhealthy heartbeat: %s with %d active", r.Status, r.ActiveAssignments)
		}
		// Going offline ended its lease at "now", so it is eligible at once
		// and keeps its retained assignment.
		f.wantLease(f.ok(f.registerCmd(rep)), 4, f.clock.Now().Add(LeaseTTL))
	})
}

func testLifecycleHeartbeatRules(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	// A heartbeat before registration: the replica is offline.
	f.rejected(f.heartbeatCmd(rep.ID, 0), registry.RuleState, registry.ErrConflict)
	f.ok(f.registerCmd(rep, func(r *aip.Registration) { r.Replica.Capacity = 3 }))
	over := f.cmd(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 1, InFlight: 4, ConnectorReady: true}))
	f.rejected(over, registry.RuleCapacity, registry.ErrAdmission)
	at := f.cmd(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 1, InFlight: 3, ConnectorReady: true}))
	f.ok(at)
	for _, prev := range []uint64{0, 1, 3, 100} {
		f.rejected(f.heartbeatCmd(rep.ID, prev), registry.RuleSequence, registry.ErrConflict)
	}
	// A heartbeat after lease expiry (maintenance not run yet) must register.
	f.clock.Advance(LeaseTTL)
	f.rejected(f.heartbeatCmd(rep.ID, 2), registry.RuleState, registry.ErrConflict)
	f.rejected(f.transitionCmd(aip.OpDrain, rep.ID, 2), registry.RuleState, registry.ErrConflict)
	f.wantState(rep.ID, aip.ReplicaReady, 2, f.clock.Now())
}

func testLifecycleUnhealthy(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	f.ok(f.registerCmd(rep))
	f.clock.Advance(5 * time.Second)
	res := f.ok(f.cmd(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 1, ConnectorReady: false})))
	// The lease is granted at the next sequence and expires now.
	f.wantLease(res, 2, f.clock.Now())
	f.wantState(rep.ID, aip.ReplicaOffline, 2, f.clock.Now())
	_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantErr(err, registry.ErrReplicaUnavailable, "resolve after an unhealthy heartbeat")
	// Further heartbeats are refused: the host must register again.
	f.rejected(f.heartbeatCmd(rep.ID, 2), registry.RuleState, registry.ErrConflict)
	f.clock.Advance(time.Millisecond)
	f.wantLease(f.ok(f.registerCmd(rep)), 3, f.clock.Now().Add(LeaseTTL))
	f.resolve(request("tenant-1", "alpha.read"))
}

func testLifecycleDrainOffline(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	f.rejected(f.transitionCmd(aip.OpDrain, rep.ID, 0), registry.RuleState, registry.ErrConflict)
	f.ok(f.registerCmd(rep))
	f.rejected(f.transitionCmd(aip.OpDrain, rep.ID, 0), registry.RuleSequence, registry.ErrConflict)
	f.rejected(f.transitionCmd(aip.OpOffline, rep.ID, 2), registry.RuleSequence, registry.ErrConflict)
	f.ok(f.transitionCmd(aip.OpDrain, rep.ID, 1))
	// Draining twice renews the draining lease; a heartbeat makes it ready.
	f.clock.Advance(time.Second)
	f.wantLease(f.ok(f.transitionCmd(aip.OpDrain, rep.ID, 2)), 3, f.clock.Now().Add(LeaseTTL))
	f.wantState(rep.ID, aip.ReplicaDraining, 3, f.clock.Now().Add(LeaseTTL))
	f.ok(f.heartbeatCmd(rep.ID, 3))
	f.wantState(rep.ID, aip.ReplicaReady, 4, f.clock.Now().Add(LeaseTTL))
	f.ok(f.transitionCmd(aip.OpOffline, rep.ID, 4))
	// Offline of an offline replica is fenced but allowed.
	f.clock.Advance(time.Second)
	res := f.ok(f.transitionCmd(aip.OpOffline, rep.ID, 5))
	if res.Outcome.Status != aip.OutcomeOffline {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	// The lease end does not move forward.
	f.wantState(rep.ID, aip.ReplicaOffline, 6, f.clock.Now().Add(-time.Second))
}

func testLifecycleLeaseExpiry(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	f.ok(f.registerCmd(rep))
	hb := f.heartbeatCmd(rep.ID, 1)
	f.ok(hb)
	a := f.resolve(request("tenant-1", "alpha.read"))
	f.clock.Advance(LeaseTTL + time.Second)
	n, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 10)
	f.must(err)
	if n != 1 {
		t.Fatalf("expired %d replicas, want 1", n)
	}
	r := f.getReplica(rep.ID)
	if r.Status != aip.ReplicaOffline || r.ActiveAssignments != 0 || r.HealthRevision != 3 || r.LastControlRequestID != "" {
		t.Fatalf("expired replica %+v", r)
	}
	if res := f.reservation(a.ActionID); res.Reserved || res.LastSettlement != registry.SettlementLeaseExpired {
		t.Fatalf("reservation after expiry %+v", res)
	}
	f.checkLedger(rep.ID)
	// The host's offline following its last heartbeat comes too late: its
	// refusal says the replica is already offline by lease expiry, not
	// that a newer request of its own won. An older one is stale.
	for prev, want := range map[uint64]string{2: "is already offline: its lease ran out", 1: "lost its lease-sequence fence"} {
		rej := f.rejected(f.transitionCmd(aip.OpOffline, rep.ID, prev), registry.RuleSequence, registry.ErrConflict)
		if !strings.Contains(rej.Error(), want) || (prev == 2 && !strings.Contains(rej.Error(), "offline (lease_expired)")) {
			t.Errorf("offline at previous_sequence %d after lease expiry: %v, want it to say %q", prev, rej, want)
		}
	}
	// The committed heartbeat is no longer the replica's last request.
	f.rejected(hb, registry.RuleReplay, registry.ErrConflict)
	// The same replica registers again and routes again.
	f.wantLease(f.ok(f.registerCmd(rep)), 4, f.clock.Now().Add(LeaseTTL))
	f.resolve(request("tenant-1", "alpha.read"))
}

// wantOffline checks why and when the stored replica last went offline
// (reason "" and at zero: it has no offline reason).
func (f *lfx) wantOffline(id string, reason registry.OfflineReason, at time.Time) {
	f.t.Helper()
	r := f.getReplica(id)
	if r.OfflineReason != reason || !r.OfflineAt.Equal(registry.Millis(at)) {
		f.t.Fatalf("replica %s (%s) went offline for %q at %s, want %q at %s",
			id, r.Status, r.OfflineReason, aip.At(r.OfflineAt), reason, aip.At(at))
	}
}

// testLifecycleOfflineReason: a replica records why it last went offline
// and when — its own offline (shutdown), an unhealthy heartbeat
// (unhealthy), lease expiry (lease_expired) or an administrator's write
// (administrator) — and a registration clears it. An offline replica that
// is taken offline again keeps the first reason; a pre-provisioned one has
// none; what a written record says of the reason is not what is stored.
func testLifecycleOfflineReason(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1", func(r *registry.ConnectorReplica) {
		r.OfflineReason, r.OfflineAt = registry.OfflineShutdown, f.clock.Now() // the registry's to set
	})
	f.wantOffline(rep.ID, "", time.Time{})
	bad := f.w.ProvisionedReplica("crepl_bad", f.clock.Now())
	bad.OfflineReason = "crashed"
	f.wantField(f.b.Admin.PutReplica(f.ctx, bad), registry.ErrInvalid, "offline_reason", "a replica with an unknown offline reason")

	// Unhealthy: the heartbeat's result and the stored replica say so.
	f.ok(f.registerCmd(rep))
	f.wantOffline(rep.ID, "", time.Time{})
	f.clock.Advance(2 * time.Second)
	res := f.ok(f.cmd(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 1, ConnectorReady: false})))
	if res.Replica.OfflineReason != registry.OfflineUnhealthy || !res.Replica.OfflineAt.Equal(f.clock.Now()) {
		t.Fatalf("the unhealthy heartbeat's result holds offline reason %q at %s, want unhealthy at %s",
			res.Replica.OfflineReason, aip.At(res.Replica.OfflineAt), aip.At(f.clock.Now()))
	}
	f.wantOffline(rep.ID, registry.OfflineUnhealthy, f.clock.Now())
	unhealthyAt := f.clock.Now()
	// A clean offline of the offline replica keeps why it went offline.
	f.clock.Advance(time.Second)
	f.ok(f.transitionCmd(aip.OpOffline, rep.ID, 2))
	f.wantOffline(rep.ID, registry.OfflineUnhealthy, unhealthyAt)

	// Registering again clears it, draining keeps none, offline is a
	// shutdown.
	f.clock.Advance(time.Second)
	f.ok(f.registerCmd(rep))
	f.wantOffline(rep.ID, "", time.Time{})
	f.ok(f.transitionCmd(aip.OpDrain, rep.ID, 4))
	f.wantOffline(rep.ID, "", time.Time{})
	f.clock.Advance(time.Second)
	f.ok(f.transitionCmd(aip.OpOffline, rep.ID, 5))
	f.wantOffline(rep.ID, registry.OfflineShutdown, f.clock.Now())

	// Lease expiry.
	f.clock.Advance(time.Second)
	f.ok(f.registerCmd(rep))
	f.clock.Advance(LeaseTTL + time.Second)
	if n, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 10); err != nil || n != 1 {
		t.Fatalf("ExpireStaleReplicas: %d, %v; want 1", n, err)
	}
	f.wantOffline(rep.ID, registry.OfflineLeaseExpired, f.clock.Now())
	expiredAt := f.clock.Now()

	// An administrator's write: one that leaves the replica offline keeps
	// the stored reason whatever it says, one that takes it offline records
	// administrator, one that makes it ready clears it.
	f.clock.Advance(time.Second)
	f.update(rep.ID, func(r *registry.ConnectorReplica) {
		r.Capacity++
		r.OfflineReason, r.OfflineAt = registry.OfflineShutdown, f.clock.Now()
	})
	f.wantOffline(rep.ID, registry.OfflineLeaseExpired, expiredAt)
	f.update(rep.ID, func(r *registry.ConnectorReplica) {
		r.Status, r.LeaseExpiresAt = aip.ReplicaReady, f.clock.Now().Add(time.Minute)
	})
	f.wantOffline(rep.ID, "", time.Time{})
	f.clock.Advance(time.Second)
	f.update(rep.ID, func(r *registry.ConnectorReplica) {
		r.Status, r.LeaseExpiresAt = aip.ReplicaOffline, f.clock.Now()
	})
	f.wantOffline(rep.ID, registry.OfflineAdministrator, f.clock.Now())

	// ListReplicas, the fleet views' source, carries them.
	got, err := f.b.Replicas.ListReplicas(f.ctx, "", 10)
	f.must(err)
	if len(got) != 1 || got[0].OfflineReason != registry.OfflineAdministrator || !got[0].OfflineAt.Equal(f.clock.Now()) {
		t.Fatalf("ListReplicas: %+v, want %s offline for administrator at %s", got, rep.ID, aip.At(f.clock.Now()))
	}
}

func testLifecycleBatch(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	a := f.provision("a1")
	b := f.provision("b1")
	regA, regB := f.registerCmd(a), f.registerCmd(b)
	res := f.apply(regB, regA, regA)
	f.wantLease(res[0], 1, f.clock.Now().Add(LeaseTTL))
	f.wantLease(res[1], 1, f.clock.Now().Add(LeaseTTL))
	// The same request twice in one call: the second is the replay.
	if !res[2].Replayed || *res[2].Outcome.Lease != *res[1].Outcome.Lease {
		t.Fatalf("in-call replay %+v", res[2])
	}
	// Two heartbeats with the same previous sequence: exactly the first
	// wins; a later command sees the earlier one's sequence.
	res = f.apply(f.heartbeatCmd(a.ID, 1), f.heartbeatCmd(a.ID, 1), f.heartbeatCmd(b.ID, 1), f.heartbeatCmd(a.ID, 2), f.heartbeatCmd(b.ID, 0))
	f.wantLease(res[0], 2, f.clock.Now().Add(LeaseTTL))
	wantRejection(t, res[1], registry.RuleSequence, registry.ErrConflict)
	f.wantLease(res[2], 2, f.clock.Now().Add(LeaseTTL))
	f.wantLease(res[3], 3, f.clock.Now().Add(LeaseTTL))
	wantRejection(t, res[4], registry.RuleSequence, registry.ErrConflict)
	f.wantState(a.ID, aip.ReplicaReady, 3, f.clock.Now().Add(LeaseTTL))
	f.wantState(b.ID, aip.ReplicaReady, 2, f.clock.Now().Add(LeaseTTL))
}

// testLifecycleBatchVersions registers, in one call, replicas of two
// instances of two versions (and one of a third instance that moved to the
// other version), interleaved: a backend loads each instance and version
// once per call, and every command must still be decided against its own
// replica's instance and version.
func testLifecycleBatchVersions(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	v2 := Version("cver_alpha2", f.w.Type.ID, "2.0.0", f.w.Type.Owner, registry.VersionActive,
		Manifest("service:alpha2", []aip.Capability{Capability("alpha.read", "reads alpha")}))
	f.must(f.b.Admin.AdmitVersion(f.ctx, v2))
	w2 := &LifecycleWorld{Type: f.w.Type, Version: v2, Instance: registry.ConnectorInstance{
		ID: "cinst_b", ConnectorTypeID: f.w.Type.ID, VersionID: v2.ID, TenantID: "tenant-2",
		ConfigRevision: 7, SecretProviderRef: "secret://alpha/b", Status: registry.InstanceEnabled,
	}}
	f.must(f.b.Admin.PutInstance(f.ctx, w2.Instance))
	provision := func(w *LifecycleWorld, id string) registry.ConnectorReplica {
		r := w.ProvisionedReplica(id, f.clock.Now())
		f.must(f.b.Admin.PutReplica(f.ctx, r))
		return f.getReplica(r.ID)
	}
	register := func(w *LifecycleWorld, rep registry.ConnectorReplica, mods ...func(*aip.Registration)) registry.LifecycleCommand {
		reg := w.Registration(&rep)
		for _, m := range mods {
			m(&reg)
		}
		return f.cmd(aip.RegisterCommand(reg))
	}
	// Instance c runs version 1 when its replica is provisioned, then moves
	// to version 2: its replica (of version 1) may no longer register.
	w3 := &LifecycleWorld{Type: f.w.Type, Version: f.w.Version, Instance: registry.ConnectorInstance{
		ID: "cinst_c", ConnectorTypeID: f.w.Type.ID, VersionID: f.w.Version.ID, TenantID: "tenant-3",
		ConfigRevision: 1, SecretProviderRef: "secret://alpha/c", Status: registry.InstanceEnabled,
	}}
	f.must(f.b.Admin.PutInstance(f.ctx, w3.Instance))
	c1 := provision(w3, "crepl_c1")
	moved := w3.Instance
	moved.VersionID, moved.ConfigRevision = v2.ID, moved.ConfigRevision+1
	f.must(f.b.Admin.PutInstance(f.ctx, moved))

	a1, a2, a3 := provision(f.w, "crepl_a1"), provision(f.w, "crepl_a2"), provision(f.w, "crepl_a3")
	b1, b2, b3, b4 := provision(w2, "crepl_b1"), provision(w2, "crepl_b2"), provision(w2, "crepl_b3"), provision(w2, "crepl_b4")
	cmds := []registry.LifecycleCommand{
		register(f.w, a1),
		register(w2, b1),
		register(f.w, a2),
		// Version 1's manifest digest for a replica of version 2.
		register(w2, b2, func(r *aip.Registration) { r.ManifestDigest = f.w.Version.ManifestDigest }),
		register(w2, b3),
		// Version 2's capability count for a replica of version 1.
		register(f.w, a3, func(r *aip.Registration) { r.CapabilityCount = uint32(len(v2.Manifest.Capabilities)) }),
		// Instance a's tenant for a replica of instance b.
		register(w2, b4, func(r *aip.Registration) { r.TenantID = f.w.Instance.TenantID }),
		register(w3, c1),
	}
	res := f.apply(cmds...)
	lease := f.clock.Now().Add(LeaseTTL)
	for _, i := range []int{0, 1, 2, 4} {
		f.wantLease(res[i], 1, lease)
	}
	wantRejection(t, res[3], registry.RuleDigest, registry.ErrAdmission)
	wantRejection(t, res[5], registry.RuleCapabilityCount, registry.ErrAdmission)
	wantRejection(t, res[6], registry.RuleInstance, registry.ErrAdmission)
	wantRejection(t, res[7], registry.RuleVersion, registry.ErrAdmission)
	for _, rep := range []registry.ConnectorReplica{a1, a2, b1, b3} {
		f.wantState(rep.ID, aip.ReplicaReady, 1, lease)
	}
	for _, rep := range []registry.ConnectorReplica{b2, a3, b4, c1} {
		f.wantState(rep.ID, aip.ReplicaOffline, 0, rep.LeaseExpiresAt)
	}
}

func testLifecycleConcurrent(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	f.ok(f.registerCmd(rep))
	const n = 16
	var wg sync.WaitGroup
	results := make([]registry.LifecycleResult, n)
	errs := make([]error, n)
	for i := range n {
		c := f.heartbeatCmd(rep.ID, 1)
		wg.Go(func() {
			res, err := f.lc.ApplyLifecycle(f.ctx, []registry.LifecycleCommand{c})
			if err == nil {
				results[i] = res[0]
			}
			errs[i] = err
		})
	}
	wg.Wait()
	wins := 0
	for i := range n {
		f.must(errs[i])
		if results[i].Err == nil {
			wins++
			f.wantLease(results[i], 2, f.clock.Now().Add(LeaseTTL))
			continue
		}
		wantRejection(t, results[i], registry.RuleSequence, registry.ErrConflict)
	}
	if wins != 1 {
		t.Fatalf("%d of %d concurrent heartbeats with the same previous_sequence won, want exactly 1", wins, n)
	}
	f.wantState(rep.ID, aip.ReplicaReady, 2, f.clock.Now().Add(LeaseTTL))
}

func testLifecycleClaimsExpire(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	rep := f.provision("a1")
	f.ok(f.registerCmd(rep))
	stale := f.heartbeatCmd(rep.ID, 0)
	f.rejected(stale, registry.RuleSequence, registry.ErrConflict)
	f.rejected(stale, registry.RuleReplay, registry.ErrConflict)
	// Past the request's expiry plus the grace the claim is gone (the
	// service refuses such a request by its window long before).
	f.clock.Set(stale.ExpiresAt.Add(registry.ReplayClaimGrace))
	f.rejected(stale, registry.RuleSequence, registry.ErrConflict)
}

func testLifecycleList(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	lister := f.b.Replicas
	for _, n := range []string{"c", "a", "e", "b", "d"} {
		f.provision(n)
	}
	got, err := lister.ListReplicas(f.ctx, "", 2)
	f.must(err)
	if len(got) != 2 || got[0].ID != "crepl_a" || got[1].ID != "crepl_b" {
		t.Fatalf("first page %v", replicaIDs(got))
	}
	got, err = lister.ListReplicas(f.ctx, "crepl_b", 10)
	f.must(err)
	if len(got) != 3 || got[0].ID != "crepl_c" || got[2].ID != "crepl_e" {
		t.Fatalf("second page %v", replicaIDs(got))
	}
	got, err = lister.ListReplicas(f.ctx, "crepl_e", 0)
	f.must(err)
	if len(got) != 0 {
		t.Fatalf("past the end %v", replicaIDs(got))
	}
	if got, err := lister.ListReplicas(f.ctx, "", -5); err != nil || len(got) != 1 {
		t.Fatalf("limit -5 clamps to 1: %v %v", replicaIDs(got), err)
	}
}

func replicaIDs(rs []registry.ConnectorReplica) []string {
	out := make([]string, len(rs))
	for i := range rs {
		out[i] = rs[i].ID
	}
	return out
}

func testLifecycleReadiness(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	probe := f.b.Readiness
	r, err := probe.Readiness(f.ctx)
	f.must(err)
	if !r.Ready() || r.Backend == "" || len(r.Checks) == 0 {
		t.Fatalf("readiness %+v", r)
	}
	if want := f.revision(); r.CatalogRevision != want {
		t.Fatalf("readiness catalog revision %d, want %d", r.CatalogRevision, want)
	}
}
