// Package readbudget bounds the memory that request bodies take while they
// are read into memory before they can be authenticated: an ingress that
// must read a whole body to check its signature is open to anyone who can
// reach its port, so the bodies being read hold at most an overall budget
// of bytes together, and one peer at most a share of it. (The dispatcher's
// action entry point, which authenticates first, uses it too: there the
// bodies are read before admission control counts them.)
//
// A request reserves its size (its Content-Length, or the largest body the
// ingress accepts) in two steps, each first come, first served:
//
//  1. its peer's share: while the peer's requests hold Config.PeerShare
//     bytes (reserved for reads in progress, or waiting for step 2), the
//     request waits for that peer's own reads to finish, at most
//     Config.MaxPeerWait when that is set (then ErrPeerBusy), and never for
//     other peers;
//  2. the overall budget (Config.Total), as before there were shares: it
//     waits while the bodies being read, of every peer, fill it.
//
// So a sender that opens many connections and trickles its bodies (or
// declares large ones) holds at most its share, and other peers' requests
// keep being read while it does; with the default share of a quarter, it
// takes at least four such senders, at four addresses, to fill the budget.
// Against many addresses the budget still bounds memory, and the operator
// guide's answer stands: firewall the port to the legitimate senders.
//
// A peer is a remote IP address; IPv6 addresses are grouped by their /64
// prefix (PeerOf). AcquireFor takes a peer the caller names instead (an
// ingress that authenticates before it reads, such as the dispatcher's
// action entry point, keys by the authenticated tenant). Behind a proxy or a NAT every sender is the proxy's
// peer. The budget keeps an entry only for a peer that holds or waits for
// part of it, so its map grows with the requests in progress, never with
// the addresses seen over time.
//
// SetReadDeadline gives a body whose reservation was granted a minimum
// transfer rate: a sender slower than Config.MinReadRate (after a grace of
// Config.ReadGrace) holds its bytes until that deadline, not until the
// server's ReadTimeout.
package readbudget

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Defaults of Config.
const (
	// DefaultPeerShareDivisor makes a peer's share a quarter of the budget
	// when Config.PeerShare is zero: large enough for several of the
	// largest bodies at once (an ingress of 4 MiB messages and a 64 MiB
	// budget lets one peer read four at once, which a legitimate sender,
	// whose bodies are read in milliseconds, rarely needs), small enough
	// that one peer leaves three quarters to the others.
	DefaultPeerShareDivisor = 4
	// DefaultMinReadRate is the slowest transfer, in bytes per second, a
	// body may arrive at once its reservation is granted (2 Mbit/s):
	// a 4 MiB body has DefaultReadGrace + 16 s, a 4 KiB one
	// DefaultReadGrace, where the server's ReadTimeout would give either a
	// minute.
	DefaultMinReadRate = 256 << 10
	// DefaultReadGrace is the time a body is given besides its size at the
	// minimum rate: connection setup, a congested moment, a slow start.
	DefaultReadGrace = 5 * time.Second
)

// IPv6PeerBits is the prefix length by which IPv6 peers are grouped. A
// host or end site is given at least a /64 (SLAAC needs one; privacy
// addresses rotate within it), so one sender controls every address of
// its /64 and keying by the full address would let it open a fresh peer per
// connection; a shorter prefix (/56, /48) would lump separate customers of
// many providers together. IPv4 peers (and IPv4-mapped IPv6 addresses)
// are keyed by the whole address.
const IPv6PeerBits = 64

var (
	// ErrPeerBusy reports a request that waited Config.MaxPeerWait for its
	// peer's share: the peer's other reads still hold it.
	ErrPeerBusy = errors.New("readbudget: the peer's share of the read budget is held by its other requests")
	// ErrTooLarge reports a request larger than a peer's share; the
	// ingress should have refused it by its size limit first.
	ErrTooLarge = errors.New("readbudget: the request is larger than a peer's share of the read budget")
)

// Config configures a Budget.
type Config struct {
	// Total bounds the bytes reserved by all requests together. Required.
	Total int64
	// PeerShare bounds the bytes one peer's requests reserve together.
	// Defaults to Total / DefaultPeerShareDivisor; at most Total.
	PeerShare int64
	// MaxPeerWait bounds how long a request waits for its peer's share;
	// past it, Acquire returns ErrPeerBusy. Zero waits as long as the
	// request's context lives. The wait for the overall budget is bounded
	// by the context only.
	MaxPeerWait time.Duration
	// MinReadRate is the slowest rate, in bytes per second, that
	// SetReadDeadline allows. Defaults to DefaultMinReadRate.
	MinReadRate int64
	// ReadGrace is the time SetReadDeadline allows besides the body's
	// size at MinReadRate. Defaults to DefaultReadGrace.
	ReadGrace time.Duration
}

