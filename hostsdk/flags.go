package hostsdk

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/flagsuggest"
)

// option is one setting of the common host CLI/env contract.
type option struct {
	flag  string
	env   string
	field string
	usage string
	kind  SettingKind
	// min and max bound integer and millisecond settings.
	min, max int64
	// check, when set, further checks a non-empty value (Setting.Check).
	check func(v string) error
	set   func(c *Config, v string) error
}

func (o *option) flagName() string {
	if o == nil {
		return ""
	}
	return "--" + o.flag
}

const envPrefix = "AIP_CONNECTOR_HOST_"

func str(p func(c *Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *p(c) = v; return nil }
}

// options lists every flag and environment variable LoadConfig accepts.
var options = []*option{
	{flag: "bind", env: "BIND", field: "Bind", usage: "listen address (default " + DefaultBind + ")", set: str(func(c *Config) *string { return &c.Bind })},
	{flag: "public-endpoint", env: "PUBLIC_ENDPOINT", field: "PublicEndpoint", usage: "URL of this replica's /aip/v1/messages", set: str(func(c *Config) *string { return &c.PublicEndpoint })},
	{flag: "control-plane-endpoint", env: "CONTROL_ENDPOINT", field: "ControlPlaneEndpoint", usage: "URL of the lifecycle service's /aip/v1/connector-control", set: str(func(c *Config) *string { return &c.ControlPlaneEndpoint })},
	{flag: "event-endpoint", env: "EVENT_ENDPOINT", field: "EventEndpoint", usage: "URL of the dispatcher's " + aip.EventsPath + " the event outbox is delivered to (unset: events stay in the outbox)", set: str(func(c *Config) *string { return &c.EventEndpoint })},
	{flag: "control-plane-did", env: "CONTROL_DID", field: "ControlPlaneDID", usage: "pinned did:key of the lifecycle service", set: str(func(c *Config) *string { return &c.ControlPlaneDID })},
	{flag: "control-plane-did-file", env: "CONTROL_DID_FILE", field: "ControlPlaneDIDFile", usage: "file holding the lifecycle service's did:key", set: str(func(c *Config) *string { return &c.ControlPlaneDIDFile })},
	{flag: "signing-seed-file", env: "SIGNING_SEED_FILE", field: "SigningSeedFile", usage: "owner-only file with this replica's Ed25519 seed (64 hex) or JWK", set: str(func(c *Config) *string { return &c.SigningSeedFile })},
	{flag: "connector-type-id", env: "TYPE_ID", field: "ConnectorTypeID", usage: "connector type ID (ctype_...)", set: str(func(c *Config) *string { return &c.ConnectorTypeID })},
	{flag: "version-id", env: "VERSION_ID", field: "VersionID", usage: "connector version ID (cver_...)", set: str(func(c *Config) *string { return &c.VersionID })},
	{flag: "instance-id", env: "INSTANCE_ID", field: "InstanceID", usage: "connector instance ID (cinst_...)", set: str(func(c *Config) *string { return &c.InstanceID })},
	{flag: "replica-id", env: "REPLICA_ID", field: "ReplicaID", usage: "replica ID (crepl_...)", set: str(func(c *Config) *string { return &c.ReplicaID })},
	{flag: "tenant-id", env: "TENANT_ID", field: "TenantID", usage: "tenant owning the instance", set: str(func(c *Config) *string { return &c.TenantID })},
	{flag: "tenant-system", env: "TENANT_SYSTEM", field: "TenantSystem", usage: "system the tenant ID belongs to: the actions' identity.tenant.system (optional)", set: str(func(c *Config) *string { return &c.TenantSystem })},
	{flag: "membership-id", env: "MEMBERSHIP_ID", field: "MembershipID", usage: "tenant membership the instance acts under, given to the connector (optional)", set: str(func(c *Config) *string { return &c.MembershipID })},
	{flag: "external-account-id", env: "EXTERNAL_ACCOUNT_ID", field: "ExternalAccountID", usage: "provider account the instance acts as: the actions' identity.external_account.id (with --external-account-system)", set: str(func(c *Config) *string { return &c.ExternalAccountID })},
	{flag: "external-account-system", env: "EXTERNAL_ACCOUNT_SYSTEM", field: "ExternalAccountSystem", usage: "system of --external-account-id (both or neither)", set: str(func(c *Config) *string { return &c.ExternalAccountSystem })},
	{flag: "credential-id", env: "CREDENTIAL_ID", field: "CredentialID", usage: "tenant credential reference: its ID (with --credential-issuer, --credential-scope and --credential-revision-ref, or none of them)", set: str(func(c *Config) *string { return &c.CredentialID })},
	{flag: "credential-issuer", env: "CREDENTIAL_ISSUER", field: "CredentialIssuer", usage: "issuer of the tenant credential", set: str(func(c *Config) *string { return &c.CredentialIssuer })},
	{flag: "credential-scope", env: "CREDENTIAL_SCOPES", field: "CredentialScopes", usage: "scope of the tenant credential (repeat the flag, or give a comma-separated list)", kind: SettingList,
		set: func(c *Config, v string) error {
			for _, s := range strings.Split(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					c.CredentialScopes = append(c.CredentialScopes, s)
				}
			}
			return nil
		}},
	{flag: "credential-revision-ref", env: "CREDENTIAL_REVISION", field: "CredentialRevisionRef", usage: "revision of the tenant credential, which the revision policy must authorize (1 to 256 bytes)", set: str(func(c *Config) *string { return &c.CredentialRevisionRef })},
	{flag: "credential-revision-policy-file", env: "CREDENTIAL_POLICY_FILE", field: "CredentialRevisionPolicyFile", usage: "JSON credential revision policy, read again before every action and cancel (unset: revisions are not checked)", set: str(func(c *Config) *string { return &c.CredentialRevisionPolicyFile })},
	{flag: "gateway-principal-id", env: "GATEWAY_PRINCIPAL_ID", field: "GatewayPrincipalID", usage: "principal ID of the dispatcher: the --principal-id aipfleet dispatch signs as (default " + DefaultGatewayPrincipalID + ", that flag's default)", set: str(func(c *Config) *string { return &c.GatewayPrincipalID })},
	{flag: "gateway-did", env: "GATEWAY_DID", field: "GatewayDID", usage: "pinned did:key of the dispatcher", set: str(func(c *Config) *string { return &c.GatewayDID })},
	{flag: "gateway-did-file", env: "GATEWAY_DID_FILE", field: "GatewayDIDFile", usage: "file holding the dispatcher's did:key", set: str(func(c *Config) *string { return &c.GatewayDIDFile })},
	{flag: "tls-ca-certificate-file", env: "TLS_CA_FILE", field: "TLSCACertificateFile", usage: "extra PEM root CA for the lifecycle service and the event endpoint", set: str(func(c *Config) *string { return &c.TLSCACertificateFile })},
	{flag: "trust-domain", env: "TRUST_DOMAIN", field: "TrustDomain", usage: "deployment trust domain", set: str(func(c *Config) *string { return &c.TrustDomain })},
	{flag: "region", env: "REGION", field: "Region", usage: "topology region (default global)", set: str(func(c *Config) *string { return &c.Region })},
	{flag: "zone", env: "ZONE", field: "Zone", usage: "topology zone (default default)", set: str(func(c *Config) *string { return &c.Zone })},
	{flag: "capacity-class", env: "CAPACITY_CLASS", field: "CapacityClass", usage: "topology capacity class (default standard)", set: str(func(c *Config) *string { return &c.CapacityClass })},
	{flag: "artifact-digest", env: "ARTIFACT_DIGEST", field: "ArtifactDigest", usage: "admitted artifact digest (sha256:...)", set: str(func(c *Config) *string { return &c.ArtifactDigest })},
	{flag: "secret-provider-ref", env: "SECRET_PROVIDER_REF", field: "SecretProviderRef", usage: "instance secret-provider reference", set: str(func(c *Config) *string { return &c.SecretProviderRef })},
	{flag: "config-revision", env: "CONFIG_REVISION", field: "ConfigRevision", usage: "instance configuration revision (default 1)", kind: SettingInt, min: 1, max: math.MaxInt64,
		set: func(c *Config, v string) error {
			n, _ := strconv.ParseInt(v, 10, 64)
			c.ConfigRevision = uint64(n)
			return nil
		}},
	{flag: "allow-insecure-loopback-http", env: "ALLOW_LOOPBACK_HTTP", field: "AllowInsecureLoopbackHTTP", usage: "allow http:// endpoints on loopback (requires a loopback --bind)", kind: SettingBool,
		set: func(c *Config, v string) error { c.AllowInsecureLoopbackHTTP, _ = strconv.ParseBool(v); return nil }},
	{flag: "max-in-flight", env: "MAX_IN_FLIGHT", field: "MaxInFlight", usage: "concurrent actions and advertised capacity (default 32)", kind: SettingInt, min: 1, max: MaxMaxInFlight,
		set: func(c *Config, v string) error { n, _ := strconv.Atoi(v); c.MaxInFlight = n; return nil }},
	{flag: "lease-ttl-ms", env: "LEASE_TTL_MS", field: "LeaseTTL", usage: "proposed lease lifetime in ms (default 30000)", kind: SettingMillis, min: MinLeaseTTL.Milliseconds(), max: MaxLeaseTTL.Milliseconds(),
		set: millis(func(c *Config) *time.Duration { return &c.LeaseTTL })},
	{flag: "heartbeat-interval-ms", env: "HEARTBEAT_MS", field: "HeartbeatInterval", usage: "heartbeat interval in ms (default 10000; at most half the lease TTL)", kind: SettingMillis, min: 1, max: MaxLeaseTTL.Milliseconds() / 2,
		set: millis(func(c *Config) *time.Duration { return &c.HeartbeatInterval })},
	{flag: "drain-timeout-ms", env: "DRAIN_TIMEOUT_MS", field: "DrainTimeout", usage: "bound on the wait for in-flight actions at shutdown, in ms (default 30000)", kind: SettingMillis, min: 1, max: MaxDrainTimeout.Milliseconds(),
		set: millis(func(c *Config) *time.Duration { return &c.DrainTimeout })},
	{flag: "drain-linger-ms", env: "DRAIN_LINGER_MS", field: "DrainLinger", usage: "how long, at least, the listener keeps refusing new actions with a signed not_ready after the drain begins (longer while a drain that did not get through leaves the lease valid), in ms (default 2000)", kind: SettingMillis, min: 1, max: MaxDrainLinger.Milliseconds(),
		set: millis(func(c *Config) *time.Duration { return &c.DrainLinger })},
	{flag: "health-probe-timeout-ms", env: "HEALTH_TIMEOUT_MS", field: "HealthProbeTimeout", usage: "storage and connector probe timeout in ms (default 2000)", kind: SettingMillis, min: 1, max: MaxHealthProbeTimeout.Milliseconds(),
		set: millis(func(c *Config) *time.Duration { return &c.HealthProbeTimeout })},
	{flag: "control-timeout-ms", env: "CONTROL_TIMEOUT_MS", field: "ControlTimeout", usage: "lifecycle request timeout in ms (default 5000)", kind: SettingMillis, min: 1, max: MaxControlTimeout.Milliseconds(),
		set: millis(func(c *Config) *time.Duration { return &c.ControlTimeout })},
	{flag: "handle-grace-ms", env: "HANDLE_GRACE_MS", field: "HandleGrace", usage: "how long a connector call may run on after its action's timeout, cancel or the shutdown before the action is journaled outcome_unknown, and the time an answer write may take besides its size at 256 KiB/s, in ms (default 10000)", kind: SettingMillis, min: 1, max: MaxHandleGrace.Milliseconds(),
		set: millis(func(c *Config) *time.Duration { return &c.HandleGrace })},
	{flag: "register-wait-ms", env: "REGISTER_WAIT_MS", field: "RegisterWait", usage: "how long the start waits for a control plane that does not answer its registration, registering again with backoff, in ms (default 120000; at most 3600000; 0 fails the start at once)", kind: SettingMillis, min: 0, max: MaxRegisterWait.Milliseconds(),
		set: func(c *Config, v string) error {
			n, _ := strconv.ParseInt(v, 10, 64)
			c.RegisterWait = time.Duration(n) * time.Millisecond
			if n == 0 {
				c.RegisterWait = NoRegisterWait
			}
			return nil
		}},
	{flag: "ready-detail", env: "READY_DETAIL", field: "HideLocalReadyDetail", usage: "who reads the error text of failing /ready checks (it names hosts, files and product URLs): " +
		readyDetailLocal + " (loopback peers whose request carries no proxy forwarding header), or " + readyDetailNone +
		" (set it behind a proxy on the same machine, such as an Envoy or Istio sidecar: every caller is loopback there); the log always has it (default " + readyDetailLocal + ")",
		check: func(v string) error {
			if v != readyDetailLocal && v != readyDetailNone {
				return fmt.Errorf("want %s or %s", readyDetailLocal, readyDetailNone)
			}
			return nil
		},
		set: func(c *Config, v string) error { c.HideLocalReadyDetail = v == readyDetailNone; return nil }},
	{flag: "state-dir", env: "STATE_DIR", field: "StateDir", usage: "directory of the embedded SQLite journal (default .aipfleet/host-<replica-id>)", set: str(func(c *Config) *string { return &c.StateDir })},
	{flag: "action-retention-ms", env: "ACTION_RETENTION_MS", field: "ActionRetention", usage: "how long a finished action's journal record is kept, in ms (default 2592000000, 30 days; at least 3600000; 0 keeps them for ever)", kind: SettingMillis, min: 0, max: math.MaxInt64 / int64(time.Millisecond),
		set: func(c *Config, v string) error {
			n, _ := strconv.ParseInt(v, 10, 64)
			c.ActionRetention = time.Duration(n) * time.Millisecond
			if n == 0 {
				c.ActionRetention = KeepActionsForever
			}
			return nil
		}},
	{flag: "database-url-file", env: "DATABASE_URL_FILE", field: "DatabaseURLFile", usage: "owner-only file with a PostgreSQL URL: keep the runtime journal in PostgreSQL instead of the SQLite journal in --state-dir (aipfleet host, aip-host and aip-sidecar open it; a hostsdk main of your own opens it with pgruntime in Config.OpenJournal)", set: str(func(c *Config) *string { return &c.DatabaseURLFile })},
}

