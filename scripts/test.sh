#!/usr/bin/env bash
# scripts/test.sh — the project's test command (run through `make test`).
#
# It starts a throwaway PostgreSQL server for the database tests (scripts/pg.sh:
# initdb into a temporary directory as an unprivileged user, fsync off), runs go
# vet and the whole test suite with the race detector, then always stops the
# server and removes its directory. The database tests fail (they do not skip)
# when the server cannot be started, because AIP_TEST_REQUIRE_DATABASE=1 is
# exported.
#
# Extra arguments are passed to `go test` (for example `-run TestName`).
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/pg.sh
. scripts/pg.sh

# fsync is off only for this throwaway test server; benchmarks (scripts/bench.sh)
# run against a server with its default durability.
start_throwaway_pg test

export AIP_TEST_DATABASE_URL="$PG_URL"
export AIP_TEST_REQUIRE_DATABASE=1

# Ctrl-C (or SIGTERM) stops the run at once. bash waits for a foreground
# command before it handles a signal, and go test catches SIGINT and goes on
# with the next packages, so each long step runs in the background and the
# trap stops it; the EXIT trap of scripts/pg.sh then stops the server.
child=0
stop_child() {
	if [ "$child" -ne 0 ]; then
		kill -TERM "$child" 2>/dev/null || true
		wait "$child" 2>/dev/null || true
	fi
}
trap 'stop_child; exit 130' INT
trap 'stop_child; exit 143' TERM
step() {
	"$@" &
	child=$!
	local status=0
	wait "$child" || status=$?
	child=0
	return "$status"
}

# Prove the database tests will really run (not skip) before the long run.
log "PostgreSQL smoke test"
step go test -count=1 -run '^TestSmoke$' -v ./internal/pgtest

log "go vet ./..."
step go vet ./...

# A 32-bit build: a constant over 2^31 compared with an int compiles on
# amd64 only. (GOOS=darwin go vet ./sidecar ./hostsdk/... ./aip checks the
# per-OS code for macOS; it compiles SQLite for darwin, two minutes cold, so
# it is left to `make vet`.)
log "GOARCH=386 go build ./..."
step env GOARCH=386 go build -o /dev/null ./...

log "go test -race -count=1 ./... $*"
status=0
step go test -race -count=1 -timeout 19m "$@" ./... || status=$?
exit "$status"
