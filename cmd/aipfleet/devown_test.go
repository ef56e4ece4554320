package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
)

// notesFleetFile is the connector guide's fleet file of the notes
// connector (section 5), with the replica's key and port replaced.
func notesFleetFile(t *testing.T, peerDID string, port int) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "connector-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "<!-- notes-fleet-file -->\n```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("the connector guide has no notes fleet file")
	}
	block = replaceField(t, block, "peer_did", peerDID)
	block = strings.Replace(block, "http://127.0.0.1:8101/", "http://127.0.0.1:"+strconv.Itoa(port)+"/", 1)
	return []byte(block)
}

func replaceField(t *testing.T, yamlText, field, value string) string {
	t.Helper()
	var out []string
	n := 0
	for _, line := range strings.Split(yamlText, "\n") {
		if k, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			line = line[:strings.Index(line, field)] + field + ": " + value
			n++
		}
		out = append(out, line)
	}
	if n != 1 {
		t.Fatalf("%d %s fields in the fleet file", n, field)
	}
	return strings.Join(out, "\n")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// printedCommand returns the lines of the command that starts with first
// in out, joined at their trailing backslashes.
func printedCommand(out, first string) string {
	var cmd []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !in && !strings.HasPrefix(line, first) {
			continue
		}
		in = true
		more := strings.HasSuffix(line, "\\")
		cmd = append(cmd, strings.TrimSuffix(line, "\\"))
		if !more {
			break
		}
	}
	return strings.Join(cmd, " ")
}

// TestDevRunsYourOwnReplica: aipfleet dev --fleet-file applies a connector
// author's fleet file (the connector guide's, for the notes connector); a
// replica of it, run outside dev by its own program started with the
// command line dev prints, registers with dev's control plane and serves an
// action sent through dev's dispatcher for the file's tenant with the token
// command dev prints. A restart with the same file changes nothing and a
// file whose admitted version changed is refused, naming the file, the
// entry and its line.
func TestDevRunsYourOwnReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("builds aipfleet and the notes host and runs them as processes")
	}
	bin := buildCLI(t)
	hostBin := filepath.Join(t.TempDir(), "noteshost")
	if out, err := exec.Command("go", "build", "-o", hostBin, "../../docs/connectorguide/noteshost").CombinedOutput(); err != nil {
		t.Fatalf("go build noteshost: %v\n%s", err, out)
	}
	work := t.TempDir()
	state := filepath.Join(work, "state")
	keyFile := filepath.Join(work, "notes-1.key")
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := aip.WriteSeedFile(keyFile, key); err != nil {
		t.Fatal(err)
	}
	fleetFile := filepath.Join(work, "notes-fleet.yaml")
	notesPort := freePort(t)
	os.WriteFile(fleetFile, notesFleetFile(t, key.DID(), notesPort), 0o644)

	env := append(environWithoutAIP(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	base := freePortBase(t, 1)
	devArgs := []string{"dev", "--state-dir", state, "--replicas", "1", "--port-base", strconv.Itoa(base), "--fleet-file", fleetFile}
	dev := startDev(t, bin, work, env, devArgs)
	dev.waitFor(t, "dev's ready banner", func() bool { return strings.Contains(dev.stdout.String(), "Your tenants' actions") })
	banner := dev.stdout.String()

	// The host's command line, as printed and as written to the state
	// directory; host.env has the fleet's side.
	hostLine := printedCommand(banner, hostProgramPlaceholder+" ")
	if !strings.Contains(hostLine, "--replica-id crepl_0192a8f0c1d27e3f8a4b5c6d7e8f9004") || !strings.Contains(hostLine, "--tenant-id acme") {
		t.Fatalf("the banner's host command: %q\n%s", hostLine, banner)
	}
	written, err := os.ReadFile(filepath.Join(state, devHostCommandsFile))
	if err != nil || printedCommand(string(written), hostProgramPlaceholder+" ") != hostLine {
		t.Fatalf("%s holds another command (%v):\n%s", devHostCommandsFile, err, written)
	}
	hostEnv, err := os.ReadFile(filepath.Join(state, devHostEnvFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"AIP_CONNECTOR_HOST_CONTROL_DID=did:key:", "AIP_CONNECTOR_HOST_GATEWAY_DID=did:key:",
		"AIP_CONNECTOR_HOST_GATEWAY_PRINCIPAL_ID=" + DefaultGatewayPrincipal,
		"AIP_CONNECTOR_HOST_CONTROL_ENDPOINT=http://127.0.0.1:" + strconv.Itoa(base+controlPortOffset) + aip.ControlPath,
		"AIP_CONNECTOR_HOST_EVENT_ENDPOINT=http://127.0.0.1:" + strconv.Itoa(base) + aip.EventsPath} {
		if !strings.Contains(string(hostEnv), want) {
			t.Errorf("%s lacks %s:\n%s", devHostEnvFile, want, hostEnv)
		}
	}

	// The author's host, started as printed.
	script := strings.Replace(strings.Replace(hostLine, hostProgramPlaceholder, shellQuote(hostBin), 1), hostKeyPlaceholder, shellQuote(keyFile), 1)
	host := exec.Command("sh", "-c", "exec "+script)
	host.Dir, host.Env = work, environWithoutAIP()
	var hostLog lockedBuffer
	host.Stdout, host.Stderr = &hostLog, &hostLog
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	hostDone := make(chan error, 1)
	go func() { hostDone <- host.Wait() }()
	defer func() {
		select {
		case <-hostDone:
		default:
			host.Process.Kill()
			<-hostDone
		}
		if t.Failed() {
			t.Logf("--- noteshost log:\n%s", lastLines(hostLog.String(), 40))
		}
	}()
	pollUntil(t, "the notes replica to register", func() bool {
		select {
		case err := <-hostDone:
			hostDone <- err
			t.Fatalf("noteshost exited: %v", err)
		default:
		}
		return strings.Contains(hostLog.String(), "serving")
	})

	// One action for tenant acme, with the command dev printed.
	_, tenants, _ := strings.Cut(banner, "Your tenants' actions")
	send := printedCommand(tenants, "aipfleet action send")
	if !strings.Contains(send, "--tenant acme") {
		t.Fatalf("the banner's action command: %q", send)
	}
	// The printed input has the capability's required members, to edit.
	if !strings.Contains(send, `--capability notes.add --input '{"text":"..."}'`) {
		t.Fatalf("the banner's action command %q does not show notes.add's required text", send)
	}
	send = strings.Replace(send, `--input '{"text":"..."}'`, `--input '{"text":"buy milk"}'`, 1)
	var out, errOut bytes.Buffer
	cmd := exec.Command("sh", "-c", send)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = work, env, &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s%s", send, err, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "buy milk") || !strings.Contains(out.String(), "crepl_0192a8f0c1d27e3f8a4b5c6d7e8f9004") {
		t.Fatalf("%s:\n%s", send, out.String())
	}

	// The author's host drains; dev stops cleanly, its own replica offline.
	host.Process.Signal(syscall.SIGTERM)
	if err := <-hostDone; err != nil {
		t.Fatalf("noteshost after SIGTERM: %v", err)
	}
	hostDone <- nil
	stopDev(t, dev)

	// The same file again: everything unchanged.
	dev = startDev(t, bin, work, env, devArgs)
	dev.waitFor(t, "dev's ready banner", func() bool { return strings.Contains(dev.stdout.String(), "Your tenants' actions") })
	if log := dev.stderr.String(); !strings.Contains(log, "your fleet file applied") || !strings.Contains(log, "created=0 updated=0 unchanged=6") {
		t.Errorf("the restarted dev did not reapply the same file unchanged:\n%s", lastLines(log, 30))
	}
	stopDev(t, dev)

	// A changed release under the same version ID is refused by name.
	changed := bytes.Replace(notesFleetFile(t, key.DID(), notesPort), []byte("Stores a note for the tenant"), []byte("Keeps a note for the tenant"), 1)
	os.WriteFile(fleetFile, changed, 0o644)
	dev = startDev(t, bin, work, env, devArgs)
	select {
	case <-dev.done:
	case <-time.After(time.Minute):
		t.Fatal("dev did not stop on a changed fleet file")
	}
	line := lineOf(t, changed, "  - id: cver_", 1)
	for _, want := range []string{"dev: fleet file " + fleetFile + ": versions[0] cver_0192a8f0c1d27e3f8a4b5c6d7e8f9002 (line " + line + "): manifest differs from the admitted version", "new version ID", "--reset"} {
		if dev.err == nil || !strings.Contains(dev.stderr.String(), want) {
			t.Errorf("dev with a changed version: %v, want an error with %q:\n%s", dev.err, want, lastLines(dev.stderr.String(), 5))
		}
	}
	// Said once: dev's own hint does not repeat the registry's advice.
	if n := strings.Count(dev.stderr.String(), "versions are immutable"); n != 1 {
		t.Errorf("the error says 'versions are immutable' %d times:\n%s", n, lastLines(dev.stderr.String(), 5))
	}
}

// stopDev stops dev with SIGINT and requires exit status 0.
func stopDev(t *testing.T, p *devProc) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("aipfleet dev did not exit within a minute of SIGINT")
	}
	if p.err != nil {
		t.Fatalf("aipfleet dev exited with %v after SIGINT, want status 0:\n%s", p.err, lastLines(p.stderr.String(), 20))
	}
}

// TestDevRefusesAFleetFileThatClashes: a replica on one of dev's ports
// (replica, dispatcher, control plane), a binding to dev's own instance, or a
// type, version, instance or replica with one of dev's IDs is refused before
// anything is applied, naming the entry and its line. Each of checkOwnFleet's
// checks has its case.
func TestDevRefusesAFleetFileThatClashes(t *testing.T) {
	f := prepared(t, t.TempDir(), 2, 18000)
	key, _ := aip.GenerateSigningKey()
	base := notesFleetFile(t, key.DID(), 18200)
	for _, c := range []struct {
		name string
		edit func([]byte) []byte
		want string
	}{
		{"replica on dev's replica-2", func(b []byte) []byte {
			return bytes.Replace(b, []byte("127.0.0.1:18200"), []byte("127.0.0.1:18012"), 1)
		}, "replicas[0] crepl_0192a8f0c1d27e3f8a4b5c6d7e8f9004 (line " + lineOf(t, base, "  - id: crepl_", 1) + "): endpoint \"http://127.0.0.1:18012/aip/v1/messages\" is the address of dev's replica-2"},
		{"replica on dev's dispatcher, as localhost", func(b []byte) []byte {
			return bytes.Replace(b, []byte("127.0.0.1:18200"), []byte("localhost:18000"), 1)
		}, `endpoint "http://localhost:18000/aip/v1/messages" is the address of dev's dispatcher`},
		{"replica on dev's control plane, as LOCALHOST", func(b []byte) []byte {
			return bytes.Replace(b, []byte("127.0.0.1:18200"), []byte("LOCALHOST:"+strconv.Itoa(18000+controlPortOffset)), 1)
		}, "is the address of dev's control plane"},
		{"a binding to dev's instance", func(b []byte) []byte {
			return bytes.Replace(b, []byte("capability_id: notes.list\n    instance_id: cinst_0192a8f0c1d27e3f8a4b5c6d7e8f9003"),
				[]byte("capability_id: notes.list\n    instance_id: "+f.state.InstanceID), 1)
		}, "bindings[1] acme/notes.list/" + f.state.InstanceID + " (line " + lineOf(t, base, "  - tenant_id: acme", 2) + "): instance_id is dev's own echo instance"},
		{"dev's instance ID", func(b []byte) []byte {
			return bytes.ReplaceAll(b, []byte("cinst_0192a8f0c1d27e3f8a4b5c6d7e8f9003"), []byte(f.state.InstanceID))
		}, "instances[0] " + f.state.InstanceID + " (line " + lineOf(t, base, "  - id: cinst_", 1) + "): id is the ID of dev's own echo instance"},
		{"dev's type ID", func(b []byte) []byte {
			return bytes.ReplaceAll(b, []byte("ctype_0192a8f0c1d27e3f8a4b5c6d7e8f9001"), []byte(f.state.TypeID))
		}, "types[0] " + f.state.TypeID + " (line " + lineOf(t, base, "  - id: ctype_", 1) + "): id is the ID of dev's own echo connector type"},
		{"dev's version ID", func(b []byte) []byte {
			return bytes.ReplaceAll(b, []byte("cver_0192a8f0c1d27e3f8a4b5c6d7e8f9002"), []byte(f.state.VersionID))
		}, "versions[0] " + f.state.VersionID + " (line " + lineOf(t, base, "  - id: cver_", 1) + "): id is the ID of dev's own echo version"},
		{"the ID of dev's replica-2", func(b []byte) []byte {
			return bytes.Replace(b, []byte("crepl_0192a8f0c1d27e3f8a4b5c6d7e8f9004"), []byte(f.state.ReplicaIDs[1]), 1)
		}, "replicas[0] " + f.state.ReplicaIDs[1] + " (line " + lineOf(t, base, "  - id: crepl_", 1) + "): id is the ID of one of dev's own replicas"},
	} {
		file := filepath.Join(t.TempDir(), "fleet.yaml")
		os.WriteFile(file, c.edit(base), 0o644)
		own, err := loadOwnFleet(file)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		err = f.checkOwnFleet(own)
		// A setting to fix (exit status 2), starting with the command.
		var fe *registry.FleetFileError
		var u *usageError
		if !errors.As(err, &fe) || !errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: fleet file "+file+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a usage error about the fleet file with %q", c.name, err, c.want)
		}
	}
	if err := f.checkOwnFleet(mustOwn(t, base)); err != nil {
		t.Fatalf("the guide's fleet file: %v", err)
	}
	// A file that is not a fleet file is refused at once, by line.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, bytes.Replace(base, []byte("capacity: 32"), []byte("capacity: lots"), 1), 0o644)
	if _, _, err := runCLI(t, nil, "dev", "--state-dir", t.TempDir(), "--fleet-file", bad); err == nil ||
		!strings.HasPrefix(err.Error(), "dev: fleet file "+bad+": replicas[0]") || !strings.Contains(err.Error(), "capacity: want a whole number") ||
		strings.Contains(err.Error(), "registry:") {
		t.Errorf("dev with a malformed fleet file: %v", err)
	}
	if _, _, err := runCLI(t, nil, "dev", "--state-dir", t.TempDir(), "--fleet-file", filepath.Join(t.TempDir(), "none.yaml")); err == nil ||
		!strings.Contains(err.Error(), "--fleet-file") || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("dev with a missing fleet file: %v", err)
	}
}