var optionByField = func() map[string]*option {
	m := make(map[string]*option, len(options))
	for _, o := range options {
		o.env = envPrefix + o.env
		m[o.field] = o
	}
	return m
}()

func millis(p func(c *Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, _ := strconv.ParseInt(v, 10, 64)
		*p(c) = time.Duration(n) * time.Millisecond
		return nil
	}
}

// ErrHelp is returned by LoadConfig when the arguments ask for help; the
// usage has been written to the FlagSet's output.
var ErrHelp = flag.ErrHelp

// LoadConfig builds a Config from command-line arguments (without the program
// name) and environment variables read through getenv (os.Getenv in a main).
// A flag wins over its AIP_CONNECTOR_HOST_* variable. Every malformed or
// out-of-range value is reported with the flag, the variable and the accepted
// range; the remaining checks happen in New. An unknown flag is an error
// that names the known flag it most likely meant, if one is close, and
// says that --help lists the flags ("unknown flag --max-in-flite; did you
// mean --max-in-flight? (run with --help for the flags)"). Programs with
// flags of their own use BindFlags instead.
func LoadConfig(args []string, getenv func(string) string) (Config, error) {
	fs := flag.NewFlagSet("connector-host", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	load := BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, ErrHelp
		}
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
			name = strings.TrimLeft(name, "-")
			msg = "unknown flag --" + name
			if known := flagsuggest.Closest(fs, name); known != "" {
				msg += "; did you mean --" + known + "?"
			}
			msg += " (run with --help for the flags)"
		}
		return Config{}, &settingFault{msg: msg, err: err}
	}
	if fs.NArg() > 0 {
		return Config{}, &settingFault{msg: fmt.Sprintf("unexpected argument %q; every setting is a --flag", fs.Arg(0))}
	}
	return load(getenv)
}

