package sidecartest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// Fleet is the central side the replicas under test talk to: a control
// plane that registers them and a dispatcher that sends them actions. Two
// implementations exist: NewFakeFleet (hostsdktest's in-process fakes) and
// realfleet.New (the aipfleet control-plane and dispatch processes on
// PostgreSQL). Tests use only this interface.
type Fleet interface {
	// Kind is "fake" or "real".
	Kind() string
	// TrustDomain is the deployment's trust domain.
	TrustDomain() string
	// Admit admits the connector version whose bound manifest is m (see
	// Describe) and binds its capabilities for the tenant. Call it before
	// NewReplica.
	Admit(t testing.TB, m *aip.Manifest)
	// NewReplica pre-provisions a replica of the admitted version and
	// returns the environment that configures a process as it.
	NewReplica(t testing.TB, opts ReplicaOptions) *Replica
	// Act sends an action to the replica (through the dispatcher). It may
	// be called from any goroutine: failures are in Answer.Err.
	Act(t testing.TB, r *Replica, a *aip.Action) *Answer
	// Cancel cancels an action.
	Cancel(t testing.TB, r *Replica, actionID, capabilityID, reason string) *Answer
	// State returns what the replica's journal holds for an action
	// (aip.StateNotFound when nothing).
	State(t testing.TB, r *Replica, actionID, capabilityID string) aip.ActionState
	// Transitions returns the lifecycle requests the control plane
	// accepted, in order.
	Transitions(t testing.TB) []Transition
	// AwaitRestartable waits until a killed replica may register again
	// (its lease expired).
	AwaitRestartable(t testing.TB, r *Replica)
	// Events returns the provider events the replicas delivered to the
	// fleet's event log, in the order it stored them.
	Events(t testing.TB) []aip.Event
}

// Transition is one lifecycle request the control plane accepted.
type Transition struct {
	At        time.Time
	Op        aip.Operation
	ReplicaID string
	// ConnectorReady is false for a heartbeat that reported the replica
	// not ready (and took it offline).
	ConnectorReady bool
}

// Answer is the fleet's answer to an action or a cancel.
type Answer struct {
	HTTPStatus int
	Result     *aip.ActionResult
	Error      *aip.ProtocolError
	Chunks     []aip.StreamChunk
	// OutcomeUnknown: the fleet recorded the action's outcome as unknown.
	OutcomeUnknown bool
	Raw            []byte
	// Err is a transport or decoding failure (no answer).
	Err error
}

// Must fails the test unless the answer is a result with status s,
// and returns it. Call it from the test's goroutine.
func (a *Answer) Must(t testing.TB, s aip.ResultStatus) *aip.ActionResult {
	t.Helper()
	if a.Err != nil {
		t.Fatalf("no answer: %v", a.Err)
	}
	if a.Result == nil || a.Result.Status != s {
		t.Fatalf("HTTP %d: want a %s result, got %+v (error %+v): %s", a.HTTPStatus, s, a.Result, a.Error, a.Raw)
	}
	return a.Result
}

// ReplicaOptions tune a replica's lifecycle timing. Zero values mean the
// fleet's defaults.
type ReplicaOptions struct {
	HeartbeatInterval time.Duration
	LeaseTTL          time.Duration
}

// Replica is one pre-provisioned replica: its identity and the
// AIP_CONNECTOR_HOST_* environment that configures a process as it.
type Replica struct {
	ID         string
	InstanceID string
	VersionID  string
	TenantID   string
	Key        *aip.SigningKey
	// Endpoint is the replica's /aip/v1/messages URL; Base its origin.
	Endpoint string
	Base     string
	// Env is KEY=VALUE lines for the process (state directory included,
	// so a restart with the same Env recovers the same journal).
	Env []string
	// Dir is a directory of the test the replica's files live in.
	Dir string
	// ManifestDigest is the admitted manifest's digest.
	ManifestDigest string
	// AgentID and AgentKind are the admitted manifest's agent.
	AgentID   string
	AgentKind aip.PrincipalKind
}

// HostEnv is what a fleet supplies to build a replica's environment.
type HostEnv struct {
	ControlEndpoint    string
	ControlDID         string
	GatewayPrincipalID string
	GatewayDID         string
	TypeID             string
	VersionID          string
	InstanceID         string
	TenantID           string
	TrustDomain        string
	ArtifactDigest     string
	SecretProviderRef  string
	MaxInFlight        int
	// EventEndpoint is the dispatcher's connector-event ingress the
	// replica delivers its event outbox to (none when empty).
	EventEndpoint string
}