// Budget is a byte budget with a share per peer. It is safe for
// concurrent use.
type Budget struct {
	cfg Config

	mu   sync.Mutex
	free int64
	// queue holds the requests that have their peer's share and wait for
	// the overall budget, in arrival order.
	queue list.List
	peers map[string]*peer
	// waitingShare counts the requests waiting for their peer's share.
	waitingShare int
}

// peer is one peer's part of the budget.
type peer struct {
	// held is the share its requests reserved: those being read and those
	// waiting for the overall budget.
	held int64
	// queue holds its requests waiting for its share, in arrival order.
	queue list.List
}

// waiter is a request waiting in a queue; ready is closed when its bytes
// were reserved for it.
type waiter struct {
	n     int64
	ready chan struct{}
}

// New returns an empty budget.
func New(cfg Config) (*Budget, error) {
	if cfg.Total <= 0 {
		return nil, fmt.Errorf("readbudget: Total is %d; give the budget a positive number of bytes", cfg.Total)
	}
	if cfg.PeerShare == 0 {
		cfg.PeerShare = cfg.Total / DefaultPeerShareDivisor
	}
	if cfg.PeerShare <= 0 || cfg.PeerShare > cfg.Total {
		return nil, fmt.Errorf("readbudget: PeerShare is %d; it must be positive and at most Total (%d)", cfg.PeerShare, cfg.Total)
	}
	if cfg.MaxPeerWait < 0 {
		return nil, fmt.Errorf("readbudget: MaxPeerWait is %s; it must not be negative", cfg.MaxPeerWait)
	}
	if cfg.MinReadRate == 0 {
		cfg.MinReadRate = DefaultMinReadRate
	}
	if cfg.ReadGrace == 0 {
		cfg.ReadGrace = DefaultReadGrace
	}
	if cfg.MinReadRate < 0 || cfg.ReadGrace < 0 {
		return nil, fmt.Errorf("readbudget: MinReadRate (%d) and ReadGrace (%s) must not be negative", cfg.MinReadRate, cfg.ReadGrace)
	}
	return &Budget{cfg: cfg, free: cfg.Total, peers: make(map[string]*peer)}, nil
}

// PeerShare is the share of one peer.
func (b *Budget) PeerShare() int64 { return b.cfg.PeerShare }

// MinReadRate is the slowest rate, in bytes per second, SetReadDeadline
// allows (Config.MinReadRate).
func (b *Budget) MinReadRate() int64 { return b.cfg.MinReadRate }

// ReadGrace is the time SetReadDeadline allows besides a body's size at
// MinReadRate (Config.ReadGrace).
func (b *Budget) ReadGrace() time.Duration { return b.cfg.ReadGrace }

// PeerOf is the peer of a request's remote address (http.Request's
// RemoteAddr: "ip:port", or a bare IP): the IPv4 address, or the IPv6
// address's /64 (IPv6PeerBits). Addresses that are not IP addresses (a Unix
// socket's) are all one peer, the zero Prefix.
func PeerOf(remoteAddr string) netip.Prefix {
	var addr netip.Addr
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		addr = ap.Addr()
	} else if a, err := netip.ParseAddr(remoteAddr); err == nil {
		addr = a
	} else {
		return netip.Prefix{}
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return netip.PrefixFrom(addr, 32)
	}
	p, _ := addr.Prefix(IPv6PeerBits)
	return p
}

// Acquire reserves n bytes for a request from remoteAddr (see PeerOf),
// waiting first for room in its peer's share, then in the overall budget.
// It returns a release func, which gives the bytes back (calling it again
// does nothing), or an error and reserves nothing: ErrTooLarge when n is
// larger than a peer's share, ErrPeerBusy when the request waited
// Config.MaxPeerWait for its share, the context's error when it ended
// first. A request of 0 bytes reserves nothing.
func (b *Budget) Acquire(ctx context.Context, remoteAddr string, n int64) (release func(), err error) {
	return b.AcquireFor(ctx, "addr:"+PeerOf(remoteAddr).String(), n)
}

