package main

import (
	"context"
	"fmt"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
)

func tokenCommand() *command {
	return &command{
		name:      "token",
		summary:   "mint a tenant bearer token (EdDSA JWT) from an issuer key",
		usage:     "--issuer-key FILE --tenant TENANT [flags]",
		envPrefix: "AIP_TOKEN_",
		long: `Mints a JWT that the dispatcher accepts as "Authorization: Bearer <token>".
The token names the tenant (claim tenant_id), the issuer (iss), the audience
(aud) and an expiry; it is signed with the issuer key, whose did:key the
dispatcher trusts (aipfleet dispatch --issuer NAME=DID). Meant for development
and tests; production tokens come from your identity provider.`,
		examples: []string{
			"aipfleet token --issuer-key .aipfleet/keys/issuer.key --tenant tenant-dev   # the issuer aipfleet dev trusts",
			"aipfleet token --issuer-key issuer.key --tenant acme --ttl 15m --subject alice",
		},
		run: runToken,
	}
}

func runToken(ctx context.Context, c *command, e *env, args []string) error {
	fs := newFlagSet(c, e.getenv)
	keyFile := fs.String("issuer-key", "", "issuer signing key file (64-hex seed or Ed25519 JWK, mode 0600)")
	tenant := fs.String("tenant", "", "tenant the token speaks for")
	issuer := fs.String("issuer", "aipfleet-dev", "issuer name (iss claim)")
	audience := fs.String("audience", tenanttoken.DefaultAudience, "audience (aud claim)")
	subject := fs.String("subject", "", "subject (sub claim), e.g. a user or service name")
	ttl := fs.Duration("ttl", time.Hour, "lifetime of the token (1s to 720h)")
	if err := fs.parse(args, e.stdout); err != nil {
		return err
	}
	if *keyFile == "" || *tenant == "" {
		return usagef("token: --issuer-key FILE and --tenant TENANT are required")
	}
	if *ttl < time.Second || *ttl > 720*time.Hour {
		return usagef("token: --ttl %s is outside 1s..720h", *ttl)
	}
	key, err := aip.LoadSigningKey(*keyFile)
	if err != nil {
		return err
	}
	now := time.Now()
	tok, err := tenanttoken.Mint(key, tenanttoken.Claims{
		Issuer: *issuer, Audience: *audience, Subject: *subject, TenantID: *tenant,
		IssuedAt: now, Expiry: now.Add(*ttl),
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, tok)
	return nil
}
