package pgregistry

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/registry"
)

// tenantGates bounds the routing transactions (resolutions, settlements
// and reroutes) of one tenant that a registry runs in the database at once.
//
// Every route and settlement of a tenant updates that tenant's admission
// counters, and a busy tenant's routes share its few replicas: in the
// database they take those rows one transaction at a time however many are
// sent. Transactions beyond a few only wait there, on row locks, and
// waiting there is not free: each wait costs the server lock-manager work,
// a sleep and a wake-up, and a re-check of the row it waited for, on the
// CPU the transactions holding the rows need. Waiting in the process, on a
// channel, costs nearly nothing; so the gates hold the excess here and the
// database sees a short queue per tenant. Different tenants' transactions
// use different rows and do not share a gate.
type tenantGates struct {
	limit   int
	timeout time.Duration
	mu      sync.Mutex
	gates   map[string]*gate
}

// gate is one tenant's: a slot per transaction in the database, each with
// its lane number (0 to limit-1, so the transactions of a tenant in the
// database at once hold different lanes), and the number of callers
// holding or waiting for a slot (the gate is dropped when it falls to
// zero).
type gate struct {
	slots chan int
	users int
}

func newTenantGates(limit int, timeout time.Duration) *tenantGates {
	return &tenantGates{limit: limit, timeout: timeout, gates: map[string]*gate{}}
}

// enter waits for a slot of tenant's gate, at most the acquire timeout,
// and returns its lane; the returned function gives it back.
func (t *tenantGates) enter(ctx context.Context, tenant, op string) (int, func(), error) {
	t.mu.Lock()
	g := t.gates[tenant]
	if g == nil {
		g = &gate{slots: make(chan int, t.limit)}
		for lane := range t.limit {
			g.slots <- lane
		}
		t.gates[tenant] = g
	}
	g.users++
	t.mu.Unlock()
	leave := func() {
		t.mu.Lock()
		if g.users--; g.users == 0 {
			delete(t.gates, tenant)
		}
		t.mu.Unlock()
	}
	select {
	case lane := <-g.slots:
		return lane, func() { g.slots <- lane; leave() }, nil
	default:
	}
	timer := time.NewTimer(t.timeout)
	defer timer.Stop()
	select {
	case lane := <-g.slots:
		return lane, func() { g.slots <- lane; leave() }, nil
	case <-ctx.Done():
		leave()
		return 0, nil, ctx.Err()
	case <-timer.C:
		leave()
		return 0, nil, fmt.Errorf("%w: %s: tenant %s already had %d routing transactions in the database (Config.TenantRouteConcurrency) for %s (Config.AcquireTimeout)",
			registry.ErrStorage, op, tenant, t.limit, t.timeout)
	}
}
