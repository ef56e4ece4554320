package hostsdktest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// DefaultDispatcherPrincipal is the principal ID a Dispatcher signs as by
// default: the real dispatcher's default principal (aipfleet dispatch
// --principal-id), which a host expects when its GatewayPrincipalID
// (--gateway-principal-id) is left to its default.
const DefaultDispatcherPrincipal = hostsdk.DefaultGatewayPrincipalID

// DispatcherConfig configures a fake dispatcher. TrustDomain is required.
type DispatcherConfig struct {
	// PrincipalID defaults to DefaultDispatcherPrincipal.
	PrincipalID string
	TrustDomain string
	// Key defaults to a fresh key.
	Key *aip.SigningKey
	// Client defaults to a client of its own, closed when the test ends.
	Client *http.Client
	// Now defaults to time.Now.
	Now func() time.Time
}

// Dispatcher is a fake of the central dispatcher: it signs real native
// envelopes carrying the pinned security.connector_route, posts them to a
// host and verifies the host's signed answers.
type Dispatcher struct {
	key       *aip.SigningKey
	principal aip.Principal
	client    *http.Client
	now       func() time.Time
}

// Target is the replica a dispatcher sends to: what the registry knows about
// it.
type Target struct {
	// Endpoint is the replica's /aip/v1/messages URL.
	Endpoint       string
	Principal      aip.Principal // the replica's principal (id, kind)
	DID            string        // the replica's did:key; answers must be signed by it
	TenantID       string
	InstanceID     string
	ReplicaID      string
	VersionID      string
	ManifestDigest string
}