// ErrSetting is matched (errors.Is) by every error that the operator
// fixes by changing a setting or a file a setting names: a mistake in how
// the program was started, for which a command exits with status 2, as
// for a flag it does not know (a failure at run time, such as an
// unreachable control plane, exits 1). It is matched by every error of
// BindFlags and BindSettings (a flag's or variable's value that cannot be
// accepted), by LoadConfig's (those and an unknown flag or a stray
// argument), by every *ConfigError (a value New refuses: a required
// setting missing, two that contradict each other) and by a
// *ValidateError (New's, or bootstrap step 1's about a file a setting
// names: a --signing-seed-file others can read), and by bootstrap step 8's
// when the control plane refused the registration because a setting
// differs from what the fleet pre-provisioned for the replica (its signing
// key, replica ID, endpoint, trust domain, tenant, configuration revision,
// secret-provider reference or artifact digest; the text then ends with
// the setting to fix). Other refusals of the registration (a manifest that
// is not the admitted one, a version not active) are the fleet's state or
// the connector's, and do not match. The texts of the others start with the
// setting, not with ErrSetting's "hostsdk: ": a program prints them after
// its own name ("noteshost: --max-in-flight
// (AIP_CONNECTOR_HOST_MAX_IN_FLIGHT, Config.MaxInFlight) is "0"; want an
// integer from 1 to 65536").
var ErrSetting = errors.New("hostsdk: setting refused")

