package registry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// docExample returns the complete example of docs/fleet-file.md: the yaml
// block after the fleet-file-example marker.
func docExample(t *testing.T) []byte {
	t.Helper()
	doc, err := os.ReadFile("../docs/fleet-file.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(doc, []byte("<!-- fleet-file-example"))
	if !ok {
		t.Fatal("docs/fleet-file.md has no fleet-file-example marker")
	}
	_, rest, ok = bytes.Cut(rest, []byte("```yaml\n"))
	if !ok {
		t.Fatal("no yaml block after the fleet-file-example marker")
	}
	block, _, ok := bytes.Cut(rest, []byte("```"))
	if !ok {
		t.Fatal("the example's yaml block is not closed")
	}
	return block
}

func newMem(t *testing.T) (*memregistry.Registry, *registrytest.Clock) {
	t.Helper()
	clock := registrytest.NewClock(registrytest.Epoch)
	r, err := memregistry.New(memregistry.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return r, clock
}

func parse(t *testing.T, data []byte) *registry.FleetFile {
	t.Helper()
	f, err := registry.ParseFleetFile(data)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestDocExampleApplies(t *testing.T) {
	ctx := t.Context()
	f := parse(t, docExample(t))
	r, clock := newMem(t)
	rep, err := registry.Apply(ctx, r, f)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Count(registry.Created); got != 12 || len(rep.Entries) != 12 {
		t.Fatalf("first apply: %d created of %d entries, want 12 of 12: %+v", got, len(rep.Entries), rep.Entries)
	}
	rev, err := r.CatalogRevision(ctx)
	if err != nil || rev != 9 {
		t.Fatalf("catalog revision %d (%v), want 9 as the document says", rev, err)
	}
	// Applying the same file again changes nothing.
	rep, err = registry.Apply(ctx, r, parse(t, docExample(t)))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Changed() || rep.Count(registry.Unchanged) != 12 {
		t.Fatalf("second apply changed something: %+v", rep.Entries)
	}
	if rev2, _ := r.CatalogRevision(ctx); rev2 != rev {
		t.Fatalf("second apply moved the catalog revision to %d", rev2)
	}
	for tenant, want := range map[string][]string{"acme": {"echo.reverse", "echo.say"}, "globex": {"echo.say"}} {
		p, err := r.QueryCapabilities(ctx, registry.CatalogQuery{Limit: 10}, registry.ForTenant(tenant))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range p.Capabilities {
			got = append(got, d.Capability.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s sees %v, want %v", tenant, got, want)
		}
	}
	acme, err := r.AdmissionPolicy(ctx, "quota:acme")
	if err != nil {
		t.Fatal(err)
	}
	want := registry.ConservativePolicy("quota:acme")
	want.MaxTenantInFlight, want.CircuitOpenMS = 200, 15000
	if acme != want {
		t.Fatalf("quota:acme = %+v, want %+v", acme, want)
	}
	globex, _ := r.AdmissionPolicy(ctx, "quota:globex")
	if want := registry.FleetPolicy("quota:globex"); globex != want {
		t.Fatalf("quota:globex = %+v, want the fleet preset %+v", globex, want)
	}
	// Pre-provisioned replicas wait offline; once a host registers, routes
	// reach it.
	rep0, err := r.ConnectorReplica(ctx, "crepl_acme_echo_b")
	if err != nil {
		t.Fatal(err)
	}
	if rep0.Status != aip.ReplicaOffline || rep0.HealthRevision != 0 || rep0.VersionID != "cver_echo_1_0_0" || rep0.PeerPrincipalKind != aip.PrincipalService {
		t.Fatalf("pre-provisioned replica %+v", rep0)
	}
	_, err = r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "acme", CapabilityID: "echo.say"})
	if !errors.Is(err, registry.ErrReplicaUnavailable) {
		t.Fatalf("resolve before registration: %v, want ErrReplicaUnavailable", err)
	}
	rep0.Status, rep0.HealthRevision, rep0.LeaseExpiresAt = aip.ReplicaReady, 1, clock.Now().Add(30*time.Second)
	if err := r.PutReplica(ctx, rep0); err != nil {
		t.Fatal(err)
	}
	a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "acme", CapabilityID: "echo.say",
		Topology: registry.RouteTopologyPreference{Region: "eu-west", Zone: "eu-west-1b"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.ReplicaID != "crepl_acme_echo_b" || a.QuotaPolicyRef != "quota:acme" || a.CredentialRevisionRef != "acme-echo-credentials-v1" {
		t.Fatalf("route %+v", a)
	}
	// The replica's lifecycle state does not make the file differ.
	rep, err = registry.Apply(ctx, r, parse(t, docExample(t)))
	if err != nil || rep.Changed() {
		t.Fatalf("apply after registration: %v %+v", err, rep.Entries)
	}
}

func TestApplyUpdates(t *testing.T) {
	ctx := t.Context()
	r, _ := newMem(t)
	if _, err := registry.Apply(ctx, r, parse(t, docExample(t))); err != nil {
		t.Fatal(err)
	}
	f := parse(t, docExample(t))
	f.Policies[0].Revision, f.Policies[0].MaxTenantInFlight = 2, 300
	f.Types[0].Enabled = false
	f.Versions[0].Status = registry.VersionAdmitted
	f.Instances[1].ConfigRevision, f.Instances[1].SecretProviderRef = 2, "vault://globex/echo-v2"
	f.Bindings[2].PolicyRevision, f.Bindings[2].Priority = 2, 5
	rep, err := registry.Apply(ctx, r, f)
	if err != nil {
		t.Fatal(err)
	}
	var updated []string
	for _, e := range rep.Entries {
		if e.Change == registry.Updated {
			updated = append(updated, e.Section+" "+e.ID)
		}
	}
	want := []string{"policies quota:acme", "types ctype_echo", "versions cver_echo_1_0_0", "instances cinst_globex_echo", "bindings globex/echo.say/cinst_globex_echo"}
	if !slices.Equal(updated, want) {
		t.Fatalf("updated %v, want %v", updated, want)
	}
	ct, _ := r.ConnectorType(ctx, "ctype_echo")
	v, _ := r.ConnectorVersion(ctx, "cver_echo_1_0_0")
	if ct.Enabled || v.Status != registry.VersionAdmitted {
		t.Fatalf("type enabled %v, version %s", ct.Enabled, v.Status)
	}
	rep, err = registry.Apply(ctx, r, f)
	if err != nil || rep.Changed() {
		t.Fatalf("re-applying the updated file: %v %+v", err, rep.Entries)
	}
}

func TestApplyRefusals(t *testing.T) {
	cases := []struct {
		name    string
		mod     func(f *registry.FleetFile)
		target  error
		section string
		id      string
		field   string
	}{
		{"policy change without a new revision", func(f *registry.FleetFile) { f.Policies[1].MaxTenantInFlight = 7 },
			registry.ErrConflict, registry.SectionPolicies, "quota:globex", "revision"},
		{"renamed type", func(f *registry.FleetFile) { f.Types[0].Name = "echo2" },
			registry.ErrConflict, registry.SectionTypes, "ctype_echo", "name"},
		{"changed release", func(f *registry.FleetFile) { f.Versions[0].Attestation.SignerIdentity = "someone@else" },
			registry.ErrConflict, registry.SectionVersions, "cver_echo_1_0_0", "attestation.signer_identity"},
		{"instance change without a new revision", func(f *registry.FleetFile) { f.Instances[0].SecretProviderRef = "vault://other" },
			registry.ErrConflict, registry.SectionInstances, "cinst_acme_echo", "config_revision"},
		{"replica moved", func(f *registry.FleetFile) { f.Replicas[2].Endpoint = "https://moved.example.test" },
			registry.ErrConflict, registry.SectionReplicas, "crepl_globex_echo_a", "endpoint"},
		{"binding to a missing policy", func(f *registry.FleetFile) {
			f.Bindings[1].QuotaPolicyRef, f.Bindings[1].PolicyRevision = "quota:none", 2
		}, registry.ErrNotFound, registry.SectionBindings, "acme/echo.reverse/cinst_acme_echo", "quota_policy_ref"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			r, _ := newMem(t)
			if _, err := registry.Apply(ctx, r, parse(t, docExample(t))); err != nil {
				t.Fatal(err)
			}
			f := parse(t, docExample(t))
			c.mod(f)
			_, err := registry.Apply(ctx, r, f)
			var fe *registry.FleetFileError
			if !errors.As(err, &fe) || !errors.Is(err, c.target) {
				t.Fatalf("apply: %v, want a *FleetFileError matching %v", err, c.target)
			}
			if fe.Section != c.section || fe.ID != c.id || fe.Field != c.field {
				t.Fatalf("error names %s %s field %q, want %s %s field %q (%v)", fe.Section, fe.ID, fe.Field, c.section, c.id, c.field, err)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	base := string(docExample(t))
	cases := []struct {
		name    string
		edit    func(string) string
		section string
		index   int
		field   string
		msg     string
	}{
		{"missing format", func(s string) string { return strings.Replace(s, "format: aipfleet.fleet/v1", "format: v0", 1) },
			"", 0, "format", "not a known format"},
		{"unknown section", func(s string) string { return s + "\nextras: []\n" }, "", 0, "extras", "unknown field"},
		{"unknown entry field", func(s string) string {
			return strings.Replace(s, "    capacity: 8", "    capacity: 8\n    capacty: 9", 1)
		},
			registry.SectionReplicas, 2, "capacty", "unknown field"},
		{"unknown nested field", func(s string) string {
			return strings.Replace(s, "topology: {region: us-east,", "topology: {regoin: x, region: us-east,", 1)
		}, registry.SectionReplicas, 2, "topology.regoin", "unknown field"},
		{"unknown manifest field", func(s string) string {
			return strings.Replace(s, "          name: Reverse", "          name: Reverse\n          colour: red", 1)
		},
			registry.SectionVersions, 0, "manifest", "colour"},
		{"bad topology label", func(s string) string { return strings.Replace(s, "zone: eu-west-1b", "zone: eu west 1b", 1) },
			registry.SectionReplicas, 1, "topology.zone", "letters, digits"},
		{"bad limit", func(s string) string {
			return strings.Replace(s, "max_binding_in_flight: 250", "max_binding_in_flight: 0", 1)
		},
			registry.SectionPolicies, 1, "max_binding_in_flight", "unlimited"},
		{"missing limit without preset", func(s string) string { return strings.Replace(s, "    max_binding_in_flight: 250\n", "", 1) },
			registry.SectionPolicies, 1, "max_binding_in_flight", "required without a preset"},
		{"unknown preset", func(s string) string { return strings.Replace(s, "preset: conservative", "preset: lavish", 1) },
			registry.SectionPolicies, 0, "preset", "conservative or fleet"},
		{"unknown feature", func(s string) string {
			return strings.Replace(s, "echo.reverse: [invocation]", "echo.reverse: [invocation, teleport]", 1)
		},
			registry.SectionVersions, 0, "implementation_support.echo.reverse", "teleport"},
		{"missing claim", func(s string) string { return strings.Replace(s, "      echo.reverse: [invocation]\n", "", 1) },
			registry.SectionVersions, 0, "implementation_support", "no claim for capability echo.reverse"},
		{"wrong manifest digest", func(s string) string {
			return strings.Replace(s, "    status: active\n", "    status: active\n    manifest_digest: "+registrytest.Digest("x")+"\n", 1)
		}, registry.SectionVersions, 0, "manifest_digest", "does not match"},
		{"failed evidence", func(s string) string {
			return strings.Replace(s, "license_policy_status: passed", "license_policy_status: failed", 1)
		},
			registry.SectionVersions, 0, "attestation.license_policy_status", "only passed evidence"},
		{"duplicate entry", func(s string) string {
			return strings.Replace(s, "  - id: cinst_globex_echo\n", "  - id: cinst_acme_echo\n", 1)
		}, registry.SectionInstances, 1, "", "repeats entry 0"},
		{"bad instance status", func(s string) string {
			return strings.Replace(s, "    secret_provider_ref: vault://acme/echo", "    secret_provider_ref: vault://acme/echo\n    status: paused", 1)
		},
			registry.SectionInstances, 0, "status", "enabled or disabled"},
		{"binding without revision", func(s string) string {
			return strings.Replace(s, "    priority: 0\n    policy_revision: 1\n", "    priority: 0\n", 1)
		},
			registry.SectionBindings, 2, "policy_revision", "required"},
		{"wrong type", func(s string) string { return strings.Replace(s, "capacity: 16", "capacity: lots", 1) },
			registry.SectionReplicas, 0, "capacity", "want a whole number, 0 or more, not the text `lots`"},
		// A quoted number is text: yaml.v3 said "cannot unmarshal !!str `1`
		// into uint64".
		{"quoted number", func(s string) string { return strings.Replace(s, "config_revision: 1", `config_revision: "1"`, 1) },
			registry.SectionInstances, 0, "config_revision", "want a whole number, 0 or more, not the text `1`; write it without quotes"},
		{"negative count", func(s string) string { return strings.Replace(s, "capacity: 16", "capacity: -2", 1) },
			registry.SectionReplicas, 0, "capacity", "want a whole number, 0 or more, not the number `-2`"},
		{"quoted boolean", func(s string) string {
			return strings.Replace(s, "    priority: 0\n", "    priority: 0\n    enabled: \"false\"\n", 1)
		}, registry.SectionBindings, 2, "enabled", "want true or false, not the text `false`; write it without quotes"},
		{"list for a number", func(s string) string { return strings.Replace(s, "capacity: 16", "capacity: [16]", 1) },
			registry.SectionReplicas, 0, "capacity", "want a whole number, 0 or more, not a list"},
		{"bad DID", func(s string) string {
			return strings.Replace(s, "did:key:z6MkqJEBr2wVXTunjrxVEXyN2B4c5Lc62hB2fWLG3Hqt3vvo", "did:web:example.test", 1)
		}, registry.SectionReplicas, 2, "peer_did", "did:key"},
		{"entry is not a mapping", func(s string) string { return strings.Replace(s, "types:\n", "types:\n  - just-a-string\n", 1) },
			registry.SectionTypes, 0, "", "mapping"},
		{"field set twice", func(s string) string {
			return strings.Replace(s, "    capacity: 8", "    capacity: 8\n    capacity: 80", 1)
		},
			registry.SectionReplicas, 2, "capacity", "set twice"},
		{"nested field set twice", func(s string) string {
			return strings.Replace(s, "topology: {region: us-east,", "topology: {region: eu-west, region: us-east,", 1)
		}, registry.SectionReplicas, 2, "topology.region", "set twice"},
		{"attestation field set twice", func(s string) string {
			return strings.Replace(s, "      owner: team-echo\n", "      owner: team-echo\n      owner: team-other\n", 1)
		}, registry.SectionVersions, 0, "attestation.owner", "set twice"},
		{"manifest key set twice", func(s string) string {
			return strings.Replace(s, "          name: Reverse\n", "          name: Reverse\n          name: Forward\n", 1)
		}, registry.SectionVersions, 0, "manifest.capabilities[1]", `key "name" is set twice`},
		{"merge key", func(s string) string {
			return strings.Replace(s, "  - id: ctype_echo\n    name: echo\n", "  - &echo\n    id: ctype_echo\n    name: echo\n    owner: team-echo\n  - <<: *echo\n    id: ctype_echo2\n    name: echo\n", 1)
		}, registry.SectionTypes, 1, "<<", "merge keys"},
		{"fractional capacity", func(s string) string { return strings.Replace(s, "capacity: 8", "capacity: 8.5", 1) },
			registry.SectionReplicas, 2, "capacity", "not a whole number"},
		{"fractional revision", func(s string) string {
			return strings.Replace(s, "    priority: 0\n    policy_revision: 1\n", "    priority: 0\n    policy_revision: 1.9\n", 1)
		}, registry.SectionBindings, 2, "policy_revision", "not a whole number"},
		{"fractional circuit open", func(s string) string {
			return strings.Replace(s, "circuit_open_ms: 15000", "circuit_open_ms: 15000.7", 1)
		},
			registry.SectionPolicies, 0, "circuit_open_ms", "not a whole number"},
		{"fractional limit", func(s string) string {
			return strings.Replace(s, "max_binding_in_flight: 250", "max_binding_in_flight: 250.5", 1)
		}, registry.SectionPolicies, 1, "max_binding_in_flight", "integer"},
		{"instance without revision", func(s string) string {
			return strings.Replace(s, "    config_revision: 1\n    secret_provider_ref: vault://globex/echo\n", "    secret_provider_ref: vault://globex/echo\n", 1)
		}, registry.SectionInstances, 1, "config_revision", "required"},
		{"revision over a bigint", func(s string) string {
			return strings.Replace(s, "    config_revision: 1\n    secret_provider_ref: vault://globex/echo\n", "    config_revision: 9223372036854775808\n    secret_provider_ref: vault://globex/echo\n", 1)
		}, registry.SectionInstances, 1, "config_revision", "over the largest revision"},
		{"NUL in the manifest", func(s string) string {
			return strings.Replace(s, "description: Returns the text reversed.", `description: "Returns the text\0 reversed."`, 1)
		}, registry.SectionVersions, 0, "manifest.capabilities[1]", "NUL"},
		{"section is a mapping", func(s string) string {
			return strings.Replace(s, "types:\n  - id: ctype_echo\n    name: echo\n", "types:\n  ctype_echo:\n    name: echo\n", 1)
		}, "", 0, "types", "must be a list of entries"},
		{"section is a scalar", func(string) string { return "format: aipfleet.fleet/v1\npolicies: none\n" },
			"", 0, "policies", "must be a list of entries"},
		{"two documents", func(s string) string { return s + "---\nformat: aipfleet.fleet/v1\n" }, "", 0, "", "one YAML document"},
		{"replica principal is not the manifest agent", func(s string) string {
			return strings.Replace(s, "    peer_principal_id: service:echo\n    peer_did: did:key:z6MkqJEBr2wVXTunjrxVEXyN2B4c5Lc62hB2fWLG3Hqt3vvo", "    peer_principal_id: service:echo-globex\n    peer_did: did:key:z6MkqJEBr2wVXTunjrxVEXyN2B4c5Lc62hB2fWLG3Hqt3vvo", 1)
		}, registry.SectionReplicas, 2, "peer_principal_id", `"service:echo-globex" is not version cver_echo_1_0_0's manifest agent's "service:echo"`},
		{"replica principal kind is not the manifest agent's", func(s string) string {
			return strings.Replace(s, "    peer_principal_id: service:echo\n    peer_did: did:key:z6Mkt6", "    peer_principal_id: service:echo\n    peer_principal_kind: agent\n    peer_did: did:key:z6Mkt6", 1)
		}, registry.SectionReplicas, 1, "peer_principal_kind", "leave peer_principal_id and peer_principal_kind out"},
		// A replica no host could register: its entry could never be
		// changed once applied, nor its ID used again.
		{"replica endpoint without the messages path", func(s string) string {
			return strings.Replace(s, "https://echo-b.acme.fleet.example.test:8081/aip/v1/messages", "https://echo-b.acme.fleet.example.test:8081", 1)
		}, registry.SectionReplicas, 1, "endpoint", "must have the path /aip/v1/messages: it is the host's --public-endpoint, whose path every host requires to be exactly that, so no host could register this replica (write https://echo-b.acme.fleet.example.test:8081/aip/v1/messages)"},
		{"replica endpoint with another path", func(s string) string {
			return strings.Replace(s, "https://echo-b.acme.fleet.example.test:8081/aip/v1/messages", "https://echo-b.acme.fleet.example.test:8081/aip/v1/messages/", 1)
		}, registry.SectionReplicas, 1, "endpoint", "must have the path /aip/v1/messages"},
		{"replica endpoint http off loopback", func(s string) string {
			return strings.Replace(s, "https://echo-b.acme.fleet.example.test:8081/aip/v1/messages", "http://echo-b.acme.fleet.example.test:8081/aip/v1/messages", 1)
		}, registry.SectionReplicas, 1, "endpoint", "must be https: a host accepts an http --public-endpoint only on a loopback host"},
		{"replica trust domain is not the manifest agent's", func(s string) string {
			return strings.Replace(s, "    trust_domain: fleet.example.test\n    topology: {region: us-east", "    trust_domain: fleet.example.org\n    topology: {region: us-east", 1)
		}, registry.SectionReplicas, 2, "trust_domain", `"fleet.example.org" is not version cver_echo_1_0_0's manifest agent's trust domain "fleet.example.test"`},
		{"replica of a misspelled instance", func(s string) string {
			return strings.Replace(s, "  - id: crepl_globex_echo_a\n    instance_id: cinst_globex_echo\n", "  - id: crepl_globex_echo_a\n    instance_id: cinst_globex_echp\n", 1)
		}, registry.SectionReplicas, 2, "version_id", "is required when instance cinst_globex_echp is not in this file (this file's instances are cinst_acme_echo, cinst_globex_echo: is instance_id misspelled?)"},
		{"non-string manifest key", func(s string) string {
			return strings.Replace(s, "        kind: service\n", "        kind: service\n        12: twelve\n", 1)
		},
			registry.SectionVersions, 0, "manifest.agent", "not a string"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			edited := c.edit(base)
			if edited == base {
				t.Fatal("the edit did not apply to the example")
			}
			_, err := registry.ParseFleetFile([]byte(edited))
			var fe *registry.FleetFileError
			if !errors.As(err, &fe) || !errors.Is(err, registry.ErrInvalid) && !errors.Is(err, registry.ErrAdmission) {
				t.Fatalf("parse: %v, want a *FleetFileError", err)
			}
			if fe.Section != c.section || fe.Index != c.index || fe.Field != c.field || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q names %s[%d] field %q, want %s[%d] field %q mentioning %q", err, fe.Section, fe.Index, fe.Field, c.section, c.index, c.field, c.msg)
			}
			if (c.section != "" || c.field != "" && c.field != "format") && fe.Line == 0 {
				t.Fatalf("error %q has no line", err)
			}
		})
	}
}

// TestParseErrorsAboutTheWholeFile: an error about the file as a whole
// (not YAML, empty, the wrong shape or format) says what is wrong with it,
// with the line where there is one, without the sentinel's "registry:
// invalid" in the middle; it still matches ErrInvalid.
func TestParseErrorsAboutTheWholeFile(t *testing.T) {
	cases := []struct{ name, file, want string }{
		{"not YAML", "garbage: [", "fleet file (line 1): not valid YAML: did not find expected node content"},
		{"not YAML further down", "format: aipfleet.fleet/v1\ntypes:\n  - id: x\n    name: y: z\n",
			"fleet file (line 4): not valid YAML: mapping values are not allowed in this context"},
		{"empty", "", "fleet file: the file is empty; start it with format: aipfleet.fleet/v1"},
		{"a list", "- format\n", "fleet file (line 1): a fleet file is a mapping of sections"},
		{"unknown format", "format: v0\n", `fleet file: format "v0" is not a known format; start the file with format: aipfleet.fleet/v1`},
		{"section not a list", "format: aipfleet.fleet/v1\ntypes: none\n",
			`fleet file (line 2): types must be a list of entries, each starting with "- " (or [] for none)`},
		{"unknown section", "format: aipfleet.fleet/v1\nextras: []\n",
			"fleet file (line 2): extras: unknown field; the fields here are bindings, format, instances, policies, replicas, types, versions"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := registry.ParseFleetFile([]byte(c.file))
			var fe *registry.FleetFileError
			if !errors.As(err, &fe) || !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("parse: %v, want a *FleetFileError matching ErrInvalid", err)
			}
			if got := err.Error(); got != c.want {
				t.Fatalf("error:\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

// TestReplicaPrincipalDefaultsToTheManifestAgent: a replica of a version in
// the file signs as the version's manifest agent (the registry refuses its
// registration otherwise), so leaving its principal out takes the agent's
// id and kind — not the kind service whatever the manifest says.
func TestReplicaPrincipalDefaultsToTheManifestAgent(t *testing.T) {
	base := string(docExample(t))
	edited := strings.ReplaceAll(base, "    peer_principal_id: service:echo\n", "")
	edited = strings.Replace(edited, "      agent:\n        id: service:echo\n        kind: service\n", "      agent:\n        id: agent:echo\n        kind: agent\n", 1)
	if strings.Contains(edited, "peer_principal_id") || !strings.Contains(edited, "id: agent:echo") {
		t.Fatal("the edits did not apply to the example")
	}
	f := parse(t, []byte(edited))
	if len(f.Replicas) != 3 {
		t.Fatalf("%d replicas", len(f.Replicas))
	}
	for _, r := range f.Replicas {
		if r.PeerPrincipalID != "agent:echo" || r.PeerPrincipalKind != aip.PrincipalAgent {
			t.Errorf("replica %s signs as %s %q, want the manifest agent agent %q", r.ID, r.PeerPrincipalKind, r.PeerPrincipalID, "agent:echo")
		}
	}
}

func TestApplyBuiltFile(t *testing.T) {
	// Apply works on files built in code too (the dev fleet does this).
	ctx := context.Background()
	r, clock := newMem(t)
	m := registrytest.Manifest("service:x", []aip.Capability{registrytest.Capability("x.do", "does x")})
	f := &registry.FleetFile{
		Types:     []registry.ConnectorType{{ID: "ctype_x", Name: "x", Owner: "owner-x", Enabled: false}},
		Versions:  []registry.ConnectorVersion{registrytest.Version("cver_x1", "ctype_x", "1", "owner-x", registry.VersionActive, m)},
		Instances: []registry.ConnectorInstance{{ID: "cinst_x", ConnectorTypeID: "ctype_x", VersionID: "cver_x1", TenantID: "t", ConfigRevision: 1, SecretProviderRef: "s", Status: registry.InstanceEnabled}},
		Bindings:  []registry.CapabilityBinding{{TenantID: "t", CapabilityID: "x.do", InstanceID: "cinst_x", PolicyRevision: 1, Enabled: true}},
		Replicas:  []registry.ConnectorReplica{registrytest.Replica("crepl_x", "cinst_x", "cver_x1", clock.Now().Add(time.Minute))},
	}
	rep, err := registry.Apply(ctx, r, f)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Count(registry.Created) != 5 {
		t.Fatalf("report %+v", rep.Entries)
	}
	ct, _ := r.ConnectorType(ctx, "ctype_x")
	if ct.Enabled {
		t.Fatal("the type the file disables is enabled")
	}
	if _, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "t", CapabilityID: "x.do"}); !errors.Is(err, registry.ErrBindingUnavailable) {
		t.Fatalf("resolve on a disabled type: %v", err)
	}
}

func TestMarshalFleetFileRoundTrip(t *testing.T) {
	doc := parse(t, docExample(t))
	// Beyond the example: non-default values of the optional fields.
	varied := parse(t, docExample(t))
	varied.Policies[0].Enabled = false
	varied.Types[0].Enabled = false
	varied.Instances[0].Status = registry.InstanceDisabled
	varied.Bindings[0].Enabled, varied.Bindings[0].Priority, varied.Bindings[0].QuotaPolicyRef = false, 7, ""
	varied.Replicas[0].TransportProfile = "aip-mcp"
	for name, f := range map[string]*registry.FleetFile{"doc example": doc, "varied": varied} {
		t.Run(name, func(t *testing.T) {
			out, err := registry.MarshalFleetFile(f)
			if err != nil {
				t.Fatal(err)
			}
			back, err := registry.ParseFleetFile(out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if diff := cmp.Diff(f, back); diff != "" {
				t.Fatalf("Marshal then Parse (-want +got):\n%s\n%s", diff, out)
			}
			again, err := registry.MarshalFleetFile(back)
			if err != nil || !bytes.Equal(again, out) {
				t.Fatalf("marshalling the parsed file again differs (%v):\n%s\n---\n%s", err, out, again)
			}
		})
	}
	// The documented shape: sections and fields in the documented order,
	// defaults left out.
	out, err := registry.MarshalFleetFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{"format: aipfleet.fleet/v1\npolicies:\n", "max_global_in_flight: unlimited", "supported_aip_versions: [", "\n      echo.say: [invocation, cancellation, retry]\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("the file lacks %q:\n%s", want, s)
		}
	}
	order := []string{"\npolicies:", "\ntypes:", "\nversions:", "\ninstances:", "\nbindings:", "\nreplicas:"}
	for i := 1; i < len(order); i++ {
		if strings.Index(s, order[i-1]) >= strings.Index(s, order[i]) {
			t.Errorf("%s is not before %s", order[i-1], order[i])
		}
	}
	if strings.Contains(s, "enabled: true") || strings.Contains(s, "preset:") || strings.Contains(s, "priority: 0") {
		t.Errorf("defaults are written:\n%s", s)
	}
	// An empty file is just its format.
	if out, err := registry.MarshalFleetFile(&registry.FleetFile{}); err != nil || string(out) != "format: "+registry.FleetFileFormat+"\n" {
		t.Fatalf("empty file: %q, %v", out, err)
	}
}

func TestParseBoundsAliasExpansion(t *testing.T) {
	// Nested aliases in a manifest ("billion laughs"): each level repeats the
	// one before ten times, so 1 KiB of YAML names 10^7 strings. The parser
	// refuses it once the expansion passes a manifest's limit instead of
	// building it.
	var b strings.Builder
	b.WriteString("            examples:\n              - &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i <= 7; i++ {
		fmt.Fprintf(&b, "              - &l%d [", i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*l%d", i-1)
		}
		b.WriteString("]\n")
	}
	const at = "            required: [text]\n    implementation_support:"
	base := string(docExample(t))
	if !strings.Contains(base, at) {
		t.Fatal("the example has no input schema to extend")
	}
	s := strings.Replace(base, at, "            required: [text]\n"+b.String()+"    implementation_support:", 1)
	_, err := registry.ParseFleetFile([]byte(s))
	var fe *registry.FleetFileError
	if !errors.As(err, &fe) || !errors.Is(err, registry.ErrInvalid) || fe.Section != registry.SectionVersions || !strings.HasPrefix(fe.Field, "manifest.") ||
		!strings.Contains(err.Error(), "aliases") {
		t.Fatalf("parse: %v, want an invalid manifest field that expands too far through aliases", err)
	}
	// Aliases within the budget are expanded.
	s = strings.Replace(base, "      echo.say: [invocation, cancellation, retry]", "      echo.say: &all [invocation, cancellation, retry]", 1)
	const props = "            properties:\n              text: {type: string}\n"
	s = strings.Replace(s, props, "            properties: &props\n              text: {type: string}\n", 1)
	s = strings.Replace(s, props, "            properties: *props\n", 1)
	got, err := registry.ParseFleetFile([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(parse(t, docExample(t)), got); diff != "" {
		t.Fatalf("aliased file differs (-want +got):\n%s", diff)
	}
}

// backends returns the in-memory registry and, when the test database is
// configured, a PostgreSQL registry, each empty, for rules both must keep.
func backends(t *testing.T) map[string]registry.Administrator {
	t.Helper()
	mem, _ := newMem(t)
	out := map[string]registry.Administrator{"memregistry": mem}
	if os.Getenv(pgtest.EnvDatabaseURL) != "" || pgtest.Required() {
		u := pgtest.NewDatabase(t)
		pg, err := pgregistry.Open(t.Context(), pgregistry.Config{ControlURL: u, DataURL: u, ControlMaxConns: 2, DataMaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pg.Close)
		out["pgregistry"] = pg
	}
	return out
}

func TestApplyFailureKeepsDisabledTypesDisabled(t *testing.T) {
	// The file disables its type, so Apply creates it enabled (to admit the
	// version) and disables it right after the versions. When a later entry
	// fails, the type must not be left enabled: its instances would be
	// routable.
	s := strings.Replace(string(docExample(t)), "    owner: team-echo\n\nversions:", "    owner: team-echo\n    enabled: false\n\nversions:", 1)
	s = strings.Replace(s, "    instance_id: cinst_globex_echo\n    priority: 0\n", "    instance_id: cinst_missing\n    priority: 0\n", 1)
	for name, admin := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			rep, err := registry.Apply(ctx, admin, parse(t, []byte(s)))
			var fe *registry.FleetFileError
			if !errors.As(err, &fe) || fe.Section != registry.SectionBindings || fe.Index != 2 || !errors.Is(err, registry.ErrNotFound) {
				t.Fatalf("apply: %v, want the missing instance of bindings[2]", err)
			}
			ct, err := admin.ConnectorType(ctx, "ctype_echo")
			if err != nil {
				t.Fatal(err)
			}
			if ct.Enabled {
				t.Fatal("the failed apply left enabled the type the file disables")
			}
			if i := slices.IndexFunc(rep.Entries, func(e registry.AppliedEntry) bool { return e.Section == registry.SectionTypes }); i < 0 || rep.Entries[i].Change != registry.Created {
				t.Fatalf("report %+v, want the type created", rep.Entries)
			}
			// Fixed and applied again, the file completes and the type stays
			// disabled.
			fixed := strings.Replace(s, "cinst_missing", "cinst_globex_echo", 1)
			rep, err = registry.Apply(ctx, admin, parse(t, []byte(fixed)))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Count(registry.Created) != 1 || rep.Count(registry.Updated) != 0 {
				t.Fatalf("second apply %+v, want only the missing binding created", rep.Entries)
			}
			if ct, _ := admin.ConnectorType(ctx, "ctype_echo"); ct.Enabled {
				t.Fatal("type enabled after the second apply")
			}
		})
	}
}

// TestApplyRefusesANewVersionOfADisabledType: the registry admits versions
// only into an enabled type, and Apply never enables a type the registry
// holds disabled, even for a moment (its instances would be routable). A
// file that adds a version to such a type is refused before anything is
// written, naming the version and saying how to stage it.
func TestApplyRefusesANewVersionOfADisabledType(t *testing.T) {
	s := strings.Replace(string(docExample(t)), "    owner: team-echo\n\nversions:", "    owner: team-echo\n    enabled: false\n\nversions:", 1)
	_, rest, _ := strings.Cut(s, "versions:\n")
	block, _, _ := strings.Cut(rest, "\ninstances:")
	next := strings.Replace(block, "id: cver_echo_1_0_0", "id: cver_echo_1_1_0", 1)
	next = strings.Replace(next, "version: 1.0.0", "version: 1.1.0", 1)
	next = strings.Replace(next, "sha256:e1ab1a044dc5", "sha256:000000000dc5", 1)
	if next == block || strings.Count(next, "cver_echo_1_1_0") != 1 || strings.Count(next, "1.1.0") != 1 || !strings.Contains(next, "sha256:000000000dc5") {
		t.Fatal("the example's version entry did not take the new ID, version and artifact")
	}
	withNext := strings.Replace(s, "\ninstances:", "\n"+strings.TrimRight(next, "\n")+"\n\ninstances:", 1)
	for name, admin := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			if _, err := registry.Apply(ctx, admin, parse(t, []byte(s))); err != nil {
				t.Fatal(err)
			}
			before, err := admin.CatalogRevision(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := registry.Apply(ctx, admin, parse(t, []byte(withNext)))
			var fe *registry.FleetFileError
			if !errors.As(err, &fe) || fe.Section != registry.SectionVersions || fe.Index != 1 || fe.ID != "cver_echo_1_1_0" ||
				fe.Field != "connector_type_id" || !errors.Is(err, registry.ErrAdmission) {
				t.Fatalf("apply: %v, want versions[1] refused for its disabled type", err)
			}
			// The staging it advises disables the instances in an apply of
			// their own, before the type is enabled: in one apply the type
			// would be enabled before the instances are disabled, routable
			// in between.
			for _, want := range []string{"connector type ctype_echo is disabled", "never enables", "enabled: true",
				"first a file that disables ctype_echo's instances", "keeps ctype_echo disabled", "not in one apply"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
			if len(rep.Entries) != 0 {
				t.Errorf("report %+v, want nothing applied", rep.Entries)
			}
			if rev, err := admin.CatalogRevision(ctx); err != nil || rev != before {
				t.Errorf("catalog revision %d (%v) after the refused apply, want %d", rev, err, before)
			}
			if ct, _ := admin.ConnectorType(ctx, "ctype_echo"); ct.Enabled {
				t.Error("the type was enabled")
			}
			// With the type enabled in the file, the version is admitted.
			enabled := strings.Replace(withNext, "    owner: team-echo\n    enabled: false\n", "    owner: team-echo\n", 1)
			if _, err := registry.Apply(ctx, admin, parse(t, []byte(enabled))); err != nil {
				t.Fatalf("apply with the type enabled: %v", err)
			}
			if _, err := admin.ConnectorVersion(ctx, "cver_echo_1_1_0"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// cancelOnBinding is an Administrator that ends the apply's context when
// the first binding is put, as Ctrl-C or an expired --timeout of aipfleet
// registry apply would.
type cancelOnBinding struct {
	registry.Administrator
	cancel context.CancelFunc
}

func (c cancelOnBinding) PutBinding(ctx context.Context, b registry.CapabilityBinding) error {
	c.cancel()
	return c.Administrator.PutBinding(ctx, b)
}

// cancelOnVersion ends the apply's context when the first version is
// admitted: the type the file disables was created enabled just before.
type cancelOnVersion struct {
	registry.Administrator
	cancel context.CancelFunc
}

func (c cancelOnVersion) AdmitVersion(ctx context.Context, v registry.ConnectorVersion) error {
	c.cancel()
	return c.Administrator.AdmitVersion(ctx, v)
}

// TestApplyCancelledKeepsDisabledTypesDisabled: an apply whose context
// ends midway (Ctrl-C, --timeout) still disables the types the file marks
// disabled, which it created enabled to admit their versions: it must not
// leave their instances and bindings routable. Cancelled while the
// versions are admitted, the disable runs on the way out, on a context of
// its own.
func TestApplyCancelledKeepsDisabledTypesDisabled(t *testing.T) {
	s := strings.Replace(string(docExample(t)), "    owner: team-echo\n\nversions:", "    owner: team-echo\n    enabled: false\n\nversions:", 1)
	for _, c := range []struct {
		section string
		wrap    func(registry.Administrator, context.CancelFunc) registry.Administrator
	}{
		{registry.SectionBindings, func(a registry.Administrator, cancel context.CancelFunc) registry.Administrator {
			return cancelOnBinding{a, cancel}
		}},
		{registry.SectionVersions, func(a registry.Administrator, cancel context.CancelFunc) registry.Administrator {
			return cancelOnVersion{a, cancel}
		}},
	} {
		for name, admin := range backends(t) {
			t.Run(c.section+"/"+name, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				_, err := registry.Apply(ctx, c.wrap(admin, cancel), parse(t, []byte(s)))
				var fe *registry.FleetFileError
				if !errors.As(err, &fe) || fe.Section != c.section || fe.Index != 0 || !errors.Is(err, context.Canceled) {
					t.Fatalf("apply: %v, want %s[0] cancelled", err, c.section)
				}
				ct, err := admin.ConnectorType(t.Context(), "ctype_echo")
				if err != nil {
					t.Fatal(err)
				}
				if ct.Enabled {
					t.Fatal("the cancelled apply left enabled the type the file disables")
				}
			})
		}
	}
}

// TestApplyNamesTheChangedFieldOfAnAdmittedVersion: a version is immutable;
// a file that changes an admitted one is refused naming the field that
// differs, with the stored and the file's value, on both backends and
// through AdmitVersion as through Apply.
func TestApplyNamesTheChangedFieldOfAnAdmittedVersion(t *testing.T) {
	example := string(docExample(t))
	for _, c := range []struct {
		old, new, field, says string
	}{
		{"    version: 1.0.0\n", "    version: 1.0\n", "version", `stored "1.0.0", here "1.0"`},
		{"sbom_digest: sha256:a0d1", "sbom_digest: sha256:b0d1", "attestation.sbom_digest", "stored \"sha256:a0d1"},
		{"echo.reverse: [invocation]", "echo.reverse: [invocation, retry]", "implementation_support.echo.reverse",
			"stored [invocation], here [invocation retry]"},
		{"description: Returns the text reversed.", "description: Returns the text backwards.", "manifest", "digest"},
	} {
		changed := strings.Replace(example, c.old, c.new, 1)
		if changed == example {
			t.Fatalf("the example has no %q", c.old)
		}
		for name, admin := range backends(t) {
			t.Run(c.field+"/"+name, func(t *testing.T) {
				ctx := t.Context()
				if _, err := registry.Apply(ctx, admin, parse(t, []byte(example))); err != nil {
					t.Fatal(err)
				}
				f := parse(t, []byte(changed))
				_, err := registry.Apply(ctx, admin, f)
				var fe *registry.FleetFileError
				if !errors.As(err, &fe) || fe.Section != registry.SectionVersions || fe.Field != c.field || !errors.Is(err, registry.ErrConflict) ||
					!strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "new version ID") {
					t.Errorf("apply: %v, want versions[0] refused naming %s (%s)", err, c.field, c.says)
				}
				err = admin.AdmitVersion(ctx, f.Versions[0])
				var field *registry.FieldError
				if !errors.As(err, &field) || field.Field != c.field || !strings.Contains(err.Error(), c.says) {
					t.Errorf("AdmitVersion: %v, want it refused naming %s (%s)", err, c.field, c.says)
				}
			})
		}
	}
}

// TestApplyExplainsAReplicaKeepsItsVersion: a replica entry without
// version_id takes its instance's current version; after the instance is
// upgraded in the file, the registered replica (whose version is fixed)
// is refused naming version_id and saying how to keep it, instead of only
// "pre-provision a new replica".
func TestApplyExplainsAReplicaKeepsItsVersion(t *testing.T) {
	ctx := t.Context()
	r, _ := newMem(t)
	if _, err := registry.Apply(ctx, r, parse(t, docExample(t))); err != nil {
		t.Fatal(err)
	}
	f := parse(t, docExample(t))
	stored := f.Replicas[2].VersionID
	f.Replicas[2].VersionID = "cver_echo_2_0_0" // as parsing gives it after the instance's upgrade
	_, err := registry.Apply(ctx, r, f)
	var fe *registry.FleetFileError
	if !errors.As(err, &fe) || fe.Section != registry.SectionReplicas || fe.Field != "version_id" || !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("apply: %v, want a conflict on replicas' version_id", err)
	}
	if !strings.Contains(err.Error(), "write version_id: "+stored) {
		t.Fatalf("%v does not say to write version_id: %s", err, stored)
	}
}

// visibleOnPut is an Administrator that, after each instance and binding
// it puts, asks the registry's tenant catalog whether the tenant's
// capabilities of that instance can be resolved — the chain routing
// follows (an enabled binding of an enabled instance, an active version,
// an enabled type) — and records the ones that can.
type visibleOnPut struct {
	registry.Administrator
	catalog registry.Catalog
	seen    *[]string
}

func (v visibleOnPut) check(ctx context.Context, when, tenant string, caps ...string) error {
	for _, c := range caps {
		if _, err := v.catalog.Capability(ctx, c, registry.ForTenant(tenant)); err == nil {
			*v.seen = append(*v.seen, fmt.Sprintf("%s: %s of tenant %s", when, c, tenant))
		} else if !errors.Is(err, registry.ErrNotFound) {
			return err
		}
	}
	return nil
}

func (v visibleOnPut) PutInstance(ctx context.Context, i registry.ConnectorInstance) error {
	if err := v.Administrator.PutInstance(ctx, i); err != nil {
		return err
	}
	return v.check(ctx, "after putting instance "+i.ID, i.TenantID, "echo.say", "echo.reverse")
}

func (v visibleOnPut) PutBinding(ctx context.Context, b registry.CapabilityBinding) error {
	if err := v.Administrator.PutBinding(ctx, b); err != nil {
		return err
	}
	return v.check(ctx, "after putting binding "+b.Key().String(), b.TenantID, b.CapabilityID)
}

// TestApplyDisablesTypesBeforeTheirInstances: a type the file marks
// disabled is created (or left) enabled only while its versions are
// admitted (the registry admits versions only into an enabled type) and
// disabled right after them: instances, replicas and bindings do not need
// it enabled, so none of the file's bindings of it is resolvable at any
// moment of the apply. Apply disabled such a type only at its end, so
// each binding was routable from its put until then.
func TestApplyDisablesTypesBeforeTheirInstances(t *testing.T) {
	s := strings.Replace(string(docExample(t)), "    owner: team-echo\n\nversions:", "    owner: team-echo\n    enabled: false\n\nversions:", 1)
	for name, admin := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			// Enabled in the file, the bindings are resolvable when put: the
			// check sees what it is meant to.
			probe, _ := newMem(t)
			var seen []string
			if _, err := registry.Apply(ctx, visibleOnPut{probe, probe, &seen}, parse(t, docExample(t))); err != nil {
				t.Fatal(err)
			}
			if len(seen) != 3 {
				t.Fatalf("with the type enabled, resolvable when put: %q; want the 3 bindings", seen)
			}
			seen = nil
			rep, err := registry.Apply(ctx, visibleOnPut{admin, admin.(registry.Catalog), &seen}, parse(t, []byte(s)))
			if err != nil {
				t.Fatal(err)
			}
			if len(seen) > 0 {
				t.Errorf("resolvable during the apply of a file that disables their type: %q", seen)
			}
			if ct, err := admin.ConnectorType(ctx, "ctype_echo"); err != nil || ct.Enabled {
				t.Errorf("type %+v (%v) after the apply, want it disabled", ct, err)
			}
			if i := slices.IndexFunc(rep.Entries, func(e registry.AppliedEntry) bool { return e.Section == registry.SectionTypes }); i < 0 || rep.Entries[i].Change != registry.Created {
				t.Errorf("report %+v, want the type created", rep.Entries)
			}
			if _, err := admin.ConnectorVersion(ctx, "cver_echo_1_0_0"); err != nil {
				t.Errorf("the version: %v", err)
			}
		})
	}
}

// TestApplyDisablesBindingsBeforeTheirInstanceSwitches: rolling an
// instance back (or on) to a version that lacks a capability is refused
// while an enabled binding needs it, so the file that switches the
// instance also disables that binding. Apply put the instances before the
// bindings, so that one file always failed at the instance ("disable or
// retarget those bindings first") although it did disable them: the
// bindings a file turns from enabled to disabled are put before the
// instances now, and the one file applies.
func TestApplyDisablesBindingsBeforeTheirInstanceSwitches(t *testing.T) {
	for name, admin := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			if _, err := registry.Apply(ctx, admin, parse(t, docExample(t))); err != nil {
				t.Fatal(err)
			}
			// A release without echo.reverse: acme's instance switches to it
			// and its echo.reverse binding is disabled, in one file.
			f := parse(t, docExample(t))
			v2 := f.Versions[0]
			v2.ID, v2.Version = "cver_echo_2_0_0", "2.0.0"
			v2.Attestation.ArtifactDigest = "sha256:" + strings.Repeat("2", 64)
			v2.Manifest.Capabilities = slices.DeleteFunc(slices.Clone(v2.Manifest.Capabilities), func(c aip.Capability) bool { return c.ID == "echo.reverse" })
			v2.ImplementationSupport = maps.Clone(v2.ImplementationSupport)
			delete(v2.ImplementationSupport, "echo.reverse")
			digest, err := aip.ManifestDigest(&v2.Manifest)
			if err != nil {
				t.Fatal(err)
			}
			v2.ManifestDigest = digest
			v2.Attestation.SchemaBundleDigest, err = registry.SchemaBundleDigest(&v2.Manifest)
			if err != nil {
				t.Fatal(err)
			}
			f.Versions = append(f.Versions, v2)
			f.Instances[0].VersionID, f.Instances[0].ConfigRevision = v2.ID, 2
			for i := range f.Replicas {
				if f.Replicas[i].InstanceID == f.Instances[0].ID {
					f.Replicas[i].VersionID = "cver_echo_1_0_0" // registered replicas keep their version
				}
			}
			if f.Bindings[1].CapabilityID != "echo.reverse" {
				t.Fatalf("the example's second binding is %s", f.Bindings[1].CapabilityID)
			}
			f.Bindings[1].Enabled, f.Bindings[1].PolicyRevision = false, 2
			rep, err := registry.Apply(ctx, admin, f)
			if err != nil {
				t.Fatalf("switching the instance and disabling the binding it no longer serves, in one file: %v", err)
			}
			inst, err := admin.ConnectorInstance(ctx, f.Instances[0].ID)
			if err != nil || inst.VersionID != v2.ID {
				t.Fatalf("instance %+v (%v), want it on %s", inst, err, v2.ID)
			}
			b, err := admin.CapabilityBinding(ctx, f.Bindings[1].Key())
			if err != nil || b.Enabled {
				t.Fatalf("binding %+v (%v), want it disabled", b, err)
			}
			var changed []string
			for _, e := range rep.Entries {
				if e.Change != registry.Unchanged {
					changed = append(changed, string(e.Change)+" "+e.Section+" "+e.ID)
				}
			}
			want := []string{"created versions cver_echo_2_0_0", "updated bindings acme/echo.reverse/cinst_acme_echo", "updated instances cinst_acme_echo"}
			if !slices.Equal(changed, want) {
				t.Errorf("changes %q, want %q (each entry once, in the order applied)", changed, want)
			}
			if len(rep.Entries) != len(f.Policies)+len(f.Types)+len(f.Versions)+len(f.Instances)+len(f.Replicas)+len(f.Bindings) {
				t.Errorf("%d entries reported, want one per entry of the file: %+v", len(rep.Entries), rep.Entries)
			}
			rep, err = registry.Apply(ctx, admin, f)
			if err != nil || rep.Changed() {
				t.Fatalf("re-applying: %v %+v", err, rep.Entries)
			}
		})
	}
}

// TestApplyExplainsHowToPreProvisionANewVersionsReplica: a replica is
// created only for its instance's current version, so an operator who
// pre-provisions the replicas of a new release before switching the
// instance (what a rolling restart does) is refused; the error says how
// the rollout goes instead, in place or on a second instance.
func TestApplyExplainsHowToPreProvisionANewVersionsReplica(t *testing.T) {
	ctx := t.Context()
	r, _ := newMem(t)
	if _, err := registry.Apply(ctx, r, parse(t, docExample(t))); err != nil {
		t.Fatal(err)
	}
	f := parse(t, docExample(t))
	v2 := f.Versions[0]
	v2.ID, v2.Version = "cver_echo_2_0_0", "2.0.0"
	v2.Attestation.ArtifactDigest = "sha256:" + strings.Repeat("2", 64)
	f.Versions = append(f.Versions, v2)
	rep := f.Replicas[0]
	rep.ID, rep.VersionID, rep.Endpoint = "crepl_acme_echo_v2", v2.ID, "https://echo-v2.acme.fleet.example.test:8081"
	f.Replicas = append(f.Replicas, rep)
	_, err := registry.Apply(ctx, r, f)
	var fe *registry.FleetFileError
	if !errors.As(err, &fe) || fe.Section != registry.SectionReplicas || fe.Field != "version_id" {
		t.Fatalf("apply: %v, want an error on the new replica's version_id", err)
	}
	for _, want := range []string{"switch instance cinst_acme_echo to " + v2.ID, "greater config_revision", "--config-revision",
		"declare a second instance of the tenant on " + v2.ID, "answered 503 until the first registers",
		// Lower number, not lower priority: a route tries the lowest
		// number first, and the new instance must be tried first.
		"at a lower priority number than cinst_acme_echo's bindings", "a route tries the lowest number first"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not say %q", err, want)
		}
	}
}

