package main

import (
	"context"
	"fmt"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

func tokenCommand() *command {
	return &command{
		name:      "token",
		summary:   "mint a tenant or operator bearer token (EdDSA JWT) from an issuer key",
		usage:     "--issuer-key FILE --tenant TENANT [flags]",
		envPrefix: "AIP_TOKEN_",
		long: `Mints a JWT that the dispatcher accepts as "Authorization: Bearer <token>".
The token names the tenant (claim tenant_id), the issuer (iss), the audience
(aud) and an expiry; it is signed with the issuer key, whose did:key the
dispatcher trusts (aipfleet dispatch --issuer NAME=DID).

With --operator it mints an operator token instead (claim aip_role =
"operator", no tenant, audience aipfleet-control): the one the control
plane's fleet views need (aipfleet control-plane --operator-issuer NAME=DID;
aipfleet fleet status --token). Meant for development and tests; production
tokens come from your identity provider.`,
		examples: []string{
			"aipfleet token --issuer-key .aipfleet/keys/issuer.key --tenant tenant-dev   # the issuer aipfleet dev trusts",
			"aipfleet token --issuer-key issuer.key --tenant acme --ttl 15m --subject alice",
			"aipfleet token --issuer-key ops.key --issuer ops --operator --subject alice   # for aipfleet fleet status --token",
		},
		run: runToken,
	}
}

func runToken(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	keyFile := fs.String("issuer-key", "", "issuer signing key file (64-hex seed or Ed25519 JWK, mode 0600)")
	tenant := fs.String("tenant", "", "tenant the token speaks for")
	operator := fs.Bool("operator", false, "mint an operator token (for the control plane's fleet views) instead of a tenant's")
	issuer := fs.String("issuer", "aipfleet-dev", "issuer name (iss claim)")
	audience := fs.String("audience", "", "audience (aud claim); default "+tenanttoken.DefaultAudience+", or "+tenanttoken.OperatorAudience+" with --operator")
	subject := fs.String("subject", "", "subject (sub claim), e.g. a user or service name")
	ttl := fs.Duration("ttl", time.Hour, "lifetime of the token (1s to 720h)")
	if err := fs.parse(args, e.stdout); err != nil {
		return err
	}
	if err := fs.noArgs(); err != nil {
		return err
	}
	switch {
	case *keyFile == "":
		return usagef("token: --issuer-key FILE is required")
	case *operator && *tenant != "":
		return usagef("token: an operator token names no tenant: give --tenant or --operator, not both")
	case !*operator && *tenant == "":
		return usagef("token: --tenant TENANT is required (or --operator for an operator token)")
	case !*operator:
		if err := tenantFlagValid("token", *tenant); err != nil {
			return err
		}
	}
	if *ttl < time.Second || *ttl > 720*time.Hour {
		return usagef("token: --ttl %s is outside 1s..720h", *ttl)
	}
	if err := mintedNameGiven("token", "issuer", *issuer); err != nil {
		return err
	}
	key, err := aip.LoadSigningKey(*keyFile)
	if err != nil {
		return flagFileError("token", "--issuer-key", err)
	}
	now := time.Now()
	claims := tenanttoken.Claims{Issuer: *issuer, Audience: *audience, Subject: *subject, TenantID: *tenant,
		IssuedAt: now, Expiry: now.Add(*ttl)}
	var tok string
	if *operator {
		if claims.Audience == "" {
			claims.Audience = tenanttoken.OperatorAudience
		}
		tok, err = tenanttoken.MintOperator(key, claims)
	} else {
		if claims.Audience == "" {
			claims.Audience = tenanttoken.DefaultAudience
		}
		tok, err = tenanttoken.Mint(key, claims)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, tok)
	return nil
}

// tenantFlagValid refuses a --tenant the dispatcher would refuse in a
// token it verifies (dispatch.ValidTenantID) with a usage error of cmd
// that says what to fix. A tenant ID holding an invisible formatting
// character was minted into a token the dispatcher took and whose actions
// the registry then refused.
func tenantFlagValid(cmd, tenant string) error {
	if c, ok := registry.FormatCharacter(tenant); ok {
		return usagef("%s: --tenant %q holds the invisible formatting character U+%04X, which no tenant ID may hold (it would print like a tenant ID it is not): remove it",
			cmd, tenant, c)
	}
	if !dispatch.ValidTenantID(tenant) {
		return usagef("%s: --tenant %q is not a tenant ID: give at most %d bytes of UTF-8 text without control characters or surrounding spaces (the dispatcher refuses a token naming anything else)",
			cmd, tenant, registry.MaxIdentifierBytes)
	}
	return nil
}

// mintedNameGiven refuses an empty --issuer or --audience of a token the
// command mints: the token library refuses it too, in words that name
// neither flag ("tenanttoken: issuer and audience are required").
func mintedNameGiven(cmd, flag, value string) error {
	if value != "" {
		return nil
	}
	switch flag {
	case "issuer":
		return usagef("%s: --issuer is empty: give the issuer name its verifier trusts the key under (the NAME of its NAME=DID), or leave the flag out for %s", cmd, devIssuer)
	case "audience":
		return usagef("%s: --audience is empty: give the audience the dispatcher requires (its --audience), or leave the flag out for %s", cmd, tenanttoken.DefaultAudience)
	}
	return usagef("%s: --%s is empty", cmd, flag)
}
