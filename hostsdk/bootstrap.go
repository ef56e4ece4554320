package hostsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/internal/onchange"
)

// Step 1: read and check the files the configuration names (signing key,
// DID files, CA certificate, credential revision policy, which must
// authorize the configured credential revision) and build the lifecycle
// client.
func (h *Host) stepValidate(ctx context.Context) error {
	c := &h.cfg
	h.key = c.SigningKey
	if h.key == nil {
		k, err := aip.LoadSigningKey(c.SigningSeedFile)
		if err != nil {
			return fmt.Errorf("%s: %w", settingName("SigningSeedFile"), err)
		}
		h.key = k
	}
	controlDID, err := resolveDID(c.ControlPlaneDID, c.ControlPlaneDIDFile, "ControlPlaneDIDFile")
	if err != nil {
		return err
	}
	h.gatewayDID, err = resolveDID(c.GatewayDID, c.GatewayDIDFile, "GatewayDIDFile")
	if err != nil {
		return err
	}
	controlKey, err := pinnedKey(controlDID)
	if err != nil {
		return err
	}
	var built http.RoundTripper // from the TLS settings, when needed
	if c.ControlPlaneTransport == nil || (c.EventEndpoint != "" && c.EventTransport == nil) {
		var caPEM []byte
		if c.TLSCACertificateFile != "" {
			if caPEM, err = aip.ReadTrustFile(c.TLSCACertificateFile, MaxCACertificateBytes); err != nil {
				return fmt.Errorf("%s: %w", settingName("TLSCACertificateFile"), err)
			}
		}
		if built, err = newControlTransport(caPEM); err != nil {
			return fmt.Errorf("%s %s: %w", settingName("TLSCACertificateFile"), c.TLSCACertificateFile, err)
		}
	}
	if err := c.checkCredentialStartup(); err != nil {
		return err
	}
	transport := c.ControlPlaneTransport
	if transport == nil {
		transport = built
	}
	h.eventTransport = c.EventTransport
	if h.eventTransport == nil {
		h.eventTransport = built
	}
	h.control = &controlClient{
		endpoint: c.ControlPlaneEndpoint,
		http: &http.Client{
			Transport:     transport,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		key: h.key, pinnedDID: controlDID, pinnedKey: controlKey,
		timeout: c.ControlTimeout, now: c.Now, tracer: h.tracer,
	}
	h.log = h.log.With("replica_did", h.key.DID())
	return nil
}

// resolveDID returns the inline DID, else the one in file, the setting
// of Config field fileField.
func resolveDID(inline, file, fileField string) (string, error) {
	if inline != "" {
		return inline, nil
	}
	raw, err := aip.ReadTrustFile(file, MaxDIDBytes)
	if err != nil {
		return "", fmt.Errorf("%s: %w", settingName(fileField), err)
	}
	did := strings.TrimSpace(string(raw))
	if _, err := aip.ParseDIDKey(did); err != nil {
		return "", fmt.Errorf("%s: %s does not hold a did:key Ed25519 identifier: %w", settingName(fileField), file, err)
	}
	return did, nil
}

// Step 2: open the runtime journal (the caller's, the one
// Config.OpenJournal opens, or the embedded SQLite journal in StateDir) and
// probe it.
func (h *Host) stepOpenJournal(ctx context.Context) error {
	switch {
	case h.cfg.Journal != nil:
		h.journal = h.cfg.Journal
	case h.cfg.OpenJournal != nil:
		j, err := h.cfg.OpenJournal(ctx)
		if err != nil {
			return err
		}
		if j == nil {
			return errors.New("Config.OpenJournal returned no journal and no error")
		}
		h.journal, h.ownsJournal = j, true
	default:
		if err := os.MkdirAll(h.cfg.StateDir, 0o700); err != nil {
			return fmt.Errorf("%s %s: %w", settingName("StateDir"), h.cfg.StateDir, err)
		}
		j, err := openDefaultJournal(ctx, h.cfg.StateDir)
		if err != nil {
			return fmt.Errorf("%s %s: %w", settingName("StateDir"), h.cfg.StateDir, err)
		}
		h.journal, h.ownsJournal = j, true
		// The directory as an absolute path: a relative one (the default,
		// .aipfleet/host-<replica ID>) is under the working directory, and
		// a process started from another one opens another journal.
		dir := h.cfg.StateDir
		if abs, err := filepath.Abs(dir); err == nil {
			dir = abs
		}
		h.log.Info("runtime journal opened", "state_dir", dir)
	}
	if d := h.journal.Durability(); d != journal.Durable {
		h.log.Warn("the runtime journal is not durable; actions will not survive a restart", "durability", d)
	}
	if err := h.claimJournal(ctx); err != nil {
		return err
	}
	if err := h.loadOrigin(ctx); err != nil {
		return err
	}
	h.state = &State{j: h.journal, h: h}
	h.events = &EventPublisher{h: h}
	if h.cfg.AfterOpenJournal != nil {
		return h.cfg.AfterOpenJournal(ctx)
	}
	return nil
}

// Step 3: tenant-scoped discovery.
func (h *Host) stepDiscover(ctx context.Context) error {
	var m *aip.Manifest
	err := h.guard("Manifest", func() (err error) {
		m, err = h.conn.Manifest(ctx, h.tenant.clone())
		return err
	})
	if err != nil {
		return err
	}
	if m == nil {
		return errors.New("the connector returned no manifest")
	}
	h.manifest = m
	return nil
}

// Step 4: bind the manifest to the trust domain and signing principal and
// compute its digest.
func (h *Host) stepBindManifest(ctx context.Context) error {
	b, err := bindManifest(h.manifest, h.cfg.TrustDomain)
	if err != nil {
		return err
	}
	if did := h.manifest.Agent.DID; did != "" && did != h.key.DID() {
		return fmt.Errorf("manifest agent did %s is not this replica's signing key %s; leave it empty", did, h.key.DID())
	}
	bound, digest := b.manifest, b.digest
	h.manifest, h.manifestJSON, h.manifestDigest, h.caps = bound, b.canonical, digest, b.caps
	h.channels = manifestChannels(bound)
	h.principal = bound.Agent
	h.principal.DID = h.key.DID()
	jwks, err := aip.JWKS(h.key.PublicKey())
	if err != nil {
		return err
	}
	h.jwks = jwks
	h.log = h.log.With("manifest_digest", digest)
	return nil
}

// BindManifest checks a connector's manifest the way a host does when it
// binds it at bootstrap (step 4), apart from what depends on the replica's
// signing key: the manifest must be valid, list the native HTTP profile,
// have at most MaxCapabilities capabilities whose input and output schemas
// compile self-contained, not name another trust domain, and be at most
// MaxManifestBytes of canonical JSON once bound. It returns the bound copy
// (agent trust_domain set to trustDomain, agent did cleared; src is not
// changed) and its digest: what an operator admits as the connector
// version, and what a host with that trust domain registers.
func BindManifest(src *aip.Manifest, trustDomain string) (*aip.Manifest, string, error) {
	b, err := bindManifest(src, trustDomain)
	if err != nil {
		return nil, "", fmt.Errorf("hostsdk: %w", err)
	}
	return b.manifest, b.digest, nil
}

// boundManifest is a manifest bound to a trust domain, with its canonical
// JSON, its digest and its compiled capabilities.
type boundManifest struct {
	manifest  *aip.Manifest
	canonical []byte
	digest    string
	caps      map[string]*capability
}

func bindManifest(src *aip.Manifest, trustDomain string) (*boundManifest, error) {
	if src == nil {
		return nil, errors.New("no manifest to bind")
	}
	if trustDomain == "" {
		return nil, errors.New("the trust domain to bind the manifest to is empty; give --trust-domain")
	}
	if r, ok := aip.FormatCharacter(trustDomain); ok {
		// A version admitted with it could register no replica: a host
		// refuses the trust domain (Config.validate), and no replica
		// record holds it.
		return nil, fmt.Errorf("the trust domain %q to bind the manifest to holds the invisible formatting character U+%04X, which no registry identifier holds (it would print like an identifier it is not); remove it from --trust-domain",
			aip.TruncateUTF8(trustDomain, 64), r)
	}
	if len(src.Profiles) == 0 {
		// Manifest.Validate says only that the list is empty.
		return nil, fmt.Errorf("manifest lists no profiles; list %s (aip.NativeHTTPProfile), the profile this host serves", aip.NativeHTTPProfile)
	}
	if err := src.Validate(); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if err := checkAgentID(src.Agent.ID); err != nil {
		return nil, err
	}
	if len(src.Capabilities) > MaxCapabilities {
		return nil, fmt.Errorf("manifest has %d capabilities; at most %d", len(src.Capabilities), MaxCapabilities)
	}
	if !slices.Contains(src.Profiles, aip.NativeHTTPProfile) {
		return nil, fmt.Errorf("manifest profiles %v must include %s, the profile this host serves", src.Profiles, aip.NativeHTTPProfile)
	}
	if td := src.Agent.TrustDomain; td != "" && td != trustDomain {
		return nil, fmt.Errorf("manifest agent trust_domain %q differs from --trust-domain %q", td, trustDomain)
	}
	if err := checkManifestJSON(src); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	bound := *src
	bound.Agent.TrustDomain = trustDomain
	bound.Agent.DID = ""
	raw, err := aip.CanonicalJSON(&bound)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if len(raw) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest is %d bytes of canonical JSON; at most %d", len(raw), MaxManifestBytes)
	}
	digest, err := aip.ManifestDigest(&bound)
	if err != nil {
		return nil, err
	}
	caps := make(map[string]*capability, len(bound.Capabilities))
	for i := range bound.Capabilities {
		c, err := compileCapability(&bound.Capabilities[i])
		if err != nil {
			return nil, err
		}
		caps[c.cap.ID] = c
	}
	return &boundManifest{manifest: &bound, canonical: raw, digest: digest, caps: caps}, nil
}

