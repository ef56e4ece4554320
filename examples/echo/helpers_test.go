package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/examples/echo/echoconnector"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	sidecartest.RemoveBuilds()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// CapSay is echo's synchronous capability.
const CapSay = echoconnector.CapSay

func output(t *testing.T, resp *hostsdktest.Response) (*aip.ActionResult, echoconnector.Output) {
	t.Helper()
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("HTTP %d: %v", resp.Status, err)
	}
	var out echoconnector.Output
	if len(res.Output) > 0 {
		if err := json.Unmarshal(res.Output, &out); err != nil {
			t.Fatal(err)
		}
	}
	return res, out
}

func say(message string, extra string) *aip.Action {
	return &aip.Action{ID: aip.NewActionID(), CapabilityID: CapSay,
		Input: json.RawMessage(`{"message":` + quote(message) + extra + `}`)}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
