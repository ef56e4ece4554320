package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Files dev writes for the hosts of a connector of your own (dev
// --fleet-file): the fleet's side of the common host settings as
// AIP_CONNECTOR_HOST_* variables, and each replica's whole command line.
const (
	devHostEnvFile      = "host.env"
	devHostCommandsFile = "host-commands.txt"
)

// Placeholders of the host command lines dev prints: the program (your
// hostsdk main, or aip-sidecar with its own flags) and the replica's key
// file, which dev cannot know.
const (
	hostProgramPlaceholder = "YOUR_HOST"
	hostKeyPlaceholder     = "KEY_FILE"
)

// ownFleet is the operator's fleet file of dev --fleet-file: applied after
// dev's own fleet at every start; the hosts of its replicas run outside
// dev.
type ownFleet struct {
	name  string // as given
	raw   []byte
	fleet *registry.FleetFile
}

// loadOwnFleet reads and checks the fleet file as registry apply does.
func loadOwnFleet(name string) (*ownFleet, error) {
	raw, err := aip.ReadPublicFile(name, registry.MaxFleetFileBytes)
	if err != nil {
		return nil, flagFileError("dev", "--fleet-file", err)
	}
	fleet, err := registry.ParseFleetFile(raw)
	if err != nil {
		return nil, settingError(inFleetFile(err, "dev", name, raw))
	}
	return &ownFleet{name: name, raw: raw, fleet: fleet}, nil
}

// entryError is a *registry.FleetFileError about field of entry i of
// section, with the file's name and the entry's line in the file.
func (o *ownFleet) entryError(section string, i int, id, field string, format string, args ...any) error {
	return &registry.FleetFileError{File: o.name, Section: section, Index: i, ID: id, Field: field,
		Line: entryLine(o.raw, section, i), Err: fmt.Errorf(format, args...)}
}

// checkOwnFleet refuses what would break dev's own fleet: a replica
// endpoint on one of dev's addresses, records with dev's own IDs, and
// bindings to dev's own instance (dev applies its own records at every
// start, so the two would take turns). The file is to fix, which starting
// dev again cannot: a setting error (exit status 2), starting with "dev:"
// (inFleetFile). It exited 1 and started with "fleet file".
func (f *devFleet) checkOwnFleet(o *ownFleet) error {
	if err := f.ownFleetClash(o); err != nil {
		return settingError(inFleetFile(err, "dev", o.name, o.raw))
	}
	return nil
}

// ownFleetClash is checkOwnFleet's check: the first entry of o that
// clashes with dev's own fleet.
func (f *devFleet) ownFleetClash(o *ownFleet) error {
	// dev listens on 127.0.0.1, and the host command printed for a replica
	// binds its endpoint's host and port: an endpoint at 127.0.0.1 or
	// localhost on one of dev's ports clashes.
	devPorts := map[string]string{}
	for addr, what := range map[string]string{f.dispatchAddr(): "dev's dispatcher", f.controlAddr(): "dev's control plane"} {
		_, port, _ := net.SplitHostPort(addr)
		devPorts[port] = what
	}
	for i := range f.state.ReplicaIDs {
		_, port, _ := net.SplitHostPort(f.replicaAddr(i))
		devPorts[port] = "dev's " + replicaName(i)
	}
	devIDs := map[string]bool{f.state.TypeID: true, f.state.VersionID: true, f.state.InstanceID: true}
	for _, id := range f.state.ReplicaIDs {
		devIDs[id] = true
	}
	for i, t := range o.fleet.Types {
		if devIDs[t.ID] {
			return o.entryError(registry.SectionTypes, i, t.ID, "id", "is the ID of dev's own %s connector type; give yours another", f.connector)
		}
	}
	for i, v := range o.fleet.Versions {
		if devIDs[v.ID] {
			return o.entryError(registry.SectionVersions, i, v.ID, "id", "is the ID of dev's own %s version; give yours another", f.connector)
		}
	}
	for i, inst := range o.fleet.Instances {
		if devIDs[inst.ID] {
			return o.entryError(registry.SectionInstances, i, inst.ID, "id", "is the ID of dev's own %s instance; give yours another", f.connector)
		}
	}
	for i, r := range o.fleet.Replicas {
		if devIDs[r.ID] {
			return o.entryError(registry.SectionReplicas, i, r.ID, "id", "is the ID of one of dev's own replicas; give yours another")
		}
		if u, err := url.Parse(r.Endpoint); err == nil {
			host := u.Hostname()
			if what, ok := devPorts[u.Port()]; ok && (host == "127.0.0.1" || strings.EqualFold(host, "localhost")) {
				return o.entryError(registry.SectionReplicas, i, r.ID, "endpoint", "%q is the address of %s (dev uses ports %d to %d): give your replica another port",
					r.Endpoint, what, f.state.PortBase, f.state.PortBase+firstReplicaOffset+len(f.state.ReplicaIDs)-1)
			}
		}
	}
	for i, b := range o.fleet.Bindings {
		if b.InstanceID == f.state.InstanceID {
			return o.entryError(registry.SectionBindings, i, b.Key().String(), "instance_id",
				"is dev's own %s instance, whose bindings dev applies at every start; bind an instance of yours", f.connector)
		}
	}
	return nil
}

// applyOwnFleet applies the file through reg after dev's fleet; an error
// names the file, the entry and its line. Applying the same file again
// changes nothing; records from an earlier run of a changed file are
// compared as registry apply compares them.
func applyOwnFleet(ctx context.Context, reg registry.Administrator, o *ownFleet) (registry.ApplyReport, error) {
	rep, err := registry.Apply(ctx, reg, o.fleet)
	if err == nil {
		return rep, nil
	}
	err = inFleetFile(err, "dev", o.name, o.raw)
	hint := "fix the file"
	if errors.Is(err, registry.ErrConflict) {
		// The registry's error says what to change in the entry (a new
		// version ID, a higher revision); this says why it meets one.
		hint = "the registry of this dev state (registry.json) holds what an earlier run applied"
	}
	return rep, fmt.Errorf("%w; %s, or pass --reset to start from an empty registry", err, hint)
}

// ownReplica is a replica of the operator's fleet file with what its host
// needs, read back from the registry.
type ownReplica struct {
	replica  registry.ConnectorReplica
	instance registry.ConnectorInstance
	version  registry.ConnectorVersion
}

func (f *devFleet) ownReplicas(ctx context.Context, reg registry.Reader, o *ownFleet) ([]ownReplica, error) {
	var out []ownReplica
	for _, r := range o.fleet.Replicas {
		rec, err := reg.ConnectorReplica(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		inst, err := reg.ConnectorInstance(ctx, rec.InstanceID)
		if err != nil {
			return nil, err
		}
		v, err := reg.ConnectorVersion(ctx, rec.VersionID)
		if err != nil {
			return nil, err
		}
		out = append(out, ownReplica{replica: rec, instance: inst, version: v})
	}
	return out, nil
}

// hostSettings is the dev fleet's side of the common host settings: what
// any host joining it needs, whatever its replica. Its names are hostsdk's
// flags; the variables are AIP_CONNECTOR_HOST_<env>.
func (f *devFleet) hostSettings() []struct{ flag, env, value string } {
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	return []struct{ flag, env, value string }{
		{"control-plane-endpoint", "CONTROL_ENDPOINT", "http://" + f.controlAddr() + aip.ControlPath},
		{"control-plane-did", "CONTROL_DID", f.keys.control.DID()},
		{"gateway-principal-id", "GATEWAY_PRINCIPAL_ID", DefaultGatewayPrincipal},
		{"gateway-did", "GATEWAY_DID", f.keys.dispatcher.DID()},
		{"event-endpoint", "EVENT_ENDPOINT", "http://" + f.dispatchAddr() + aip.EventsPath},
		{"lease-ttl-ms", "LEASE_TTL_MS", ms(devLeaseTTL)},
		{"heartbeat-interval-ms", "HEARTBEAT_MS", ms(devHeartbeat)},
		{"allow-insecure-loopback-http", "ALLOW_LOOPBACK_HTTP", "true"},
	}
}

// hostEnv renders host.env: the fleet's side of the host settings as
// variables a hostsdk program (and aip-sidecar) reads.
func (f *devFleet) hostEnv() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by aipfleet dev at every start: what a connector host of your own
# (a hostsdk program, or aip-sidecar) needs to join this dev fleet, as the
# variables every host reads. Load them and give the host its replica's
# identity (the banner of aipfleet dev --fleet-file prints each replica's
# whole command line, also in %s):
#   set -a; . %s; set +a
# dev's own replicas run in trust domain %s; a replica of yours runs in the
# trust_domain of its record (--trust-domain). Tokens for any tenant:
#   aipfleet token --issuer-key %s --tenant TENANT
`, f.path(devHostCommandsFile), f.path(devHostEnvFile), devTrustDomain, f.path("keys", "issuer.key"))
	for _, s := range f.hostSettings() {
		fmt.Fprintf(&b, "AIP_CONNECTOR_HOST_%s=%s\n", s.env, s.value)
	}
	return []byte(b.String())
}

// hostCommand is a replica's host command line: the fleet's settings and
// the replica's identity from the registry, the program and key file as
// placeholders.
func (f *devFleet) hostCommand(r ownReplica) [][]string {
	// The host listens where its registered endpoint points.
	bind := r.replica.Endpoint
	if u, err := url.Parse(r.replica.Endpoint); err == nil {
		bind = u.Host
		if u.Port() == "" {
			port := "80"
			if u.Scheme == "https" {
				port = "443"
			}
			bind = net.JoinHostPort(u.Hostname(), port)
		}
	}
	lines := [][]string{{hostProgramPlaceholder}, {"--bind", bind, "--public-endpoint", r.replica.Endpoint}}
	settings := f.hostSettings()
	for i := 0; i < len(settings); i += 2 {
		var line []string
		for _, s := range settings[i:min(i+2, len(settings))] {
			if s.value == "true" {
				line = append(line, "--"+s.flag)
			} else {
				line = append(line, "--"+s.flag, s.value)
			}
		}
		lines = append(lines, line)
	}
	lines = append(lines,
		[]string{"--connector-type-id", r.version.ConnectorTypeID, "--version-id", r.replica.VersionID},
		[]string{"--instance-id", r.instance.ID, "--replica-id", r.replica.ID},
		[]string{"--tenant-id", r.instance.TenantID, "--trust-domain", r.replica.TrustDomain},
		[]string{"--secret-provider-ref", r.instance.SecretProviderRef, "--config-revision", strconv.FormatUint(r.instance.ConfigRevision, 10)},
		[]string{"--artifact-digest", r.version.Attestation.ArtifactDigest},
		[]string{"--state-dir", f.path("host-" + r.replica.ID)},
		[]string{"--signing-seed-file", hostKeyPlaceholder},
	)
	return lines
}

// writeHostCommand writes a host command line, one line of flags per
// row, shell-quoted, continued with backslashes.
func writeHostCommand(w io.Writer, indent string, lines [][]string) {
	for i, line := range lines {
		quoted := make([]string, len(line))
		for j, a := range line {
			quoted[j] = shellQuote(a)
		}
		sep := " \\"
		if i == len(lines)-1 {
			sep = ""
		}
		lead := indent
		if i > 0 {
			lead += "  "
		}
		fmt.Fprintf(w, "%s%s%s\n", lead, strings.Join(quoted, " "), sep)
	}
}

// hostCommands renders host-commands.txt: every replica's command line.
func (f *devFleet) hostCommands(o *ownFleet, reps []ownReplica) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by aipfleet dev at every start: the host command line of each\n"+
		"# replica of %s. Replace %s with your host program (or\n"+
		"# aip-sidecar and its own flags) and %s with the replica's key file,\n"+
		"# the one whose did:key is its peer_did (aipfleet keygen --did-of FILE).\n"+
		"# aip-sidecar's --exec CMD (or --mcp-command CMD) goes last, after the key\n"+
		"# file: everything after it is the connector's command line.\n", o.name, hostProgramPlaceholder, hostKeyPlaceholder)
	for _, r := range reps {
		fmt.Fprintf(&b, "\n# %s (tenant %s, instance %s)\n", r.replica.ID, r.instance.TenantID, r.instance.ID)
		writeHostCommand(&b, "", f.hostCommand(r))
	}
	return []byte(b.String())
}

// ownBanner is the part of the ready banner about the operator's fleet
// file: its replicas, how to run their hosts (or that it lists none), how
// to reach its tenants.
func (f *devFleet) ownBanner(w io.Writer, o *ownFleet, reps []ownReplica) {
	cli := cliName()
	if len(reps) == 0 {
		// No host to start: no "Start each replica's host" with no
		// command under it.
		fmt.Fprintf(w, "\nYour fleet file %s lists no replicas: there is no host to start.\n", o.name)
	} else {
		offline := "offline until your host registers (dev does not start it)"
		if len(reps) != 1 {
			offline = "offline until their hosts register (dev does not start them)"
		}
		fmt.Fprintf(w, "\nYour fleet file %s: %s, %s:\n", o.name, plural(len(reps), "replica"), offline)
		for _, r := range reps {
			fmt.Fprintf(w, "  %s  tenant %s  %s\n", r.replica.ID, r.instance.TenantID, r.replica.Endpoint)
		}
		fmt.Fprintf(w, "\nStart each replica's host like this, %s being your host program (or\n"+
			"aip-sidecar and its own flags) and %s the key whose did:key is the replica's\n"+
			"peer_did (aipfleet keygen --did-of FILE prints a key's); aip-sidecar's --exec CMD\n"+
			"(or --mcp-command CMD) goes last, after the key: everything after it is the\n"+
			"connector's command line. The commands are also in %s,\n"+
			"and the fleet's side alone, as variables, in %s.\n",
			hostProgramPlaceholder, hostKeyPlaceholder, f.path(devHostCommandsFile), f.path(devHostEnvFile))
		for _, r := range reps {
			fmt.Fprintln(w)
			writeHostCommand(w, "  ", f.hostCommand(r))
		}
	}
	// One line per tenant of the file's bindings: tokens of dev's issuer.
	var tenants []string
	firstCap, firstInput := map[string]string{}, map[string]string{}
	for _, b := range o.fleet.Bindings {
		if !slices.Contains(tenants, b.TenantID) {
			tenants = append(tenants, b.TenantID)
			firstCap[b.TenantID] = b.CapabilityID
			if in, ok := f.exampleInput(o.fleet, b); ok {
				firstInput[b.TenantID] = in
			}
		}
	}
	if len(tenants) == 0 {
		return
	}
	issuerKey := shellQuote(f.path("keys", "issuer.key"))
	var devFlags string
	if filepath.Clean(f.dir) != DefaultDevStateDir {
		devFlags = " --dev-state-dir " + shellQuote(f.dir)
	}
	fmt.Fprintf(w, "\nYour tenants' actions go through dev's dispatcher with a token of dev's issuer\n"+
		"(the dev token is for %s only; a token for another tenant:\n  %s token --issuer-key %s --tenant TENANT):\n", DevTenant, cli, issuerKey)
	for _, t := range tenants {
		in, ok := firstInput[t]
		if ok {
			fmt.Fprintf(w, "  %s action send%s --tenant %s --issuer-key %s --capability %s --input %s\n",
				cli, devFlags, shellQuote(t), issuerKey, shellQuote(firstCap[t]), shellQuote(in))
			continue
		}
		// No example of its input dev can vouch for: JSON to fill in,
		// and the command that prints the schema it must pass.
		fmt.Fprintf(w, "  %s action send%s --tenant %s --issuer-key %s --capability %s --input JSON\n"+
			"    (JSON: an input its input_schema accepts, which %s capability get%s --tenant %s --issuer-key %s %s prints)\n",
			cli, devFlags, shellQuote(t), issuerKey, shellQuote(firstCap[t]),
			cli, devFlags, shellQuote(t), issuerKey, shellQuote(firstCap[t]))
	}
}

// writeHostFiles writes host.env and, with --fleet-file, host-commands.txt
// (removing one an earlier run with a fleet file left).
func (f *devFleet) writeHostFiles(reps []ownReplica) error {
	if err := writeFileAtomic(f.path(devHostEnvFile), 0o644, writeBytes(f.hostEnv())); err != nil {
		return err
	}
	if f.own == nil {
		if err := os.Remove(f.path(devHostCommandsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return writeFileAtomic(f.path(devHostCommandsFile), 0o644, writeBytes(f.hostCommands(f.own, reps)))
}

// exampleInput is an input for the binding's capability to print in a
// command: the input schema's required properties, each with a
// placeholder of its type ("..." for a string), to be edited; "{}" when
// the schema requires none. The capability's schema is that of the
// binding's instance's version, in the file or dev's own (an instance of
// yours may run dev's connector). ok is false when that schema cannot be
// found or read, or the example would not pass it (a minimum, a pattern,
// an enum): the banner then prints no input to copy, only where the
// schema is. It printed "{}", which echo.say refuses.
func (f *devFleet) exampleInput(o *registry.FleetFile, b registry.CapabilityBinding) (input string, ok bool) {
	var c *aip.Capability
	for _, inst := range o.Instances {
		if inst.ID != b.InstanceID {
			continue
		}
		if inst.VersionID == f.state.VersionID {
			c, _ = f.manifest.Capability(b.CapabilityID)
		}
		for _, v := range o.Versions {
			if v.ID == inst.VersionID {
				c, _ = v.Manifest.Capability(b.CapabilityID)
			}
		}
	}
	if c == nil {
		return "", false
	}
	var s struct {
		Required   []string `json:"required"`
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
	}
	if json.Unmarshal(c.InputSchema, &s) != nil {
		return "", false
	}
	example := make(map[string]any, len(s.Required))
	for _, name := range s.Required {
		t, _ := s.Properties[name].Type.(string)
		switch t {
		case "integer", "number":
			example[name] = 0
		case "boolean":
			example[name] = false
		case "array":
			example[name] = []any{}
		case "object":
			example[name] = map[string]any{}
		case "null":
			example[name] = nil
		default:
			example[name] = "..."
		}
	}
	out, err := json.Marshal(example)
	if err != nil || !passesSchema(c.InputSchema, out) {
		return "", false
	}
	return string(out), true
}

// passesSchema reports whether doc is valid under schema, compiled as a
// host compiles a capability's input schema (draft 2020-12 unless the
// schema says otherwise; no $ref is fetched).
func passesSchema(schema json.RawMessage, doc []byte) bool {
	sd, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return false
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noSchemaLoader{})
	const url = "urn:aipfleet:dev:example-input-schema"
	if c.AddResource(url, sd) != nil {
		return false
	}
	compiled, err := c.Compile(url)
	if err != nil {
		return false
	}
	d, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	return err == nil && compiled.Validate(d) == nil
}

// noSchemaLoader loads no schema reference: capability schemas are
// self-contained.
type noSchemaLoader struct{}

func (noSchemaLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema reference %s is not loaded", url)
}