// TestDocErrorsAreTheCodes: the errors docs/fleet-file.md shows are what
// ParseFleetFile and Apply return for the edits of its example named
// here, with File set as aipfleet registry apply -f fleet.yaml sets it
// (and, for Apply's, the entry's line that command adds). Each is one
// sentence naming the file, the entry, its line and the field, without
// the sentinel's "registry: invalid: " (or "registry: conflict: ") in the
// middle, which the doc showed before; the errors still match their
// sentinels.
func TestDocErrorsAreTheCodes(t *testing.T) {
	doc, err := os.ReadFile("../docs/fleet-file.md")
	if err != nil {
		t.Fatal(err)
	}
	_, shown, _ := strings.Cut(string(doc), "\n## Errors\n")
	_, shown, _ = strings.Cut(shown, "```\n")
	shown, _, _ = strings.Cut(shown, "```")
	base := string(docExample(t))
	once := func(s, old, new string) string {
		t.Helper()
		if strings.Count(s, old) < 1 {
			t.Fatalf("the example has no %q", old)
		}
		return strings.Replace(s, old, new, 1)
	}
	var got []string
	for _, c := range []struct {
		name   string
		edit   func(string) string
		target error
	}{
		{"not YAML", func(s string) string { return once(s, "    name: echo\n", "    name: echo: 1\n") }, registry.ErrInvalid},
		{"bad zone", func(s string) string { return once(s, "zone: eu-west-1b", `zone: "eu west 1b"`) }, registry.ErrInvalid},
		{"misspelled field", func(s string) string {
			return once(s, "capacity_class: standard}\n    capacity: 8", "capacity_class: standard}\n    capacty: 8")
		}, registry.ErrInvalid},
		{"no config revision", func(s string) string {
			return once(s, "    config_revision: 1\n", "")
		}, registry.ErrInvalid},
		{"unknown kind", func(s string) string {
			i := strings.Index(s, "- id: echo.reverse")
			return s[:i] + once(s[i:], "kind: tool", "kind: toool")
		}, registry.ErrInvalid},
	} {
		_, err := registry.ParseFleetFile([]byte(c.edit(base)))
		var fe *registry.FleetFileError
		if !errors.As(err, &fe) || !errors.Is(err, c.target) {
			t.Fatalf("%s: %v, want a *FleetFileError matching %v", c.name, err, c.target)
		}
		fe.File = "fleet.yaml"
		got = append(got, err.Error())
	}
	for _, c := range []struct {
		name   string
		mod    func(*registry.FleetFile)
		target error
	}{
		{"instance change without a new revision", func(f *registry.FleetFile) { f.Instances[0].SecretProviderRef = "vault://other" }, registry.ErrConflict},
		{"changed release", func(f *registry.FleetFile) { f.Versions[0].Version = "1.0" }, registry.ErrConflict},
	} {
		r, _ := newMem(t)
		if _, err := registry.Apply(t.Context(), r, parse(t, docExample(t))); err != nil {
			t.Fatal(err)
		}
		f := parse(t, docExample(t))
		c.mod(f)
		_, err := registry.Apply(t.Context(), r, f)
		var fe *registry.FleetFileError
		if !errors.As(err, &fe) || !errors.Is(err, c.target) {
			t.Fatalf("%s: %v, want a *FleetFileError matching %v", c.name, err, c.target)
		}
		fe.File = "fleet.yaml"
		fe.Line = entryLine(t, base, fe.Section, fe.Index)
		got = append(got, err.Error())
	}
	for _, e := range got {
		if strings.Contains(e, "registry:") {
			t.Errorf("the error has a sentinel's text in the middle: %s", e)
		}
		if !strings.Contains("\n"+shown, "\n"+e+"\n") {
			t.Errorf("docs/fleet-file.md's errors do not show\n%s", e)
		}
	}
}

