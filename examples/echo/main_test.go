package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

// TestMainExitStatus runs main in a child process (this test binary, with
// ECHO_MAIN set): a value the host's settings refuse (hostsdk.ErrSetting),
// an unknown flag, a stray argument and a bad log level exited 1 like a
// failed start; they are mistakes in how the program was started, status
// 2 as aip-host's and the connector guide's noteshost's. So is a
// configuration hostsdk.New refuses (no settings at all: a required
// setting is missing), which exited 1; -h exits 0. A --database-url-file
// that cannot be used (readable by others, or a URL that does not parse)
// exited 1 too, as a database that cannot be reached still does; it exits
// 2, as in aip-host and aipfleet host.
func TestMainExitStatus(t *testing.T) {
	if args, ok := hostsdktest.MainArgs(); ok {
		os.Args = append([]string{"echo"}, args...)
		main()
		return
	}
	// A replica's complete settings, and URL files of each kind.
	replica := sidecartest.NewFakeFleet(t).NewReplica(t, sidecartest.ReplicaOptions{}).Env
	dir := t.TempDir()
	urlFile := func(name, content string, mode os.FileMode) []string {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(file, mode); err != nil {
			t.Fatal(err)
		}
		return append(slices.Clone(replica), "AIP_CONNECTOR_HOST_DATABASE_URL_FILE="+file)
	}
	// A / in the password ends the user information: pgx reads "s3" as
	// the port.
	malformed := urlFile("malformed.url", "postgres://u:s3/xyzzy@127.0.0.1:5432/db\n", 0o600)
	loose := urlFile("loose.url", "postgres://u@127.0.0.1:1/db\n", 0o644)
	unreachable := urlFile("unreachable.url", "postgres://u@127.0.0.1:1/db?connect_timeout=5\n", 0o600)
	const step2 = "echo: hostsdk: bootstrap step 2 (open_journal): --database-url-file (AIP_CONNECTOR_HOST_DATABASE_URL_FILE): "
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
		{nil, malformed, 2, step2 + "pgruntime: database URL file " + filepath.Join(dir, "malformed.url") + " does not hold a valid PostgreSQL connection string: "},
		{nil, loose, 2, step2 + "secret file " + filepath.Join(dir, "loose.url") + " is accessible by group or others"},
		{nil, unreachable, 1, step2 + "database URL file " + filepath.Join(dir, "unreachable.url") + ": "},
	} {
		status, stderr := hostsdktest.RunMain(t, "TestMainExitStatus", c.args, c.env)
		if strings.Contains(stderr, "xyzzy") {
			t.Errorf("echo %v %v: stderr shows the URL file's password:\n%s", c.args, c.env, stderr)
		}
		if status != c.status || !strings.Contains(stderr, c.stderr) {
			t.Errorf("echo %v %v: exit status %d, want %d; stderr:\n%s\nwant it to contain %s", c.args, c.env, status, c.status, stderr, c.stderr)
		}
	}
}