// maxAgentIDBytes bounds a manifest's agent ID: registry.MaxIdentifierBytes,
// the bound of the replica's peer_principal_id, which must equal it.
const maxAgentIDBytes = 256

// checkAgentID holds the manifest's agent ID to the registry's rule for
// the replica's peer_principal_id, which must equal it (every replica of
// the version signs as its manifest's agent): 1 to maxAgentIDBytes bytes
// of UTF-8 text without control characters, invisible formatting
// characters (Unicode Cf) or white space at either end. The registry
// refuses to admit a version whose agent ID breaks it, so a host serving
// such a manifest could never register; it is refused here, before the
// connector's tests (hostsdktest's fake control plane admits what the
// host proposes) or its replica find out from the registry. The error
// names the character, as the registry's does.
func checkAgentID(id string) error {
	const rule = "; every replica signs as its manifest's agent, and the registry admits a version only with an agent ID its replicas' peer_principal_id can equal: " +
		"1 to 256 bytes of UTF-8 text without control characters, invisible formatting characters (Unicode Cf) or white space at either end; fix the agent ID in the connector's manifest"
	q := strconv.Quote(aip.TruncateUTF8(id, 64))
	if len(id) > 64 {
		q += "..."
	}
	if len(id) > maxAgentIDBytes {
		return fmt.Errorf("manifest agent id %s is %d bytes%s", q, len(id), rule)
	}
	if fault := aip.IdentifierCharFault(id); fault != "" {
		return fmt.Errorf("manifest agent id %s %s%s", q, fault, rule)
	}
	return nil
}

