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

# Prove the database tests will really run (not skip) before the long run.
log "PostgreSQL smoke test"
go test -count=1 -run '^TestSmoke$' -v ./internal/pgtest

log "go vet ./..."
go vet ./...

log "go test -race -count=1 ./... $*"
set +e
go test -race -count=1 -timeout 19m "$@" ./...
status=$?
set -e
exit $status
