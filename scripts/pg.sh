# scripts/pg.sh — a throwaway PostgreSQL server, shared by scripts/test.sh and
# scripts/bench.sh (source it; it is not a command).
#
# start_throwaway_pg MODE finds the PostgreSQL binaries (installing the
# postgresql package with apt-get when initdb is missing), initdb's a fresh
# temporary directory as an unprivileged user (PostgreSQL refuses to run as
# root; the user aipfleet-pg is created when needed), starts the server on a
# free loopback port with its socket in that directory, and installs a trap
# that always stops the server and removes the directory, keeping the exit
# status. It sets PG_BIN, PG_DIR, PG_PORT, PG_URL and RUN_AS (the command
# prefix that runs as the server's user).
#
# MODE is "test" (fsync, synchronous_commit and full_page_writes off: fast,
# and only for a server that is thrown away; databases collate with ICU
# en-US, a linguistic collation like most installations') or "bench" (PostgreSQL's default
# durability, with checkpoints spaced for a write-heavy server as
# docs/operator-guide.md recommends).

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }

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

pg_cleanup() {
	local status=$?
	if [ -n "${PG_DIR:-}" ]; then
		if [ -f "$PG_DIR/data/postmaster.pid" ]; then
			"${RUN_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
		fi
		rm -rf "$PG_DIR"
	fi
	exit "$status"
}

start_throwaway_pg() {
	local mode=$1 settings
	case "$mode" in
	test)
		settings="-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=128MB -c max_connections=500"
		;;
	bench)
		settings="-c shared_buffers=512MB -c max_connections=300 -c max_wal_size=8GB -c checkpoint_timeout=30min"
		;;
	*)
		log "start_throwaway_pg: unknown mode $mode (want test or bench)"
		return 1
		;;
	esac

	PG_BIN=$(find_pg_bin) || { install_postgres; PG_BIN=$(find_pg_bin) || { log "PostgreSQL binaries still not found after apt-get install"; exit 1; }; }
	log "using PostgreSQL binaries in $PG_BIN"

	PG_DIR=$(mktemp -d -t aipfleet-pg.XXXXXX)
	RUN_AS=()
	if [ "$(id -u)" -eq 0 ]; then
		# PostgreSQL refuses to run as root: run it as an unprivileged user.
		local pg_user=aipfleet-pg
		if ! id "$pg_user" >/dev/null 2>&1; then
			useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user"
		fi
		chown "$pg_user" "$PG_DIR"
		RUN_AS=(runuser -u "$pg_user" --)
	fi
	trap pg_cleanup EXIT INT TERM

	# The test server's databases default to a linguistic collation (ICU
	# en-US), as most installations' do (en_US and similar), so a query
	# that relies on the byte order of the "C" collation fails in the
	# tests, not only in production. PostgreSQL before 15, or one built
	# without ICU, falls back to the C locale (and says so).
	local locale=(--no-locale)
	if [ "$mode" = test ]; then
		locale=(--locale=C.UTF-8 --locale-provider=icu --icu-locale=en-US)
	fi
	if ! "${RUN_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres --auth=trust --encoding=UTF8 "${locale[@]}" >"$PG_DIR/initdb.log" 2>&1; then
		if [ "${locale[0]}" = --no-locale ]; then
			cat "$PG_DIR/initdb.log" >&2
			log "initdb failed"
			exit 1
		fi
		log "initdb with the ICU collation en-US failed; using the C locale (collation-dependent defects will not show): $(tail -n 1 "$PG_DIR/initdb.log")"
		rm -rf "$PG_DIR/data"
		"${RUN_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres --auth=trust --encoding=UTF8 --no-locale >"$PG_DIR/initdb.log" 2>&1 || {
			cat "$PG_DIR/initdb.log" >&2
			log "initdb failed"
			exit 1
		}
	fi

	local started="" attempt
	for attempt in 1 2 3 4 5; do
		PG_PORT=$(free_port)
		if "${RUN_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
			-o "-c listen_addresses=127.0.0.1 -c port=$PG_PORT -c unix_socket_directories=$PG_DIR $settings" \
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
	PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
	log "PostgreSQL ($mode settings) listening on 127.0.0.1:$PG_PORT (data in $PG_DIR)"
}