// checkManifestJSON names the member of a manifest whose raw JSON
// (json.RawMessage: a capability's schemas, a resource, ...) is not JSON,
// which encoding the manifest would otherwise report only as a
// json.RawMessage that failed to marshal.
func checkManifestJSON(m *aip.Manifest) error {
	check := func(what string, raw json.RawMessage) error {
		if len(raw) == 0 {
			return nil
		}
		if err := json.Unmarshal(raw, new(json.RawMessage)); err != nil { // syntax only
			return fmt.Errorf("%s is not JSON (%v): %s", what, err, aip.TruncateUTF8(string(raw), 64))
		}
		return nil
	}
	for i := range m.Capabilities {
		c := &m.Capabilities[i]
		for _, f := range []struct {
			name string
			raw  json.RawMessage
		}{{"input_schema", c.InputSchema}, {"output_schema", c.OutputSchema}, {"cost", c.Cost}, {"auth", c.Auth}} {
			if err := check(fmt.Sprintf("capability %s %s", c.ID, f.name), f.raw); err != nil {
				return err
			}
		}
	}
	// Channels are checked by Manifest.Validate, before this.
	for i, raw := range m.Resources {
		if err := check(fmt.Sprintf("resources[%d]", i), raw); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"security", m.Security}, {"governance", m.Governance}, {"limits", m.Limits}, {"compatibility", m.Compatibility}, {"extensions", m.Extensions}} {
		if err := check(f.name, f.raw); err != nil {
			return err
		}
	}
	return nil
}

// Step 5: build the native gateway and product routes and bind the
// listener (connections queue until step 10 serves them, or, for /health,
// /ready and the native ingress, until the early start after step 6:
// early.go).
func (h *Host) stepBuildRoutes(ctx context.Context) error {
	actionBase, stopActions := context.WithCancelCause(context.WithoutCancel(ctx))
	h.actionBase, h.hardStop = actionBase, func() { stopActions(ErrHostStopping) }
	var product []Route
	if rp, ok := h.conn.(RouteProvider); ok {
		err := h.guard("Routes", func() (err error) {
			product, err = rp.Routes(ctx, &RouteContext{
				Tenant: h.tenant.clone(), Events: h.events, State: h.state, Ready: h.ready, Logger: h.log,
			})
			return err
		})
		if err != nil {
			return fmt.Errorf("product routes: %w", err)
		}
	}
	mux, err := h.routes(product)
	if err != nil {
		return err
	}
	h.server = &http.Server{
		Handler:           h.untilServing(mux),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		// Responses last as long as their action (bounded by the action's
		// timeout_ms) or stream; no global write deadline.
		WriteTimeout:   0,
		IdleTimeout:    120 * time.Second,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       nil,
		ConnState:      h.conns.observe,
	}
	if h.cfg.Listener != nil {
		if err := listenerOpen(h.cfg.Listener); err != nil {
			return err
		}
		h.listener = h.cfg.Listener
		return nil
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", h.cfg.Bind)
	if err != nil {
		return fmt.Errorf("%s %s: %w", settingName("Bind"), h.cfg.Bind, err)
	}
	h.listener = l
	return nil
}

// listenerOpen refuses a Config.Listener that is already closed, as a
// Config reused for a second host (a test restarting its connector on the
// same journal) hands over the listener the first host closed when it
// stopped. Without this check the host would register and recover and
// fail only at serving, with "use of closed network connection". A
// listener that cannot say (it does not implement syscall.Conn) is taken
// as open.
func listenerOpen(l net.Listener) error {
	sc, ok := l.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err == nil {
		err = raw.Control(func(uintptr) {})
	}
	if err != nil && errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("Config.Listener is closed (%s): a host closes its Listener when it stops, so a Config reused for another host needs a new listener; set Listener to a new one, or to nil to bind Bind", l.Addr())
	}
	return nil
}

