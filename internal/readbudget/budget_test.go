package readbudget

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	peerA = "192.0.2.1:40000"
	peerB = "192.0.2.2:40000"
)

func newBudget(t *testing.T, cfg Config) *Budget {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustAcquire(t *testing.T, b *Budget, addr string, n int64) func() {
	t.Helper()
	release, err := b.Acquire(t.Context(), addr, n)
	if err != nil {
		t.Fatalf("Acquire(%s, %d): %v", addr, n, err)
	}
	return release
}

// acquireAsync starts Acquire in a goroutine; its result arrives on the
// returned channel.
type result struct {
	release func()
	err     error
}

func acquireAsync(ctx context.Context, b *Budget, addr string, n int64) <-chan result {
	ch := make(chan result, 1)
	go func() {
		release, err := b.Acquire(ctx, addr, n)
		ch <- result{release, err}
	}()
	return ch
}

func checkStats(t *testing.T, b *Budget, want Stats) {
	t.Helper()
	if diff := cmp.Diff(want, b.Stats()); diff != "" {
		t.Fatalf("Stats (-want +got):\n%s", diff)
	}
}

func pending(ch <-chan result) bool {
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// A peer at its share waits for its own reads only; another peer's
// requests are granted meanwhile, and another peer's release does not let
// the waiting one in.
func TestPeerAtShareWaitsForItsOwnReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBudget(t, Config{Total: 64})
		if b.PeerShare() != 16 {
			t.Fatalf("PeerShare = %d, want 16 (a quarter)", b.PeerShare())
		}
		var held []func()
		for range 4 {
			held = append(held, mustAcquire(t, b, peerA, 4))
		}
		over := acquireAsync(t.Context(), b, peerA, 4)
		synctest.Wait()
		if !pending(over) {
			t.Fatal("peer A's request over its share was granted")
		}
		checkStats(t, b, Stats{Reserved: 16, Peers: 1, WaitingShare: 1})

		// Peer B is served at once, up to its own share.
		var heldB []func()
		for range 4 {
			heldB = append(heldB, mustAcquire(t, b, peerB, 4))
		}
		checkStats(t, b, Stats{Reserved: 32, Peers: 2, WaitingShare: 1})
		// B's reads finishing does not help A.
		for _, r := range heldB {
			r()
		}
		synctest.Wait()
		if !pending(over) {
			t.Fatal("peer B's release granted peer A's request over its share")
		}
		// A's own read finishing does.
		held[0]()
		held[0]() // a second release does nothing
		synctest.Wait()
		got := <-over
		if got.err != nil {
			t.Fatal(got.err)
		}
		checkStats(t, b, Stats{Reserved: 16, Peers: 1})
		got.release()
		for _, r := range held[1:] {
			r()
		}
		checkStats(t, b, Stats{})
	})
}

// With MaxPeerWait, a request over its peer's share is refused with
// ErrPeerBusy once it waited that long; it reserves nothing and the peer's
// entry goes once its reads finish.
func TestPeerBusyAfterMaxPeerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBudget(t, Config{Total: 64, MaxPeerWait: time.Second})
		release := mustAcquire(t, b, peerA, 16)
		start := time.Now()
		over := acquireAsync(t.Context(), b, peerA, 1)
		synctest.Wait()
		checkStats(t, b, Stats{Reserved: 16, Peers: 1, WaitingShare: 1})
		got := <-over
		if !errors.Is(got.err, ErrPeerBusy) {
			t.Fatalf("Acquire over the share: %v, want ErrPeerBusy", got.err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Fatalf("refused after %s, want MaxPeerWait (1s)", waited)
		}
		checkStats(t, b, Stats{Reserved: 16, Peers: 1})
		release()
		checkStats(t, b, Stats{})
	})
}

// A request that gives up while it waits reserves nothing, and the
// requests queued behind it are served when they fit.
func TestCancelledWaitersReserveNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBudget(t, Config{Total: 8, PeerShare: 8})
		release := mustAcquire(t, b, peerA, 4)
		ctx, cancel := context.WithCancel(t.Context())
		big := acquireAsync(ctx, b, peerA, 8) // waits for the share
		synctest.Wait()
		small := acquireAsync(t.Context(), b, peerA, 4) // queued behind big
		synctest.Wait()
		checkStats(t, b, Stats{Reserved: 4, Peers: 1, WaitingShare: 2})
		cancel()
		if got := <-big; !errors.Is(got.err, context.Canceled) {
			t.Fatalf("cancelled Acquire: %v", got.err)
		}
		got := <-small
		if got.err != nil {
			t.Fatal(got.err)
		}
		checkStats(t, b, Stats{Reserved: 8, Peers: 1})

		// Waiting for the overall budget, then giving up.
		b2 := newBudget(t, Config{Total: 8, PeerShare: 8})
		r2 := mustAcquire(t, b2, peerB, 8)
		ctx2, cancel2 := context.WithCancel(t.Context())
		w := acquireAsync(ctx2, b2, peerA, 4)
		synctest.Wait()
		checkStats(t, b2, Stats{Reserved: 8, Peers: 2, WaitingBudget: 1})
		cancel2()
		if got := <-w; !errors.Is(got.err, context.Canceled) {
			t.Fatalf("cancelled Acquire: %v", got.err)
		}
		checkStats(t, b2, Stats{Reserved: 8, Peers: 1})
		r2()
		release()
		got.release()
		checkStats(t, b, Stats{})
		checkStats(t, b2, Stats{})
	})
}