func mustOwn(t *testing.T, raw []byte) *ownFleet {
	t.Helper()
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	os.WriteFile(file, raw, 0o644)
	own, err := loadOwnFleet(file)
	if err != nil {
		t.Fatal(err)
	}
	return own
}

// lineOf is the number of the nth line (from 1) of b that starts with
// prefix.
func lineOf(t *testing.T, b []byte, prefix string, nth int) string {
	t.Helper()
	for i, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			if nth--; nth == 0 {
				return strconv.Itoa(i + 1)
			}
		}
	}
	t.Fatalf("no line starts with %q", prefix)
	return ""
}

// TestOwnBannerCountsHosts: the banner said "offline until your host
// registers (dev does not start it)" for a fleet file of several replicas
// too; it now speaks of their hosts then. For a file of no replicas it
// printed "0 replicas" and "Start each replica's host like this" with no
// command under it; it now says there is no host to start.
func TestOwnBannerCountsHosts(t *testing.T) {
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	f := &devFleet{dir: t.TempDir(), replicas: 1, connector: "echo", keys: devKeys{control: key, dispatcher: key, issuer: key}}
	o := &ownFleet{name: "fleet.yaml", fleet: &registry.FleetFile{}}
	rep := func(id string) ownReplica {
		return ownReplica{replica: registry.ConnectorReplica{ID: id, Endpoint: "http://127.0.0.1:8101/"},
			instance: registry.ConnectorInstance{ID: "cinst_a", TenantID: "acme"}}
	}
	for _, c := range []struct {
		reps []ownReplica
		want string
	}{
		{[]ownReplica{rep("crepl_a")}, "\nYour fleet file fleet.yaml: 1 replica, offline until your host registers (dev does not start it):\n"},
		{[]ownReplica{rep("crepl_a"), rep("crepl_b")}, "\nYour fleet file fleet.yaml: 2 replicas, offline until their hosts register (dev does not start them):\n"},
		{nil, "\nYour fleet file fleet.yaml lists no replicas: there is no host to start.\n"},
	} {
		var b bytes.Buffer
		f.ownBanner(&b, o, c.reps)
		if !strings.HasPrefix(b.String(), c.want) {
			t.Errorf("%d replicas: banner starts %q, want %q", len(c.reps), strings.SplitN(b.String(), "\n  ", 2)[0], c.want)
		}
		// A file of no replicas printed "Start each replica's host like
		// this" with no command under it.
		if len(c.reps) == 0 && strings.Contains(b.String(), "Start each replica's host") {
			t.Errorf("no replicas: banner\n%s\nsays how to start hosts there are none of", b.String())
		}
	}
}

