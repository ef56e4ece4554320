package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

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

// analyze updates the planner statistics of the database at url; ANALYZE
// also invalidates the plans the registry's connections cached.
func analyze(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "ANALYZE"); err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	return nil
}