// Step 7: probe storage and connector health; both must be ready. When
// ctx was cancelled meanwhile (a shutdown requested while starting), a
// check it cut short says nothing of health and is left out, so that the
// other check's failure of its own is not taken for the cancellation.
func (h *Host) stepProbe(ctx context.Context) error {
	storageErr, connErr := h.probe(ctx)
	return probeStepError(ctx, storageErr, connErr)
}

// probeStepError is step 7's error from the two checks' (nil: both ready).
func probeStepError(ctx context.Context, storageErr, connErr error) error {
	if storageErr != nil && connErr != nil {
		if stoppedByCancel(ctx, storageErr) {
			return connErr
		}
		if stoppedByCancel(ctx, connErr) {
			return storageErr
		}
	}
	return errors.Join(storageErr, connErr)
}

// Step 8: the signed registration.
//
// A registration the control plane did not answer (ErrControlUnavailable:
// unreachable, hung, its signed 503, an answer lost or unverifiable) is
// sent again with jittered exponential backoff for up to
// Config.RegisterWait (registerWait): a control plane that restarts, or
// whose database fails over, is back within that, and a replica starting
// meanwhile waits for it instead of failing its start into its
// supervisor's crash loop. While the outcome of its attempts is unknown
// (one may have been applied and its answer lost) the same request is
// sent again (ID and payload, re-signed only when its window runs out:
// refresh), as lease recovery does: the control plane then answers a
// registration it applied with its lease instead of refusing a new one as
// lease_live. A replay answering a lease that ran out meanwhile, or refused
// because the replica changed since it was applied (the replay rule: the
// lease ran out and maintenance took the replica offline), is followed by
// a new registration at once.
//
// A registration refused because the replica's lease is still live in the
// registry (lease_live: an earlier run of this replica that stopped
// without going offline — a kill -9, an OOM kill, a lost machine — or
// another process started with this replica ID) is sent again, with a new
// request, once that lease can have expired (awaitLeaseLive), for at most
// MaxLeaseTTL plus a margin: the registry refuses any takeover while the
// lease is live, so waiting here is what a supervisor restarting the
// process would do, without its crash loop (a systemd unit with the
// default start limit gives up after five quick failures). Any other
// signed rejection fails the start at once.
func (h *Host) stepRegister(ctx context.Context) error {
	var deadline time.Time
	wait := h.newRegisterWait()
	var sr *sealedRequest // the request to send again, nil: seal a new one
	for {
		replay := sr != nil
		var err error
		if replay {
			sr, err = h.control.refresh(sr)
		} else {
			sr, err = h.control.seal(aip.RegisterCommand(h.registration()))
		}
		if err != nil {
			return err
		}
		lease, err := h.registerOnce(ctx, sr)
		var rej *ControlRejectedError
		switch {
		case err == nil && replay && !lease.ExpiresAt.After(h.cfg.Now()):
			h.log.Warn("the control plane answered the replayed registration with the lease it committed earlier, which has expired since; registering again with a new request",
				"request_id", sr.req.RequestID, "sequence", lease.Sequence, "expired_at", lease.ExpiresAt.String())
			sr = nil
			continue
		case err == nil:
			wait.registered()
			// The control plane's lease TTL is authoritative; a host whose
			// heartbeats come less often than half of it loses its lease
			// between them and flaps between not ready and re-registering.
			if granted := lease.ExpiresAt.Sub(h.cfg.Now()); granted < 2*h.cfg.HeartbeatInterval {
				h.log.Warn("the control plane grants a lease shorter than two heartbeat intervals: the lease will lapse between heartbeats; set --heartbeat-interval-ms to at most half the control plane's --lease-ttl",
					"lease", granted.Round(time.Millisecond).String(), "heartbeat_interval", h.cfg.HeartbeatInterval.String())
			}
			return nil
		case errors.Is(err, ErrControlUnavailable):
			if ctx.Err() != nil {
				return err
			}
			if err := wait.sleep(ctx, err); err != nil {
				return err
			}
			continue // sr again: its outcome is unknown, or nothing of it was applied
		case !errors.As(err, &rej):
			return err
		case replay && sr.maybeApplied && strings.HasPrefix(rej.Message, replayRulePrefix):
			h.log.Warn("the control plane refused the replayed registration: it was applied, and the replica has changed since (its lease ran out); registering again with a new request",
				"request_id", sr.req.RequestID, "message", rej.Message)
			sr = nil
			continue
		case !strings.HasPrefix(rej.Message, leaseLivePrefix):
			return h.settingRefusal(err, rej)
		}
		sr = nil
		wait.answered()
		now := h.cfg.Now()
		if deadline.IsZero() {
			deadline = now.Add(MaxLeaseTTL + leaseLiveMargin)
		}
		delay := leaseLiveWait(rej.Message, now, h.cfg.HeartbeatInterval)
		if now.Add(delay).After(deadline) {
			return fmt.Errorf("%w (still live after waiting %s for it to expire: another process may hold this replica ID; give each replica its own ID)",
				err, (MaxLeaseTTL + leaseLiveMargin).String())
		}
		h.log.Warn("registration refused while the replica's previous lease is live in the registry (a run that stopped without going offline, or another process with this replica ID); registering again once it can have expired",
			"message", rej.Message, "retry_in", delay.Round(time.Millisecond).String())
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for the replica's previous lease to expire: %w (%w)", err, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// settingRefusal returns err, the signed rejection rej of the
// registration, as an error that matches ErrSetting and says which of the
// host's settings to fix when the control plane refused it because a
// setting differs from what the fleet pre-provisioned for the replica:
// the signing key (the control plane's signer check: "signer_did DID is
// not the DID pre-provisioned for replica R"), the replica ID (not
// pre-provisioned), the replica's fixed identity (the registry's identity
// rule: instance, version, endpoint, trust domain, topology), or the
// instance's tenant, configuration revision, secret-provider reference or
// the version's artifact digest (the instance and digest rules). Starting
// the host again with the same settings is refused the same way. Any
// other rejection (a version not active, an instance disabled, a manifest
// that is not the admitted one: the fleet's state or the connector) is
// returned as it is.
func (h *Host) settingRefusal(err error, rej *ControlRejectedError) error {
	hint := registerSettingHint(rej.Message, h.key.DID(), &h.cfg)
	if hint == "" {
		return err
	}
	return &settingRefusedError{err: err, hint: hint}
}

// signingKeySetting names where the host's signing key comes from.
func signingKeySetting(c *Config) string {
	if c.SigningKey != nil {
		return "Config.SigningKey"
	}
	return settingName("SigningSeedFile") + " " + c.SigningSeedFile
}

// registerSettingHint is what to fix for a registration refused with
// message, "" when no setting of the host is at fault. The control plane
// words its signer and pre-provisioning checks in full and the registry's
// rules as "<rule>: <reason>", the reason naming the registration's field
// first (registry.DecideLifecycle).
func registerSettingHint(message, did string, c *Config) string {
	if strings.HasPrefix(message, signerRulePrefix) && strings.Contains(message, signerRulePhrase) {
		return fmt.Sprintf("this host presented the DID %s of its signing key (%s): the peer_did of replica %s in the fleet file must be that key's DID "+
			"(`aipfleet keygen --did-of FILE` prints a key file's DID); start the host with the key file whose DID is that peer_did, or set the peer_did to %s and apply the fleet file again",
			did, signingKeySetting(c), c.ReplicaID, did)
	}
	if strings.Contains(message, notProvisionedPhrase) || strings.HasPrefix(message, notProvisionedRulePrefix) {
		return fmt.Sprintf("check that %s %s is the ID of a replica of the fleet file, and that the fleet file was applied", settingName("ReplicaID"), c.ReplicaID)
	}
	rule, reason, ok := strings.Cut(message, ": ")
	if !ok {
		return ""
	}
	field, _, _ := strings.Cut(reason, " ")
	switch rule {
	case identityRule:
		if field == "peer" { // "peer principal KIND ID is not version V's manifest agent"
			return "the connector's manifest agent is not the admitted version's: run the connector the version was admitted with"
		}
		if setting, ok := identitySettings[field]; ok {
			if setting == "SigningSeedFile" {
				return fmt.Sprintf("start the host with the signing key whose DID is the replica's peer_did (this host's is %s, from %s)", did, signingKeySetting(c))
			}
			return fmt.Sprintf("set %s to the value pre-provisioned for replica %s in the fleet file, or pre-provision a replica with this one", settingName(setting), c.ReplicaID)
		}
		return fmt.Sprintf("the host's %s is not the one pre-provisioned for replica %s in the fleet file", field, c.ReplicaID)
	case instanceRule, digestRule:
		if setting, ok := instanceSettings[field]; ok {
			return fmt.Sprintf("set %s to the value the fleet file gives the replica's instance and version", settingName(setting))
		}
	}
	return ""
}

// The wording of the rejections registerSettingHint reads: the control
// plane's signer and pre-provisioning checks (controlplane.Service and
// hostsdktest's control plane word them with aip's phrases), and the
// registry's rules (registry.RuleIdentity, RuleInstance, RuleDigest,
// RuleNotProvisioned) that start the message of a registration they
// refuse.
const (
	signerRulePrefix         = "signer_did "
	signerRulePhrase         = aip.SignerNotProvisionedPhrase
	notProvisionedPhrase     = aip.NotProvisionedPhrase
	notProvisionedRulePrefix = "not_provisioned: "
	identityRule             = "identity"
	instanceRule             = "instance"
	digestRule               = "digest"
)

// identitySettings maps the fields of the registry's identity rule to the
// Config field of the setting that gives them.
var identitySettings = map[string]string{
	"replica.instance_id":             "InstanceID",
	"replica.version_id":              "VersionID",
	"replica.endpoint":                "PublicEndpoint",
	"replica.peer_did":                "SigningSeedFile",
	"replica.trust_domain":            "TrustDomain",
	"replica.topology.region":         "Region",
	"replica.topology.zone":           "Zone",
	"replica.topology.capacity_class": "CapacityClass",
}

// instanceSettings maps the fields of the registry's instance and digest
// rules that a setting of the host gives to its Config field.
var instanceSettings = map[string]string{
	"tenant_id":           "TenantID",
	"config_revision":     "ConfigRevision",
	"secret_provider_ref": "SecretProviderRef",
	"artifact_digest":     "ArtifactDigest",
}

// leaseLivePrefix starts the message of a registration the registry refused
// under its lease_live rule (the control plane words its rejections
// "<rule>: <reason>"), and replayRulePrefix one refused under its replay
// rule (registry.RuleReplay): a request ID the registry decided already,
// whose replay it no longer answers with that decision.
const (
	leaseLivePrefix  = aip.ControlRuleLeaseLive + ": "
	replayRulePrefix = aip.ControlRuleReplay + ": "
)

// leaseLiveMargin is added to MaxLeaseTTL to bound the wait for a live lease:
// the control plane's maintenance takes an expired lease offline within its
// interval (1 s by default).
const leaseLiveMargin = 10 * time.Second

// leaseLiveWait is how long to wait before registering again after a
// lease_live refusal: until the lease's expiry the message names ("with a
// lease until <RFC 3339 time>") plus a second for the control plane's
// maintenance, at least a second; a heartbeat interval when it names none.
func leaseLiveWait(message string, now time.Time, heartbeat time.Duration) time.Duration {
	_, rest, ok := strings.Cut(message, aip.LeaseUntilPhrase)
	if !ok {
		return heartbeat
	}
	until, _, _ := strings.Cut(rest, " ")
	t, err := time.Parse(time.RFC3339Nano, until)
	if err != nil {
		return heartbeat
	}
	return max(t.Sub(now)+time.Second, time.Second)
}

// registerOnce sends sr (an attempt and, after an ambiguous failure, its
// resend) and applies the lease it answers. After a failure that leaves
// open whether the control plane applied it, sr is the pending
// registration: a failed start replays it to learn that and takes the
// replica offline. (One that never left the host, or that the control
// plane refused with its signed word, was not applied.) An answer, or a
// signed rejection, clears it.
func (h *Host) registerOnce(ctx context.Context, sr *sealedRequest) (*aip.Lease, error) {
	out, err := h.control.do(ctx, sr)
	h.controlMu.Lock()
	h.pendingRegister = nil
	var rej *ControlRejectedError
	if err != nil && !errors.As(err, &rej) && sr.maybeApplied {
		h.pendingRegister = sr
	}
	h.controlMu.Unlock()
	if err != nil {
		return nil, err
	}
	if out.Lease == nil {
		return nil, fmt.Errorf("register answered %s without a lease", out.Status)
	}
	h.lease.apply(out.Lease)
	if err := h.fixOrigin(ctx, out.Lease.Sequence); err != nil {
		return nil, err
	}
	return out.Lease, nil
}

// registration is the replica proposal: ready, no assignments, health
// revision zero, no previous request.
func (h *Host) registration() aip.Registration {
	c := &h.cfg
	return aip.Registration{
		Replica: aip.Replica{
			ID: c.ReplicaID, InstanceID: c.InstanceID, VersionID: c.VersionID,
			Endpoint:        c.PublicEndpoint,
			PeerPrincipalID: h.principal.ID, PeerPrincipalKind: h.principal.Kind, PeerDID: h.key.DID(),
			TrustDomain: c.TrustDomain, TransportProfile: aip.NativeHTTPProfile,
			Topology: aip.Topology{Region: c.Region, Zone: c.Zone, CapacityClass: c.CapacityClass},
			Status:   aip.ReplicaReady, LeaseExpiresAt: aip.At(c.Now().Add(c.LeaseTTL)),
			Capacity: uint32(c.MaxInFlight),
		},
		ManifestDigest: h.manifestDigest, ArtifactDigest: c.ArtifactDigest, TenantID: c.TenantID,
		ConfigRevision: c.ConfigRevision, SecretProviderRef: c.SecretProviderRef,
		CapabilityCount: uint32(len(h.manifest.Capabilities)),
	}
}

// Step 9: the lease is applied; start the heartbeat worker.
func (h *Host) stepApplyLease(ctx context.Context) error {
	seq, exp := h.lease.get()
	if !exp.After(h.cfg.Now()) {
		return fmt.Errorf("the lease granted at sequence %d expired at %s; check the clocks of this host and the control plane", seq, aip.At(exp))
	}
	h.log.Info("lease granted", "sequence", seq, "expires_at", aip.At(exp).String())
	hbCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.hbCancel, h.hbDone = cancel, make(chan struct{})
	go func() {
		defer close(h.hbDone)
		h.runHeartbeats(hbCtx)
	}()
	return nil
}

// Step 10: start the event delivery loop (when Config.EventEndpoint is
// set; before anything can publish), serve (the server serving the native
// ingress since step 6, when it did, now serves everything and runs
// actions: early.go), and start the connector's event source if it has
// one.
func (h *Host) stepServe(ctx context.Context) error {
	if h.serveDone != nil {
		select {
		case <-h.serveDone:
			return fmt.Errorf("the HTTP server, serving the native ingress since recovery, stopped: %w", h.serveErr)
		default:
		}
	}
	h.startEventDelivery(ctx)
	if h.serveDone == nil {
		h.startServer()
	}
	h.serving.Store(true)
	h.endStart()
	if es, ok := h.conn.(EventSource); ok {
		evCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		h.evCancel, h.evDone = cancel, make(chan struct{})
		go func() {
			defer close(h.evDone)
			err := h.guard("RunEvents", func() error { return es.RunEvents(evCtx, h.events) })
			if err != nil && !errors.Is(err, context.Canceled) {
				h.evErr = err
				h.log.Error("event source stopped", "error", err)
			}
		}()
	}
	h.log.Info("serving", "addr", h.listener.Addr().String(), "endpoint", h.cfg.PublicEndpoint)
	return nil
}

// probe checks storage and connector health with the probe timeout and
// records the results. The storage check is checkStorage: the journal's
// Probe and, after a journal write failed for a storage reason (an
// action's, an outbox batch's, a state value's), a write as large as that
// one (see storageRecheckMinBytes); such a write that fails while it runs
// makes the result not ready even when the check passed, since it
// may have begun before the failure. The timeout holds even for a check
// that ignores its context (see boundedCheck). A check that failed once
// ctx had ended (the client of a /ready that went away, a heartbeat
// stopped by the shutdown) was cut short by its caller: it says nothing of
// health, and is returned but not recorded, so a peer that abandons /ready
// cannot make the replica refuse actions until the next probe.
func (h *Host) probe(ctx context.Context) (storageErr, connErr error) {
	pctx, cancel := context.WithTimeout(ctx, h.cfg.HealthProbeTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		storageErr = h.storageCheck.do(pctx, h.cfg.HealthProbeTimeout, h.checkStorage)
	}()
	var degraded *DegradedError
	if hc, ok := h.conn.(HealthChecker); ok {
		connErr = h.connectorCheck.do(pctx, h.cfg.HealthProbeTimeout, hc.CheckHealth)
		if degraded = asDegraded(connErr); degraded != nil {
			connErr = nil // ready, but degraded
		}
	}
	<-done
	if f := h.writeFailed.Load(); storageErr == nil && f != nil {
		storageErr = f.err
	}
	if storageErr != nil {
		if errors.Is(storageErr, context.DeadlineExceeded) {
			storageErr = fmt.Errorf("%w after %s", errStorageProbeTimeout, h.cfg.HealthProbeTimeout)
		} else {
			storageErr = fmt.Errorf("durable runtime storage readiness check failed: %w", storageErr)
		}
	}
	if connErr != nil {
		connErr = fmt.Errorf("connector is not ready: %w", connErr)
	}
	abandoned := ctx.Err() != nil
	if storageErr == nil || !abandoned {
		h.recordStorage(storageErr)
	}
	if connErr == nil || !abandoned {
		h.recordConnector(connErr, degraded)
	}
	return storageErr, connErr
}

// recordStorage records the outcome of a storage check.
func (h *Host) recordStorage(storageErr error) {
	sd := probeDetail{full: "durable runtime storage is readable and writable"}
	if h.journal.Durability() != journal.Durable {
		sd.full = "runtime storage is readable and writable (ephemeral)"
	}
	sd.public = sd.full
	if storageErr != nil {
		sd.full, sd.public = storageErr.Error(), "durable runtime storage readiness check failed"
		if errors.Is(storageErr, errStorageProbeTimeout) {
			sd.public = sd.full // the timeout is all it says
		}
	}
	sd.full = aip.TruncateUTF8(sd.full, aip.MaxErrorMessageBytes)
	h.storageDetail.Store(&sd)
	h.storageReady.Store(storageErr == nil)
}

// recordConnector records the outcome of a connector check: connErr when
// it failed, degraded when it passed but said the connector is degraded.
// Becoming degraded is logged at warn and no longer being so at info; a
// degraded detail that changes from probe to probe is not logged again.
func (h *Host) recordConnector(connErr error, degraded *DegradedError) {
	cd := probeDetail{full: "connector is ready", public: "connector is ready"}
	switch {
	case connErr != nil:
		cd.full, cd.public = connErr.Error(), "connector is not ready"
	case degraded != nil:
		cd.full, cd.public = "connector is ready but degraded: "+degraded.Err.Error(), "connector is ready but degraded"
	}
	if connErr == nil {
		switch was := h.connectorDegraded.Swap(degraded != nil); {
		case degraded != nil && !was:
			h.log.Warn("connector is ready but degraded; the replica keeps serving", "detail", degraded.Err.Error())
		case degraded == nil && was:
			h.log.Info("connector is no longer degraded")
		}
	}
	cd.full = aip.TruncateUTF8(cd.full, aip.MaxErrorMessageBytes)
	h.connectorDetail.Store(&cd)
	h.connectorReady.Store(connErr == nil)
}

// errStorageProbeTimeout is the storage probe's error when it runs out of
// time.
var errStorageProbeTimeout = errors.New("durable runtime storage readiness check timed out")

// probeDetail is a probe's outcome as /ready shows it: full to peers on
// this machine (its error text names hosts, files, product URLs), public
// (a fixed text) to the others. The host logs the full text.
type probeDetail struct{ full, public string }

// forPeer is the text for a peer: full when local.
func (d *probeDetail) forPeer(local bool) string {
	if local {
		return d.full
	}
	return d.public
}

// boundedCheck runs a health check for concurrent callers (heartbeat,
// /ready), one run at a time: a caller joins the run in flight or starts
// one, with a timeout of its own that no caller cancels, and waits for it
// at most until the caller's ctx is done. So a check that ignores its
// context holds no caller past the probe timeout, and one stuck for good
// is not started again at every probe.
//
// A check that panics at every probe has its panic passed to onPanic (when
// set) once, and again only when the panic changes or after a run without
// one: a probe runs every few seconds, a stack at each would flood the log.
type boundedCheck struct {
	mu      sync.Mutex
	cur     *checkRun
	onPanic func(*checkPanic)
	panics  onchange.Text // the value last passed to onPanic, "" after a run without a panic
}

type checkRun struct {
	done chan struct{}
	err  error
}

func (b *boundedCheck) do(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	r := b.cur
	if r == nil {
		r = &checkRun{done: make(chan struct{})}
		b.cur = r
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		go func() {
			defer cancel()
			err := runCheck(cctx, check)
			var p *checkPanic
			if !errors.As(err, &p) {
				p = &checkPanic{}
			}
			if b.panics.Changed(p.value) && p.value != "" && b.onPanic != nil {
				b.onPanic(p)
			}
			b.mu.Lock()
			r.err, b.cur = err, nil
			b.mu.Unlock()
			close(r.done)
		}()
	}
	b.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// guard runs one of the connector's methods (named by method) and turns a
// panic in it into an error that names the method, so that a connector's
// bug fails the step, the cancel or the event source it was called for
// instead of ending the process (a panic on a goroutine the connector
// started itself still ends it). The panic is logged at ERROR with its
// stack, which the error does not carry.
func (h *Host) guard(method string, f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the connector's %s panicked: %v", method, p)
			h.log.Error("the connector panicked", "method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
	}()
	return f()
}

// runCheck runs check, turning a panic into a *checkPanic: the check runs
// on a goroutine of its own, where a panic would end the process.
func runCheck(ctx context.Context, check func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &checkPanic{value: fmt.Sprint(p), stack: debug.Stack()}
		}
	}()
	return check(ctx)
}

// checkPanic is the error of a check that panicked: the panic's value and
// the stack, which the error's text does not carry.
type checkPanic struct {
	value string
	stack []byte
}

func (p *checkPanic) Error() string { return "the check panicked: " + p.value }
