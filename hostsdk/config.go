package hostsdk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/internal/netutil"
)

// Defaults and bounds of the host's knobs (reference: the common connector
// host CLI contract).
const (
	DefaultBind               = "0.0.0.0:8081"
	DefaultMaxInFlight        = 32
	MaxMaxInFlight            = 65536
	DefaultLeaseTTL           = 30 * time.Second
	MinLeaseTTL               = time.Second
	MaxLeaseTTL               = 300 * time.Second
	DefaultHeartbeatInterval  = 10 * time.Second
	DefaultDrainTimeout       = 30 * time.Second
	MaxDrainTimeout           = 300 * time.Second
	DefaultDrainLinger        = 2 * time.Second
	MaxDrainLinger            = 60 * time.Second
	DefaultHealthProbeTimeout = 2 * time.Second
	MaxHealthProbeTimeout     = 30 * time.Second
	DefaultControlTimeout     = 5 * time.Second
	MaxControlTimeout         = 30 * time.Second
	DefaultHandleGrace        = 10 * time.Second
	MaxHandleGrace            = 300 * time.Second
	DefaultConfigRevision     = 1
	// DefaultRegisterWait and MaxRegisterWait: Config.RegisterWait's
	// default and bound.
	DefaultRegisterWait = 2 * time.Minute
	MaxRegisterWait     = time.Hour
	// DefaultGatewayPrincipalID is Config.GatewayPrincipalID when unset:
	// the principal aipfleet dispatch signs as by default (its
	// --principal-id). A host only accepts native messages from this
	// principal signed with the pinned GatewayDID, so a dispatcher with
	// another principal is refused, never trusted.
	DefaultGatewayPrincipalID = "service:aipfleet-dispatch"
	// DefaultStateDirRoot is where the embedded journal lives when
	// Config.StateDir is empty: <root>/host-<replica ID>.
	DefaultStateDirRoot = ".aipfleet"
	// MaxManifestBytes bounds the bound manifest's canonical JSON.
	MaxManifestBytes = 4 << 20
	// MaxCapabilities bounds the capabilities of a manifest.
	MaxCapabilities = 512
	// MaxCACertificateBytes bounds the optional control-plane CA file.
	MaxCACertificateBytes = 1 << 20
	// MaxDIDBytes bounds a DID given inline or in a file.
	MaxDIDBytes = 512
	// MaxCredentialPolicyBytes bounds the credential revision policy file.
	MaxCredentialPolicyBytes = 64 << 10
	// MaxCredentialRevisionRefBytes bounds a credential revision reference
	// (Config.CredentialRevisionRef and each one of the policy).
	MaxCredentialRevisionRefBytes = 256
	// DefaultActionRetention is how long a finished action's journal record
	// is kept by default (as long as upstream keeps runtime events).
	DefaultActionRetention = 30 * 24 * time.Hour
	// MinActionRetention is the shortest action retention accepted.
	MinActionRetention = time.Hour
	// KeepActionsForever, as Config.ActionRetention, never prunes actions.
	KeepActionsForever time.Duration = -1
	// NoRegisterWait, as Config.RegisterWait, fails the start at the
	// first failed registration (its attempt and resend), without waiting
	// for the control plane.
	NoRegisterWait time.Duration = -1
)

// The values of the --ready-detail setting (Config.HideLocalReadyDetail),
// as the control plane's and the dispatcher's flag of that name takes
// them: local shows the error texts of failing /ready checks to unproxied
// loopback peers, none to no peer.
const (
	readyDetailLocal = "local"
	readyDetailNone  = "none"
)

