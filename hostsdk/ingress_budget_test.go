package hostsdk_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// The bodies of native messages read before their signature is checked
// hold at most hostsdk.MaxIngressReadBytes together: anyone who can reach
// the listener can send them. A message declared larger than a message can
// be is refused unread; senders beyond the budget wait (counted in
// aip_host_ingress_reads_waiting) instead of growing the host's memory; the
// dispatcher's messages go through once the budget frees.
func TestIngressReadsAreBounded(t *testing.T) {
	f := newFleet(t)
	_, target := f.start(t, newTestConnector())
	u, err := url.Parse(target.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	post := func(c net.Conn, length int) {
		t.Helper()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", u.Path, u.Host, length)
	}
	metric := func() float64 {
		t.Helper()
		resp, err := http.Get(strings.TrimSuffix(target.Endpoint, aip.MessagesPath) + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, hostsdk.MetricIngressWaiting+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		t.Fatalf("no %s in /metrics", hostsdk.MetricIngressWaiting)
		return 0
	}

	// Declared larger than a message: refused before anything is read.
	big := dial()
	post(big, aip.MaxMessageBytes+1)
	big.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(big), nil)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body declared over %d bytes: %v, %v; want 413", aip.MaxMessageBytes, resp, err)
	}

	// Slow senders of whole-size messages fill the budget; the next waits.
	slots := hostsdk.MaxIngressReadBytes / aip.MaxMessageBytes
	var slow []net.Conn
	for range slots + 1 {
		c := dial()
		post(c, aip.MaxMessageBytes)
		slow = append(slow, c)
	}
	deadline := time.Now().Add(30 * time.Second)
	for metric() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s is %v with %d slow senders of %d-byte messages and a %d-byte budget; want 1 waiting",
				hostsdk.MetricIngressWaiting, metric(), slots+1, aip.MaxMessageBytes, hostsdk.MaxIngressReadBytes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Once they go away, the dispatcher's action is read and runs.
	for _, c := range slow {
		c.Close()
	}
	r, err := f.d.Act(ctxT(t), target, action(capEcho, `{"message":"after"}`))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("action after the slow senders left: %+v, %v", res, err)
	}
	if v := metric(); v != 0 {
		t.Fatalf("%s is %v after the slow senders left", hostsdk.MetricIngressWaiting, v)
	}
}
