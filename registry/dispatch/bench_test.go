package dispatch_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// BenchmarkDispatch measures the dispatcher's API in one process: the
// in-memory registry, three real hostsdk replicas of the counting
// connector and 32 parallel clients, each action a fresh ID (token check,
// admission, resolve, signed hop, verification, settle). With -cpuprofile
// it shows where the dispatcher and the host spend their CPU.
func BenchmarkDispatch(b *testing.B) {
	w := newWorld(b, worldOptions{})
	for range 3 {
		w.startHost(64, 64)
	}
	tok := "Bearer " + w.token(tenant)
	b.SetParallelism(16) // 32 clients on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body, _ := json.Marshal(dispatch.ActionRequest{ActionID: aip.NewActionID(), CapabilityID: capSay, Input: say("bench", "")})
			req, _ := http.NewRequest(http.MethodPost, w.srv.URL+dispatch.PathActions, bytes.NewReader(body))
			req.Header.Set("Authorization", tok)
			resp, err := w.api.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}
