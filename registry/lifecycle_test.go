package registry_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// lifecycleWorld returns the records a registration is checked against,
// built without a backend.
func lifecycleWorld(t *testing.T) (*registrytest.LifecycleWorld, registry.ConnectorReplica, registry.LifecycleVersion) {
	t.Helper()
	caps := []aip.Capability{registrytest.Capability("alpha.read", "reads"), registrytest.Capability("alpha.write", "writes")}
	w := &registrytest.LifecycleWorld{
		Type:    registry.ConnectorType{ID: "ctype_alpha", Name: "alpha", Owner: "owner-alpha", Enabled: true},
		Version: registrytest.Version("cver_alpha1", "ctype_alpha", "1.0.0", "owner-alpha", registry.VersionActive, registrytest.Manifest("service:alpha", caps)),
	}
	w.Instance = registry.ConnectorInstance{
		ID: "cinst_a", ConnectorTypeID: "ctype_alpha", VersionID: "cver_alpha1", TenantID: "tenant-1",
		ConfigRevision: 3, SecretProviderRef: "secret://a", Status: registry.InstanceEnabled,
	}
	rep := w.ProvisionedReplica("crepl_a1", registrytest.Epoch)
	return w, rep, registry.NewLifecycleVersion(&w.Version)
}

func TestDecideLifecycleDoesNotModifyItsInput(t *testing.T) {
	w, rep, v := lifecycleWorld(t)
	now := registrytest.Epoch.Add(time.Second)
	cmd := registrytest.LifecycleCommand(now, aip.RegisterCommand(w.Registration(&rep)))
	before := rep
	dec := registry.DecideLifecycle(&cmd, registry.LifecycleInput{Replica: &rep, Instance: &w.Instance, Version: &v, Now: now})
	if dec.Result.Err != nil {
		t.Fatal(dec.Result.Err)
	}
	if diff := cmp.Diff(before, rep); diff != "" {
		t.Fatalf("DecideLifecycle changed its input (-before +after):\n%s", diff)
	}
	if !dec.Write || dec.Claim == nil {
		t.Fatalf("a registration must be written and claimed: %+v", dec)
	}
	want := registry.ReplayClaim{RequestID: cmd.RequestID, Digest: cmd.Digest, ReplicaID: rep.ID, ExpiresAt: cmd.ExpiresAt.Add(registry.ReplayClaimGrace)}
	if diff := cmp.Diff(want, *dec.Claim); diff != "" {
		t.Fatalf("claim (-want +got):\n%s", diff)
	}
	got := dec.Result.Replica
	if got.Status != aip.ReplicaReady || got.HealthRevision != 1 || !got.LeaseExpiresAt.Equal(now.Add(registrytest.LeaseTTL)) ||
		got.LastControlRequestID != cmd.RequestID || got.LastControlRequestDigest != cmd.Digest {
		t.Fatalf("next state %+v", got)
	}
	// The decision is deterministic.
	again := registry.DecideLifecycle(&cmd, registry.LifecycleInput{Replica: &rep, Instance: &w.Instance, Version: &v, Now: now})
	if diff := cmp.Diff(dec, again); diff != "" {
		t.Fatalf("a second decision differs:\n%s", diff)
	}
}

func TestDecideLifecycleTruncatesToMilliseconds(t *testing.T) {
	w, rep, v := lifecycleWorld(t)
	now := registrytest.Epoch.Add(1500*time.Microsecond + 7)
	cmd := registrytest.LifecycleCommand(now, aip.RegisterCommand(w.Registration(&rep)))
	dec := registry.DecideLifecycle(&cmd, registry.LifecycleInput{Replica: &rep, Instance: &w.Instance, Version: &v, Now: now})
	want := registrytest.Epoch.Add(time.Millisecond + registrytest.LeaseTTL)
	if got := dec.Result.Replica.LeaseExpiresAt; !got.Equal(want) {
		t.Fatalf("lease %s, want %s", got, want)
	}
	if got := dec.Result.Outcome.Lease.ExpiresAt.Time; !got.Equal(want) {
		t.Fatalf("outcome lease %s, want %s", got, want)
	}
}

