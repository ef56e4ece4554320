package main

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

func TestRunServesAndDrainsCleanly(t *testing.T) {
	f := sidecartest.NewFakeFleet(t)
	cp, d := f.ControlPlane, f.Dispatcher
	r := newReplica(t, f)
	env := map[string]string{}
	for _, kv := range r.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	// The bind address comes as a flag, the rest from the environment.
	args := []string{"--bind", env["AIP_CONNECTOR_HOST_BIND"], "--log-level", "info"}
	delete(env, "AIP_CONNECTOR_HOST_BIND")

	ctx, cancel := context.WithCancel(ctxT(t))
	var stderr hostsdktest.LogBuffer
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, args, func(k string) string { return env[k] }, &bytes.Buffer{}, &stderr) }()
	if err := cp.Await(ctx, func(o []hostsdktest.Operation) bool { return len(o) > 0 && o[0].Outcome == aip.OutcomeLease }); err != nil {
		t.Fatal(err)
	}
	target := targetOf(t, r)
	if _, out := output(t, must(d.Act(ctx, target, say("via run", "")))); out.SideEffects != 1 {
		t.Errorf("output %+v", out)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	o := cp.Operations()
	if o[len(o)-1].Op != aip.OpOffline {
		t.Errorf("last operation %s", o[len(o)-1].Op)
	}
	if !strings.Contains(stderr.String(), `"msg":"offline; shutdown was clean"`) {
		t.Errorf("log:\n%s", stderr.String())
	}
}

func TestRunRejectsBadConfiguration(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"--max-in-flight", "-1"}, func(string) string { return "" }, &stderr, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--max-in-flight") || !strings.Contains(err.Error(), "AIP_CONNECTOR_HOST_MAX_IN_FLIGHT") {
		t.Fatalf("run: %v", err)
	}
	// A bad log level names where it came from: the flag, or the
	// environment when the flag is not given.
	err = run(context.Background(), []string{"--log-level", "loud"}, func(string) string { return "" }, &stderr, &stderr)
	if err == nil || !strings.Contains(err.Error(), `--log-level "loud"`) {
		t.Fatalf("run --log-level loud: %v", err)
	}
	envLevel := func(k string) string {
		if k == "AIP_ECHO_LOG_LEVEL" {
			return "loud"
		}
		return ""
	}
	err = run(context.Background(), nil, envLevel, &stderr, &stderr)
	if err == nil || !strings.Contains(err.Error(), `AIP_ECHO_LOG_LEVEL "loud"`) || strings.Contains(err.Error(), "--log-level") {
		t.Fatalf("run with AIP_ECHO_LOG_LEVEL=loud: %v", err)
	}
	if err := run(context.Background(), []string{"-h"}, func(string) string { return "" }, &stderr, &stderr); err != flag.ErrHelp {
		t.Fatalf("run -h: %v", err)
	}
	if !strings.Contains(stderr.String(), "-signing-seed-file") {
		t.Errorf("help does not list the host flags:\n%s", stderr.String())
	}
}