// Config configures a Host. Required fields have no default; every other
// field's zero value means the documented default. LoadConfig fills a Config
// from flags and AIP_CONNECTOR_HOST_* environment variables.
type Config struct {
	// Bind is the listen address, host:port with a port number (0: any
	// free port). Defaults to 0.0.0.0:8081.
	Bind string
	// Listener, when set, is used instead of binding Bind (tests, socket
	// activation). The host closes it when it stops; a closed one is refused
	// at bootstrap step 5, so a Config reused for another host needs a new
	// listener.
	Listener net.Listener
	// PublicEndpoint is the URL the dispatcher reaches this replica at; its
	// path must be exactly /aip/v1/messages. Required.
	PublicEndpoint string

	// ControlPlaneEndpoint is the lifecycle service URL; its path must be
	// exactly /aip/v1/connector-control. Required.
	ControlPlaneEndpoint string
	// ControlPlaneDID (or ControlPlaneDIDFile, exactly one) pins the
	// did:key the lifecycle service signs its responses with.
	ControlPlaneDID     string
	ControlPlaneDIDFile string
	// TLSCACertificateFile optionally adds a PEM root CA (not a secret, but
	// it must not be writable by group or others) for the control plane and
	// the event endpoint.
	TLSCACertificateFile string
	// AllowInsecureLoopbackHTTP permits http:// endpoints on loopback hosts
	// (development and tests). It requires a loopback bind address.
	AllowInsecureLoopbackHTTP bool
	// ControlPlaneTransport, when set, carries lifecycle requests instead of
	// a transport built from the TLS settings (tests use an in-memory one).
	ControlPlaneTransport http.RoundTripper

	// EventEndpoint is the dispatcher's connector-event ingress; its path
	// must be exactly /aip/v1/connector-events (aip.EventsPath), with the
	// same https and loopback-http rules as ControlPlaneEndpoint. When set,
	// the host delivers its event outbox there, signed with its key, and
	// accepts only answers signed by the pinned gateway DID. When empty,
	// published events stay in the outbox (counted in /ready) and are not
	// delivered. TLSCACertificateFile applies to it too.
	EventEndpoint string
	// EventTransport, when set, carries event deliveries instead of a
	// transport built from the TLS settings (tests use an in-memory one).
	EventTransport http.RoundTripper

	// SigningSeedFile is the owner-only file with this replica's Ed25519
	// key (64 hex characters or an Ed25519 JWK). Required unless SigningKey
	// is set.
	SigningSeedFile string
	// SigningKey, when set, is used instead of reading SigningSeedFile.
	SigningKey *aip.SigningKey

	// Registry identity of this replica: the IDs of its records, each its
	// prefix (ctype_, cver_, cinst_, crepl_) followed by letters, digits,
	// '.', '_' or '-' (aip.ValidateRecordID), as the registry takes them.
	// Required.
	ConnectorTypeID string
	VersionID       string
	InstanceID      string
	ReplicaID       string
	// TenantID is the tenant owning the instance (1 to 256 bytes,
	// aip.MaxTenantIDBytes, without an invisible formatting character:
	// no registry tenant ID is longer or holds one). Required.
	TenantID string
	// TenantSystem optionally names the system TenantID is an identifier
	// of (1 to 512 bytes): identity.tenant.system of every action the
	// connector sees.
	TenantSystem string
	// MembershipID optionally names the tenant membership the instance
	// acts under (1 to 512 bytes). Connectors read it from TenantContext;
	// the action's identity has no member for it.
	MembershipID string
	// ExternalAccountID and ExternalAccountSystem (both or neither; 1 to
	// 512 and 1 to 128 bytes) name the provider account the instance acts
	// as: identity.external_account of every action the connector sees.
	ExternalAccountID     string
	ExternalAccountSystem string
	// CredentialID, CredentialIssuer, CredentialScopes and
	// CredentialRevisionRef reference the tenant credential the instance
	// uses (never its value): all four or none. ID and issuer are 1 to 512
	// bytes; at least one scope, each 1 to 512 bytes; the revision 1 to
	// 256 bytes. {id, issuer, scopes} is identity.credential_ref of every
	// action the connector sees; the revision is the one
	// CredentialRevisionPolicyFile must authorize when the host starts.
	CredentialID          string
	CredentialIssuer      string
	CredentialScopes      []string
	CredentialRevisionRef string
	// CredentialRevisionPolicyFile optionally names the credential
	// revision policy: a JSON file (not a secret, but it must not be
	// writable by group or others; at most MaxCredentialPolicyBytes)
	// holding {"current_revision_ref", "accepted_previous_revisions",
	// "revoked_revisions"}. The host reads and checks it when it starts
	// (it must authorize CredentialRevisionRef) and again before every
	// action and cancel, against the credential_revision_ref of the
	// message's route: a revoked or unlisted revision is refused with
	// connector_host.credential_revision_denied, and a file that cannot
	// be read or is invalid then refuses with
	// connector_host.credential_revision_unavailable (docs/operator-guide.md,
	// "Credential revisions"). Without it no revision is checked.
	CredentialRevisionPolicyFile string
	// GatewayPrincipalID is the dispatcher's principal (kind service); native
	// messages must come from it. It must equal the dispatcher's principal
	// (aipfleet dispatch --principal-id); default
	// DefaultGatewayPrincipalID, that flag's default.
	GatewayPrincipalID string
	// GatewayDID (or GatewayDIDFile, exactly one) pins the did:key native
	// messages must be signed with.
	GatewayDID     string
	GatewayDIDFile string
	// TrustDomain is the deployment trust domain (1 to 253 bytes, without
	// an invisible formatting character, which no registry replica's trust
	// domain holds). Required.
	TrustDomain string
	// Region, Zone and CapacityClass place the replica. Default to global,
	// default and standard; each is at most 128 of [A-Za-z0-9._-].
	Region        string
	Zone          string
	CapacityClass string
	// ArtifactDigest is the admitted artifact digest ("sha256:" + 64 hex).
	// Required.
	ArtifactDigest string
	// SecretProviderRef is the instance's secret-provider reference (1 to
	// 256 bytes, aip.MaxSecretProviderRefBytes, without an invisible
	// formatting character: the registry holds none longer or with one,
	// and the registration must name the instance's). Required.
	SecretProviderRef string
	// ConfigRevision is the instance configuration revision. Defaults to 1.
	ConfigRevision uint64

	// MaxInFlight bounds concurrent actions and is advertised as the
	// replica's capacity. Defaults to 32; 1 to 65536.
	MaxInFlight int
	// LeaseTTL is the advisory lease lifetime proposed at registration (the
	// control plane's expiry is authoritative). Defaults to 30s; 1s to 300s.
	LeaseTTL time.Duration
	// HeartbeatInterval defaults to 10s; at most LeaseTTL/2. A beat that
	// failed for a reason that may pass is retried in between, with
	// backoff up to HeartbeatInterval/2 (see Lease and heartbeats).
	HeartbeatInterval time.Duration
	// DrainTimeout bounds the wait for in-flight actions on shutdown (those
	// still running then are cancelled, and answered on their connections
	// within HandleGrace), and then the graceful HTTP shutdown. Defaults
	// to 30s; 1ms to 300s.
	DrainTimeout time.Duration
	// DrainLinger is how long, at least, the listener keeps answering after
	// the drain begins (and after the control plane accepted it, if
	// later), even with nothing in flight: an action the dispatcher routed
	// just before the registry recorded the drain then gets the signed
	// connector_host.not_ready (which proves it did not start here, so it
	// can be rerouted) instead of a refused connection. When the drain did
	// not get through, the listener answers so until the lease the control
	// plane granted last has expired, plus a second and DrainLinger (the
	// registry may route actions here until then), unless a replay of the
	// drain gets through first; at most DrainTimeout after the drain step.
	// Defaults to 2s; 1ms to 60s; the linger after the drain began is never
	// longer than DrainTimeout.
	DrainLinger time.Duration
	// HealthProbeTimeout bounds each storage and connector probe. Defaults
	// to 2s; 1ms to 30s.
	HealthProbeTimeout time.Duration
	// ControlTimeout bounds each lifecycle HTTP attempt. Defaults to 5s;
	// 1ms to 30s.
	ControlTimeout time.Duration
	// RegisterWait bounds how long bootstrap step 8 waits for a control
	// plane that does not answer the registration (ErrControlUnavailable:
	// unreachable, hung, answering its signed 503, or an answer lost), as
	// while it restarts or the database behind it fails over: the host
	// logs that it waits and registers again with jittered exponential
	// backoff (1s doubling to 10s), sending the same request again while
	// the outcome of its attempts is unknown, and fails the start once
	// RegisterWait has passed since the first failed attempt (the
	// attempt in flight then finishes first). A signed rejection fails
	// the start at once, except lease_live (the replica's previous lease
	// is still live), which is waited out for up to MaxLeaseTTL plus 10s
	// whatever RegisterWait is. Defaults to 2 minutes; 1ms to 1 hour;
	// NoRegisterWait fails the start at the first failed attempt and its
	// resend.
	RegisterWait time.Duration
	// HandleGrace is how long the host waits for the connector's Handle
	// (or HandleStream) to return after the action's context ended (its
	// timeout_ms passed, a cancel asked for it, or the host stopped). A
	// call still running then is abandoned: the action is journaled
	// outcome_unknown (its effect may still happen) and answered so — a
	// read-only capability's failed connector_host.interrupted, retryable
	// (Interrupted) — and
	// the call keeps its in-flight slot until it returns
	// (aip_connector_host_abandoned_calls counts them). A drain does not wait for
	// abandoned calls; Stop names those still running in its
	// *ShutdownError. It also bounds each answer write, with the answer's
	// size at 256 KiB/s: a receiver that does not take an answer (a JSON
	// answer, or one line of a stream) in that time has stopped reading,
	// and the answer is logged as undelivered (a streaming call's
	// ChunkWriter.Send fails with ErrStreamClosed). Defaults to 10s; 1ms
	// to 300s.
	HandleGrace time.Duration
	// HideLocalReadyDetail keeps the error texts of failing /ready checks
	// (the storage and connector probes' and recovery's: they name hosts,
	// files and product URLs) from local peers too, leaving them to the
	// log; every peer then reads the fixed texts. By default a request
	// from a loopback peer that carries no proxy forwarding header
	// (netutil.IsLocalUnproxied) reads them; set this behind a proxy on
	// the same machine that adds no such header (an Envoy or Istio
	// sidecar's inbound listener, for one), where every caller is a
	// loopback peer. It is the --ready-detail setting: none sets it,
	// local (the default) leaves it unset.
	HideLocalReadyDetail bool

	// Journal, when set, is the runtime journal the host uses (for example
	// a pgruntime journal). The caller owns it: the host never closes it.
	// When nil (and OpenJournal is nil), the host opens the embedded SQLite
	// journal in StateDir and closes it when it stops.
	Journal journal.Journal
	// OpenJournal, when set, opens the runtime journal at bootstrap step 2,
	// after the configuration and its files passed step 1: a main that
	// keeps the journal in PostgreSQL (pgruntime with DatabaseURLFile)
	// sets it rather than open the journal before New, so that an invalid
	// setting is refused before the database is touched (its schema
	// installed, its namespace locked). The host owns what it returns and
	// closes it when it stops or when its start fails. At most one of
	// Journal and OpenJournal.
	OpenJournal func(ctx context.Context) (journal.Journal, error)
	// AfterOpenJournal, when set, is called at the end of bootstrap step 2,
	// once the journal is open and claimed for this host — so with its
	// exclusive lock held: no other live host uses this journal — and
	// before discovery and recovery. A host that starts the connector's
	// processes itself (the sidecar) uses it to stop what a killed
	// predecessor left running and to start them. An error fails step 2
	// (OpenJournalError) and the journal is closed.
	AfterOpenJournal func(ctx context.Context) error
	// StateDir is the embedded journal's directory. Defaults to
	// .aipfleet/host-<ReplicaID> under the working directory (see
	// defaultStateDir for a replica ID too long for a file name). A
	// missing one is created 0700; an existing one that its group or
	// others may write to, or that another user owns, is refused.
	StateDir string
	// ActionRetention is how long the journal keeps a finished action's
	// record (its result, answered to every retry of the action ID) after
	// the action finished; older records are pruned in the background with
	// their receipts. A delivery of an action that may be older than what
	// was pruned is refused with connector_host.action_expired, never run
	// again (docs/connector-guide.md, "Journal retention"). Defaults to 30
	// days; at least MinActionRetention; KeepActionsForever disables
	// pruning.
	ActionRetention time.Duration
	// DatabaseURLFile names an owner-only file with a PostgreSQL URL for the
	// runtime journal. The host itself does not open PostgreSQL: a main
	// that supports it sets OpenJournal to open pgruntime with this file
	// (or passes an open journal as Journal). Setting it without either is
	// an error.
	DatabaseURLFile string

	// Logger receives JSON-friendly structured logs. Defaults to a logger
	// that discards everything.
	Logger *slog.Logger
	// TracerProvider provides the tracer for bootstrap, lifecycle and action
	// spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Collectors are registered on the host's metrics registry and served
	// on its /metrics next to the host's own (a wrapper's counters, such as
	// the sidecar's). Their metric names must not collide with the host's;
	// New refuses a collector the registry refuses.
	Collectors []prometheus.Collector
	// Now is the clock for timestamps, signing windows and lease validity.
	// Defaults to time.Now. Timers use the time package (tests run them
	// under testing/synctest).
	Now func() time.Time
}