// settingFault is one of LoadConfig's own errors: an unknown flag or a
// stray argument. It matches ErrSetting and what the flag package
// returned.
type settingFault struct {
	msg string
	err error
}

func (e *settingFault) Error() string { return e.msg }

func (e *settingFault) Unwrap() []error {
	if e.err == nil {
		return []error{ErrSetting}
	}
	return []error{ErrSetting, e.err}
}

// BindFlags defines the host's flags on fs and returns a function that,
// after fs.Parse, merges them with the environment into a Config. A value
// that cannot be accepted is a *ConfigError that matches ErrSetting.
func BindFlags(fs *flag.FlagSet) func(getenv func(string) string) (Config, error) {
	settings := make([]Setting, len(options))
	byFlag := make(map[string]*option, len(options))
	for i, o := range options {
		settings[i] = Setting{Flag: o.flag, Env: o.env, Usage: o.usage, Kind: o.kind, Min: o.min, Max: o.max, Check: o.check}
		byFlag[o.flag] = o
	}
	load := BindSettings(fs, settings)
	return func(getenv func(string) string) (Config, error) {
		values, err := load(getenv)
		if err != nil {
			var se *SettingError
			if errors.As(err, &se) && byFlag[se.Flag] != nil {
				o := byFlag[se.Flag]
				return Config{}, &ConfigError{Field: o.field, Flag: o.flag, Env: o.env, Reason: se.reason(), cause: se}
			}
			return Config{}, err
		}
		var c Config
		for _, o := range options {
			v, ok := values[o.flag]
			if !ok {
				continue
			}
			if err := o.set(&c, v); err != nil {
				return Config{}, err
			}
		}
		return c, nil
	}
}

