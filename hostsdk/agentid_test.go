package hostsdk_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/registry"
)

// TestBindManifestRefusesAgentIDTheRegistryRefuses: a manifest whose agent
// ID is no registry identifier (the replica's peer_principal_id must equal
// it) is refused at bind_manifest, naming the fault, instead of starting —
// and registering with hostsdktest's fake control plane, which admits what
// the host proposes — when the registry would never admit its version.
func TestBindManifestRefusesAgentIDTheRegistryRefuses(t *testing.T) {
	for _, c := range []struct{ id, want string }{
		{"agent:notes\u200b", `"agent:notes\u200b" holds the invisible formatting character '\u200b' (U+200B) at byte 11`},
		{" agent:notes", `starts with the white space ' ' (U+0020) at byte 0`},
		{"agent:notes\t", `ends with the white space '\t' (U+0009) at byte 11`},
		{"agent:\x01notes", `holds the control character '\x01' (U+0001) at byte 6`},
		{"agent:\xffnotes", `holds the byte 0xFF at byte 6, which is not UTF-8`},
		{"agent:" + strings.Repeat("n", registry.MaxIdentifierBytes-5), "is 257 bytes"},
	} {
		conn := newTestConnector()
		conn.agentID = c.id
		m, err := conn.Manifest(t.Context(), hostsdk.TenantContext{})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = hostsdk.BindManifest(m, "example.test")
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "fix the agent ID in the connector's manifest") {
			t.Errorf("agent ID %q: BindManifest: %v, want an error saying %q and what to fix", c.id, err, c.want)
		}
	}
	// The registry's bounds hold: white space inside, and exactly
	// registry.MaxIdentifierBytes bytes, bind.
	for _, id := range []string{"agent:my notes", "agent:" + strings.Repeat("n", registry.MaxIdentifierBytes-6)} {
		conn := newTestConnector()
		conn.agentID = id
		m, err := conn.Manifest(t.Context(), hostsdk.TenantContext{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
			t.Errorf("agent ID %q: BindManifest: %v", id, err)
		}
	}
}

// TestStartRefusesAgentIDTheRegistryRefuses: the host refuses such a
// manifest at bootstrap step 4, so a connector's hostsdktest tests fail
// as its replica would.
func TestStartRefusesAgentIDTheRegistryRefuses(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	conn := newTestConnector()
	conn.agentID = "agent:notes\u200b"
	h, err := hostsdk.New(hostsdktest.HostConfig(t, cp, d, nil), conn)
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start(t.Context())
	var bind *hostsdk.BindManifestError
	if !errors.As(err, &bind) || !strings.Contains(err.Error(), "U+200B") {
		t.Fatalf("Start: %v, want a bind_manifest error naming U+200B", err)
	}
	if ops := cp.Operations(); len(ops) != 0 {
		t.Errorf("the control plane saw %d lifecycle operations", len(ops))
	}
}
