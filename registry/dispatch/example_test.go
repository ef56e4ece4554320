package dispatch_test

import (
	"context"
	"fmt"
	"net"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// Embedding the dispatcher: an in-memory registry serves as resolver,
// catalog and rerouter, a token verifier trusts one issuer, and Run serves
// the API on a listener until the context ends.
func Example() {
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		panic(err)
	}
	gateway, _ := aip.GenerateSigningKey() // hosts pin gateway.DID() as --gateway-did
	issuer, _ := aip.GenerateSigningKey()
	tokens, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{
		Issuers: []tenanttoken.Issuer{{Name: "dev", DIDs: []string{issuer.DID()}}},
	})
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	d, err := dispatch.New(dispatch.Config{SigningKey: gateway, PrincipalID: "service:aipfleet-dispatch", Listener: ln},
		dispatch.Deps{Resolver: reg, Catalog: reg, Rerouter: reg, Tokens: tokens, Ready: dispatch.ReadinessProbe(reg)})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a real program cancels on SIGTERM
	fmt.Println(d.Run(ctx))
	// Output: <nil>
}
