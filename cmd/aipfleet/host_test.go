package main

import (
	"errors"
	"strings"
	"testing"
)

func TestHostFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{want: "--connector is required: one of echo"},
		{args: []string{"--connector", "cal-diy"}, want: `"cal-diy" is not a built-in connector; choose one of echo`},
		{args: []string{"--connector", "echo", "--log-level", "chatty"}, want: "--log-level"},
		{args: []string{"--connector", "echo", "extra"}, want: "unexpected argument"},
		// The common host settings are checked by hostsdk, which names the
		// flag and its variable.
		{args: []string{"--connector", "echo", "--max-in-flight", "0"}, want: "--max-in-flight (AIP_CONNECTOR_HOST_MAX_IN_FLIGHT"},
		{env: map[string]string{"AIP_CONNECTOR_HOST_CONNECTOR": "echo", "AIP_CONNECTOR_HOST_LEASE_TTL_MS": "5"}, want: "AIP_CONNECTOR_HOST_LEASE_TTL_MS"},
		{args: []string{"--connector", "echo"}, want: "--public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT"},
	} {
		_, _, err := runCLI(t, c.env, append([]string{"host"}, c.args...)...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("host %v %v: err = %v, want a usage error containing %q", c.args, c.env, err, c.want)
		}
	}
}

func TestHostHelpListsTheCommonHostFlags(t *testing.T) {
	out, _, err := runCLI(t, nil, "host", "--help")
	if !errors.Is(err, errHelpShown) {
		t.Fatal(err)
	}
	for _, want := range []string{
		"--connector", "$AIP_CONNECTOR_HOST_CONNECTOR",
		"--signing-seed-file", "$AIP_CONNECTOR_HOST_SIGNING_SEED_FILE",
		"--allow-insecure-loopback-http", "$AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP",
		"--heartbeat-interval-ms", "$AIP_CONNECTOR_HOST_HEARTBEAT_MS",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("host --help lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "[$") {
		t.Errorf("host --help repeats variable names in the usage text:\n%s", out)
	}
}
