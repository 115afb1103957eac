#!/usr/bin/env bash
# Renewal tail latency of two `serve` builds side by side: for each round,
# each build in turn gets a fresh server and database, one lease, and
# `wrk -t2 -c16 -d5s` renewing it (benches/wrk/renew.lua); prints the rate
# and p99 of every run, so a noisy round shows as such.
#
# Also printed per run: wrk's maximum latency and the CPU time the host took
# from this VM meanwhile (steal, /proc/stat). On the development VM the host
# took a busy vCPU away for about 100 ms at a time; wrk's two threads are
# always busy, so one of them is
# usually what freezes, and all its connections' requests count the freeze
# as latency. A round whose max is ~100 ms measured the host, not the server
# (cross-check: the closed-loop mode of benches/fleet.rs).
#
#   bash benches/wrk-renew-ab.sh BIN_A BIN_B [ROUNDS]   # ROUNDS default 5
#
# BIN_A/BIN_B: `leaseagent` binaries (`serve` is run through each).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rounds=${3:-5}
command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk" >&2; exit 1; }

one() { # bin -> "rate p99 max steal"
  local bin=$1 dir pid addr grant id tok out
  dir=$(mktemp -d)
  # No auth file: said explicitly (builds from before --no-auth run without it).
  local no_auth=
  "$bin" serve --help | grep -q -- --no-auth && no_auth=--no-auth
  "$bin" serve $no_auth --listen 127.0.0.1:0 --db "$dir/db" 2> "$dir/log" &
  pid=$!
  for _ in $(seq 200); do
    addr=$(sed -n 's|.*listening on http://\([^ ]*\).*|\1|p' "$dir/log")
    [ -n "$addr" ] && break
    sleep 0.05
  done
  [ -n "$addr" ] || { echo "serve did not start: $(cat "$dir/log")" >&2; kill "$pid"; exit 1; }
  grant=$(curl -s -H "Content-Type: application/json" "http://$addr/v1/acquire" -d '{"task":"bench","holder":"wrk","ttl_ms":600000}')
  id=$(echo "$grant" | sed 's/.*"lease_id":"\([^"]*\)".*/\1/')
  tok=$(echo "$grant" | sed 's/.*"token":\([0-9]*\).*/\1/')
  steal0=$(awk '/^cpu /{print $9}' /proc/stat)
  out=$(BODY="{\"lease_id\":\"$id\",\"token\":$tok}" wrk -t2 -c16 -d5s --latency \
    -s "$here/wrk/renew.lua" "http://$addr/v1/renew")
  steal=$(( $(awk '/^cpu /{print $9}' /proc/stat) - steal0 ))
  echo "$(echo "$out" | awk '/Requests\/sec/{printf "%.0f/s", $2}') p99 $(echo "$out" | awk '$1=="99%"{print $2}')" \
    "max $(echo "$out" | awk '$1=="Latency" && $2!="Distribution"{print $4}') steal ${steal}0ms"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

for r in $(seq "$rounds"); do
  echo "round $r (load $(cut -d' ' -f1 /proc/loadavg)): A $(one "$1") | B $(one "$2")"
done
