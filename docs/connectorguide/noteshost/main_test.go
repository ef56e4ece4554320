package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
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
// every setting in AIP_CONNECTOR_HOST_* variables, against the fake control
// plane and dispatcher of hostsdktest.
func TestRunRegistersServesAndDrains(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	dir := t.TempDir()
	key, _ := aip.GenerateSigningKey()
	seed := filepath.Join(dir, "notes-1.key")
	if err := aip.WriteSeedFile(seed, key); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ids := map[string]string{"TYPE_ID": aip.NewID(aip.PrefixType), "VERSION_ID": aip.NewID(aip.PrefixVersion),
		"INSTANCE_ID": aip.NewID(aip.PrefixInstance), "REPLICA_ID": aip.NewID(aip.PrefixReplica)}
	env := map[string]string{
		"AIP_CONNECTOR_HOST_BIND": addr, "AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT": "http://" + addr + aip.MessagesPath,
		"AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP": "true", "AIP_CONNECTOR_HOST_CONTROL_ENDPOINT": cp.Endpoint(),
		"AIP_CONNECTOR_HOST_CONTROL_DID": cp.DID(), "AIP_CONNECTOR_HOST_SIGNING_SEED_FILE": seed,
		"AIP_CONNECTOR_HOST_TENANT_ID": hostsdktest.TenantID, "AIP_CONNECTOR_HOST_GATEWAY_PRINCIPAL_ID": d.PrincipalID(),
		"AIP_CONNECTOR_HOST_GATEWAY_DID": d.DID(), "AIP_CONNECTOR_HOST_TRUST_DOMAIN": hostsdktest.TrustDomain,
		"AIP_CONNECTOR_HOST_ARTIFACT_DIGEST": aip.DigestBytes([]byte("notes")), "AIP_CONNECTOR_HOST_SECRET_PROVIDER_REF": "secret://notes",
		"AIP_CONNECTOR_HOST_STATE_DIR": filepath.Join(dir, "state"),
	}
	for k, v := range ids {
		env["AIP_CONNECTOR_HOST_"+k] = v
	}
	cp.Provision(hostsdktest.ReplicaSpec{ID: ids["REPLICA_ID"], DID: key.DID()})

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
	target := hostsdktest.Target{Endpoint: "http://" + addr + aip.MessagesPath, Principal: aip.Principal{ID: m.Agent.ID, Kind: m.Agent.Kind},
		DID: key.DID(), TenantID: hostsdktest.TenantID, InstanceID: ids["INSTANCE_ID"], ReplicaID: ids["REPLICA_ID"],
		VersionID: ids["VERSION_ID"], ManifestDigest: digest}
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
