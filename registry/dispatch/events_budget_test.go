package dispatch_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// clientFrom is an HTTP client whose connections come from source, a
// loopback address: each source is its own peer of the read budget.
func clientFrom(source string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	return &http.Client{
		Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		Timeout:   30 * time.Second,
	}
}

// metric returns the value of the /metrics line that starts with series
// (a name and its labels).
func (w *eventWorld) metric(series string) string {
	w.t.Helper()
	resp, err := w.srv.Client().Get(w.srv.URL + dispatch.PathMetrics)
	must(w.t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	w.t.Fatalf("/metrics lacks %s", series)
	return ""
}

// rawAnswer is what a raw connection read: a 100 Continue (the dispatcher
// began reading the body) or the final answer.
type rawAnswer struct {
	continued bool
	resp      *http.Response
	body      []byte
	err       error
}

// trickleDelivery starts, from source, a delivery announcing the largest
// body (see trickle).
func (w *eventWorld) trickleDelivery(source string) (net.Conn, <-chan rawAnswer) {
	w.t.Helper()
	return trickle(w.t, w.srv.URL, source, aip.EventsPath, "", aip.MaxEventDeliveryBytes)
}

// readAnswers waits for the first answer of each trickled request and
// returns how many the server began to read (a 100 Continue); refused
// checks each of the others, a final answer.
func readAnswers(t testing.TB, answers []<-chan rawAnswer, refused func(a rawAnswer)) int {
	t.Helper()
	continued := 0
	for _, ch := range answers {
		switch a := <-ch; {
		case a.err != nil:
			t.Fatal(a.err)
		case a.continued:
			continued++
		default:
			refused(a)
		}
	}
	return continued
}

// trickle starts, from source (a loopback address; "" for any), a POST to
// path on the server at srvURL announcing a body of n bytes with Expect:
// 100-continue, with header (whole lines, each ending "\r\n") added; it
// sends one byte of the body once the server asks for it. The first
// answer arrives on the channel.
func trickle(t testing.TB, srvURL, source, path, header string, n int64) (net.Conn, <-chan rawAnswer) {
	t.Helper()
	u, err := url.Parse(srvURL)
	must(t, err)
	var d net.Dialer
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	c, err := d.Dial("tcp", u.Host)
	must(t, err)
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
		path, u.Host, header, n)
	ch := make(chan rawAnswer, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			ch <- rawAnswer{err: err}
			return
		}
		if resp.StatusCode == http.StatusContinue {
			c.Write([]byte("{"))
			ch <- rawAnswer{continued: true}
			return
		}
		body, err := io.ReadAll(resp.Body)
		ch <- rawAnswer{resp: resp, body: body, err: err}
	}()
	return c, ch
}

// TestConnectorEventSenderAtItsShare: one address that opens as many
// deliveries as the whole read budget admits, and trickles their bodies,
// is read only up to its share (a quarter); its deliveries over the share
// wait for its own reads, then are refused with a signed, retryable
// connector_event.capacity (counted as peer_capacity), and a host at
// another address has its delivery read and accepted meanwhile. Once the
// sender goes, the budget keeps no entry for it.
func TestConnectorEventSenderAtItsShare(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	slots := dispatch.DefaultMaxEventBodyBytes / aip.MaxEventDeliveryBytes
	share := slots / 4
	var conns []net.Conn
	var answers []<-chan rawAnswer
	for range slots {
		c, ch := w.trickleDelivery("127.0.0.2")
		conns, answers = append(conns, c), append(answers, ch)
	}
	continued := readAnswers(t, answers, func(a rawAnswer) {
		status, ans, hdr := w.verifyAnswer(a.resp, a.body)
		if status != http.StatusServiceUnavailable || ans.Body.Error == nil || ans.Body.Error.Error.Code != aip.CodeEventCapacity {
			t.Fatalf("a delivery over its address's share: HTTP %d %+v, want 503 %s", status, ans.Body.Error, aip.CodeEventCapacity)
		}
		pe := ans.Body.Error.Error
		if !pe.IsRetryable() || pe.RetryAfterMS == nil || *pe.RetryAfterMS != 1000 || hdr.Get("Retry-After") != "1" {
			t.Fatalf("peer-share refusal %+v (Retry-After %q): want retryable after 1 s", pe, hdr.Get("Retry-After"))
		}
	})
	if continued != share {
		t.Fatalf("%d of %d trickled deliveries from one address were read, want its share (%d)", continued, slots, share)
	}

	// A host at another address is read and accepted while the sender
	// holds its share.
	status, ans, _ := w.postVia(clientFrom("127.0.0.1"), w.delivery(event("k", `{"n":1}`)))
	if status != http.StatusOK {
		t.Fatalf("the host's delivery while another address holds its share: HTTP %d %+v", status, ans.Body.Error)
	}
	if got, want := w.metric(`aip_dispatch_events_received_total{result="peer_capacity"}`), fmt.Sprint(slots-share); got != want {
		t.Errorf("peer_capacity refusals: %s, want %s", got, want)
	}

	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for dispatch.EventBodyPeers(w.d) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the read budget keeps %d peers after their deliveries ended", dispatch.EventBodyPeers(w.d))
		}
		time.Sleep(10 * time.Millisecond) // polling: nothing to wait on from outside the handler
	}
	for _, reason := range []string{"budget", "peer_share"} {
		if v := w.metric(`aip_dispatch_event_deliveries_waiting{reason="` + reason + `"}`); v != "0" {
			t.Errorf("deliveries waiting (%s): %s, want 0", reason, v)
		}
	}
}

// TestConnectorEventSlowBodyIsCutOff: a delivery whose body arrives slower
// than the minimum rate is cut off after its grace (5 s for a small body),
// not after the server's ReadTimeout, and gives its reservation back.
func TestConnectorEventSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	w := newEventWorld(t, eventWorldOptions{})
	u, err := url.Parse(w.srv.URL)
	must(t, err)
	c, err := net.Dial("tcp", u.Host)
	must(t, err)
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", aip.EventsPath, u.Host)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body within 30 s: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Unsigned: nothing of the delivery was read, let alone authenticated.
	pe := w.unsignedRefusal(resp, body, http.StatusBadRequest, aip.CodeEventInvalid)
	// The refusal, to anyone who can reach the route (it needs no
	// token), says what happened, and names neither the dispatcher's
	// own address nor the connection's: the read error did (read tcp
	// <dispatcher>-><sender>: i/o timeout).
	msg := pe.Message
	if strings.Contains(msg, u.Host) || strings.Contains(msg, c.LocalAddr().String()) || !strings.Contains(msg, "did not arrive in time") {
		t.Errorf("the refusal of a stalled body says %q: want it to say the body did not arrive in time, without the connection's addresses", msg)
	}
	if n := dispatch.EventBodyPeers(w.d); n != 0 {
		t.Errorf("the read budget keeps %d peers after the stalled delivery was answered", n)
	}
}