// SettingKind says how a Setting's value is checked.
type SettingKind int

const (
	// SettingString accepts any value.
	SettingString SettingKind = iota
	// SettingBool accepts what strconv.ParseBool does; a bare --flag is
	// true.
	SettingBool
	// SettingInt accepts a decimal integer from Min to Max.
	SettingInt
	// SettingMillis accepts a decimal number of milliseconds from Min to
	// Max (SettingValues.Millis).
	SettingMillis
	// SettingList accepts any value; the flag may be repeated, and its
	// values are joined with commas (the variable gives a comma-separated
	// list).
	SettingList
)

// Setting is one option of a program's flag and environment contract, in
// the host's style: a flag and the environment variable behind it, the
// flag winning. BindFlags reads the host's settings this way; a program
// with settings of its own (cmd/aip-sidecar) reads them with
// BindSettings.
type Setting struct {
	// Flag is the flag name without dashes; Env the full variable name.
	Flag, Env string
	Usage     string
	Kind      SettingKind
	// Min and Max bound SettingInt and SettingMillis values.
	Min, Max int64
	// Check, when set, further checks a non-empty value; its error is the
	// reason the value is refused ("want report or unready").
	Check func(v string) error
}

// SettingError is a setting's value that cannot be accepted: the flag,
// its variable, where the value came from (the flag with its dashes, or
// the variable), the value and what is accepted. Its text starts with
// what was set, without a "hostsdk: " prefix (the setting may be the
// program's own, read with BindSettings): `--drain-timeout-ms
// (AIP_CONNECTOR_HOST_DRAIN_TIMEOUT_MS) is "soon"; want an integer from 1
// to 300000 ms`, or `AIP_SIDECAR_ON_MANIFEST_CHANGE
// (--on-manifest-change) is "apply"; want report or unready`.
type SettingError struct {
	Flag, Env, Source, Value, Want string
}

