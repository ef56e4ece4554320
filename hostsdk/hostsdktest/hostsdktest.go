// Package hostsdktest lets connector authors test a connector built with
// hostsdk over the real transport: an in-process fake control plane that
// speaks the signed lifecycle protocol and decides each request with the
// registry's own lifecycle rules, as the real control plane does
// (ControlPlane; a parity test holds the two to the same answers), a fake
// dispatcher that
// signs real native envelopes with the pinned route and verifies the host's
// signed answers (Dispatcher), a fake connector-event ingress that checks
// the host's signed event deliveries against the control plane's registry
// and answers with the dispatcher's key (EventIngress), and helpers that
// configure and start a test host on a loopback port with a temporary state
// directory.
//
// A typical test:
//
//	f := hostsdktest.Start(t, myConnector{}, nil)
//	res := f.Result(t, hostsdktest.NewAction("tickets.create", `{"title":"x"}`))
//
// Result fails the test on an answer that carries no action result (a
// signed error such as connector_host.input_invalid, or
// connector_host.outcome_unknown when the outcome is unknown); Act returns
// any verified answer, whose ProtocolError then says which.
// StartWithEvents also starts an EventIngress the host delivers its
// provider events to (Fixture.Events). Start is shorthand for the pieces,
// which a test assembles itself for an in-memory transport:
//
//	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
//	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
//	cfg := hostsdktest.HostConfig(t, cp, d, nil)
//	h := hostsdktest.StartHost(t, cfg, myConnector{})
//	resp, err := d.Act(ctx, hostsdktest.TargetOf(h, cfg), &aip.Action{...})
//
// For lifecycle tests under testing/synctest, where no real network I/O may
// happen, use ControlPlaneConfig.InMemory with a MemListener: the host
// reaches the control plane through ControlPlane.Transport and the
// dispatcher reaches the host through MemListener.Client. To test event
// delivery, point the host at an EventIngress with its Configure (an
// in-memory ingress is reached through EventIngress.Transport).
package hostsdktest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// TrustDomain is the trust domain HostConfig uses.
const TrustDomain = "test.aipfleet.invalid"

// TenantID is the tenant HostConfig uses.
const TenantID = "tenant-test"

// HostConfig returns a Config for a test host: fresh registry identities and
// a fresh signing key, pre-provisioned in cp; the dispatcher d as the pinned
// gateway; the control plane's DID pinned; loopback HTTP allowed; the
// embedded journal in a temporary directory. The host listens on l, or on a
// fresh loopback TCP port when l is nil.
func HostConfig(t testing.TB, cp *ControlPlane, d *Dispatcher, l net.Listener) hostsdk.Config {
	t.Helper()
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	if l == nil {
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	cfg := hostsdk.Config{
		Listener:                  l,
		Bind:                      l.Addr().String(),
		PublicEndpoint:            "http://" + l.Addr().String() + aip.MessagesPath,
		ControlPlaneEndpoint:      cp.Endpoint(),
		ControlPlaneDID:           cp.DID(),
		AllowInsecureLoopbackHTTP: true,
		SigningKey:                key,
		ConnectorTypeID:           aip.NewID(aip.PrefixType),
		VersionID:                 aip.NewID(aip.PrefixVersion),
		InstanceID:                aip.NewID(aip.PrefixInstance),
		ReplicaID:                 aip.NewID(aip.PrefixReplica),
		TenantID:                  TenantID,
		GatewayPrincipalID:        d.PrincipalID(),
		GatewayDID:                d.DID(),
		TrustDomain:               TrustDomain,
		ArtifactDigest:            aip.DigestBytes([]byte("hostsdktest artifact")),
		SecretProviderRef:         "secret://hostsdktest",
		StateDir:                  t.TempDir(),
		// Tests drain quickly; a real host lingers DefaultDrainLinger.
		DrainLinger: 50 * time.Millisecond,
	}
	if cp.server == nil {
		cfg.ControlPlaneTransport = cp.Transport()
	}
	cp.Provision(ReplicaSpec{
		ID: cfg.ReplicaID, DID: key.DID(), InstanceID: cfg.InstanceID, VersionID: cfg.VersionID,
		Endpoint: cfg.PublicEndpoint, TenantID: cfg.TenantID, ArtifactDigest: cfg.ArtifactDigest,
	})
	return cfg
}

// StartHost creates and starts a host and stops it when the test ends
// (tests that check the shutdown call Stop themselves; Stop is idempotent).
func StartHost(t testing.TB, cfg hostsdk.Config, conn hostsdk.Connector) *hostsdk.Host {
	t.Helper()
	h, err := hostsdk.New(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		h.Stop(ctx)
	})
	return h
}

// TargetOf returns the dispatch target of a started host.
func TargetOf(h *hostsdk.Host, cfg hostsdk.Config) Target {
	p := h.Principal()
	return Target{
		Endpoint:  cfg.PublicEndpoint,
		Principal: aip.Principal{ID: p.ID, Kind: p.Kind},
		DID:       h.DID(), TenantID: cfg.TenantID, InstanceID: cfg.InstanceID,
		ReplicaID: cfg.ReplicaID, VersionID: cfg.VersionID, ManifestDigest: h.ManifestDigest(),
	}
}

// MemListener is an in-memory net.Listener: connections are net.Pipe pairs
// made by its DialContext, so a host can serve inside a testing/synctest
// bubble.
type MemListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

// NewMemListener returns an open in-memory listener.
func NewMemListener() *MemListener {
	return &MemListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

var errListenerClosed = errors.New("hostsdktest: listener closed")

// Accept implements net.Listener.
func (l *MemListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, errListenerClosed
	}
}

// Close implements net.Listener.
func (l *MemListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr implements net.Listener: a placeholder loopback address.
func (l *MemListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9} }

// DialContext connects to the listener whatever the address.
func (l *MemListener) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, errListenerClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Client returns an HTTP client whose connections go to the listener. Call
// CloseIdleConnections on its transport (or let the test's cleanup do it
// through NewDispatcher) before the test ends.
func (l *MemListener) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: l.DialContext, MaxIdleConnsPerHost: 8}}
}

// LogBuffer is a log sink safe for concurrent writes (a host's logger and
// the test reading it), for example slog.NewTextHandler(&buf, nil).
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Take returns the lines written since the last Take that contain substr
// ("" for all), and forgets everything written so far.
func (l *LogBuffer) Take(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.SplitSeq(l.b.String(), "\n") {
		if line != "" && strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	l.b.Reset()
	return out
}
