#!/usr/bin/env bash
# scripts/test.sh — the project's test command (run through `make test`).
#
# It starts a throwaway PostgreSQL server for the database tests, runs go vet and
# the whole test suite with the race detector, then always stops the server and
# removes its directory. The database tests fail (they do not skip) when the
# server cannot be started, because AIP_TEST_REQUIRE_DATABASE=1 is exported.
#
# Extra arguments are passed to `go test` (for example `-run TestName`).
set -euo pipefail

cd "$(dirname "$0")/.."

log() { printf 'test.sh: %s\n' "$*" >&2; }

find_pg_bin() {
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(readlink -f "$(command -v initdb)")"
		return 0
	fi
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

install_postgres() {
	log "initdb not found; installing postgresql with apt-get"
	local sudo=""
	[ "$(id -u)" -ne 0 ] && sudo="sudo"
	$sudo apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >&2
}

free_port() {
	if command -v python3 >/dev/null 2>&1; then
		python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
	else
		echo $(( 20000 + RANDOM % 20000 ))
	fi
}

PG_BIN=$(find_pg_bin) || { install_postgres; PG_BIN=$(find_pg_bin) || { log "PostgreSQL binaries still not found after apt-get install"; exit 1; }; }
log "using PostgreSQL binaries in $PG_BIN"

PG_DIR=$(mktemp -d -t aipfleet-pg.XXXXXX)
RUN_AS=()
if [ "$(id -u)" -eq 0 ]; then
	# PostgreSQL refuses to run as root: run it as an unprivileged user.
	PG_USER=aipfleet-pg
	if ! id "$PG_USER" >/dev/null 2>&1; then
		useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_USER"
	fi
	chown "$PG_USER" "$PG_DIR"
	RUN_AS=(runuser -u "$PG_USER" --)
fi

cleanup() {
	local status=$?
	if [ -f "$PG_DIR/data/postmaster.pid" ]; then
		"${RUN_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
	fi
	rm -rf "$PG_DIR"
	exit "$status"
}
trap cleanup EXIT INT TERM

"${RUN_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres --auth=trust --encoding=UTF8 --no-locale >"$PG_DIR/initdb.log" 2>&1 || {
	cat "$PG_DIR/initdb.log" >&2
	log "initdb failed"
	exit 1
}

started=""
for attempt in 1 2 3 4 5; do
	PG_PORT=$(free_port)
	# fsync is off only for this throwaway test server; benchmarks run against a
	# server with its default durability.
	if "${RUN_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
		-o "-c listen_addresses=127.0.0.1 -c port=$PG_PORT -c unix_socket_directories=$PG_DIR -c max_connections=500 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=128MB" \
		start >/dev/null 2>&1; then
		started=1
		break
	fi
	log "PostgreSQL did not start on port $PG_PORT (attempt $attempt); retrying"
done
if [ -z "$started" ]; then
	cat "$PG_DIR/server.log" >&2 || true
	log "could not start PostgreSQL"
	exit 1
fi
log "PostgreSQL listening on 127.0.0.1:$PG_PORT (data in $PG_DIR)"

export AIP_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
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
