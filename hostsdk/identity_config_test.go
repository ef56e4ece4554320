package hostsdk_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestLoadConfigIdentitySettings: the reference's identity and tenant
// credential settings are read from flags and variables; --credential-scope
// may be repeated, and its variable is a comma-separated list (spaces
// around a scope and empty entries dropped).
func TestLoadConfigIdentitySettings(t *testing.T) {
	args, _, _ := validArgs(t)
	args = append(args, "--tenant-system", "crm", "--membership-id", "mem-1",
		"--credential-scope", "notes:read", "--credential-scope", "notes:write,notes:delete")
	env := map[string]string{
		"AIP_CONNECTOR_HOST_EXTERNAL_ACCOUNT_ID":     "acct-9",
		"AIP_CONNECTOR_HOST_EXTERNAL_ACCOUNT_SYSTEM": "provider",
		"AIP_CONNECTOR_HOST_CREDENTIAL_ID":           "cred-acme",
		"AIP_CONNECTOR_HOST_CREDENTIAL_ISSUER":       "vault",
		"AIP_CONNECTOR_HOST_CREDENTIAL_SCOPES":       "ignored, the flag wins",
		"AIP_CONNECTOR_HOST_CREDENTIAL_REVISION":     "rev-2",
		"AIP_CONNECTOR_HOST_CREDENTIAL_POLICY_FILE":  "/etc/aip/credential-policy.json",
	}
	cfg, err := hostsdk.LoadConfig(args, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TenantSystem != "crm" || cfg.MembershipID != "mem-1" || cfg.ExternalAccountID != "acct-9" || cfg.ExternalAccountSystem != "provider" ||
		cfg.CredentialID != "cred-acme" || cfg.CredentialIssuer != "vault" || cfg.CredentialRevisionRef != "rev-2" ||
		cfg.CredentialRevisionPolicyFile != "/etc/aip/credential-policy.json" ||
		!slices.Equal(cfg.CredentialScopes, []string{"notes:read", "notes:write", "notes:delete"}) {
		t.Errorf("config %+v", cfg)
	}
	if _, err := hostsdk.New(cfg, newTestConnector()); err != nil {
		t.Errorf("New: %v", err)
	}

	args, _, _ = validArgs(t)
	cfg, err = hostsdk.LoadConfig(args, func(k string) string {
		if k == "AIP_CONNECTOR_HOST_CREDENTIAL_SCOPES" {
			return " a , ,b,"
		}
		return ""
	})
	if err != nil || !slices.Equal(cfg.CredentialScopes, []string{"a", "b"}) {
		t.Errorf("scopes from the variable: %q, %v", cfg.CredentialScopes, err)
	}
}

// TestNewValidatesIdentitySettings: the pairs go together, the credential
// is all or none, and the lengths are the reference's; each error names
// the flag and its variable.
func TestNewValidatesIdentitySettings(t *testing.T) {
	args, _, _ := validArgs(t)
	base, err := hostsdk.LoadConfig(args, nil)
	if err != nil {
		t.Fatal(err)
	}
	credential := func(c *hostsdk.Config) {
		c.CredentialID, c.CredentialIssuer, c.CredentialScopes, c.CredentialRevisionRef = "cred", "vault", []string{"s"}, "rev-1"
	}
	for _, c := range []struct {
		name string
		edit func(*hostsdk.Config)
		want []string
	}{
		{"external account without its system", func(c *hostsdk.Config) { c.ExternalAccountID = "acct" },
			[]string{"--external-account-system", "AIP_CONNECTOR_HOST_EXTERNAL_ACCOUNT_SYSTEM", "both or neither"}},
		{"external system without its account", func(c *hostsdk.Config) { c.ExternalAccountSystem = "provider" },
			[]string{"--external-account-id", "AIP_CONNECTOR_HOST_EXTERNAL_ACCOUNT_ID", "both or neither"}},
		{"external account too long", func(c *hostsdk.Config) { c.ExternalAccountID, c.ExternalAccountSystem = strings.Repeat("a", 513), "p" },
			[]string{"--external-account-id", "513 bytes", "1 to 512"}},
		{"external system too long", func(c *hostsdk.Config) { c.ExternalAccountID, c.ExternalAccountSystem = "a", strings.Repeat("p", 129) },
			[]string{"--external-account-system", "AIP_CONNECTOR_HOST_EXTERNAL_ACCOUNT_SYSTEM", "129 bytes", "1 to 128"}},
		{"membership too long", func(c *hostsdk.Config) { c.MembershipID = strings.Repeat("m", 513) },
			[]string{"--membership-id", "AIP_CONNECTOR_HOST_MEMBERSHIP_ID", "513 bytes"}},
		{"tenant system too long", func(c *hostsdk.Config) { c.TenantSystem = strings.Repeat("s", 513) },
			[]string{"--tenant-system", "AIP_CONNECTOR_HOST_TENANT_SYSTEM", "513 bytes"}},
		{"credential without its revision", func(c *hostsdk.Config) { credential(c); c.CredentialRevisionRef = "" },
			[]string{"--credential-revision-ref", "AIP_CONNECTOR_HOST_CREDENTIAL_REVISION", "all of", "or none"}},
		{"credential without scopes", func(c *hostsdk.Config) { credential(c); c.CredentialScopes = nil },
			[]string{"--credential-scope", "AIP_CONNECTOR_HOST_CREDENTIAL_SCOPES", "all of"}},
		{"revision alone", func(c *hostsdk.Config) { c.CredentialRevisionRef = "rev-1" },
			[]string{"--credential-id", "AIP_CONNECTOR_HOST_CREDENTIAL_ID", "--credential-revision-ref (AIP_CONNECTOR_HOST_CREDENTIAL_REVISION) is set"}},
		{"empty scope", func(c *hostsdk.Config) { credential(c); c.CredentialScopes = []string{"s", ""} },
			[]string{"--credential-scope", "scope 2 is 0 bytes"}},
		{"revision too long", func(c *hostsdk.Config) { credential(c); c.CredentialRevisionRef = strings.Repeat("r", 257) },
			[]string{"--credential-revision-ref", "257 bytes", "1 to 256"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := base
			c.edit(&cfg)
			_, err := hostsdk.New(cfg, newTestConnector())
			if err == nil {
				t.Fatal("New accepted it")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	cfg := base
	credential(&cfg)
	cfg.CredentialRevisionRef = strings.Repeat("r", 256)
	cfg.ExternalAccountID, cfg.ExternalAccountSystem = strings.Repeat("a", 512), strings.Repeat("p", 128)
	if _, err := hostsdk.New(cfg, newTestConnector()); err != nil {
		t.Errorf("the longest accepted values: %v", err)
	}
}