// entryLine is the line of entry i of section in the fleet file s.
func entryLine(t *testing.T, s, section string, i int) int {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(s), &doc); err != nil {
		t.Fatal(err)
	}
	root := doc.Content[0]
	for k := 0; k+1 < len(root.Content); k += 2 {
		if root.Content[k].Value == section {
			return root.Content[k+1].Content[i].Line
		}
	}
	t.Fatalf("no %s[%d]", section, i)
	return 0
}

// TestFleetFileRefusesAVersionNoReplicaCanSignAs: a version whose manifest
// agent ID no replica's peer_principal_id can equal (here an invisible
// formatting character) is refused at its own entry, in one sentence
// naming the file, the entry, its line, the field and the character, and
// what to fix; it was admitted, and the file failed at its first replica,
// with an error about the replica's peer_principal_id. Apply refuses it
// likewise in a file built in code, before any replica is put.
func TestFleetFileRefusesAVersionNoReplicaCanSignAs(t *testing.T) {
	const rule = ": every replica of the version signs as its manifest's agent, and a replica's peer_principal_id, which must equal the agent ID, " +
		"is 1 to 256 bytes of UTF-8 text without control characters, invisible formatting characters (Unicode Cf) or white space at either end, " +
		"so no replica of this version could ever be provisioned; fix the agent ID in the connector's manifest and admit that manifest"
	base := string(docExample(t))
	// The replicas take their principal from the version, as a file
	// usually leaves it.
	edited := strings.ReplaceAll(base, "    peer_principal_id: service:echo\n", "")
	edited = strings.Replace(edited, "        id: service:echo\n", "        id: \"service:echo\\u200b\"\n", 1)
	if strings.Contains(edited, "peer_principal_id") || !strings.Contains(edited, `\u200b`) {
		t.Fatal("the edits did not apply to the example")
	}
	line := 0
	for i, l := range strings.Split(edited, "\n") {
		if l == "  - id: cver_echo_1_0_0" {
			line = i + 1
		}
	}
	_, err := registry.ParseFleetFile([]byte(edited))
	var fe *registry.FleetFileError
	if !errors.As(err, &fe) || !errors.Is(err, registry.ErrInvalid) {
		t.Fatalf("parse: %v, want a *FleetFileError matching ErrInvalid", err)
	}
	fe.File = "fleet.yaml" // as aipfleet registry apply names it
	want := fmt.Sprintf(`fleet file fleet.yaml: versions[0] cver_echo_1_0_0 (line %d): manifest.agent.id "service:echo\u200b" holds the invisible formatting character '\u200b' (U+200B) at byte 12`, line) + rule
	if got := err.Error(); got != want {
		t.Fatalf("error:\n got %s\nwant %s", got, want)
	}

	ctx := t.Context()
	r, clock := newMem(t)
	m := registrytest.Manifest("service:x\x01", []aip.Capability{registrytest.Capability("x.do", "does x")})
	rep := registrytest.Replica("crepl_x", "cinst_x", "cver_x1", clock.Now().Add(time.Minute))
	rep.PeerPrincipalID = m.Agent.ID
	f := &registry.FleetFile{
		Types:     []registry.ConnectorType{{ID: "ctype_x", Name: "x", Owner: "owner-x", Enabled: true}},
		Versions:  []registry.ConnectorVersion{registrytest.Version("cver_x1", "ctype_x", "1", "owner-x", registry.VersionActive, m)},
		Instances: []registry.ConnectorInstance{{ID: "cinst_x", ConnectorTypeID: "ctype_x", VersionID: "cver_x1", TenantID: "t", ConfigRevision: 1, SecretProviderRef: "s", Status: registry.InstanceEnabled}},
		Replicas:  []registry.ConnectorReplica{rep},
	}
	report, err := registry.Apply(ctx, r, f)
	want = `fleet file: versions[0] cver_x1: manifest.agent.id "service:x\x01" holds the control character '\x01' (U+0001) at byte 9` + rule
	if !errors.As(err, &fe) || !errors.Is(err, registry.ErrInvalid) || err.Error() != want {
		t.Fatalf("apply:\n got %v\nwant %s", err, want)
	}
	if got := report.Count(registry.Created); got != 1 {
		t.Fatalf("apply created %d records, want the type only: %+v", got, report.Entries)
	}
	if _, err := r.ConnectorVersion(ctx, "cver_x1"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("the version was admitted: %v", err)
	}
}
