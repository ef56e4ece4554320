package e2e

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// proxyMode is what a dbProxy does with connections.
type proxyMode int

const (
	// proxyUp forwards every connection to the server.
	proxyUp proxyMode = iota
	// proxyRefuse closes the listener: a new connection is refused
	// (ECONNREFUSED), as from a server host whose PostgreSQL is down.
	proxyRefuse
	// proxyBlackhole accepts new connections and never answers them, and
	// stops forwarding on the open ones without closing them, as across a
	// network partition that drops packets: nothing fails, it hangs.
	proxyBlackhole
)

func (m proxyMode) String() string {
	return [...]string{"up", "refused", "black-holed"}[m]
}

// dbProxy is a TCP proxy between one process and the PostgreSQL server,
// which the test can cut and restore. Each upstream connection's local
// port is kept, so the test can name the process's sessions in
// pg_stat_activity (client_port) and terminate them.
type dbProxy struct {
	t      testing.TB
	name   string
	target string // the server's host:port
	addr   string // the proxy's host:port

	mu       sync.Mutex
	mode     proxyMode
	ln       net.Listener // nil while refusing
	links    map[*proxyLink]struct{}
	accepted int // connections accepted, over the proxy's life
	wg       sync.WaitGroup
	closed   bool
}

// proxyLink is one proxied connection.
type proxyLink struct {
	client, server net.Conn // server is nil for a black-holed connection
	// gate is closed while the link forwards; a black-holed link's
	// copiers wait on a fresh gate (or a closed link) before each write.
	gate chan struct{}
}

// newDBProxy starts a proxy in front of the server dbURL names and
// returns it; rewrite gives the URL through it.
func newDBProxy(t testing.TB, name, dbURL string) *dbProxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("database URL: %v", err)
	}
	p := &dbProxy{t: t, name: name, target: u.Host, links: map[*proxyLink]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.ln, p.addr = ln, ln.Addr().String()
	p.wg.Go(func() { p.serve(ln) })
	t.Cleanup(p.close)
	return p
}

// rewrite returns dbURL with the proxy as its host.
func (p *dbProxy) rewrite(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		p.t.Fatalf("database URL: %v", err)
	}
	u.Host = p.addr
	return u.String()
}

func (p *dbProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // the listener closed (refuse, or the proxy closed)
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.accepted++
		l := &proxyLink{client: c, gate: make(chan struct{})}
		mode := p.mode
		p.links[l] = struct{}{}
		p.mu.Unlock()
		if mode == proxyBlackhole {
			p.wg.Go(func() { p.hold(l) })
			continue
		}
		close(l.gate)
		p.wg.Go(func() { p.link(l) })
	}
}

// hold keeps a connection accepted while black-holed: it reads and
// drops what the client sends until the link is closed.
func (p *dbProxy) hold(l *proxyLink) {
	_, _ = io.Copy(io.Discard, l.client)
	p.drop(l)
}

// link dials the server and copies both ways.
func (p *dbProxy) link(l *proxyLink) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(l)
		return
	}
	p.mu.Lock()
	if _, open := p.links[l]; !open {
		p.mu.Unlock()
		s.Close()
		return
	}
	l.server = s
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.copy(l, s, l.client) })
	wg.Go(func() { p.copy(l, l.client, s) })
	wg.Wait()
	p.drop(l)
}

// copy forwards src to dst, waiting at the link's gate while it is
// black-holed. The first failure closes the link.
func (p *dbProxy) copy(l *proxyLink, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := l.gate
			p.mu.Unlock()
			<-gate // closed while forwarding; while black-holed, until restored or cut
			if !p.linkOpen(l) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				p.drop(l)
				return
			}
		}
		if err != nil {
			p.drop(l)
			return
		}
	}
}

func (p *dbProxy) linkOpen(l *proxyLink) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, open := p.links[l]
	return open
}

// drop closes a link's connections and forgets it.
func (p *dbProxy) drop(l *proxyLink) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked(l)
}