func TestLifecycleRejectionMatchesItsSentinel(t *testing.T) {
	w, rep, v := lifecycleWorld(t)
	now := registrytest.Epoch
	for _, c := range []struct {
		mod      func(*aip.Registration)
		rule     registry.LifecycleRule
		sentinel error
		mention  string
	}{
		{func(r *aip.Registration) { r.Replica.Endpoint = "https://x.test" }, registry.RuleIdentity, registry.ErrConflict, "replica.endpoint"},
		{func(r *aip.Registration) { r.TenantID = "tenant-9" }, registry.RuleInstance, registry.ErrAdmission, "tenant-9"},
		// A tenant or identity field holding an invisible formatting
		// character (no record holds one) is refused by the same rule,
		// in words that name the character and the fix: the mismatch
		// showed it only as an escape ("tenant-1\u200b" is not "tenant-1").
		{func(r *aip.Registration) { r.TenantID = "tenant-1\u200b" }, registry.RuleInstance, registry.ErrAdmission,
			`tenant_id "tenant-1\u200b" is not instance cinst_a's tenant "tenant-1": it holds the invisible formatting character U+200B, which no registry identifier holds; remove it from the host's tenant ID setting`},
		{func(r *aip.Registration) { r.Replica.TrustDomain += "\u00ad" }, registry.RuleIdentity, registry.ErrConflict,
			"replica.trust_domain " + `"` + rep.TrustDomain + `\u00ad" is not the pre-provisioned "` + rep.TrustDomain + `": it holds the invisible formatting character U+00AD`},
		{func(r *aip.Registration) { r.Replica.HealthRevision = 2 }, registry.RuleProposal, registry.ErrInvalid, "health revision 0"},
		{func(r *aip.Registration) { r.CapabilityCount = 9 }, registry.RuleCapabilityCount, registry.ErrAdmission, "capability_count 9"},
	} {
		reg := w.Registration(&rep)
		c.mod(&reg)
		cmd := registrytest.LifecycleCommand(now, aip.RegisterCommand(reg))
		dec := registry.DecideLifecycle(&cmd, registry.LifecycleInput{Replica: &rep, Instance: &w.Instance, Version: &v, Now: now})
		var rej *registry.LifecycleRejection
		if !errors.As(dec.Result.Err, &rej) || rej.Rule != c.rule || !errors.Is(dec.Result.Err, c.sentinel) {
			t.Fatalf("%s: got %v", c.rule, dec.Result.Err)
		}
		if !strings.Contains(rej.Error(), c.mention) || !strings.Contains(rej.Error(), rep.ID) {
			t.Errorf("%s: message %q does not mention %q and the replica", c.rule, rej.Error(), c.mention)
		}
		if dec.Write || dec.Claim == nil || dec.Claim.RequestID != cmd.RequestID {
			t.Errorf("%s: a rejection writes nothing and burns its ID: %+v", c.rule, dec)
		}
	}
}

func TestNewLifecycleVersionQualifies(t *testing.T) {
	w, _, v := lifecycleWorld(t)
	if !v.Qualified || v.CapabilityCount != 2 || v.AgentID != "service:alpha" || v.ArtifactDigest != w.Version.Attestation.ArtifactDigest {
		t.Fatalf("summary %+v", v)
	}
	bad := w.Version.Clone()
	bad.Attestation.LicensePolicyStatus = registry.EvidenceFailed
	lv := registry.NewLifecycleVersion(&bad)
	if lv.Qualified || !strings.Contains(lv.QualifyError, "license_policy_status") {
		t.Fatalf("unqualified summary %+v", lv)
	}
	rep := w.ProvisionedReplica("crepl_a1", registrytest.Epoch)
	cmd := registrytest.LifecycleCommand(registrytest.Epoch, aip.RegisterCommand(w.Registration(&rep)))
	dec := registry.DecideLifecycle(&cmd, registry.LifecycleInput{Replica: &rep, Instance: &w.Instance, Version: &lv, Now: registrytest.Epoch})
	var rej *registry.LifecycleRejection
	if !errors.As(dec.Result.Err, &rej) || rej.Rule != registry.RuleVersion || !strings.Contains(rej.Reason, "qualified") {
		t.Fatalf("unqualified version: %v", dec.Result.Err)
	}
}

