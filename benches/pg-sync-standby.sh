#!/usr/bin/env bash
# serve on PostgreSQL with a synchronous standby, side by side with serve on
# PostgreSQL alone and serve on SQLite: durable grants/s and renewals/s
# (benches/serve_load.rs), ROUNDS rounds alternated A, B, C so that a burst
# of someone else's load spreads over all three.
#
#   bash benches/pg-sync-standby.sh [ROUNDS] [SECS]     # defaults 2 and 10
#
# Needs root (the clusters run as `nobody`, as the tests run them) and
# postgresql-15 (/usr/lib/postgresql/15/bin). Two clusters are made in
# temporary directories: a primary with a streaming standby that it names
# in synchronous_standby_names (every commit waits for the standby's flush:
# what Patroni's synchronous_mode gives), and a primary alone. Both are
# stopped and removed however the script ends.
set -euo pipefail
ROUNDS=${1:-2}
SECS=${2:-10}
BIN=/usr/lib/postgresql/15/bin
[ "$(id -u)" = 0 ] || { echo "run as root (the clusters run as nobody)" >&2; exit 1; }
[ -x "$BIN/postgres" ] || { echo "$BIN/postgres missing: apt-get install postgresql-15" >&2; exit 1; }
command -v setpriv >/dev/null || { echo "setpriv missing: apt-get install util-linux" >&2; exit 1; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
SECRETS=$(mktemp -d)
PIDS=()
cleanup() {
    # SIGQUIT: PostgreSQL's immediate shutdown (nothing here is kept).
    for p in "${PIDS[@]}"; do kill -QUIT "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK" "$SECRETS"
}
trap cleanup EXIT
chown nobody:nogroup "$WORK"
PW=bench-$RANDOM$RANDOM
printf '%s\n' "$PW" >"$SECRETS/pw"
chmod 0600 "$SECRETS/pw"
cp "$SECRETS/pw" "$WORK/initdb-pw"
chown nobody:nogroup "$WORK/initdb-pw"

NOBODY=(setpriv --reuid=nobody --regid=nogroup --clear-groups -- env -i PATH=/usr/bin:/bin LC_ALL=C.UTF-8)
as_nobody() { "${NOBODY[@]}" "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # NAME PORT SETTINGS...
    local name=$1 port=$2; shift 2
    # A simple command (not a function) in the background: $! is the
    # postmaster's own pid (setpriv and env exec), which the cleanup signals.
    "${NOBODY[@]}" "$BIN/postgres" -D "$WORK/$name" -c listen_addresses=127.0.0.1 -c "port=$port" \
        -c "unix_socket_directories=$WORK" -c shared_buffers=64MB -c max_connections=60 \
        "$@" >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 300); do
        "$BIN/pg_isready" -q -h 127.0.0.1 -p "$port" && return 0
        sleep 0.1
    done
    echo "postgres $name did not start:" >&2; cat "$WORK/$name.log" >&2; exit 1
}
psql_at() { PGPASSWORD=$PW "$BIN/psql" -X -A -t -h 127.0.0.1 -p "$1" -U leaseagent -d postgres -c "$2"; }

for c in alone primary; do
    as_nobody "$BIN/initdb" -D "$WORK/$c" -U leaseagent --auth=scram-sha-256 -E UTF8 \
        --pwfile="$WORK/initdb-pw" >/dev/null
done
P_ALONE=$(free_port); P_PRIMARY=$(free_port); P_STANDBY=$(free_port)
start alone "$P_ALONE"
start primary "$P_PRIMARY" -c synchronous_standby_names=s1
as_nobody env PGPASSWORD="$PW" "$BIN/pg_basebackup" -h 127.0.0.1 -p "$P_PRIMARY" -U leaseagent \
    -D "$WORK/standby" -R -X stream
start standby "$P_STANDBY" -c cluster_name=s1
for _ in $(seq 300); do
    [ "$(psql_at "$P_PRIMARY" "SELECT sync_state FROM pg_stat_replication WHERE application_name='s1'")" = sync ] && break
    sleep 0.1
done
state=$(psql_at "$P_PRIMARY" "SELECT sync_state FROM pg_stat_replication WHERE application_name='s1'")
[ "$state" = sync ] || { echo "the standby is not synchronous ($state)" >&2; exit 1; }
echo "primary :$P_PRIMARY with synchronous standby s1 :$P_STANDBY; primary alone :$P_ALONE"

cd "$ROOT"
cargo bench --bench serve_load --no-run >/dev/null 2>&1
run() { # LABEL [STORE]
    local label=$1 store=${2:-}
    if [ -n "$store" ]; then
        LOAD_SECS=$SECS LOAD_STORE=$store LOAD_STORE_PASSWORD_FILE=$SECRETS/pw cargo bench --bench serve_load 2>"$WORK/bench.err"
    else
        LOAD_SECS=$SECS cargo bench --bench serve_load 2>"$WORK/bench.err"
    fi >"$WORK/bench.out" || { echo "$label: serve_load failed:" >&2; cat "$WORK/bench.out" "$WORK/bench.err" >&2; exit 1; }
    grep -E "grants|renewals" "$WORK/bench.out" | sed "s/^/$label: /"
}
# Each run on a database of its own: the leases of the one before (ttl
# 600 s) would otherwise still be held.
for r in $(seq "$ROUNDS"); do
    echo "round $r"
    psql_at "$P_PRIMARY" "CREATE DATABASE round$r" >/dev/null
    psql_at "$P_ALONE" "CREATE DATABASE round$r" >/dev/null
    run "sync standby" "postgresql://leaseagent@127.0.0.1:$P_PRIMARY/round$r"
    run "pg alone    " "postgresql://leaseagent@127.0.0.1:$P_ALONE/round$r"
    run "sqlite      "
done
