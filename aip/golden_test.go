package aip

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current code")

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test ./aip -run Golden -update` to create it)", err)
	}
	if !bytes.Equal(append(got, '\n'), want) {
		t.Fatalf("%s changed:\ngot  %s\nwant %s", path, got, want)
	}
}

func TestGoldenSignedRegisterRequest(t *testing.T) {
	got, err := Seal(hostKey(t), SignedRequestField, fixedRegisterRequest(t))
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "register_request", got)

	r, err := OpenControlRequest(got)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.VerifyFrom(hostKey(t).DID()); err != nil {
		t.Fatalf("golden request does not verify: %v", err)
	}
	if r.Request.Command.Register == nil || r.Request.Command.Register.Replica.Capacity != 32 {
		t.Fatalf("decoded command = %+v", r.Request.Command)
	}
}

func TestGoldenSignedLeaseResponse(t *testing.T) {
	ck := controlKey(t)
	got, err := Seal(ck, SignedResponseField, fixedLeaseResponse(t))
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "lease_response", got)

	resp, err := OpenControlResponse(got, ck.DID(), ck.PublicKey(), "msg_0194a3b2c1d07e3f8a9b0c1d2e3f4a5b", fixedNow)
	if err != nil {
		t.Fatalf("golden response does not open: %v", err)
	}
	if resp.Outcome.Status != OutcomeLease || resp.Outcome.Lease.Sequence != 1 {
		t.Fatalf("outcome = %+v", resp.Outcome)
	}
}

func TestGoldenSignedActionEnvelope(t *testing.T) {
	host := hostKey(t) // stands in for the dispatcher's key here
	got, err := SignEnvelope(host, fixedActionEnvelope(t))
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "action_envelope", got)

	v, err := VerifyEnvelope(got, host.DID())
	if err != nil {
		t.Fatalf("golden envelope does not verify: %v", err)
	}
	var route ConnectorRoute
	if ok, err := v.Envelope.SecurityValue(SecurityConnectorRoute, &route); !ok || err != nil || route.FenceToken == "" {
		t.Fatalf("connector_route: ok=%v err=%v route=%+v", ok, err, route)
	}
}
