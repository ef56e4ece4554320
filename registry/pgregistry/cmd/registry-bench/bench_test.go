package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) string { return "" }

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-database-url", "postgres://x/y", "-workers", "0"},
		{"-database-url", "postgres://x/y", "-duration", "10ms"},
		{"-database-url", "postgres://x/y", "-profile", "huge"},
		{"-database-url", "postgres://x/y", "-page-size", "500"},
		{"-database-url", "postgres://x/y", "extra"},
	} {
		var stderr bytes.Buffer
		if err := run(context.Background(), args, noEnv, &bytes.Buffer{}, &stderr); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-help"}, noEnv, &bytes.Buffer{}, &stderr); err != nil || !strings.Contains(stderr.String(), "Usage:") {
		t.Fatalf("-help: %v\n%s", err, stderr.String())
	}
}

// TestSmallProfile runs the whole command against the test server with the
// small profile: it seeds through the Batch administrator, measures, prints
// every figure and drops its scratch database.
func TestSmallProfile(t *testing.T) {
	server := pgtest.ServerURL(t)
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"-database-url", server, "-profile", "small", "-duration", "1s", "-warmup", "0s",
		"-workers", "4", "-readers", "4", "-explain"}, noEnv, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"seeding:", "seed: 50 types", "== route selection", "resolve+settle:", "route (resolve) p50", "catalog pages (50 items):"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
