package hostsdk

import (
	"context"
	"errors"
	"net/http"
)

// The early ingress: the native ingress served from recovery to the
// registration.
//
// The listener is bound at step 5; the host registers at step 8 and serves
// at step 10. Between them the registration can wait a long time: a
// replica killed (kill -9, an OOM kill) and started again at once is
// refused as lease_live until the lease of its previous run expires (up to
// the lease TTL), and a control plane that does not answer is waited for
// (Config.RegisterWait). Meanwhile the registry still routes new actions
// to the replica under that previous lease, and the kernel accepts their
// connections: without an answer, an action waits until the host serves
// (and runs here then) or its timeout ends (dispatch.timeout, pinned),
// where a signed refusal would have let the dispatcher move it to a
// healthy replica (docs/routing.md, "The provably-not-started reroute").
//
// So, once recovery (step 6) has settled the journal, the host serves the
// native ingress (POST /aip/v1/messages) with the same exchange code as
// when ready, except that it runs no action until step 10 (serving):
//
//   - an action the journal holds is answered from its record (its result,
//     outcome_unknown, an idempotency conflict), as on any delivery;
//   - an action routed before the journal's prune horizon, or before the
//     journal served the replica (its route's replica health revision below
//     the journal's origin: origin.go), is refused with the signed 410
//     action_expired, as when ready;
//   - any other action is refused with the signed 503 not_ready, its message
//     ID claimed first (refuseUnstarted), which the dispatcher may present
//     to move the action elsewhere;
//   - a journal read or claim that fails is storage_unavailable, which the
//     dispatcher settles as uncertain;
//   - a cancel and a status query are answered from the journal as when
//     ready (no action runs, so a cancel finds none running).
//
// Why the not_ready refusal is true here: it says that the action did not
// start on this replica and that the refused envelope never runs here. The
// second holds because the message ID is claimed in the durable replay
// registry before the answer, and every later delivery of the envelope,
// early or once the host serves, is refused as a replay. The first needs
// the journal to hold every action this replica ID ever started under the
// route's lineage: the host journals an action (AcceptAction, durable)
// before the connector runs it, and one journal serves a replica ID at a
// time (sqliteruntime's lock, pgruntime's advisory lock), so the previous
// run of this process on this journal cannot be writing to it; recovery
// has settled what that run left received or running, so none of its
// records reads as in progress. What the journal does not prove is an
// action routed while another journal served the replica ID (a lost state
// directory): the origin rule refuses those with action_expired, as it
// does once the host serves. A journal whose origin is still pending has
// never served this replica ID (a new journal, or one opened under another
// replica ID): every route the registry can send now was assigned before
// it, so the journal proves nothing about any of them, and a not_ready
// would be false; the truthful answer, action_expired, is the one the
// host gives once it serves (its registration fixes an origin above every
// such route). The host does not serve such a journal early, and keeps
// their connections waiting as before: answering action_expired at once
// would release the action's reservation while the registry goes on
// routing new actions to this replica under the previous lease, each of
// them lost at once too, and an unsigned 503 would be settled
// outcome_unknown, telling the client that an action the host knows it
// will not run may have run, for no action saved.
//
// The dispatcher's side of the argument is unchanged: a refusal moves an
// action only when its route was handed out exactly once, so the refused
// envelope is the only one under its fence.
//
// The server itself starts after recovery whatever the journal: /health
// answers from then on (the process is alive: a liveness probe with a
// short timeout must not kill a replica that is only waiting out its
// previous lease, up to the lease TTL, or for a control plane that does
// not answer, up to Config.RegisterWait), and /ready answers 503
// not_ready until the host serves (the lease is granted at step 8, but no
// action runs before step 10). Every other route (/metrics, the manifest,
// the JWKS, product routes and paths that match none), and the native
// ingress when the journal has not served this replica ID, waits until
// the host serves at step 10, as its connection waited in the listener's
// queue before: a product webhook must not run before the host serves.
// When the start fails instead, their connections are closed without an
// answer.

// serveEarly starts serving the listener after recovery: /health and
// /ready, and the native ingress when the journal has served this replica
// ID (its origin is known); see above.
func (h *Host) serveEarly() {
	h.startServer()
	if origin := h.origin.Load(); origin == originPending {
		h.log.Info("the native ingress is served once the replica has registered: this journal has not served this replica ID yet, so it cannot tell which actions routed to it before did not start here")
		return
	}
	h.earlyIngress.Store(true)
	h.log.Info("serving the native ingress before registering: until the host serves, new actions are refused with a signed not_ready and journaled ones answered from the journal",
		"addr", h.listener.Addr().String(), "origin_revision", h.origin.Load())
}

// startServer serves the listener on a goroutine of its own (serveDone);
// a server that fails is reported on h.fatal.
func (h *Host) startServer() {
	h.serveDone = make(chan struct{})
	go func() {
		defer close(h.serveDone)
		if err := h.server.Serve(h.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.serveErr = err
			select {
			case h.fatal <- err:
			default:
			}
		}
	}()
}

// endStart ends the early window: the requests held by untilServing go on
// when the host serves, or are dropped when the start failed.
func (h *Host) endStart() {
	h.startEndOnce.Do(func() { close(h.startEnded) })
}

// untilServing wraps the host's mux: before the host serves (step 10),
// only /health, /ready and, when the journal proves what it refuses
// (earlyIngress), the native ingress are handled; every other request
// waits for the host to serve, and is dropped (its connection closed, no
// answer) if the start fails.
func (h *Host) untilServing(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.serving.Load() || h.earlyRoute(r) {
			next.ServeHTTP(w, r)
			return
		}
		select {
		case <-h.startEnded:
		case <-r.Context().Done():
			return
		}
		if !h.serving.Load() {
			panic(http.ErrAbortHandler)
		}
		next.ServeHTTP(w, r)
	})
}

// earlyRoute reports whether r is answered before the host serves.
func (h *Host) earlyRoute(r *http.Request) bool {
	switch r.URL.Path {
	case PathHealth, PathReady:
		return r.Method == http.MethodGet || r.Method == http.MethodHead
	case PathMessages:
		return r.Method == http.MethodPost && h.earlyIngress.Load()
	}
	return false
}

// stopEarlyServer shuts down, after a failed start, the server serveEarly
// started: the held requests are dropped, the exchanges in progress
// awaited for at most ControlTimeout.
func (h *Host) stopEarlyServer() error {
	if h.serveDone == nil {
		return nil
	}
	h.endStart()
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.ControlTimeout)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- h.server.Shutdown(ctx) }()
	h.conns.closeUnused()
	err := <-shut
	if err != nil {
		h.server.Close()
	}
	<-h.serveDone
	return err
}