func (e *SettingError) reason() string {
	return fmt.Sprintf("is %q; %s", e.Value, e.Want)
}

func (e *SettingError) Error() string {
	return settingLabel(e.Flag, e.Env, e.Source, "") + " " + e.reason()
}

// Is reports whether target is ErrSetting.
func (e *SettingError) Is(target error) bool { return target == ErrSetting }

// SettingValues are the values BindSettings read, by flag name: a flag
// given on the command line (even empty), else a non-empty variable. They
// have been checked; integers and milliseconds are without surrounding
// spaces.
type SettingValues map[string]string

// Bool returns a SettingBool value (false when not given).
func (v SettingValues) Bool(flag string) bool {
	b, _ := strconv.ParseBool(v[flag])
	return b
}

// Int returns a SettingInt value (0 when not given).
func (v SettingValues) Int(flag string) int64 {
	n, _ := strconv.ParseInt(v[flag], 10, 64)
	return n
}

// Millis returns a SettingMillis value as a duration (0 when not given).
func (v SettingValues) Millis(flag string) time.Duration {
	return time.Duration(v.Int(flag)) * time.Millisecond
}

// BindSettings defines the settings' flags on fs (the usage names the
// variable) and returns a function that, after fs.Parse, reads each
// setting from its flag when given, else from its variable through getenv
// (nil: flags only), and checks it. The first value that cannot be
// accepted is returned as a *SettingError, which matches ErrSetting.
func BindSettings(fs *flag.FlagSet, settings []Setting) func(getenv func(string) string) (SettingValues, error) {
	values := make([]*string, len(settings))
	for i, s := range settings {
		v := new(string)
		values[i] = v
		usage := s.Usage + " [$" + s.Env + "]"
		switch s.Kind {
		case SettingBool:
			fs.Var(boolValue{v}, s.Flag, usage)
		case SettingList:
			fs.Var(&listValue{p: v}, s.Flag, usage)
		default:
			fs.StringVar(v, s.Flag, "", usage)
		}
	}
	return func(getenv func(string) string) (SettingValues, error) {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		out := SettingValues{}
		for i := range settings {
			s := &settings[i]
			raw, source := *values[i], "--"+s.Flag
			if !set[s.Flag] {
				if getenv == nil {
					continue
				}
				raw, source = getenv(s.Env), s.Env
				if raw == "" {
					continue
				}
			}
			v, err := s.check(raw)
			if err != nil {
				return nil, &SettingError{Flag: s.Flag, Env: s.Env, Source: source, Value: raw, Want: err.Error()}
			}
			out[s.Flag] = v
		}
		return out, nil
	}
}

// check returns the value to use (integers trimmed of surrounding spaces)
// or what is accepted.
func (s *Setting) check(raw string) (string, error) {
	v := raw
	switch s.Kind {
	case SettingBool:
		if _, err := strconv.ParseBool(raw); err != nil {
			return "", errors.New("want true or false")
		}
	case SettingInt, SettingMillis:
		unit := ""
		if s.Kind == SettingMillis {
			unit = " ms"
		}
		v = strings.TrimSpace(raw)
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < s.Min || n > s.Max {
			return "", fmt.Errorf("want an integer from %d to %d%s", s.Min, s.Max, unit)
		}
	}
	if s.Check != nil && v != "" {
		if err := s.Check(v); err != nil {
			return "", err
		}
	}
	return v, nil
}

// boolValue is a flag.Value that accepts a bare --flag as true.
type boolValue struct{ p *string }

func (b boolValue) String() string {
	if b.p == nil {
		return ""
	}
	return *b.p
}
func (b boolValue) Set(s string) error { *b.p = s; return nil }
func (b boolValue) IsBoolFlag() bool   { return true }

// listValue is a flag.Value that a repeated flag appends to, with a comma.
type listValue struct {
	p   *string
	set bool
}

func (l *listValue) String() string {
	if l == nil || l.p == nil {
		return ""
	}
	return *l.p
}

func (l *listValue) Set(s string) error {
	if l.set {
		s = *l.p + "," + s
	}
	*l.p, l.set = s, true
	return nil
}
