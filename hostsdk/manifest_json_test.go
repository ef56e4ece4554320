package hostsdk_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestBindManifestNamesRawJSONThatIsNotJSON: a manifest member written as
// json.RawMessage that is not JSON (a schema with a typo, a truncated
// channel) is refused naming the member. The error said only that a
// json.RawMessage failed to marshal for canonical JSON, not which.
func TestBindManifestNamesRawJSONThatIsNotJSON(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*aip.Manifest)
		want string
	}{
		{"input schema", func(m *aip.Manifest) { m.Capabilities[0].InputSchema = json.RawMessage(`{"type":`) }, "capability " + capEcho + " input_schema is not JSON"},
		{"output schema", func(m *aip.Manifest) { m.Capabilities[0].OutputSchema = json.RawMessage(`{type:"object"}`) }, "capability " + capEcho + " output_schema is not JSON"},
		{"channel", func(m *aip.Manifest) {
			m.Channels = []json.RawMessage{json.RawMessage(`"a"`), json.RawMessage(`{"id":`)}
		}, "channels[1] is not JSON"},
		{"extensions", func(m *aip.Manifest) { m.Extensions = json.RawMessage(`{,}`) }, "extensions is not JSON"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := newTestConnector().Manifest(t.Context(), hostsdk.TenantContext{})
			if err != nil {
				t.Fatal(err)
			}
			c.edit(m)
			if _, _, err := hostsdk.BindManifest(m, "example.test"); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("BindManifest: %v, want an error containing %q", err, c.want)
			}
		})
	}
}
