package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) string { return "" }

func TestFlags(t *testing.T) {
	const db = "postgres://x/y"
	for _, c := range []struct {
		args []string
		want string // a substring the error must contain
	}{
		{[]string{}, "-database-url is required"},
		{[]string{"-database-url", db, "-workers", "0"}, "-workers 0"},
		{[]string{"-database-url", db, "-workers", "513"}, "-workers 513"},
		{[]string{"-database-url", db, "-readers", "0"}, "-readers 0"},
		{[]string{"-database-url", db, "-duration", "10ms"}, "-duration 10ms"},
		{[]string{"-database-url", db, "-duration", "2h"}, "-duration 2h0m0s"},
		{[]string{"-database-url", db, "-warmup", "-1s"}, "-warmup -1s"},
		{[]string{"-database-url", db, "-profile", "huge"}, `-profile "huge"`},
		{[]string{"-database-url", db, "-page-size", "500"}, "-page-size 500"},
		{[]string{"-database-url", db, "-heartbeat-workers", "-1"}, "-heartbeat-workers -1"},
		{[]string{"-database-url", db, "-heartbeat-batch", "0"}, "-heartbeat-batch 0"},
		{[]string{"-database-url", db, "extra"}, `unexpected arguments ["extra"]`},
		{[]string{"-database-url", db, "-no-such-flag"}, "-no-such-flag"},
	} {
		_, err := parseFlags(c.args, noEnv, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", c.args, err, c.want)
		}
	}
	o, err := parseFlags([]string{"-workers", "512", "-duration", "1h", "-profile", "small", "-page-size", "200"},
		func(k string) string {
			if k == "AIP_BENCH_DATABASE_URL" {
				return db
			}
			return ""
		}, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseFlags with valid bounds: %v", err)
	}
	if o.databaseURL != db || o.workers != 512 || o.duration != time.Hour || o.profile != "small" || o.pageSize != 200 {
		t.Fatalf("parseFlags with valid bounds: %+v", o)
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
