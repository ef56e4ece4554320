package sidecartest

import (
	"testing"
)

// TestAwaitFindsALineAfterManyOthers: Await finds a log line however many
// lines the process wrote before the test started waiting.
func TestAwaitFindsALineAfterManyOthers(t *testing.T) {
	p := Start(t, "/bin/sh", nil, "-c", `i=0; while [ $i -lt 5000 ]; do echo '{"msg":"noise"}' >&2; i=$((i+1)); done; echo '{"msg":"marker","n":1}' >&2`)
	if err := p.Wait(t); err != nil {
		t.Fatal(err)
	}
	if m := p.Await(t, "marker", "n", "1"); m["msg"] != "marker" {
		t.Fatalf("Await = %v", m)
	}
	if n := len(p.Records()); n != 5001 {
		t.Errorf("%d records", n)
	}
}
