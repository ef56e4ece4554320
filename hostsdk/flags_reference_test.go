package hostsdk

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSettingsMatchTheReference holds every setting of the common host
// contract to the reference's table (ConnectorHostBootstrapArgs: flag,
// variable, default, bounds) and to the defaults the docs give, through
// LoadConfig as an operator sets them: by variable. Differences that are
// design choices are marked. The reference's settings this host does not
// have (--callback-*, --event-allow-*) are not listed.
func TestSettingsMatchTheReference(t *testing.T) {
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	rows := []struct {
		flag, env string
		get       func(c *Config) string
		def       string // after withDefaults; "" for a setting without default
		lo, hi    string // accepted bounds, "" when unbounded (checked by value, not range)
	}{
		{"bind", "BIND", func(c *Config) string { return c.Bind }, "0.0.0.0:8081", "", ""},
		{"public-endpoint", "PUBLIC_ENDPOINT", func(c *Config) string { return c.PublicEndpoint }, "", "", ""},
		{"control-plane-endpoint", "CONTROL_ENDPOINT", func(c *Config) string { return c.ControlPlaneEndpoint }, "", "", ""},
		{"control-plane-did", "CONTROL_DID", func(c *Config) string { return c.ControlPlaneDID }, "", "", ""},
		{"control-plane-did-file", "CONTROL_DID_FILE", func(c *Config) string { return c.ControlPlaneDIDFile }, "", "", ""},
		// Optional here: without it the journal is SQLite in --state-dir.
		{"database-url-file", "DATABASE_URL_FILE", func(c *Config) string { return c.DatabaseURLFile }, "", "", ""},
		{"signing-seed-file", "SIGNING_SEED_FILE", func(c *Config) string { return c.SigningSeedFile }, "", "", ""},
		{"connector-type-id", "TYPE_ID", func(c *Config) string { return c.ConnectorTypeID }, "", "", ""},
		{"version-id", "VERSION_ID", func(c *Config) string { return c.VersionID }, "", "", ""},
		{"instance-id", "INSTANCE_ID", func(c *Config) string { return c.InstanceID }, "", "", ""},
		{"replica-id", "REPLICA_ID", func(c *Config) string { return c.ReplicaID }, "crepl_x", "", ""},
		{"tenant-id", "TENANT_ID", func(c *Config) string { return c.TenantID }, "", "", ""},
		// Optional, unbounded in the reference; 1 to 512 bytes here
		// (TestNewValidatesIdentitySettings), as the reference's --tenant-id.
		{"tenant-system", "TENANT_SYSTEM", func(c *Config) string { return c.TenantSystem }, "", "", ""},
		// 1 to 512 bytes; the external account's pair both or neither, 1 to
		// 512 and 1 to 128 bytes (TestNewValidatesIdentitySettings).
		{"membership-id", "MEMBERSHIP_ID", func(c *Config) string { return c.MembershipID }, "", "", ""},
		{"external-account-id", "EXTERNAL_ACCOUNT_ID", func(c *Config) string { return c.ExternalAccountID }, "", "", ""},
		{"external-account-system", "EXTERNAL_ACCOUNT_SYSTEM", func(c *Config) string { return c.ExternalAccountSystem }, "", "", ""},
		// All or none, at least one scope, the revision 1 to 256 bytes
		// (TestNewValidatesIdentitySettings); --credential-scope repeats or
		// takes a comma list (TestLoadConfigIdentitySettings). The
		// reference bounds neither the ID nor the issuer; 1 to 512 bytes
		// here.
		{"credential-id", "CREDENTIAL_ID", func(c *Config) string { return c.CredentialID }, "", "", ""},
		{"credential-issuer", "CREDENTIAL_ISSUER", func(c *Config) string { return c.CredentialIssuer }, "", "", ""},
		{"credential-scope", "CREDENTIAL_SCOPES", func(c *Config) string { return strings.Join(c.CredentialScopes, ",") }, "", "", ""},
		{"credential-revision-ref", "CREDENTIAL_REVISION", func(c *Config) string { return c.CredentialRevisionRef }, "", "", ""},
		// Optional; at most 64 KiB, read again before every action and
		// cancel (TestCredentialPolicyFileRules, TestCredentialRevisionPolicy).
		{"credential-revision-policy-file", "CREDENTIAL_POLICY_FILE", func(c *Config) string { return c.CredentialRevisionPolicyFile }, "", "", ""},
		// Required by the reference; defaults here to the principal
		// aipfleet dispatch signs as (operator-guide.md, section 7).
		{"gateway-principal-id", "GATEWAY_PRINCIPAL_ID", func(c *Config) string { return c.GatewayPrincipalID }, "service:aipfleet-dispatch", "", ""},
		{"gateway-did", "GATEWAY_DID", func(c *Config) string { return c.GatewayDID }, "", "", ""},
		{"gateway-did-file", "GATEWAY_DID_FILE", func(c *Config) string { return c.GatewayDIDFile }, "", "", ""},
		{"tls-ca-certificate-file", "TLS_CA_FILE", func(c *Config) string { return c.TLSCACertificateFile }, "", "", ""},
		{"trust-domain", "TRUST_DOMAIN", func(c *Config) string { return c.TrustDomain }, "", "", ""},
		{"region", "REGION", func(c *Config) string { return c.Region }, "global", "", ""},
		{"zone", "ZONE", func(c *Config) string { return c.Zone }, "default", "", ""},
		{"capacity-class", "CAPACITY_CLASS", func(c *Config) string { return c.CapacityClass }, "standard", "", ""},
		{"artifact-digest", "ARTIFACT_DIGEST", func(c *Config) string { return c.ArtifactDigest }, "", "", ""},
		{"secret-provider-ref", "SECRET_PROVIDER_REF", func(c *Config) string { return c.SecretProviderRef }, "", "", ""},
		{"config-revision", "CONFIG_REVISION", func(c *Config) string { return strconv.FormatUint(c.ConfigRevision, 10) }, "1", "1", ""},
		{"event-endpoint", "EVENT_ENDPOINT", func(c *Config) string { return c.EventEndpoint }, "", "", ""},
		{"allow-insecure-loopback-http", "ALLOW_LOOPBACK_HTTP", func(c *Config) string { return strconv.FormatBool(c.AllowInsecureLoopbackHTTP) }, "false", "", ""},
		// The reference bounds it below only (> 0); 65536 here.
		{"max-in-flight", "MAX_IN_FLIGHT", func(c *Config) string { return strconv.Itoa(c.MaxInFlight) }, "32", "1", "65536"},
		{"lease-ttl-ms", "LEASE_TTL_MS", func(c *Config) string { return ms(c.LeaseTTL) }, "30000", "1000", "300000"},
		// And at most half the lease TTL (TestNewValidatesConfig).
		{"heartbeat-interval-ms", "HEARTBEAT_MS", func(c *Config) string { return ms(c.HeartbeatInterval) }, "10000", "1", "150000"},
		{"drain-timeout-ms", "DRAIN_TIMEOUT_MS", func(c *Config) string { return ms(c.DrainTimeout) }, "30000", "1", "300000"},
		{"health-probe-timeout-ms", "HEALTH_TIMEOUT_MS", func(c *Config) string { return ms(c.HealthProbeTimeout) }, "2000", "1", "30000"},
		{"control-timeout-ms", "CONTROL_TIMEOUT_MS", func(c *Config) string { return ms(c.ControlTimeout) }, "5000", "1", "30000"},
		// aipfleet's own (operator-guide.md, sections 7 and 8).
		{"drain-linger-ms", "DRAIN_LINGER_MS", func(c *Config) string { return ms(c.DrainLinger) }, "2000", "1", "60000"},
		{"handle-grace-ms", "HANDLE_GRACE_MS", func(c *Config) string { return ms(c.HandleGrace) }, "10000", "1", "300000"},
		// 0 is NoRegisterWait (TestRegisterWaitSetting).
		{"register-wait-ms", "REGISTER_WAIT_MS", func(c *Config) string { return ms(c.RegisterWait) }, "120000", "", "3600000"},
		// aipfleet's own, as the control plane's and the dispatcher's
		// --ready-detail: local or none (TestReadyDetailSetting).
		{"ready-detail", "READY_DETAIL", func(c *Config) string {
			if c.HideLocalReadyDetail {
				return "none"
			}
			return "local"
		}, "local", "", ""},
		{"state-dir", "STATE_DIR", func(c *Config) string { return c.StateDir }, ".aipfleet/host-crepl_x", "", ""},
		{"action-retention-ms", "ACTION_RETENTION_MS", func(c *Config) string { return ms(c.ActionRetention) }, "2592000000", "", ""},
	}
	listed := map[string]bool{}
	for _, r := range rows {
		listed[r.flag] = true
		t.Run(r.flag, func(t *testing.T) {
			o := optionByField[fieldOfFlag(r.flag)]
			env := envPrefix + r.env
			if o == nil || o.env != env {
				t.Fatalf("--%s: option %+v, want variable %s", r.flag, o, env)
			}
			if got := r.get(ptr(Config{ReplicaID: "crepl_x"}.withDefaults())); got != r.def {
				t.Errorf("default %q, want %q", got, r.def)
			}
			if r.def != "" && r.def != "false" && r.flag != "state-dir" && strings.Contains(o.usage, "(default ") && !strings.Contains(o.usage, "(default "+r.def) {
				t.Errorf("usage %q does not give the default %s", o.usage, r.def)
			}
			load := func(v string) (Config, error) {
				return LoadConfig(nil, func(k string) string {
					if k == env {
						return v
					}
					return ""
				})
			}
			for _, in := range []string{r.lo, r.hi} {
				if in == "" {
					continue
				}
				c, err := load(in)
				if err != nil || r.get(&c) != in {
					t.Errorf("%s=%s: %v, value %q; want it accepted", env, in, err, r.get(&c))
				}
			}
			for _, out := range []string{step(r.lo, -1), step(r.hi, +1)} {
				if out == "" {
					continue
				}
				_, err := load(out)
				if err == nil || !strings.Contains(err.Error(), "--"+r.flag) || !strings.Contains(err.Error(), env) {
					t.Errorf("%s=%s: %v; want it refused naming --%s and %s", env, out, err, r.flag, env)
				}
			}
		})
	}
	for _, o := range options {
		if !listed[o.flag] {
			t.Errorf("--%s is not in the table: add it", o.flag)
		}
	}
}

func fieldOfFlag(flag string) string {
	for _, o := range options {
		if o.flag == flag {
			return o.field
		}
	}
	return ""
}

func ptr[T any](v T) *T { return &v }

// step returns the decimal n+d, "" for "".
func step(n string, d int64) string {
	if n == "" {
		return ""
	}
	v, _ := strconv.ParseInt(n, 10, 64)
	return strconv.FormatInt(v+d, 10)
}