// ConfigError reports an invalid configuration value; it names the Config
// field, the flag and the environment variable, and says what is accepted.
// Its text is for the person who set the value, so it has no "hostsdk: "
// prefix: it starts with the setting, the variable first when the value
// came from it ("AIP_CONNECTOR_HOST_HEARTBEAT_MS (--heartbeat-interval-ms,
// Config.HeartbeatInterval) is "0"; want an integer from 1 to 150000 ms"),
// and a program prints it after its own name. New's and the bootstrap's
// wrap it in a step error ("hostsdk: bootstrap step 1 (validate): ...").
// It matches ErrSetting: the operator must change the setting.
type ConfigError struct {
	Field  string
	Flag   string
	Env    string
	Reason string

	cause error // BindFlags: the *SettingError, so the error matches ErrSetting
}

// Unwrap returns the *SettingError of a value BindFlags refused (so
// errors.Is(err, ErrSetting) holds), or nil.
func (e *ConfigError) Unwrap() error { return e.cause }

// Is reports whether target is ErrSetting: every *ConfigError is a value
// to change, whether BindFlags, New or the bootstrap refused it.
func (e *ConfigError) Is(target error) bool { return target == ErrSetting }

func (e *ConfigError) Error() string {
	if e.Flag == "" {
		return fmt.Sprintf("Config.%s %s", e.Field, e.Reason)
	}
	source := ""
	if se, ok := e.cause.(*SettingError); ok {
		source = se.Source
	}
	return settingLabel(e.Flag, e.Env, source, e.Field) + " " + e.Reason
}