func TestLifecycleKeys(t *testing.T) {
	now := registrytest.Epoch
	_, rep, _ := lifecycleWorld(t)
	w, _, _ := lifecycleWorld(t)
	hb := func(id string) registry.LifecycleCommand {
		return registrytest.LifecycleCommand(now, aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, ConnectorReady: true}))
	}
	reg := registrytest.LifecycleCommand(now, aip.RegisterCommand(w.Registration(&rep)))
	bad := hb("crepl_bad")
	bad.Digest = ""
	cmds := []registry.LifecycleCommand{hb("crepl_z"), reg, hb("crepl_b"), hb("crepl_z"), bad, reg}
	replicas, requests, registering := registry.LifecycleKeys(cmds)
	if want := []string{"crepl_a1", "crepl_b", "crepl_z"}; !slices.Equal(replicas, want) {
		t.Fatalf("replicas %v, want %v", replicas, want)
	}
	if len(requests) != 4 || !slices.IsSorted(requests) {
		t.Fatalf("requests %v: want the 4 distinct valid IDs, sorted", requests)
	}
	if !slices.Equal(registering, []string{"crepl_a1"}) {
		t.Fatalf("registering %v", registering)
	}
}

func TestLifecycleBatchWrites(t *testing.T) {
	w, rep, v := lifecycleWorld(t)
	now := registrytest.Epoch
	b := registry.LifecycleBatch{
		Now:       now,
		Replicas:  map[string]*registry.ConnectorReplica{rep.ID: &rep},
		Instances: map[string]*registry.ConnectorInstance{w.Instance.ID: &w.Instance},
		Versions:  map[string]*registry.LifecycleVersion{v.ID: &v},
	}
	reg := registrytest.LifecycleCommand(now, aip.RegisterCommand(w.Registration(&rep)))
	hb := registrytest.LifecycleCommand(now, aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 1, ConnectorReady: true}))
	stale := registrytest.LifecycleCommand(now, aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 1, ConnectorReady: true}))
	res := b.Apply([]registry.LifecycleCommand{reg, hb, stale, reg})
	if res[0].Err != nil || res[1].Err != nil || res[2].Err == nil {
		t.Fatalf("results %+v", res)
	}
	// The registration is no longer the last request: its reuse is refused.
	var rej *registry.LifecycleRejection
	if !errors.As(res[3].Err, &rej) || rej.Rule != registry.RuleReplay {
		t.Fatalf("reused registration: %v", res[3].Err)
	}
	changed := b.ChangedReplicas()
	if len(changed) != 1 || changed[0].HealthRevision != 2 || changed[0].LastControlRequestID != hb.RequestID {
		t.Fatalf("changed %+v", changed)
	}
	claims := b.NewClaims()
	if len(claims) != 3 || claims[0].RequestID != reg.RequestID || claims[1].RequestID != hb.RequestID || claims[2].RequestID != stale.RequestID {
		t.Fatalf("claims %+v: want the registration, the heartbeat and the burned stale heartbeat", claims)
	}
}

func TestLifecycleCommandValidate(t *testing.T) {
	now := registrytest.Epoch
	good := registrytest.LifecycleCommand(now, aip.TransitionCommand(aip.OpDrain, aip.Transition{ReplicaID: "crepl_a"}))
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*registry.LifecycleCommand){
		"long request ID": func(c *registry.LifecycleCommand) { c.RequestID = strings.Repeat("x", aip.MaxRequestIDBytes+1) },
		"no replica":      func(c *registry.LifecycleCommand) { c.Command.Transition = &aip.Transition{} },
		"unknown op":      func(c *registry.LifecycleCommand) { c.Command.Operation = "restart" },
		"no payload":      func(c *registry.LifecycleCommand) { c.Command.Transition = nil },
		"TTL":             func(c *registry.LifecycleCommand) { c.LeaseTTL = 0 },
	} {
		c := good
		mod(&c)
		if err := c.Validate(); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		}
	}
}
