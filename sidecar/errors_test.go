package sidecar

import (
	"errors"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// A ConfigError names the flag and variable that set its field: the
// sidecar's own (AIP_SIDECAR_*), the host's bind address (hostsdk's
// AIP_CONNECTOR_HOST_BIND), or only the Go field when no flag sets it.
func TestConfigErrorNamesItsSetting(t *testing.T) {
	for _, tc := range []struct{ field, want string }{
		{"MCP.ConnectTimeout", "--start-timeout-ms (AIP_SIDECAR_START_TIMEOUT_MS, Config.MCP.ConnectTimeout) is bad"},
		{"Host.Bind", "--bind (AIP_CONNECTOR_HOST_BIND, Config.Host.Bind) is bad"},
		{"Host.HealthProbeTimeout", "Config.Host.HealthProbeTimeout is bad"},
		{"Local.MaxChunks", "Config.Local.MaxChunks is bad"},
	} {
		if got := cfgErr(tc.field, "is bad").Error(); got != tc.want {
			t.Errorf("cfgErr(%q) = %q, want %q", tc.field, got, tc.want)
		}
	}
}

// TestConfigErrorMatchesErrSetting: a *ConfigError is a setting the
// operator must change, as hostsdk's refused settings are: it matches
// hostsdk.ErrSetting (aip-sidecar exits 2 for it; it exited 1) and is
// still found with errors.As.
func TestConfigErrorMatchesErrSetting(t *testing.T) {
	err := error(cfgErr("Local.URL", "is empty"))
	var ce *ConfigError
	if !errors.Is(err, hostsdk.ErrSetting) || !errors.As(err, &ce) {
		t.Errorf("%v: want a *ConfigError matching hostsdk.ErrSetting", err)
	}
	if _, err := New(Config{}); !errors.Is(err, hostsdk.ErrSetting) {
		t.Errorf("New(Config{}): %v; want an error matching hostsdk.ErrSetting", err)
	}
}
