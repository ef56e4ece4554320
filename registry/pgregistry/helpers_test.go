package pgregistry_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// world is a small routable fleet: type alpha with an active version of
// alpha.read and alpha.write, one enabled instance per tenant bound to both
// capabilities under policy, and replicas ready for an hour.
type world struct {
	clock    *registrytest.Clock
	version  registry.ConnectorVersion
	policy   registry.AdmissionPolicy
	replicas []registry.ConnectorReplica
}

// seedWorld creates the world through admin: tenants × instances, each
// instance with replicasPer replicas of the given capacity.
func seedWorld(t testing.TB, admin registry.Administrator, clock *registrytest.Clock, policy registry.AdmissionPolicy, tenants, instancesPer, replicasPer int, capacity uint32) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{clock: clock, policy: policy}
	must(t, admin.PutAdmissionPolicy(ctx, policy))
	ct := registry.ConnectorType{ID: "ctype_alpha", Name: "alpha", Owner: "owner-alpha", Enabled: true}
	must(t, admin.PutConnectorType(ctx, ct))
	caps := []aip.Capability{registrytest.Capability("alpha.read", "reads"), registrytest.Capability("alpha.write", "writes")}
	w.version = registrytest.Version("cver_alpha1", ct.ID, "1.0.0", ct.Owner, registry.VersionActive, registrytest.Manifest("service:alpha", caps))
	must(t, admin.AdmitVersion(ctx, w.version))
	for tn := range tenants {
		tenant := tenantName(tn)
		for in := range instancesPer {
			inst := registry.ConnectorInstance{
				ID: "cinst_" + tenant + "-" + string(rune('a'+in)), ConnectorTypeID: ct.ID, VersionID: w.version.ID, TenantID: tenant,
				ConfigRevision: 1, SecretProviderRef: "secret://" + tenant, Status: registry.InstanceEnabled,
			}
			must(t, admin.PutInstance(ctx, inst))
			for _, c := range []string{"alpha.read", "alpha.write"} {
				must(t, admin.PutBinding(ctx, registry.CapabilityBinding{
					TenantID: tenant, CapabilityID: c, InstanceID: inst.ID, PolicyRevision: 1, QuotaPolicyRef: policy.PolicyRef, Enabled: true,
				}))
			}
			for rn := range replicasPer {
				r := registrytest.Replica("crepl_"+inst.ID[len("cinst_"):]+"-"+string(rune('0'+rn)), inst.ID, inst.VersionID, clock.Now().Add(time.Hour))
				r.Capacity = capacity
				must(t, admin.PutReplica(ctx, r))
				w.replicas = append(w.replicas, r)
			}
		}
	}
	return w
}

func tenantName(n int) string { return "tenant-" + string(rune('a'+n/26)) + string(rune('a'+n%26)) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// asRole returns dbURL with its user replaced by role (the test server
// trusts local connections).
func asRole(t testing.TB, dbURL, role string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// connect opens a plain connection closed at the end of the test.
func connect(t testing.TB, dbURL string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// sqlState returns the SQLSTATE of err, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// openClock opens a registry on a fresh database with a test clock.
func openClock(t testing.TB, cfg pgregistry.Config) (*pgregistry.Registry, string, *registrytest.Clock) {
	t.Helper()
	clock := registrytest.NewClock(registrytest.Epoch)
	r, dbURL := openWith(t, registrytest.Options{Clock: clock}, cfg)
	return r, dbURL, clock
}