// TestOwnBannerExampleInputPassesItsSchema: the banner's action send for a
// tenant of the fleet file printed --input '{}' for a capability whose
// schema it could not find (an instance of yours running dev's echo
// version: echo.say requires a message, so the command was refused), and
// an example its schema refuses for one with a minimum. The example is
// now taken from dev's own version too and checked against the schema;
// when there is none that passes, the banner prints JSON to fill in and
// the command that shows the schema.
func TestOwnBannerExampleInputPassesItsSchema(t *testing.T) {
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	m, err := builtinConnectors["echo"]().Manifest(context.Background(), hostsdk.TenantContext{TenantID: DevTenant})
	if err != nil {
		t.Fatal(err)
	}
	f := &devFleet{dir: t.TempDir(), replicas: 1, connector: "echo", manifest: *m,
		state: devState{VersionID: "cver_dev"}, keys: devKeys{control: key, dispatcher: key, issuer: key}}
	o := &ownFleet{name: "fleet.yaml", fleet: &registry.FleetFile{
		Versions: []registry.ConnectorVersion{{ID: "cver_mine", Manifest: aip.Manifest{Capabilities: []aip.Capability{
			{ID: "mine.count", InputSchema: json.RawMessage(`{"type":"object","required":["n"],"properties":{"n":{"type":"integer","minimum":1}}}`)},
		}}}},
		Instances: []registry.ConnectorInstance{
			{ID: "cinst_echo", TenantID: "acme", VersionID: "cver_dev"},
			{ID: "cinst_mine", TenantID: "beta", VersionID: "cver_mine"},
		},
		Bindings: []registry.CapabilityBinding{
			{TenantID: "acme", CapabilityID: "echo.say", InstanceID: "cinst_echo"},
			{TenantID: "beta", CapabilityID: "mine.count", InstanceID: "cinst_mine"},
			{TenantID: "gamma", CapabilityID: "elsewhere.op", InstanceID: "cinst_elsewhere"},
		},
	}}
	var b bytes.Buffer
	f.ownBanner(&b, o, nil)
	banner := b.String()
	if strings.Contains(banner, "--input '{}'") || strings.Contains(banner, "--input {}") {
		t.Errorf("banner prints an input the schema may refuse:\n%s", banner)
	}
	sendOf := func(tenant string) string {
		for _, line := range strings.Split(banner, "\n") {
			if strings.Contains(line, " action send ") && strings.Contains(line, " --tenant "+tenant+" ") {
				return strings.TrimSpace(line)
			}
		}
		t.Fatalf("no action send for tenant %s in\n%s", tenant, banner)
		return ""
	}
	say, _ := m.Capability("echo.say")
	acme := sendOf("acme")
	_, in, _ := strings.Cut(acme, "--input ")
	in = strings.Trim(in, "'")
	if !passesSchema(say.InputSchema, []byte(in)) {
		t.Errorf("echo.say's example input %s does not pass its schema (%s)", in, acme)
	}
	for _, tenant := range []string{"beta", "gamma"} {
		line := sendOf(tenant)
		if !strings.HasSuffix(line, " --input JSON") {
			t.Errorf("tenant %s: %q, want --input JSON (no example dev can vouch for)", tenant, line)
		}
	}
	// dev's own banner's example passes echo.say's schema too.
	var main bytes.Buffer
	f.banner(&main, nil, "token", time.Now())
	_, own, _ := strings.Cut(main.String(), "--capability echo.say --input '")
	own, _, _ = strings.Cut(own, "'")
	if !passesSchema(say.InputSchema, []byte(own)) {
		t.Errorf("dev's banner's echo.say input %q does not pass its schema:\n%s", own, main.String())
	}
	if !strings.Contains(banner, "(JSON: an input its input_schema accepts, which ") || !strings.Contains(banner, "/keys/issuer.key mine.count prints)") {
		t.Errorf("banner does not say where the schema is:\n%s", banner)
	}
}
