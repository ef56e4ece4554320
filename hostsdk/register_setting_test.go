package hostsdk_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestRegisterRefusedForSetting: a registration the control plane refuses
// because a setting of the host differs from what the fleet pre-provisioned
// for the replica (the signing key, the replica ID, the endpoint, the
// tenant) is a setting to fix: the start's error matches ErrSetting (the
// program exits 2) and names the setting; a rejection that no setting
// causes does not.
func TestRegisterRefusedForSetting(t *testing.T) {
	otherKey, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		change  func(f *fleet)
		setting bool
		want    []string
	}{
		{"signer", func(f *fleet) { f.cfg.SigningKey = otherKey }, true, []string{
			"signer_did " + otherKey.DID() + " is not the DID pre-provisioned for replica",
			"this host presented the DID " + otherKey.DID() + " of its signing key (Config.SigningKey)",
			"the peer_did of replica", "must be that key's DID", "aipfleet keygen --did-of FILE",
		}},
		{"not provisioned", func(f *fleet) { f.cfg.ReplicaID = aip.NewID(aip.PrefixReplica) }, true, []string{
			"--replica-id (AIP_CONNECTOR_HOST_REPLICA_ID)", "the fleet file was applied",
		}},
		{"endpoint", func(f *fleet) { f.cfg.PublicEndpoint = "http://127.0.0.1:1" + aip.MessagesPath }, true, []string{
			"identity: replica.endpoint", "set --public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT) to the value pre-provisioned",
		}},
		{"tenant", func(f *fleet) { f.cfg.TenantID = "tenant-other" }, true, []string{
			"instance: tenant_id", "set --tenant-id (AIP_CONNECTOR_HOST_TENANT_ID)",
		}},
		{"other rejection", func(f *fleet) { f.cp.FailNext(1, hostsdktest.FaultReject) }, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			tc.change(f)
			err := startErr(t, f, newTestConnector())
			var re *hostsdk.RegisterError
			var rej *hostsdk.ControlRejectedError
			if !errors.As(err, &re) || !errors.As(err, &rej) {
				t.Fatalf("error %v, want *RegisterError wrapping *ControlRejectedError", err)
			}
			if got := errors.Is(err, hostsdk.ErrSetting); got != tc.setting {
				t.Errorf("errors.Is(ErrSetting) = %v, want %v: %v", got, tc.setting, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}
