#!/usr/bin/env bash
# wrk figures for `leaseagent serve` (renewals/s and durable grants/s, plain
# and TLS). Needs wrk (apt-get install -y wrk), openssl, and a release build:
#   cargo build --release && bash benches/wrk.sh [SECONDS] [CONNECTIONS]
set -euo pipefail
secs=${1:-5}
conns=${2:-16}
here=$(cd "$(dirname "$0")" && pwd)
bin=${LEASEAGENT_BIN:-$here/../target/$(rustc -vV | sed -n 's/^host: //p')/release/leaseagent}
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

start() { # scheme extra-args...
  local scheme=$1; shift
  # No auth file: said explicitly (builds from before --no-auth run without it).
  local no_auth=
  "$bin" serve --help | grep -q -- --no-auth && no_auth=--no-auth
  "$bin" serve $no_auth --listen 127.0.0.1:0 --db "$dir/db-$RANDOM" "$@" 2> "$dir/serve.log" &
  pid=$!
  for _ in $(seq 100); do
    addr=$(sed -n "s|.*listening on $scheme://\([^ ]*\).*|\1|p" "$dir/serve.log")
    [ -n "$addr" ] && break
    sleep 0.05
  done
  url="$scheme://$addr"
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

run() { # label scheme curl-args...
  local label=$1 scheme=$2; shift 2
  local grant
  grant=$(curl -sk -H "Content-Type: application/json" "$@" "$url/v1/acquire" -d '{"task":"bench","holder":"wrk","ttl_ms":600000}')
  local id tok
  id=$(echo "$grant" | sed 's/.*"lease_id":"\([^"]*\)".*/\1/')
  tok=$(echo "$grant" | sed 's/.*"token":\([0-9]*\).*/\1/')
  echo "== $label: renewals, $conns keep-alive connections, ${secs}s"
  BODY="{\"lease_id\":\"$id\",\"token\":$tok}" wrk -t2 -c"$conns" -d"${secs}s" --latency \
    -s "$here/wrk/renew.lua" "$url/v1/renew" | grep -E "Requests/sec|99%|50%|Non-2xx|Socket errors" || true
  echo "== $label: durable grants, $conns connections, ${secs}s"
  wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$here/wrk/acquire.lua" "$url/v1/acquire" \
    | grep -E "Requests/sec|99%|50%|Non-2xx|Socket errors" || true
}

start http
run plain http
stop

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
chmod 600 "$dir/key.pem"
start https --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem"
run TLS https
stop
