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
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// ingressProbe sends raw native requests to a host from chosen loopback
// source addresses (each its own peer) and reads its ingress metrics.
type ingressProbe struct {
	t       *testing.T
	host    *hostsdk.Host
	target  hostsdktest.Target
	addr    string // host:port of the listener
	path    string
	metrics string
}

func newIngressProbe(t *testing.T, f *fleet) *ingressProbe {
	t.Helper()
	h, target := f.start(t, newTestConnector())
	u, err := url.Parse(target.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return &ingressProbe{t: t, host: h, target: target, addr: u.Host, path: u.Path,
		metrics: strings.TrimSuffix(target.Endpoint, aip.MessagesPath) + "/metrics"}
}

// dial connects from source, a loopback address (127.0.0.1 is the test
// dispatcher's).
func (p *ingressProbe) dial(source string) net.Conn {
	p.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	c, err := d.Dial("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("dial from %s: %v", source, err)
	}
	p.t.Cleanup(func() { c.Close() })
	return c
}

// trickle starts a message of length bytes from source and sends its
// first byte only.
func (p *ingressProbe) trickle(source string, length int) net.Conn {
	p.t.Helper()
	c := p.dial(source)
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", p.path, p.addr, length)
	return c
}

// waiting reads aip_connector_host_ingress_reads_waiting by reason.
func (p *ingressProbe) waiting() map[string]float64 {
	p.t.Helper()
	resp, err := http.Get(p.metrics)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	got := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, hostsdk.MetricIngressWaiting+`{reason="`)
		if !ok {
			continue
		}
		reason, v, _ := strings.Cut(rest, `"} `)
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			p.t.Fatalf("metrics line %q: %v", line, err)
		}
		got[reason] = f
	}
	return got
}

// awaitWaiting waits until the messages waiting for the read budget are
// budget and peerShare, by reason. There is no event to wait for from
// outside the host: the metric is polled.
func (p *ingressProbe) awaitWaiting(budget, peerShare float64) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := p.waiting()
		if got["budget"] == budget && got["peer_share"] == peerShare {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s is %v; want budget %v, peer_share %v", hostsdk.MetricIngressWaiting, got, budget, peerShare)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitNoPeers waits until the read budget keeps no peer.
func (p *ingressProbe) awaitNoPeers() {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for hostsdk.IngressPeers(p.host) != 0 {
		if time.Now().After(deadline) {
			p.t.Fatalf("the ingress read budget still keeps %d peers after their reads ended", hostsdk.IngressPeers(p.host))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The bodies of native messages read before their signature is checked
// hold at most hostsdk.MaxIngressReadBytes together, from however many
// senders: anyone who can reach the listener can send them. A message
// declared larger than a message can be is refused unread; senders beyond
// the budget wait (counted in aip_connector_host_ingress_reads_waiting) instead of
// growing the host's memory; the dispatcher's messages go through once the
// budget frees.
func TestIngressReadsAreBounded(t *testing.T) {
	f := newFleet(t)
	p := newIngressProbe(t, f)

	// Declared larger than a message: refused before anything is read.
	big := p.trickle("127.0.0.2", aip.MaxMessageBytes+1)
	big.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(big), nil)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body declared over %d bytes: %v, %v; want 413", aip.MaxMessageBytes, resp, err)
	}

	// Slow senders of whole-size messages at five addresses, each within
	// its share, fill the budget; the messages beyond it wait for it.
	perPeer := hostsdk.MaxIngressReadBytesPerPeer / aip.MaxMessageBytes
	slots := hostsdk.MaxIngressReadBytes / aip.MaxMessageBytes
	peers := slots/perPeer + 1
	var slow []net.Conn
	for i := range peers {
		for range perPeer {
			slow = append(slow, p.trickle(fmt.Sprintf("127.0.0.%d", i+2), aip.MaxMessageBytes))
		}
	}
	p.awaitWaiting(float64(peers*perPeer-slots), 0)
	// One more from a sender at its share waits for that sender's reads.
	slow = append(slow, p.trickle("127.0.0.2", aip.MaxMessageBytes))
	p.awaitWaiting(float64(peers*perPeer-slots), 1)

	// Once they go away, the dispatcher's action is read and runs.
	for _, c := range slow {
		c.Close()
	}
	r, err := f.d.Act(ctxT(t), p.target, action(capEcho, `{"message":"after"}`))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("action after the slow senders left: %+v, %v", res, err)
	}
	p.awaitWaiting(0, 0)
	p.awaitNoPeers()
}

// One sender that opens as many connections as the whole budget admits
// and trickles their bodies holds only its share: the dispatcher's signed
// action, from another address, is read and served while the sender's
// messages over its share keep waiting for its own reads.
func TestIngressSenderAtItsShareDoesNotBlockTheDispatcher(t *testing.T) {
	f := newFleet(t)
	p := newIngressProbe(t, f)

	slots := hostsdk.MaxIngressReadBytes / aip.MaxMessageBytes
	perPeer := hostsdk.MaxIngressReadBytesPerPeer / aip.MaxMessageBytes
	var slow []net.Conn
	for range slots {
		slow = append(slow, p.trickle("127.0.0.2", aip.MaxMessageBytes))
	}
	p.awaitWaiting(0, float64(slots-perPeer))

	r, err := f.d.Act(ctxT(t), p.target, action(capEcho, `{"message":"through"}`))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("the dispatcher's action while a sender holds its share: %+v, %v", res, err)
	}
	// The dispatcher's read finishing did not let the sender's waiting
	// messages in.
	if got := p.waiting(); got["peer_share"] != float64(slots-perPeer) || got["budget"] != 0 {
		t.Fatalf("%s after the dispatcher's action: %v; want peer_share %d", hostsdk.MetricIngressWaiting, got, slots-perPeer)
	}

	for _, c := range slow {
		c.Close()
	}
	p.awaitWaiting(0, 0)
	p.awaitNoPeers()
}

// A body that arrives slower than the ingress's minimum rate is cut off
// after its grace (5 s for a small message), not after the server's 60 s
// ReadTimeout, and its reservation is given back.
func TestIngressSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	p := newIngressProbe(t, f)
	c := p.trickle("127.0.0.2", 100)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body within 30 s: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a stalled body: status %d, want 400", resp.StatusCode)
	}
	// The unsigned refusal, to anyone who can reach the listener, names
	// neither the replica's own address nor the connection's.
	if strings.Contains(string(body), p.addr) || strings.Contains(string(body), "127.0.0.2") {
		t.Errorf("the refusal of a stalled body quotes the connection's addresses: %s", body)
	}
	p.awaitNoPeers()
}
