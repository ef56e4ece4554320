package hostsdk_test

import (
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestBindManifestWithoutProfilesSaysWhichToList: a manifest that lists
// no profiles (Profiles left out, as a first connector does) is refused
// naming the profile to list; it said only "manifest lists no profiles".
func TestBindManifestWithoutProfilesSaysWhichToList(t *testing.T) {
	m, err := newTestConnector().Manifest(t.Context(), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	m.Profiles = nil
	_, _, err = hostsdk.BindManifest(m, "example.test")
	if err == nil || !strings.Contains(err.Error(), "manifest lists no profiles; list "+aip.NativeHTTPProfile+" (aip.NativeHTTPProfile)") {
		t.Errorf("BindManifest without profiles: %v, want it to name %s", err, aip.NativeHTTPProfile)
	}
}
