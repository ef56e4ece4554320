#!/usr/bin/env bash
# scripts/bench.sh — every benchmark of docs/performance.md, with its target,
# against a throwaway PostgreSQL server with default durability (run through
# `make bench`).
#
#   scripts/bench.sh              all of them (about 4 minutes on 2 cores)
#   scripts/bench.sh e2e host     only the named ones
#   scripts/bench.sh soak         the leak soak (internal/e2e TestSoak): 10
#                                 minutes unless AIP_SOAK_DURATION says
#                                 otherwise; not part of "all"
#
# Names: aip memregistry controlplane host rss sidecar registry heartbeat hot
# register e2e. The server (scripts/pg.sh, mode bench) keeps fsync and
# synchronous_commit on and spaces checkpoints as docs/operator-guide.md
# recommends; it is stopped and removed at the end. Run it on a quiet machine:
# the figures are throughput and latency, and anything else running takes
# from them.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/pg.sh
. scripts/pg.sh

all=(aip memregistry controlplane host rss sidecar registry heartbeat hot register e2e)
if [ $# -eq 0 ]; then
	set -- "${all[@]}"
fi
for name in "$@"; do
	case " ${all[*]} soak " in
	*" $name "*) ;;
	*)
		log "unknown benchmark $name; the names are: ${all[*]} soak"
		exit 2
		;;
	esac
done

needs_pg=""
for name in "$@"; do
	case "$name" in registry | heartbeat | hot | register | e2e | soak) needs_pg=1 ;; esac
done
if [ -n "$needs_pg" ]; then
	start_throwaway_pg bench
fi

# fresh_db NAME creates an empty database and prints its URL.
fresh_db() {
	"$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres "$1"
	echo "postgres://postgres@127.0.0.1:$PG_PORT/$1?sslmode=disable"
}

# section NAME TARGET prints a header.
section() { printf '\n== %s (target: %s)\n' "$1" "$2"; }

# figures keeps a benchmark's result lines and drops progress and go test noise.
figures() { grep -Ev '^(goos|goarch|pkg|cpu|PASS|ok |seeding: |=== )' || true; }

for name in "$@"; do
	case "$name" in
	aip)
		section "sign + verify a heartbeat" "≤ 150 µs/op, ≤ 60 allocs/op"
		go test -run '^$' -bench 'SignVerifyHeartbeat' -benchmem ./aip | figures
		;;
	memregistry)
		section "memregistry resolve+settle and catalog page" "≥ 50 000 resolve+settle/s; page ≤ 200 µs"
		go test -run '^$' -bench 'ResolveSettle|CatalogPage$' -benchmem ./registry/memregistry | figures
		;;
	controlplane)
		section "control plane, server side of one heartbeat" "none (a locator for heartbeat)"
		go test -run '^$' -bench 'ServeHeartbeat' -benchmem ./controlplane | figures
		;;
	host)
		section "one host: signed action → SQLite journal → echo → signed answer, 32 clients" "≥ 2 000 actions/s, p99 ≤ 20 ms"
		go test -run '^$' -bench 'HostEcho/sync=full' -benchtime 20000x ./examples/echo/echoconnector | figures
		;;
	rss)
		section "idle RSS: echo host, sidecar" "host ≤ 40 MiB, sidecar ≤ 30 MiB"
		go test -run '^$' -bench 'IdleRSS' ./examples/echo ./sidecar | figures
		;;
	sidecar)
		section "sidecar hop, added latency over a native Go connector" "p50 ≤ 1 ms, p99 ≤ 3 ms"
		go test -run '^$' -bench 'SidecarHop' ./sidecar | figures
		;;
	registry)
		section "pgregistry at the scale profile" "seed ≤ 60 s; ≥ 1 000 resolve+settle/s, route p99 ≤ 50 ms; catalog p99 ≤ 50 ms"
		go run ./registry/pgregistry/cmd/registry-bench -database-url "$(fresh_db bench_registry)" 2>&1 | figures
		;;
	heartbeat)
		section "heartbeats through the control plane, 10 000 replicas, 64 clients" "PostgreSQL ≥ 3 000/s, p99 ≤ 50 ms; memregistry ≥ 15 000/s"
		go build -o "${PG_DIR:-/tmp}/heartbeat-bench" ./controlplane/cmd/heartbeat-bench
		"${PG_DIR:-/tmp}/heartbeat-bench" -backend postgres -database-url "$(fresh_db bench_heartbeat)" 2>&1 | figures
		"${PG_DIR:-/tmp}/heartbeat-bench" -backend memory 2>&1 | figures
		;;
	hot)
		section "pgregistry, one hot tenant (the end-to-end shape)" "none (a locator for e2e)"
		AIP_TEST_DATABASE_URL="$PG_URL" go test -run '^$' -bench 'HotTenant' ./registry/pgregistry | figures
		;;
	register)
		section "pgregistry, 256 re-registrations in one lifecycle call (after an outage)" "well within the 5 s store timeout"
		AIP_TEST_DATABASE_URL="$PG_URL" go test -run '^$' -bench 'RegisterBatch' ./registry/pgregistry | figures
		;;
	e2e)
		section "end to end: client → dispatcher → 3 echo hosts → back, pgregistry, 32 clients" "≥ 500 actions/s, p99 ≤ 50 ms"
		AIP_TEST_DATABASE_URL="$PG_URL" go test -run '^$' -bench 'EndToEnd' -benchtime 15000x ./internal/e2e | figures
		;;
	soak)
		section "soak: every process's RSS, goroutines, fds, heap, PostgreSQL sessions flat under a steady load (${AIP_SOAK_DURATION:-10m})" "no figure grows without bound (docs/performance.md, Soak)"
		AIP_TEST_DATABASE_URL="$PG_URL" AIP_SOAK_DURATION="${AIP_SOAK_DURATION:-10m}" \
			go test -count=1 -run '^TestSoak$' -v -timeout 2h ./internal/e2e | grep -Ev '^(=== |PASS|ok )'
		;;
	esac
done
