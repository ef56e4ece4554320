package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/docs/connectorguide/notes"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPrintManifest(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--print-manifest", "--trust-domain", "fleet.example.test"}, func(string) string { return "" }, &out, &out); err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	raw, _ := json.Marshal(doc)
	var printed aip.Manifest
	if err := json.Unmarshal(raw, &printed); err != nil {
		t.Fatal(err)
	}
	m, _ := notes.Connector{}.Manifest(context.Background(), hostsdk.TenantContext{})
	m.Agent.TrustDomain = "fleet.example.test"
	want, _ := aip.ManifestDigest(m)
	if got, _ := aip.ManifestDigest(&printed); got != want {
		t.Fatalf("printed manifest digest %s, want %s:\n%s", got, want, out.String())
	}
	if err := run(context.Background(), []string{"--print-manifest"}, func(string) string { return "" }, &out, &out); err == nil || !strings.Contains(err.Error(), "--trust-domain") {
		t.Fatalf("without --trust-domain: %v", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunRegistersServesAndDrains runs the command as the guide does, with
// every setting in AIP_CONNECTOR_HOST_* variables (sidecartest's
// NewReplicaEnv, the environment an operator's replica gets), against the
// fake control plane and dispatcher of hostsdktest.
func TestRunRegistersServesAndDrains(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	r := sidecartest.NewReplicaEnv(t, sidecartest.HostEnv{
		ControlEndpoint: cp.Endpoint(), ControlDID: cp.DID(),
		GatewayPrincipalID: d.PrincipalID(), GatewayDID: d.DID(),
		TypeID: aip.NewID(aip.PrefixType), VersionID: aip.NewID(aip.PrefixVersion), InstanceID: aip.NewID(aip.PrefixInstance),
		TenantID: hostsdktest.TenantID, TrustDomain: hostsdktest.TrustDomain,
		ArtifactDigest: aip.DigestBytes([]byte("notes")), SecretProviderRef: "secret://notes",
	}, sidecartest.ReplicaOptions{})
	env := map[string]string{}
	for _, kv := range r.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	cp.Provision(hostsdktest.ReplicaSpec{ID: r.ID, DID: r.Key.DID()})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	var log syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(runCtx, nil, func(k string) string { return env[k] }, &log, &log) }()
	if err := cp.Await(ctx, func(o []hostsdktest.Operation) bool { return len(o) > 0 && o[0].Outcome == aip.OutcomeLease }); err != nil {
		t.Fatal(err)
	}
	m, _ := notes.Connector{}.Manifest(ctx, hostsdk.TenantContext{})
	m.Agent.TrustDomain = hostsdktest.TrustDomain
	digest, _ := aip.ManifestDigest(m)
	target := hostsdktest.Target{Endpoint: r.Endpoint, Principal: aip.Principal{ID: m.Agent.ID, Kind: m.Agent.Kind},
		DID: r.Key.DID(), TenantID: r.TenantID, InstanceID: r.InstanceID, ReplicaID: r.ID,
		VersionID: r.VersionID, ManifestDigest: digest}
	resp, err := d.Act(ctx, target, &aip.Action{ID: aip.NewActionID(), CapabilityID: notes.CapAdd, Input: json.RawMessage(`{"text":"hi"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("add: %+v %v", res, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "offline; shutdown was clean") {
		t.Fatalf("log:\n%s", log.String())
	}
}

// TestMainExitStatus runs main in a child process (this test binary, with
// NOTESHOST_MAIN set): a value the host's settings refuse
// (hostsdk.ErrSetting) exited 1 like a failed start; it is a mistake in
// how the program was started, status 2 as aip-host's, and so are an
// unknown flag and a stray argument. So is a configuration hostsdk.New
// refuses (no settings at all: a required setting is missing), which
// exited 1, and --print-manifest without --trust-domain, which exited 1;
// -h exits 0.
func TestMainExitStatus(t *testing.T) {
	if args, ok := hostsdktest.MainArgs(); ok {
		os.Args = append([]string{"noteshost"}, args...)
		main()
		return
	}
	for _, c := range []struct {
		args   []string
		env    []string
		status int
		stderr string
	}{
		{[]string{"--max-in-flight=0"}, nil, 2,
			`noteshost: --max-in-flight (AIP_CONNECTOR_HOST_MAX_IN_FLIGHT, Config.MaxInFlight) is "0"; want an integer from 1 to 65536`},
		{nil, []string{"AIP_CONNECTOR_HOST_LEASE_TTL_MS=5"}, 2,
			`noteshost: AIP_CONNECTOR_HOST_LEASE_TTL_MS (--lease-ttl-ms, Config.LeaseTTL) is "5"; want an integer from 1000 to 300000 ms`},
		{[]string{"--no-such-flag"}, nil, 2, "noteshost: flag provided but not defined: -no-such-flag"},
		{[]string{"stray"}, nil, 2, `noteshost: unexpected argument "stray"; every setting is a flag`},
		{nil, nil, 2, "noteshost: hostsdk: bootstrap step 1 (validate): --public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT, Config.PublicEndpoint) is required"},
		{[]string{"--print-manifest"}, nil, 2, "noteshost: --print-manifest needs --trust-domain"},
		{[]string{"-h"}, nil, 0, "-print-manifest"},
	} {
		status, stderr := hostsdktest.RunMain(t, "TestMainExitStatus", c.args, c.env)
		if status != c.status || !strings.Contains(stderr, c.stderr) {
			t.Errorf("noteshost %v %v: exit status %d, want %d; stderr:\n%s\nwant it to contain %s", c.args, c.env, status, c.status, stderr, c.stderr)
		}
	}
}
