// Command heartbeat-bench measures the lifecycle service: it pre-provisions
// and registers N replicas (on PostgreSQL it then analyzes the loaded
// tables), then drives signed heartbeats from C concurrent clients through
// the real HTTP server on loopback and prints heartbeats per second and
// latency percentiles.
//
//	go run ./controlplane/cmd/heartbeat-bench -replicas 10000 -clients 64 -duration 20s
//	go run ./controlplane/cmd/heartbeat-bench -backend postgres -database-url postgres://...
//
// Every request is signed by its replica's key and every answer's
// signature, request ID and window are verified (-verify=false skips the
// client-side verification to leave more of a shared machine's CPU to the
// server). The load generator runs in the same process as the server, so
// on a small machine both compete for the same cores.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "heartbeat-bench:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	return bench(ctx, cfg, stdout)
}