// NewReplicaEnv writes a replica's key and returns the replica with its
// environment; the fleet provisions it.
func NewReplicaEnv(t testing.TB, h HostEnv, opts ReplicaOptions) *Replica {
	t.Helper()
	dir := t.TempDir()
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "seed")
	if err := aip.WriteSeedFile(seed, key); err != nil {
		t.Fatal(err)
	}
	addr := FreeAddr(t)
	r := &Replica{
		ID: aip.NewID(aip.PrefixReplica), InstanceID: h.InstanceID, VersionID: h.VersionID, TenantID: h.TenantID, Key: key,
		Endpoint: "http://" + addr + aip.MessagesPath, Base: "http://" + addr, Dir: dir,
	}
	r.Env = []string{
		"AIP_CONNECTOR_HOST_BIND=" + addr,
		"AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT=" + r.Endpoint,
		"AIP_CONNECTOR_HOST_CONTROL_ENDPOINT=" + h.ControlEndpoint,
		"AIP_CONNECTOR_HOST_CONTROL_DID=" + h.ControlDID,
		"AIP_CONNECTOR_HOST_SIGNING_SEED_FILE=" + seed,
		"AIP_CONNECTOR_HOST_TYPE_ID=" + h.TypeID,
		"AIP_CONNECTOR_HOST_VERSION_ID=" + h.VersionID,
		"AIP_CONNECTOR_HOST_INSTANCE_ID=" + h.InstanceID,
		"AIP_CONNECTOR_HOST_REPLICA_ID=" + r.ID,
		"AIP_CONNECTOR_HOST_TENANT_ID=" + h.TenantID,
		"AIP_CONNECTOR_HOST_GATEWAY_PRINCIPAL_ID=" + h.GatewayPrincipalID,
		"AIP_CONNECTOR_HOST_GATEWAY_DID=" + h.GatewayDID,
		"AIP_CONNECTOR_HOST_TRUST_DOMAIN=" + h.TrustDomain,
		"AIP_CONNECTOR_HOST_ARTIFACT_DIGEST=" + h.ArtifactDigest,
		"AIP_CONNECTOR_HOST_SECRET_PROVIDER_REF=" + h.SecretProviderRef,
		"AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP=true",
		"AIP_CONNECTOR_HOST_STATE_DIR=" + filepath.Join(dir, "state"),
		"AIP_SIDECAR_LOG_LEVEL=debug",
	}
	if h.EventEndpoint != "" {
		r.Env = append(r.Env, "AIP_CONNECTOR_HOST_EVENT_ENDPOINT="+h.EventEndpoint)
	}
	if h.MaxInFlight > 0 {
		r.Env = append(r.Env, fmt.Sprintf("AIP_CONNECTOR_HOST_MAX_IN_FLIGHT=%d", h.MaxInFlight))
	}
	if opts.HeartbeatInterval > 0 {
		r.Env = append(r.Env, fmt.Sprintf("AIP_CONNECTOR_HOST_HEARTBEAT_MS=%d", opts.HeartbeatInterval.Milliseconds()))
	}
	if opts.LeaseTTL > 0 {
		r.Env = append(r.Env, fmt.Sprintf("AIP_CONNECTOR_HOST_LEASE_TTL_MS=%d", opts.LeaseTTL.Milliseconds()))
	}
	return r
}

// Describe runs the sidecar with --print-manifest and the given
// environment and arguments (the connector's), and returns the bound
// manifest and its digest: what an operator admits.
func Describe(t testing.TB, trustDomain string, env []string, args ...string) (*aip.Manifest, string) {
	t.Helper()
	p := Start(t, Sidecar(t), append(append([]string{}, env...), "AIP_CONNECTOR_HOST_TRUST_DOMAIN="+trustDomain),
		append([]string{"--print-manifest"}, args...)...)
	if err := p.Wait(t); err != nil {
		t.Fatalf("aip-sidecar --print-manifest: %v\n%s", err, p.Log())
	}
	var out struct {
		ManifestDigest string       `json:"manifest_digest"`
		Manifest       aip.Manifest `json:"manifest"`
	}
	if err := json.Unmarshal([]byte(p.Stdout()), &out); err != nil {
		t.Fatalf("aip-sidecar --print-manifest printed %q: %v", p.Stdout(), err)
	}
	return &out.Manifest, out.ManifestDigest
}

// FreeAddr returns a free loopback TCP address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// SocketPath returns a short unix socket path in a directory removed when
// the test ends (a socket path is at most 107 bytes).
func SocketPath(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sct")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, name)
}

// Client is an HTTP client that keeps no idle connections (goleak-safe).
var Client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}

// GetJSON GETs url and decodes its JSON body into v; it returns the status.
func GetJSON(t testing.TB, url string, v any) int {
	t.Helper()
	resp, err := Client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
	return resp.StatusCode
}

// Ready returns the replica's /ready status code and document.
func (r *Replica) Ready(t testing.TB) (int, hostsdk.ReadyDocument) {
	t.Helper()
	var doc hostsdk.ReadyDocument
	code := GetJSON(t, r.Base+hostsdk.PathReady, &doc)
	return code, doc
}

// AwaitReady polls the replica's /ready until it answers 200 (after a
// registration the control plane recorded, the host applies the lease).
func (r *Replica) AwaitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := Client.Get(r.Base + hostsdk.PathReady)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica %s did not become ready", r.ID)
		}
		time.Sleep(10 * time.Millisecond) // polling a process for readiness
	}
}

// AwaitTransition polls f until a transition after the first since ones
// satisfies pred, and returns it.
func AwaitTransition(t testing.TB, f Fleet, since int, pred func(Transition) bool) Transition {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		tr := f.Transitions(t)
		for _, x := range tr[min(since, len(tr)):] {
			if pred(x) {
				return x
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no matching lifecycle transition; the control plane saw %+v", tr)
		}
		time.Sleep(20 * time.Millisecond) // polling the control plane's record
	}
}

// LastTransition returns the last transition of op for the replica.
func LastTransition(tr []Transition, replicaID string, op aip.Operation) (Transition, bool) {
	for i := len(tr) - 1; i >= 0; i-- {
		if tr[i].Op == op && tr[i].ReplicaID == replicaID {
			return tr[i], true
		}
	}
	return Transition{}, false
}