// settingLabel names a setting in an error about its value: the flag and
// its variable, the variable first when source (where the value came
// from) is the variable, and Config's field when field is not "".
func settingLabel(flag, env, source, field string) string {
	first, other := "--"+flag, env
	if source == env && env != "" {
		first, other = env, "--"+flag
	}
	if field != "" {
		other += ", Config." + field
	}
	return first + " (" + other + ")"
}

// settingName names the setting of a Config field in an error about its
// value: "--signing-seed-file (AIP_CONNECTOR_HOST_SIGNING_SEED_FILE)", so
// an operator who configures the host with variables finds it too.
func settingName(field string) string {
	o := optionByField[field]
	if o == nil {
		return "Config." + field
	}
	return fmt.Sprintf("--%s (%s)", o.flag, o.env)
}

func cfgErr(field, reason string, args ...any) *ConfigError {
	o := optionByField[field]
	e := &ConfigError{Field: field, Reason: fmt.Sprintf(reason, args...)}
	if o != nil {
		e.Flag, e.Env = o.flag, o.env
	}
	return e
}

// withDefaults returns c with zero knobs replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.Bind == "" {
		c.Bind = DefaultBind
	}
	if c.GatewayPrincipalID == "" {
		c.GatewayPrincipalID = DefaultGatewayPrincipalID
	}
	if c.Region == "" {
		c.Region = aip.DefaultRegion
	}
	if c.Zone == "" {
		c.Zone = aip.DefaultZone
	}
	if c.CapacityClass == "" {
		c.CapacityClass = aip.DefaultCapacityClass
	}
	if c.ConfigRevision == 0 {
		c.ConfigRevision = DefaultConfigRevision
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.DrainLinger == 0 {
		c.DrainLinger = DefaultDrainLinger
	}
	if c.HealthProbeTimeout == 0 {
		c.HealthProbeTimeout = DefaultHealthProbeTimeout
	}
	if c.ControlTimeout == 0 {
		c.ControlTimeout = DefaultControlTimeout
	}
	if c.HandleGrace == 0 {
		c.HandleGrace = DefaultHandleGrace
	}
	if c.RegisterWait == 0 {
		c.RegisterWait = DefaultRegisterWait
	}
	if c.ActionRetention == 0 {
		c.ActionRetention = DefaultActionRetention
	}
	if c.StateDir == "" && c.Journal == nil && c.OpenJournal == nil && c.ReplicaID != "" {
		c.StateDir = defaultStateDir(c.ReplicaID)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate checks c (after withDefaults) without I/O. Files are read in the
// first bootstrap step.
func (c *Config) validate() error {
	if err := c.validateEndpoints(); err != nil {
		return err
	}
	if c.SigningKey == nil && c.SigningSeedFile == "" {
		return cfgErr("SigningSeedFile", "is required: name the owner-only file holding this replica's Ed25519 seed")
	}
	for _, id := range []struct{ field, prefix, value string }{
		{"ConnectorTypeID", aip.PrefixType, c.ConnectorTypeID},
		{"VersionID", aip.PrefixVersion, c.VersionID},
		{"InstanceID", aip.PrefixInstance, c.InstanceID},
		{"ReplicaID", aip.PrefixReplica, c.ReplicaID},
	} {
		if id.value == "" {
			return cfgErr(id.field, "is required: the registry's ID of this replica's record (%s followed by letters, digits, '.', '_' or '-')", id.prefix)
		}
		if err := aip.ValidateRecordID(id.prefix, id.value); err != nil {
			return cfgErr(id.field, "is %q; want %s followed by 1 to %d letters, digits, '.', '_' or '-', as the registry's record ID", aip.TruncateUTF8(id.value, 64), id.prefix, aip.MaxRecordIDBytes-len(id.prefix))
		}
	}
	for _, s := range []struct {
		field, value string
		min, max     int
		optional     bool // empty means not set
	}{
		{"TenantID", c.TenantID, 1, aip.MaxTenantIDBytes, false},
		{"TenantSystem", c.TenantSystem, 1, 512, true},
		{"MembershipID", c.MembershipID, 1, 512, true},
		{"ExternalAccountID", c.ExternalAccountID, 1, 512, true},
		{"ExternalAccountSystem", c.ExternalAccountSystem, 1, 128, true},
		{"CredentialID", c.CredentialID, 1, 512, true},
		{"CredentialIssuer", c.CredentialIssuer, 1, 512, true},
		{"CredentialRevisionRef", c.CredentialRevisionRef, 1, MaxCredentialRevisionRefBytes, true},
		{"GatewayPrincipalID", c.GatewayPrincipalID, 1, 512, false},
		{"TrustDomain", c.TrustDomain, 1, 253, false},
		{"SecretProviderRef", c.SecretProviderRef, 1, aip.MaxSecretProviderRefBytes, false},
	} {
		if s.optional && s.value == "" {
			continue
		}
		if len(s.value) < s.min || len(s.value) > s.max {
			return cfgErr(s.field, "is %d bytes; must be %d to %d bytes", len(s.value), s.min, s.max)
		}
	}
	// The tenant, the trust domain and the secret-provider reference must
	// equal the registry's: the instance's tenant_id and
	// secret_provider_ref and the replica's trust_domain, identifiers that
	// hold no invisible formatting character (aip.FormatCharacter), as
	// does a binding's credential_revision_ref, the revision the host's
	// stands for. With one, the host started and the control plane
	// rejected its registration as another tenant's, trust domain or
	// secret reference than the pre-provisioned one (or no binding could
	// name its revision), the character printed only as an escape.
	for _, s := range []struct{ field, value, what string }{
		{"TenantID", c.TenantID, "the tenant ID of the instance's registry record"},
		{"TrustDomain", c.TrustDomain, "the trust domain of the replica's registry record"},
		{"SecretProviderRef", c.SecretProviderRef, "the secret_provider_ref of the instance's registry record"},
		{"CredentialRevisionRef", c.CredentialRevisionRef, "a binding's credential_revision_ref"},
	} {
		if r, ok := aip.FormatCharacter(s.value); ok {
			return cfgErr(s.field, "is %q, which holds the invisible formatting character U+%04X: no registry identifier holds one (it would print like an identifier it is not), so it cannot be %s; remove it",
				aip.TruncateUTF8(s.value, 64), r, s.what)
		}
	}
	if err := c.validateIdentity(); err != nil {
		return err
	}
	for _, l := range []struct{ field, value string }{
		{"Region", c.Region}, {"Zone", c.Zone}, {"CapacityClass", c.CapacityClass},
	} {
		if !validLabel(l.value) {
			return cfgErr(l.field, "is %q; must be 1 to 128 characters of [A-Za-z0-9._-]", l.value)
		}
	}
	if err := aip.ValidateDigest(c.ArtifactDigest); err != nil {
		return cfgErr("ArtifactDigest", "is %q; must be \"sha256:\" followed by 64 lowercase hex digits", c.ArtifactDigest)
	}
	if err := exactlyOneDID("ControlPlaneDID", c.ControlPlaneDID, "ControlPlaneDIDFile", c.ControlPlaneDIDFile); err != nil {
		return err
	}
	if err := exactlyOneDID("GatewayDID", c.GatewayDID, "GatewayDIDFile", c.GatewayDIDFile); err != nil {
		return err
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > MaxMaxInFlight {
		return cfgErr("MaxInFlight", "is %d; must be 1 to %d", c.MaxInFlight, MaxMaxInFlight)
	}
	if err := durationIn("LeaseTTL", c.LeaseTTL, MinLeaseTTL, MaxLeaseTTL); err != nil {
		return err
	}
	if c.HeartbeatInterval < time.Millisecond || 2*c.HeartbeatInterval > c.LeaseTTL {
		return cfgErr("HeartbeatInterval", "is %d ms; must be at least 1 ms and at most half the lease TTL (%d ms)", c.HeartbeatInterval.Milliseconds(), c.LeaseTTL.Milliseconds()/2)
	}
	if err := durationIn("DrainTimeout", c.DrainTimeout, time.Millisecond, MaxDrainTimeout); err != nil {
		return err
	}
	if err := durationIn("DrainLinger", c.DrainLinger, time.Millisecond, MaxDrainLinger); err != nil {
		return err
	}
	if err := durationIn("HealthProbeTimeout", c.HealthProbeTimeout, time.Millisecond, MaxHealthProbeTimeout); err != nil {
		return err
	}
	if err := durationIn("ControlTimeout", c.ControlTimeout, time.Millisecond, MaxControlTimeout); err != nil {
		return err
	}
	if err := durationIn("HandleGrace", c.HandleGrace, time.Millisecond, MaxHandleGrace); err != nil {
		return err
	}
	if c.RegisterWait != NoRegisterWait && (c.RegisterWait < time.Millisecond || c.RegisterWait > MaxRegisterWait || c.RegisterWait%time.Millisecond != 0) {
		return cfgErr("RegisterWait", "is %s; must be a whole number of milliseconds from 1 to %d ms (%s), or 0 on the command line (NoRegisterWait in Config) to fail the start without waiting for the control plane",
			c.RegisterWait, MaxRegisterWait.Milliseconds(), MaxRegisterWait)
	}
	if c.ActionRetention != KeepActionsForever && c.ActionRetention < MinActionRetention {
		return cfgErr("ActionRetention", "is %d ms; must be at least %d ms (%s), or 0 on the command line (KeepActionsForever in Config) to keep finished actions for ever",
			c.ActionRetention.Milliseconds(), MinActionRetention.Milliseconds(), MinActionRetention)
	}
	if c.Journal != nil && c.OpenJournal != nil {
		return &ConfigError{Field: "OpenJournal", Reason: "and Config.Journal are both set; give the host one journal"}
	}
	if c.Journal == nil && c.OpenJournal == nil && c.DatabaseURLFile != "" {
		return cfgErr("DatabaseURLFile", "is set but the host opens only the embedded SQLite journal itself; set Config.OpenJournal to open pgruntime with this file in your main (or pass an open journal as Config.Journal), or unset it")
	}
	if c.Journal == nil && c.OpenJournal == nil && c.StateDir == "" {
		return cfgErr("StateDir", "is empty; name the directory of the embedded journal")
	}
	return nil
}

// validateIdentity checks the settings that go together: the external
// account's pair and the credential's four. Their lengths are checked
// with the other strings'.
func (c *Config) validateIdentity() error {
	if (c.ExternalAccountID == "") != (c.ExternalAccountSystem == "") {
		if c.ExternalAccountID == "" {
			return cfgErr("ExternalAccountID", "is empty but %s is set; give both or neither", settingName("ExternalAccountSystem"))
		}
		return cfgErr("ExternalAccountSystem", "is empty but %s is set; give both or neither", settingName("ExternalAccountID"))
	}
	cred := []struct {
		field string
		set   bool
	}{
		{"CredentialID", c.CredentialID != ""},
		{"CredentialIssuer", c.CredentialIssuer != ""},
		{"CredentialScopes", len(c.CredentialScopes) > 0},
		{"CredentialRevisionRef", c.CredentialRevisionRef != ""},
	}
	var given []string
	for _, f := range cred {
		if f.set {
			given = append(given, settingName(f.field))
		}
	}
	if len(given) > 0 {
		verb := "are"
		if len(given) == 1 {
			verb = "is"
		}
		for _, f := range cred {
			if !f.set {
				return cfgErr(f.field, "is missing but %s %s set; the tenant credential needs all of --credential-id, --credential-issuer, --credential-scope and --credential-revision-ref, or none",
					strings.Join(given, ", "), verb)
			}
		}
	}
	for i, s := range c.CredentialScopes {
		if s == "" || len(s) > 512 {
			return cfgErr("CredentialScopes", "scope %d is %d bytes; each scope must be 1 to 512 bytes", i+1, len(s))
		}
	}
	return nil
}

func (c *Config) validateEndpoints() error {
	if c.AllowInsecureLoopbackHTTP {
		addr := c.Bind
		if c.Listener != nil {
			addr = c.Listener.Addr().String()
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil || !netutil.IsLoopbackHost(host) {
			return cfgErr("AllowInsecureLoopbackHTTP", "requires a loopback bind address (127.0.0.0/8, ::1 or localhost), but the host binds %q", addr)
		}
	}
	if c.Listener == nil {
		if _, port, err := net.SplitHostPort(c.Bind); err != nil || !validPort(port, 0) {
			return cfgErr("Bind", "is %q; want host:port with a port number from 0 to 65535 (0: any free port), e.g. 0.0.0.0:8081", c.Bind)
		}
	}
	if err := checkEndpoint("PublicEndpoint", c.PublicEndpoint, aip.MessagesPath, c.AllowInsecureLoopbackHTTP); err != nil {
		return err
	}
	if err := checkEndpoint("ControlPlaneEndpoint", c.ControlPlaneEndpoint, aip.ControlPath, c.AllowInsecureLoopbackHTTP); err != nil {
		return err
	}
	if c.EventEndpoint == "" {
		return nil
	}
	return checkEndpoint("EventEndpoint", c.EventEndpoint, aip.EventsPath, c.AllowInsecureLoopbackHTTP)
}

func checkEndpoint(field, raw, path string, allowLoopbackHTTP bool) error {
	if raw == "" {
		return cfgErr(field, "is required: an absolute https URL whose path is exactly %s", path)
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" {
		return cfgErr(field, "is %q; want an absolute URL whose path is exactly %s", raw, path)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return cfgErr(field, "is %q; it must not carry credentials, a query or a fragment", raw)
	}
	if u.Path != path || u.EscapedPath() != path {
		return cfgErr(field, "is %q; its path must be exactly %s", raw, path)
	}
	if p := u.Port(); p != "" && !validPort(p, 1) {
		return cfgErr(field, "is %q; its port must be a number from 1 to 65535", raw)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !allowLoopbackHTTP || !netutil.IsLoopbackHost(u.Hostname()) {
			return cfgErr(field, "is %q; http is accepted only for a loopback host with --allow-insecure-loopback-http; use https", raw)
		}
	default:
		return cfgErr(field, "is %q; the scheme must be https", raw)
	}
	return nil
}

func exactlyOneDID(field, inline, fileField, file string) error {
	switch {
	case inline == "" && file == "":
		return cfgErr(field, "is required: give the did:key inline or with %s", optionByField[fileField].flagName())
	case inline != "" && file != "":
		return cfgErr(field, "and %s are both set; give exactly one", optionByField[fileField].flagName())
	case inline != "":
		if len(inline) > MaxDIDBytes {
			return cfgErr(field, "is %d bytes; must be 1 to %d bytes", len(inline), MaxDIDBytes)
		}
		if _, err := aip.ParseDIDKey(inline); err != nil {
			return cfgErr(field, "is not a did:key Ed25519 identifier: %v", err)
		}
	}
	return nil
}

func durationIn(field string, d, lo, hi time.Duration) error {
	if d < lo || d > hi || d%time.Millisecond != 0 {
		return cfgErr(field, "is %s; must be a whole number of milliseconds from %d to %d ms", d, lo.Milliseconds(), hi.Milliseconds())
	}
	return nil
}

// validPort reports whether port is a decimal port number from min to
// 65535.
func validPort(port string, min uint64) bool {
	n, err := strconv.ParseUint(port, 10, 16)
	return err == nil && n >= min
}

func validLabel(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '_' || ch == '-') {
			return false
		}
	}
	return true
}

// maxFileNameBytes is the longest file name common file systems take.
const maxFileNameBytes = 255

// defaultStateDir is DefaultStateDirRoot/host-<replica ID>. A replica ID
// may be aip.MaxRecordIDBytes long, more than a file name holds with
// "host-": such a name keeps its first bytes, then '~' (which no ID
// contains, so no other ID's directory is named so) and 16 hex digits of
// the ID's SHA-256.
func defaultStateDir(replicaID string) string {
	name := "host-" + replicaID
	if len(name) > maxFileNameBytes {
		sum := sha256.Sum256([]byte(replicaID))
		suffix := "~" + hex.EncodeToString(sum[:8])
		name = name[:maxFileNameBytes-len(suffix)] + suffix
	}
	return filepath.Join(DefaultStateDirRoot, name)
}