// Across many peers, each within its share, the overall budget still
// holds: the requests beyond it wait for it, first come first served, and
// every peer's entry goes once its reads finish.
func TestOverallBudgetHoldsAcrossPeers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBudget(t, Config{Total: 64})
		var held []func()
		var waiting []<-chan result
		for i := range 8 {
			addr := fmt.Sprintf("198.51.100.%d:1", i+1)
			if i < 4 {
				held = append(held, mustAcquire(t, b, addr, 16))
				continue
			}
			waiting = append(waiting, acquireAsync(t.Context(), b, addr, 16))
			synctest.Wait()
		}
		checkStats(t, b, Stats{Reserved: 64, Peers: 8, WaitingBudget: 4})
		for i, r := range held {
			r()
			synctest.Wait()
			// The longest-waiting request is served first.
			got := <-waiting[i]
			if got.err != nil {
				t.Fatal(got.err)
			}
			for _, w := range waiting[i+1:] {
				if !pending(w) {
					t.Fatalf("after %d releases a later request was served", i+1)
				}
			}
			if s := b.Stats(); s.Reserved != 64 {
				t.Fatalf("Reserved = %d, want 64", s.Reserved)
			}
			held[i] = got.release
		}
		for _, r := range held {
			r()
		}
		checkStats(t, b, Stats{})
	})
}

// The peer map holds only peers that hold or wait for part of the budget:
// after many distinct addresses come and go it is empty.
func TestPeerMapEmptiesAfterReads(t *testing.T) {
	b := newBudget(t, Config{Total: 1 << 20})
	for i := range 1000 {
		addr := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}).String() + ":443"
		mustAcquire(t, b, addr, 100)()
	}
	checkStats(t, b, Stats{})
}

func TestAcquireRefusesWhatCannotFit(t *testing.T) {
	b := newBudget(t, Config{Total: 64})
	if _, err := b.Acquire(t.Context(), peerA, 17); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Acquire over a share: %v, want ErrTooLarge", err)
	}
	if _, err := b.Acquire(t.Context(), peerA, -1); err == nil {
		t.Fatal("Acquire(-1) succeeded")
	}
	mustAcquire(t, b, peerA, 0)()
	checkStats(t, b, Stats{})
}

func TestNewValidates(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Total: -1},
		{Total: 10, PeerShare: 11},
		{Total: 10, PeerShare: -1},
		{Total: 3}, // a quarter of 3 bytes is nothing
		{Total: 10, MaxPeerWait: -time.Second},
		{Total: 10, MinReadRate: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestPeerOf(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"192.0.2.1:5000", "192.0.2.1/32"},
		{"192.0.2.1", "192.0.2.1/32"},
		{"[::ffff:192.0.2.1]:5000", "192.0.2.1/32"},
		{"[2001:db8:1:2:3:4:5:6]:5000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:443", "2001:db8:1:3::/64"},
		{"[fe80::1%eth0]:443", "fe80::/64"},
		{"::1", "::/64"},
	} {
		if got := PeerOf(tc.addr).String(); got != tc.want {
			t.Errorf("PeerOf(%q) = %s, want %s", tc.addr, got, tc.want)
		}
	}
	for _, addr := range []string{"", "@", "/run/aip.sock", "example.com:80"} {
		if got := PeerOf(addr); got != (netip.Prefix{}) {
			t.Errorf("PeerOf(%q) = %s, want the zero Prefix", addr, got)
		}
	}
}

// SetReadDeadline cuts off a body slower than the minimum rate (the server
// here has no ReadTimeout at all), and a body read in time leaves the
// request's context alone after the deadline passes.
func TestSetReadDeadline(t *testing.T) {
	const grace = 100 * time.Millisecond
	b := newBudget(t, Config{Total: 1 << 20, MinReadRate: 1 << 30, ReadGrace: grace})
	handled := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := b.SetReadDeadline(w, r, r.ContentLength); err != nil {
			handled <- err
			return
		}
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			handled <- err
			return
		}
		// The body was read: the deadline no longer applies to the
		// connection, and the request lives on past it.
		select {
		case <-r.Context().Done():
			handled <- fmt.Errorf("the request's context ended after its body was read: %w", context.Cause(r.Context()))
		case <-time.After(3 * grace):
			handled <- nil
		}
	}))
	t.Cleanup(srv.Close)

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	// A trickler: one byte of a 1000-byte body, then nothing.
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("stalled body: status %d, want 400", resp.StatusCode)
	}
	var ne net.Error
	if err := <-handled; !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("reading the stalled body: %v, want a timeout", err)
	}

	// A body sent at once, on a fresh connection.
	resp, err = http.Post(srv.URL, "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := <-handled; err != nil {
		t.Fatal(err)
	}
}

// AcquireFor keys by the caller's own peer name: requests with one key
// share a share, another key has its own, and the overall budget holds
// across both.
func TestAcquireForKeysByName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBudget(t, Config{Total: 32, PeerShare: 16, MaxPeerWait: time.Second})
		acme, err := b.AcquireFor(t.Context(), "tenant:acme", 16)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.AcquireFor(t.Context(), "tenant:acme", 1); !errors.Is(err, ErrPeerBusy) {
			t.Fatalf("a second request of a key at its share: %v, want ErrPeerBusy", err)
		}
		globex, err := b.AcquireFor(t.Context(), "tenant:globex", 16)
		if err != nil {
			t.Fatalf("another key's request: %v", err)
		}
		checkStats(t, b, Stats{Reserved: 32, Peers: 2})
		third := make(chan error, 1)
		go func() {
			release, err := b.AcquireFor(t.Context(), "tenant:initech", 8)
			if err == nil {
				release()
			}
			third <- err
		}()
		synctest.Wait()
		checkStats(t, b, Stats{Reserved: 32, Peers: 3, WaitingBudget: 1})
		acme()
		if err := <-third; err != nil {
			t.Fatalf("a third key waiting for the overall budget: %v", err)
		}
		globex()
		checkStats(t, b, Stats{})
	})
}