// NewDispatcher returns a fake dispatcher.
func NewDispatcher(t testing.TB, cfg DispatcherConfig) *Dispatcher {
	t.Helper()
	if cfg.TrustDomain == "" {
		t.Fatal("hostsdktest: DispatcherConfig.TrustDomain is required")
	}
	key := cfg.Key
	if key == nil {
		var err error
		if key, err = aip.GenerateSigningKey(); err != nil {
			t.Fatal(err)
		}
	}
	client := cfg.Client
	if client != nil {
		t.Cleanup(client.CloseIdleConnections)
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		client = &http.Client{Transport: tr}
		t.Cleanup(tr.CloseIdleConnections)
	}
	id := cfg.PrincipalID
	if id == "" {
		id = DefaultDispatcherPrincipal
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Dispatcher{
		key:       key,
		principal: aip.Principal{ID: id, Kind: aip.PrincipalService, TrustDomain: cfg.TrustDomain, DID: key.DID()},
		client:    client, now: now,
	}
}

// DID returns the dispatcher's did:key (pin it as the host's gateway DID).
func (d *Dispatcher) DID() string { return d.key.DID() }

// PrincipalID returns the dispatcher's principal ID (the host's gateway
// principal).
func (d *Dispatcher) PrincipalID() string { return d.principal.ID }

// Response is a host's verified answer.
type Response struct {
	Status      int
	ContentType string
	// Envelope is the answer (for streaming actions: the final line).
	Envelope *aip.Envelope
	// Chunks are a streaming answer's chunks in the order received.
	Chunks []aip.StreamChunk
	// Raw is the body as received.
	Raw []byte
}

// Result returns the action result, or an error describing what came
// instead.
func (r *Response) Result() (*aip.ActionResult, error) {
	if r.Envelope == nil {
		return nil, fmt.Errorf("HTTP %d without an envelope: %s", r.Status, r.Raw)
	}
	if res := r.Envelope.Body.ActionResult; res != nil {
		return res, nil
	}
	if e := r.Envelope.Body.Error; e != nil {
		return nil, &e.Error
	}
	return nil, fmt.Errorf("HTTP %d with a %s body", r.Status, r.Envelope.Body.Tag())
}

// ProtocolError returns the error body of the answer, or nil.
func (r *Response) ProtocolError() *aip.ProtocolError {
	if r.Envelope == nil || r.Envelope.Body.Error == nil {
		return nil
	}
	return &r.Envelope.Body.Error.Error
}

// Route returns the connector_route the dispatcher pins for an action.
func (d *Dispatcher) Route(t Target, actionID, capabilityID string, mode aip.ActionMode) aip.ConnectorRoute {
	r := aip.ConnectorRoute{
		ActionID: actionID, CapabilityID: capabilityID, TenantID: t.TenantID, InstanceID: t.InstanceID,
		ReplicaID: t.ReplicaID, VersionID: t.VersionID, ManifestDigest: t.ManifestDigest,
		CatalogRevision: 1, BindingPolicyRevision: 1, FenceToken: FenceToken(d.now()),
	}
	if mode != "" {
		m := mode
		r.OriginalMode = &m
	}
	return r
}

// Envelope builds an unsigned envelope for body addressed to the target,
// with route as security.connector_route. An action whose input is not
// JSON (NewAction's input is the JSON text itself) is refused here, naming
// the action and the input: no signed envelope can carry it.
func (d *Dispatcher) Envelope(t Target, body aip.Body, route aip.ConnectorRoute) (*aip.Envelope, error) {
	if a := body.Action; a != nil && a.Input != nil {
		if err := json.Compact(new(bytes.Buffer), a.Input); err != nil {
			return nil, fmt.Errorf("hostsdktest: the input of action %s is not JSON (%v): %q; give a JSON value, such as {} for a capability that takes no input",
				a.ID, err, aip.TruncateUTF8(string(a.Input), 64))
		}
	}
	env, err := aip.NewEnvelope(d.now(), body)
	if err != nil {
		return nil, err
	}
	from := d.principal
	to := aip.Principal{ID: t.Principal.ID, Kind: t.Principal.Kind}
	env.From, env.To = &from, &to
	env.CorrelationID = aip.NewID(aip.PrefixCorrelation)
	if err := env.SetSecurity(aip.SecurityConnectorRoute, route); err != nil {
		return nil, err
	}
	return env, nil
}

// Sign signs env with the dispatcher's key and returns the bytes to post.
func (d *Dispatcher) Sign(env *aip.Envelope) ([]byte, error) { return aip.SignEnvelope(d.key, env) }

// Act sends an action and returns the verified answer.
func (d *Dispatcher) Act(ctx context.Context, t Target, a *aip.Action) (*Response, error) {
	env, err := d.Envelope(t, aip.Body{Action: a}, d.Route(t, a.ID, a.CapabilityID, a.Mode))
	if err != nil {
		return nil, err
	}
	return d.Send(ctx, t, env)
}

// Cancel sends an action-scoped cancel.
func (d *Dispatcher) Cancel(ctx context.Context, t Target, actionID, capabilityID, reason string) (*Response, error) {
	env, err := d.Envelope(t, aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: actionID}, Reason: reason}},
		d.Route(t, actionID, capabilityID, ""))
	if err != nil {
		return nil, err
	}
	return d.Send(ctx, t, env)
}

// Status asks the replica what its journal holds for an action.
func (d *Dispatcher) Status(ctx context.Context, t Target, actionID, capabilityID string) (*aip.ActionStatus, *Response, error) {
	env, err := d.Envelope(t, aip.Body{ActionStatusQuery: &aip.ActionStatusQuery{ActionID: actionID}},
		d.Route(t, actionID, capabilityID, ""))
	if err != nil {
		return nil, nil, err
	}
	resp, err := d.Send(ctx, t, env)
	if err != nil {
		return nil, resp, err
	}
	if resp.Envelope.Body.ActionStatus == nil {
		return nil, resp, fmt.Errorf("HTTP %d: answer is a %s body", resp.Status, resp.Envelope.Body.Tag())
	}
	return resp.Envelope.Body.ActionStatus, resp, nil
}

// Send signs env and posts it, then verifies the answer (see Post).
func (d *Dispatcher) Send(ctx context.Context, t Target, env *aip.Envelope) (*Response, error) {
	raw, err := d.Sign(env)
	if err != nil {
		return nil, err
	}
	return d.Post(ctx, t, raw, env.MessageID)
}

