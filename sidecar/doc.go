// Package sidecar gives a connector that is not written in Go — or any MCP
// server — the connector-host lifecycle of package hostsdk: bootstrap,
// durable journal, signed heartbeats, drain, recovery. There is one
// lifecycle implementation: the sidecar is a hostsdk.Connector that
// forwards to a local process, and a hostsdk.Host runs it.
//
// The binary is cmd/aip-sidecar; this package is its library.
//
// # The local connector contract
//
// Local forwards to a connector that serves five HTTP routes on a loopback
// port or a unix socket (docs/sidecar-protocol.md, with a JSON Schema per
// message in Schemas):
//
//	GET  /aip/manifest                 the connector's AIP manifest
//	GET  /aip/health                   200 {"status":"ok"} when it can serve
//	POST /aip/actions                  one action in, its result out (or NDJSON chunks, then the result)
//	POST /aip/actions/{id}/cancel      stop a running action
//	POST /aip/reconcile                optional: what became of an action after a crash
//
// Every action, cancel and reconcile carries the action ID and the
// idempotency key (in the body and in the AIP-Action-ID and
// AIP-Idempotency-Key headers). The host has already verified, journaled
// and schema-checked the action; the connector's answer is journaled with
// a receipt. Every capability of the manifest must carry a contract
// (aip.Manifest.Validate, which every host applies to the manifest it
// binds): its side effects decide what a cut-off action becomes.
// The mapping of answers:
//
//   - 200 with a result: completed, failed or cancelled as the connector
//     says; outcome_unknown when it cannot tell whether the provider effect
//     happened;
//   - 4xx, or 503: the connector refused the action before running it — a
//     failed result (its error object when it sent one);
//   - any other status, a malformed answer, a stream without a result
//     line, or a connection that breaks after the request was sent (the
//     connector crashed): outcome_unknown — the action is never run again
//     — except that a read-only capability's (hostsdk.ReadOnly) action cut
//     off by a crash (a stream without a result line, a broken
//     connection, no answer within CancelGrace) changed nothing and fails
//     connector_host.interrupted, retryable (hostsdk.Interrupted);
//   - no connection at all (the connector is down): a failed, retryable
//     sidecar.connector_unavailable — the action was not delivered.
//
// When an action's context ends (a cancel, its timeout, the host's
// shutdown) the connector is sent a cancel and has CancelGrace to answer
// before the exchange is abandoned as outcome_unknown (a read's as failed
// connector_host.interrupted). Responses are
// bounded (MaxResultBytes, MaxChunkBytes, MaxChunks) and decoded strictly.
//
// # Publishing events
//
// A local connector publishes provider events with POST /sidecar/events on
// the replica's listener (PathEvents): a batch on a declared channel, each
// event with a stable ID and occurred_at, answered 200 once
// hostsdk.EventPublisher.Publish stored it in the journal's outbox, 400
// when Publish refuses it as invalid, 503 with Retry-After when the
// replica does not take events now. The route takes its own bearer token
// (Config.EventsToken; generated per run with Exec and handed to the child
// in AIP_SIDECAR_EVENTS_TOKEN with AIP_SIDECAR_EVENTS_URL) from peers on
// this machine only, and is not mounted without a token or in MCP mode.
//
// # MCP
//
// MCP wraps an MCP server (a stdio command or a Streamable HTTP URL) with
// the official Go SDK: each tool becomes a capability (ID = prefix + tool
// name, the tool's input schema, side effects and retry safety from its
// readOnly/destructive/idempotent/openWorld hints), an action becomes a
// tools/call, progress notifications become stream chunks, a cancel becomes
// an MCP cancel (notifications/cancelled), and health is an MCP ping. The
// admitted manifest is immutable: a tools/list change after registration is
// reported (a log line and GET /sidecar/status) and never applied; with
// ManifestChangeUnready it also takes the replica offline. A broken session
// (it ended, or a ping or tools/call found it gone) is re-established with
// backoff while the replica reports unhealthy; with
// RestartUnresponsiveAfter, so is a hung one (that many pings in a row
// without an answer, not counting those while a tool call is in progress
// and within its deadline: a busy server may not answer): a stdio server
// is restarted, a URL server's session re-opened. A tool call the broken session cut off is outcome_unknown,
// except a read-only tool's, which had no effect: failed
// connector_host.interrupted, retryable (hostsdk.Interrupted; after a
// restart the host's recovery decides the same). A call of which nothing
// was written to a stdio server (its session had broken before the SDK
// got the call) did not run: it fails sidecar.connector_unavailable,
// retryable, as a call made while the session is down. A stdio server's
// answer longer than 16 MiB fails its call alone (hostsdk.UnusableResult),
// not the session (frameGuard), and so does a server's JSON-RPC error
// answer with a code the Go SDK reserves for a connection's end, -32003
// or -32004 (watchedConn.Read for a stdio server, closingCodeTransport
// for a Streamable HTTP one). The bridge has no user and no model: a
// tool's request for user input (elicitation) is answered cancel, and
// sampling is refused (MCP.callTool). A stdio server is started and reaped by
// the sidecar itself, like an --exec child: when it exits, what remains of its process group
// is stopped (SIGTERM, SIGKILL after StopTimeout, given up on a few
// seconds after SIGKILL) before it is restarted or counts as stopped. At
// the sidecar's shutdown a stdio server is stopped as MCP's stdio
// shutdown says: its input is closed first (a server that then exits on
// its own has stopped, with any exit status, logged when not 0, since
// several servers exit 1 when their input ends; a death by a signal the
// sidecar did not send, or an exit before the stop began, is a crash
// that makes the shutdown unclean), and only a server still running
// after half of StopTimeout gets SIGTERM (SIGKILL at StopTimeout); one
// that does not exit within a few
// seconds after SIGKILL (uninterruptible sleep) is given up on, as an
// --exec child is, so that a shutdown is never held by it.
//
// # Supervision and the shutdown order
//
// With Config.Exec the sidecar starts the connector as its child (its own
// process group; on Linux it is killed if the sidecar dies), once the host
// holds the replica's journal, waits for its health before the host goes
// on with discovery and recovery, and restarts it with exponential
// backoff after a crash while health checks report the replica unhealthy
// (the next heartbeat says connector_ready=false, which takes it offline;
// once the child is back a healthy heartbeat re-registers). When the child
// exits, what remains of its process group is stopped before the exit
// counts (SIGTERM, SIGKILL after StopTimeout), so nothing of a crashed
// connector holds its socket or port against the restarted one; and
// before every restart, as before the first start, the child's address
// is checked: while another process listens there, the child is not
// restarted (that process would answer for it), the replica stays
// unhealthy, and the address is checked again with the backoff; a
// restarted child that exits within StartTimeout while another process
// now listens there (it took the address between the check and the start,
// and the child could not bind) is held back the same way, not counted as
// a crash. A child, or a process of its group,
// that does not exit within a few seconds after SIGKILL (uninterruptible
// sleep) is given up on, so that a shutdown is never held by it: a stop
// takes at most StopTimeout and those seconds. The
// processes a child started outlive a sidecar that is killed (only the
// child dies with it): every process the sidecar starts is marked with
// EnvChildOf (the replica ID), which they inherit, and on Linux a
// starting sidecar, holding the replica's journal and before it starts
// anything, kills the processes of its user that carry exactly its
// replica's marker and waits for them (a process that cleared its
// environment escapes; another replica's are never touched). Run documents
// the shutdown order: the host's drain and offline complete while the child
// still serves, and only then is the child stopped. Without Exec the
// sidecar attaches to a connector that is already running and waits for its
// health, for at most StartTimeout.
//
// The sidecar serves GET /sidecar/status (Status) on the host's listener:
// the connector's target, the last health result, the supervised process
// and any manifest change.
package sidecar
