package main

import (
	"context"

	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// openStore opens the benchmarked backend. For PostgreSQL it installs the
// schema in the (empty) database; the service then runs on that registry's
// data pool.
func openStore(ctx context.Context, c config) (store, func(), error) {
	if c.backend == "memory" {
		r, err := memregistry.New(memregistry.Config{})
		if err != nil {
			return nil, nil, err
		}
		return r, func() {}, nil
	}
	r, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: c.databaseURL, DataMaxConns: int32(c.dataConns)})
	if err != nil {
		return nil, nil, err
	}
	return r, r.Close, nil
}
