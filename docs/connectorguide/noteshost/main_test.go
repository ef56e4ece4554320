package main

import (
	"bytes"
	"context"
	"encoding/json"
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
