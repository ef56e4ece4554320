package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// greeter is a minimal connector: one capability that greets.
type greeter struct{}

func (greeter) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: "agent:greeter", Kind: aip.PrincipalAgent},
		Profiles:        []string{aip.NativeHTTPProfile},
		Capabilities: []aip.Capability{{
			ID: "greeter.hello", Name: "Say hello", Kind: aip.KindTool,
			InputSchema: []byte(`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`),
		}},
	}, nil
}

func (greeter) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	var in struct{ Name string }
	if err := jsonUnmarshal(call.Action.Input, &in); err != nil {
		return nil, err
	}
	return call.Complete(map[string]string{"greeting": "hello, " + in.Name})
}

// Load the configuration from flags and the environment, as a main does with
// os.Args[1:] and os.Getenv.
func ExampleLoadConfig() {
	env := map[string]string{
		"AIP_CONNECTOR_HOST_TENANT_ID":     "tenant-a",
		"AIP_CONNECTOR_HOST_MAX_IN_FLIGHT": "64",
	}
	cfg, err := hostsdk.LoadConfig([]string{"--max-in-flight", "16", "--zone", "eu-1"}, func(k string) string { return env[k] })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.TenantID, cfg.MaxInFlight, cfg.Zone)
	// Output: tenant-a 16 eu-1
}

// Every invalid value names the setting as it was given (here the
// variable, then its flag and Config field) and the accepted range. It
// matches ErrSetting: a main exits with status 2 for it, as for an unknown
// flag.
func ExampleLoadConfig_error() {
	_, err := hostsdk.LoadConfig(nil, func(k string) string {
		if k == "AIP_CONNECTOR_HOST_HEARTBEAT_MS" {
			return "0"
		}
		return ""
	})
	fmt.Println(err)
	fmt.Println(errors.Is(err, hostsdk.ErrSetting))
	// Output:
	// AIP_CONNECTOR_HOST_HEARTBEAT_MS (--heartbeat-interval-ms, Config.HeartbeatInterval) is "0"; want an integer from 1 to 150000 ms
	// true
}

// New validates the configuration without doing any I/O.
func ExampleNew() {
	_, err := hostsdk.New(hostsdk.Config{}, greeter{})
	var ce *hostsdk.ConfigError
	if errors.As(err, &ce) {
		fmt.Println("fix", "--"+ce.Flag)
	}
	// Output: fix --public-endpoint
}

// A connector streams ordered chunks through the ChunkWriter and returns its
// final result, which the host journals.
func ExampleChunkWriter() {
	handle := func(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
		for i := range 3 {
			if err := chunks.Send(aip.ChunkProgress, map[string]int{"step": i}); err != nil {
				return nil, err
			}
		}
		return call.Complete(map[string]uint64{"chunks": chunks.Sent()})
	}
	_ = handle
}

// Connector bookkeeping lives in the journal-backed state store; Update is a
// compare-and-set loop.
func ExampleState_Update() {
	handle := func(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
		_, rev, err := call.State().Update(ctx, "greeter.calls", call.Tenant.TenantID, func(cur json.RawMessage) (json.RawMessage, error) {
			n := 0
			fmt.Sscan(strings.TrimSpace(string(cur)), &n)
			return json.RawMessage(fmt.Sprint(n + 1)), nil
		})
		if err != nil {
			return nil, err
		}
		return call.Complete(map[string]uint64{"revision": rev})
	}
	_ = handle
}