func (p *dbProxy) dropLocked(l *proxyLink) {
	if _, open := p.links[l]; !open {
		return
	}
	delete(p.links, l)
	l.client.Close()
	if l.server != nil {
		l.server.Close()
	}
	select {
	case <-l.gate:
	default:
		close(l.gate) // release a copier waiting at a black-holed gate
	}
}

// cut closes every open connection and then refuses or black-holes new
// ones (mode proxyRefuse or proxyBlackhole).
func (p *dbProxy) cut(mode proxyMode) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		p.dropLocked(l)
	}
	p.setModeLocked(mode)
}

// freeze black-holes the open connections without closing them and
// black-holes new ones: every statement in flight, and every one sent
// later, waits for an answer that does not come.
func (p *dbProxy) freeze() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		select {
		case <-l.gate:
			l.gate = make(chan struct{})
		default:
		}
	}
	p.setModeLocked(proxyBlackhole)
}

// restore forwards new connections again. The connections black-holed
// or frozen before stay silent, as after a failover to a new server
// (or a partition the peers' TCP gave up on): the old sessions are gone
// without a word, and only a deadline ends a wait on them.
func (p *dbProxy) restore() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setModeLocked(proxyUp)
}

func (p *dbProxy) setModeLocked(mode proxyMode) {
	p.t.Helper()
	switch {
	case mode == proxyRefuse && p.ln != nil:
		p.ln.Close()
		p.ln = nil
	case mode != proxyRefuse && p.ln == nil:
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			p.t.Fatalf("proxy %s: listen again on %s: %v", p.name, p.addr, err)
		}
		p.ln = ln
		p.wg.Go(func() { p.serve(ln) })
	}
	p.mode = mode
}

// ports returns the local ports of the proxy's open server connections:
// the client_port of the process's sessions in pg_stat_activity.
func (p *dbProxy) ports() []int { return p.serverPorts(false) }

// livePorts is ports without the connections frozen (and never restored):
// the sessions the process can still reach. A frozen session is cut off
// from its client as by a partition; only the server's own timeouts
// (idle_in_transaction_session_timeout) end it.
func (p *dbProxy) livePorts() []int { return p.serverPorts(true) }

func (p *dbProxy) serverPorts(liveOnly bool) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for l := range p.links {
		if l.server == nil {
			continue
		}
		if liveOnly && !forwarding(l) {
			continue // frozen
		}
		out = append(out, l.server.LocalAddr().(*net.TCPAddr).Port)
	}
	return out
}

// acceptedCount returns how many connections the proxy accepted over its life.
func (p *dbProxy) acceptedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// held counts the connections accepted while black-holed that the
// process still keeps open: connection attempts waiting for a server that
// will never answer them.
func (p *dbProxy) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if l.server == nil {
			n++
		}
	}
	return n
}

// open counts the proxy's open connections.
func (p *dbProxy) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// liveOpen counts the open connections that forward (not frozen, not
// black-holed): the connections the process can still use.
func (p *dbProxy) liveOpen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if forwarding(l) {
			n++
		}
	}
	return n
}

// forwarding reports whether l forwards (its gate is open); p.mu is held.
func forwarding(l *proxyLink) bool {
	select {
	case <-l.gate:
		return true
	default:
		return false
	}
}

// terminate ends, with pg_terminate_backend, every session of the
// process behind the proxy whose state matches states (all sessions when
// none given; "active", "idle in transaction", ...), as a server restart
// or a failover does, and returns how many it ended.
func (p *dbProxy) terminate(ctx context.Context, pool *pgxpool.Pool, states ...string) (int, error) {
	ports := p.ports()
	if len(ports) == 0 {
		return 0, nil
	}
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND client_port = ANY($1) AND pid <> pg_backend_pid()
		AND ($2::text[] IS NULL OR state = ANY($2))) t`, ports, states).Scan(&n)
	return n, err
}

func (p *dbProxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for l := range p.links {
		p.dropLocked(l)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
