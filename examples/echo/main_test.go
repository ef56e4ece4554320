package main

import (
	"os"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestMainExitStatus runs main in a child process (this test binary, with
// ECHO_MAIN set): a value the host's settings refuse (hostsdk.ErrSetting),
// an unknown flag, a stray argument and a bad log level exited 1 like a
// failed start; they are mistakes in how the program was started, status
// 2 as aip-host's and the connector guide's noteshost's. So is a
// configuration hostsdk.New refuses (no settings at all: a required
// setting is missing), which exited 1; -h exits 0.
func TestMainExitStatus(t *testing.T) {
	if args, ok := hostsdktest.MainArgs(); ok {
		os.Args = append([]string{"echo"}, args...)
		main()
		return
	}
	for _, c := range []struct {
		args   []string
		env    []string
		status int
		stderr string
	}{
		{[]string{"--max-in-flight=0"}, nil, 2,
			`echo: --max-in-flight (AIP_CONNECTOR_HOST_MAX_IN_FLIGHT, Config.MaxInFlight) is "0"; want an integer from 1 to 65536`},
		{nil, []string{"AIP_CONNECTOR_HOST_LEASE_TTL_MS=5"}, 2,
			`echo: AIP_CONNECTOR_HOST_LEASE_TTL_MS (--lease-ttl-ms, Config.LeaseTTL) is "5"; want an integer from 1000 to 300000 ms`},
		{[]string{"--log-level", "loud"}, nil, 2, `echo: --log-level "loud": want debug, info, warn or error`},
		{nil, []string{"AIP_ECHO_LOG_LEVEL=loud"}, 2, `echo: AIP_ECHO_LOG_LEVEL "loud": want debug, info, warn or error`},
		{[]string{"--no-such-flag"}, nil, 2, "echo: flag provided but not defined: -no-such-flag"},
		{[]string{"stray"}, nil, 2, `echo: unexpected argument "stray"; every setting is a flag`},
		{nil, nil, 2, "echo: hostsdk: bootstrap step 1 (validate): --public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT, Config.PublicEndpoint) is required"},
		{[]string{"-h"}, nil, 0, "-signing-seed-file"},
	} {
		status, stderr := hostsdktest.RunMain(t, "TestMainExitStatus", c.args, c.env)
		if status != c.status || !strings.Contains(stderr, c.stderr) {
			t.Errorf("echo %v %v: exit status %d, want %d; stderr:\n%s\nwant it to contain %s", c.args, c.env, status, c.status, stderr, c.stderr)
		}
	}
}