// ErrUnsigned is returned (wrapped) when the host answered without a signed
// envelope (malformed requests and signing failures).
var ErrUnsigned = errors.New("hostsdktest: unsigned answer")

// Post posts raw bytes to the target and verifies every envelope of the
// answer: signed by the target's DID, in response to messageID, addressed
// to the dispatcher. An unsigned answer returns the Response with an error
// wrapping ErrUnsigned.
func (d *Dispatcher) Post(ctx context.Context, t Target, raw []byte, messageID string) (*Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.Endpoint, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	hresp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer hresp.Body.Close()
	resp := &Response{Status: hresp.StatusCode, ContentType: hresp.Header.Get("Content-Type")}
	if strings.HasPrefix(resp.ContentType, "application/x-ndjson") {
		return resp, d.readStream(hresp.Body, resp, t, messageID)
	}
	if resp.Raw, err = io.ReadAll(io.LimitReader(hresp.Body, aip.MaxMessageBytes+1)); err != nil {
		return resp, err
	}
	env, err := d.verify(resp.Raw, t, messageID)
	if err != nil {
		return resp, err
	}
	resp.Envelope = env
	return resp, nil
}

func (d *Dispatcher) readStream(body io.Reader, resp *Response, t Target, messageID string) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), aip.MaxMessageBytes)
	var all bytes.Buffer
	for sc.Scan() {
		line := sc.Bytes()
		all.Write(line)
		all.WriteByte('\n')
		if resp.Envelope != nil {
			return fmt.Errorf("hostsdktest: a line follows the final envelope of the stream")
		}
		env, err := d.verify(line, t, messageID)
		if err != nil {
			resp.Raw = all.Bytes()
			return err
		}
		if c := env.Body.StreamChunk; c != nil {
			if want := uint64(len(resp.Chunks)); c.Sequence != want {
				return fmt.Errorf("hostsdktest: chunk sequence %d, want %d", c.Sequence, want)
			}
			resp.Chunks = append(resp.Chunks, *c)
			continue
		}
		resp.Envelope = env
	}
	resp.Raw = all.Bytes()
	if err := sc.Err(); err != nil {
		return err
	}
	if resp.Envelope == nil {
		return errors.New("hostsdktest: the stream ended without a final envelope")
	}
	return nil
}

func (d *Dispatcher) verify(raw []byte, t Target, messageID string) (*aip.Envelope, error) {
	var probe struct {
		Security map[string]json.RawMessage `json:"security"`
	}
	if json.Unmarshal(raw, &probe) != nil || probe.Security == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnsigned, raw)
	}
	v, err := aip.VerifyEnvelope(raw, t.DID)
	if err != nil {
		return nil, fmt.Errorf("hostsdktest: answer does not verify: %w", err)
	}
	env := &v.Envelope
	if env.InResponseTo == nil || env.InResponseTo.Message != messageID {
		return nil, fmt.Errorf("hostsdktest: answer is not in response to %s", messageID)
	}
	if env.To == nil || env.To.ID != d.principal.ID {
		return nil, errors.New("hostsdktest: answer is not addressed to the dispatcher")
	}
	if env.From == nil || env.From.ID != t.Principal.ID || env.From.DID != t.DID {
		return nil, errors.New("hostsdktest: answer is not from the target replica")
	}
	return env, nil
}

// FenceToken returns a fence token (route_ and a UUIDv7) carrying the
// assignment time at, as the registry issues one when it assigns a route at
// at on its clock. Route uses the dispatcher's clock (DispatcherConfig.Now),
// so a host on the same fake clock, or in a synctest bubble, sees its routes
// assigned now and not in its future (aip.NewID carries the process's latest
// reading of the real clock).
func FenceToken(at time.Time) string {
	var u [16]byte
	if _, err := rand.Read(u[6:]); err != nil {
		panic("hostsdktest: crypto/rand failed: " + err.Error())
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(u[:6], ms[2:])
	u[6] = 0x70 | u[6]&0x0f
	u[8] = 0x80 | u[8]&0x3f
	return aip.PrefixRoute + hex.EncodeToString(u[:])
}
