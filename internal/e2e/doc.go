// Package e2e holds the fleet's end-to-end tests: they build the aipfleet
// and examples/echo binaries once per run and start real processes — the
// control plane (`aipfleet control-plane`) and the dispatcher (`aipfleet
// dispatch`) on a fresh PostgreSQL database, and echo connector hosts —
// and talk to them over loopback HTTP as an operator and a client would.
// The central side is sidecar/sidecartest/realfleet's (started with this
// package's lease, log level and dispatcher flags); processes, builds and
// polling are sidecartest's.
//
// The scenarios: many actions spread over every replica; the same action
// ID returns the same result without a second side effect; a rolling
// restart under load loses, fails and repeats nothing; so does a new
// connector version rolled out blue/green under load (TestBlueGreenVersionUpgrade:
// a second instance on the new version, added by `aipfleet registry apply`
// and bound at a lower priority number, takes new actions once one of its
// replicas is ready, then the old instance is retired); a replica killed
// mid-action leaves the action outcome_unknown and pinned, never run
// elsewhere; a dispatcher killed mid-action leaves its route reserved until
// the restarted dispatcher reconciles it from the replica's journal; bad
// tokens, foreign capabilities, oversized bodies and
// malformed actions get their documented errors and change nothing.
// TestChaos injects a seeded random sequence of faults (replicas killed
// and replaced or restarted on their own journal, drained, paused with
// SIGSTOP; the dispatcher and the control plane killed and restarted)
// while 16 clients send and resend actions, then checks that nothing ran
// twice, every completed answer has its one side effect, every action's
// status agrees with its side effects and the ledger holds nothing; the
// seed is logged, and AIP_CHAOS_SEED (and AIP_CHAOS_DURATION) replay a
// run.
// The database outage tests put a TCP proxy (dbProxy) between each central
// process and PostgreSQL: TestDatabaseOutage refuses the dispatcher's and
// then the control plane's database for less than a lease, then freezes
// both (open connections hang, new ones are never answered) for longer
// than a lease, and checks /ready, the errors clients get, recovery
// without restarts, connection counts and the logs; TestDatabaseSessionsKilled
// ends the processes' sessions with pg_terminate_backend under load. Both
// then check TestChaos's invariants.
// BenchmarkEndToEnd measures client → dispatcher → host → echo → back
// with 32 concurrent clients.
// TestSoak (only with AIP_SOAK_DURATION set; scripts/bench.sh soak) runs
// the processes and an aip-sidecar in front of examples/python-connector
// under a steady mixed load with replicas drained and replaced, samples
// every process's RSS, goroutines, fds, heap and PostgreSQL sessions and
// the journal and database sizes, and fails when a figure keeps growing;
// docs/performance.md ("Soak") has the rule and the figures.
//
// The tests need AIP_TEST_DATABASE_URL (see internal/pgtest) and skip
// without it. Side effects are audited in every replica's own journal:
// echo counts its effect per action ID there, and the audit sums the
// counts over all replicas, stopped ones included.
package e2e
