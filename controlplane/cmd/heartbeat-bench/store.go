package main

import (
	"context"
	"errors"

	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// openStore opens the benchmarked backend.
func openStore(ctx context.Context, c config) (store, func(), error) {
	switch c.backend {
	case "memory":
		r, err := memregistry.New(memregistry.Config{})
		if err != nil {
			return nil, nil, err
		}
		return r, func() {}, nil
	}
	return nil, nil, errors.New("-backend postgres: pgregistry does not implement registry.Lifecycle yet")
}
