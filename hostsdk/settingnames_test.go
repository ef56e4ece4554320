package hostsdk_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
)

// TestStartErrorsNameTheSettingAndVariable: the files and addresses the
// bootstrap reads are reported with their flag and their
// AIP_CONNECTOR_HOST_* variable, as the value errors of New are. They
// named the flag only, which an operator configuring a container by
// variables does not see anywhere.
func TestStartErrorsNameTheSettingAndVariable(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key, _ := aip.GenerateSigningKey()
	looseSeed := write("loose.seed", "", 0o600)
	os.Remove(looseSeed)
	if err := aip.WriteSeedFile(looseSeed, key); err != nil {
		t.Fatal(err)
	}
	os.Chmod(looseSeed, 0o640)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	type startCase struct {
		name string
		edit func(f *fleet)
		want []string
	}
	cases := []startCase{
		{"signing key file readable by its group", func(f *fleet) { f.cfg.SigningKey, f.cfg.SigningSeedFile = nil, looseSeed },
			[]string{"--signing-seed-file", "AIP_CONNECTOR_HOST_SIGNING_SEED_FILE", "chmod 600"}},
		{"seed of the wrong length", func(f *fleet) {
			f.cfg.SigningKey, f.cfg.SigningSeedFile = nil, write("short.seed", strings.Repeat("a", 63)+"\r\n", 0o600)
		}, []string{"--signing-seed-file", "AIP_CONNECTOR_HOST_SIGNING_SEED_FILE", "64 hexadecimal characters", "got 63"}},
		{"control DID file writable by others", func(f *fleet) {
			f.cfg.ControlPlaneDIDFile, f.cfg.ControlPlaneDID = write("control.did", f.cp.DID()+"\n", 0o666), ""
		}, []string{"--control-plane-did-file", "AIP_CONNECTOR_HOST_CONTROL_DID_FILE", "chmod go-w"}},
		{"gateway DID file without a did:key", func(f *fleet) {
			f.cfg.GatewayDIDFile, f.cfg.GatewayDID = write("gateway.did", "did:web:example.com\n", 0o644), ""
		}, []string{"--gateway-did-file", "AIP_CONNECTOR_HOST_GATEWAY_DID_FILE", "did:key"}},
		{"CA file without a certificate", func(f *fleet) {
			f.cfg.ControlPlaneTransport, f.cfg.TLSCACertificateFile = nil, write("ca.pem", "not PEM\n", 0o644)
		}, []string{"--tls-ca-certificate-file", "AIP_CONNECTOR_HOST_TLS_CA_FILE"}},
		{"state directory that is a file", func(f *fleet) {
			f.cfg.Journal, f.cfg.StateDir = nil, write("not-a-dir", "x", 0o600)
		}, []string{"--state-dir", "AIP_CONNECTOR_HOST_STATE_DIR"}},
		{"bind address in use", func(f *fleet) {
			f.cfg.Listener.Close()
			f.cfg.Listener, f.cfg.Bind = nil, taken.Addr().String()
		}, []string{"--bind", "AIP_CONNECTOR_HOST_BIND", "address already in use"}},
	}
	if os.Geteuid() == 0 {
		// Its owner can rewrite it whatever its mode, and name the key
		// actions are taken from.
		cases = append(cases, startCase{"gateway DID file another user owns", func(f *fleet) {
			p := write("others.did", f.d.DID()+"\n", 0o644)
			if err := os.Chown(p, 4242, 4242); err != nil {
				t.Error(err)
			}
			f.cfg.GatewayDIDFile, f.cfg.GatewayDID = p, ""
		}, []string{"--gateway-did-file", "AIP_CONNECTOR_HOST_GATEWAY_DID_FILE", "owned by uid 4242", "chown"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			c.edit(f)
			err := startErr(t, f, newTestConnector())
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
