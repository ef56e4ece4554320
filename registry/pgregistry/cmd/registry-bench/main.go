// Command registry-bench measures the PostgreSQL registry at the reference
// scale profile: it creates a scratch database on the server named by
// -database-url, seeds the profile (1 000 connector types, 1 000
// capabilities, 10 000 instances and replicas, 100 tenants, 100 000
// bindings) with a progress line, then prints the seed time, resolve+settle
// throughput with route p50/p99 at -workers concurrent workers, and catalog
// page p99 at -readers parallel tenant readers. The scratch database is
// dropped at the end unless -keep is set.
//
//	go run ./registry/pgregistry/cmd/registry-bench -database-url 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "registry-bench:", err)
		os.Exit(1)
	}
}
