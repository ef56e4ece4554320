package hostsdktest

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// mainArgsEnv carries, to the child process RunMain starts, the command
// line its main is to see, as a JSON array.
const mainArgsEnv = "HOSTSDKTEST_MAIN_ARGS"

// MainArgs reports whether this process is the child RunMain started,
// and with what command line (without the program's name). The test it
// re-runs sets os.Args from them and calls main:
//
//	if args, ok := hostsdktest.MainArgs(); ok {
//		os.Args = append([]string{"aip-host"}, args...)
//		main()
//		return
//	}
func MainArgs() ([]string, bool) {
	raw, ok := os.LookupEnv(mainArgsEnv)
	if !ok {
		return nil, false
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		panic("hostsdktest: " + mainArgsEnv + " is not a JSON array of strings: " + err.Error())
	}
	return args, true
}

// RunMain runs the test named test of this test binary again in a child
// process that calls main with args (see MainArgs), and returns its exit
// status and standard error: a program's main exits the process, so its
// exit status can be seen only from outside. The child's environment is
// this process's without the AIP_* and OTEL_* variables (the settings a
// host reads), plus env ("NAME=value" entries).
func RunMain(t testing.TB, test string, args, env []string) (status int, stderr string) {
	t.Helper()
	if args == nil {
		args = []string{}
	}
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIP_") && !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, mainArgsEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, mainArgsEnv+"="+string(raw)), env...)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		status = ee.ExitCode()
	case err != nil:
		t.Fatalf("run %s in a child process: %v", test, err)
	}
	return status, errBuf.String()
}