// AcquireFor is Acquire for a peer the caller names: requests with the
// same key share one peer's share (the dispatcher keys action bodies by
// their authenticated tenant). Keys Acquire makes begin "addr:"; a
// budget should be keyed one way only.
func (b *Budget) AcquireFor(ctx context.Context, key string, n int64) (release func(), err error) {
	switch {
	case n < 0:
		return nil, fmt.Errorf("readbudget: cannot reserve %d bytes", n)
	case n == 0:
		return func() {}, nil
	case n > b.cfg.PeerShare:
		return nil, fmt.Errorf("%w: %d bytes, a share is %d", ErrTooLarge, n, b.cfg.PeerShare)
	}
	b.mu.Lock()
	p := b.peers[key]
	if p == nil {
		p = &peer{}
		b.peers[key] = p
	}
	// Step 1: the peer's share.
	if p.queue.Len() == 0 && p.held+n <= b.cfg.PeerShare {
		p.held += n
		b.mu.Unlock()
	} else {
		w := &waiter{n: n, ready: make(chan struct{})}
		elem := p.queue.PushBack(w)
		b.waitingShare++
		b.mu.Unlock()
		var timeout <-chan time.Time
		if b.cfg.MaxPeerWait > 0 {
			t := time.NewTimer(b.cfg.MaxPeerWait)
			defer t.Stop()
			timeout = t.C
		}
		var cause error
		select {
		case <-w.ready:
		case <-ctx.Done():
			cause = ctx.Err()
		case <-timeout:
			cause = fmt.Errorf("%w: it holds %d bytes, waited %s", ErrPeerBusy, b.cfg.PeerShare, b.cfg.MaxPeerWait)
		}
		if cause != nil {
			b.mu.Lock()
			select {
			case <-w.ready:
				// Granted as it gave up: give the share back.
				p.held -= n
			default:
				p.queue.Remove(elem)
				b.waitingShare--
			}
			// Either way the requests behind it may fit now.
			b.grantShares(p)
			b.forget(key, p)
			b.mu.Unlock()
			return nil, cause
		}
	}
	// Step 2: the overall budget.
	b.mu.Lock()
	if b.queue.Len() == 0 && b.free >= n {
		b.free -= n
		b.mu.Unlock()
		return b.releaser(key, p, n), nil
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	elem := b.queue.PushBack(w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return b.releaser(key, p, n), nil
	case <-ctx.Done():
		b.mu.Lock()
		select {
		case <-w.ready:
			b.free += n
		default:
			b.queue.Remove(elem)
		}
		b.grantOverall()
		p.held -= n
		b.grantShares(p)
		b.forget(key, p)
		b.mu.Unlock()
		return nil, ctx.Err()
	}
}

// releaser gives back n bytes of the overall budget and of p's share.
func (b *Budget) releaser(key string, p *peer, n int64) func() {
	return sync.OnceFunc(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.free += n
		b.grantOverall()
		p.held -= n
		b.grantShares(p)
		b.forget(key, p)
	})
}

// grantOverall reserves the overall budget for the requests waiting for it
// while the first of them fits.
func (b *Budget) grantOverall() {
	for e := b.queue.Front(); e != nil; e = b.queue.Front() {
		w := e.Value.(*waiter)
		if w.n > b.free {
			return
		}
		b.free -= w.n
		b.queue.Remove(e)
		close(w.ready)
	}
}

// grantShares reserves p's share for its requests waiting for it while the
// first of them fits.
func (b *Budget) grantShares(p *peer) {
	for e := p.queue.Front(); e != nil; e = p.queue.Front() {
		w := e.Value.(*waiter)
		if p.held+w.n > b.cfg.PeerShare {
			return
		}
		p.held += w.n
		p.queue.Remove(e)
		b.waitingShare--
		close(w.ready)
	}
}

// forget drops p's entry once it holds and waits for nothing.
func (b *Budget) forget(key string, p *peer) {
	if p.held == 0 && p.queue.Len() == 0 {
		delete(b.peers, key)
	}
}

// Stats is a snapshot of a budget.
type Stats struct {
	// Reserved is the bytes reserved by requests being read.
	Reserved int64
	// Peers is the number of peers that hold or wait for part of the
	// budget.
	Peers int
	// WaitingShare counts the requests waiting for their peer's share (a
	// peer at its share); WaitingBudget those waiting for the overall
	// budget (the budget is spent).
	WaitingShare, WaitingBudget int
}

// Stats returns a snapshot of the budget.
func (b *Budget) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return Stats{
		Reserved:      b.cfg.Total - b.free,
		Peers:         len(b.peers),
		WaitingShare:  b.waitingShare,
		WaitingBudget: b.queue.Len(),
	}
}

// ReadDeadline is the time by which a body of n bytes whose reading starts
// at start must have arrived: Config.ReadGrace plus n bytes at
// Config.MinReadRate.
func (b *Budget) ReadDeadline(start time.Time, n int64) time.Time {
	return start.Add(b.cfg.ReadGrace + time.Duration(float64(n)/float64(b.cfg.MinReadRate)*float64(time.Second)))
}

// SetReadDeadline sets the read deadline of r's connection (r being
// served on w) to ReadDeadline(now, n), so a body of n bytes that arrives
// slower than the minimum rate fails to read and gives its reservation
// back. Call it after Acquire, before reading the body: the deadline
// replaces the server's ReadTimeout for the rest of the body, so the time
// spent waiting for the budget does not count against the sender, and the
// time it holds the budget is bounded. A request without a body is left
// alone (net/http is already watching its connection for the next
// request). It returns http.ErrNotSupported when the connection has no read
// deadline (the server's ReadTimeout then still bounds the read).
func (b *Budget) SetReadDeadline(w http.ResponseWriter, r *http.Request, n int64) error {
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	return http.NewResponseController(w).SetReadDeadline(b.ReadDeadline(time.Now(), n))
}
