#!/usr/bin/env bash
# Start-up overhead and peak RSS of `leaseagent --authority etcd://… -- true`
# next to `etcdctl lock x true`, on one throwaway etcd on a loopback port.
#
#   cargo build --release && bash benches/etcd-startup.sh [RUNS]
#   TLS=1 bash benches/etcd-startup.sh [RUNS]   # etcds:// and etcdctl --cacert,
#                                               # certificates made with openssl
#
# Prints the median, min and max wall time of RUNS (default 25) runs of each,
# alternating the two tools, and the peak RSS (max over runs).
set -euo pipefail
RUNS=${1:-25}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AGENT=${LEASEAGENT:-$ROOT/target/$(rustc -vV | sed -n 's/^host: //p')/release/leaseagent}
command -v etcd >/dev/null || { echo "etcd missing: run .ci/install-etcd.sh" >&2; exit 1; }
[ -x "$AGENT" ] || { echo "$AGENT missing: cargo build --release" >&2; exit 1; }

DIR=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
PEER=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
SCHEME=http; LA_URL="etcd://127.0.0.1:$PORT"; LA_TLS=(); CTL_TLS=(); ETCD_TLS=()
if [ "${TLS:-0}" = 1 ]; then
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout "$DIR/ca.key" -out "$DIR/ca.pem" -days 1 -subj /CN=bench-ca 2>/dev/null
    openssl req "${ec[@]}" -keyout "$DIR/srv.key" -out "$DIR/srv.csr" -subj /CN=localhost 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$DIR/ext"
    openssl x509 -req -in "$DIR/srv.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial \
        -out "$DIR/srv.pem" -days 1 -extfile "$DIR/ext" 2>/dev/null
    SCHEME=https; LA_URL="etcds://127.0.0.1:$PORT"
    LA_TLS=(--ca-file "$DIR/ca.pem"); CTL_TLS=(--cacert "$DIR/ca.pem")
    ETCD_TLS=(--cert-file "$DIR/srv.pem" --key-file "$DIR/srv.key")
fi
etcd --name b --data-dir "$DIR/data" "${ETCD_TLS[@]}" \
    --listen-client-urls "$SCHEME://127.0.0.1:$PORT" --advertise-client-urls "$SCHEME://127.0.0.1:$PORT" \
    --listen-peer-urls "http://127.0.0.1:$PEER" --initial-advertise-peer-urls "http://127.0.0.1:$PEER" \
    --initial-cluster "b=http://127.0.0.1:$PEER" >"$DIR/etcd.log" 2>&1 &
ETCD_PID=$!
trap 'kill $ETCD_PID 2>/dev/null; wait $ETCD_PID 2>/dev/null; rm -rf "$DIR"' EXIT
export ETCDCTL_API=3
for _ in $(seq 100); do
    etcdctl "${CTL_TLS[@]}" --endpoints="$SCHEME://127.0.0.1:$PORT" endpoint health >/dev/null 2>&1 && break
    sleep 0.1
done

# Wall time: alternates the two tools RUNS times, from posix_spawn to wait4.
# Peak RSS is measured separately with GNU time (fork+exec from a small
# process): a vfork'ed child of python would be charged python's own RSS.
python3 - "$RUNS" "$AGENT" "$LA_URL" "$SCHEME://127.0.0.1:$PORT" "${LA_TLS[*]}" "${CTL_TLS[*]}" <<'PY'
import os, statistics, sys, time
runs, agent, url, endpoint = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
la_tls, ctl_tls = sys.argv[5].split(), sys.argv[6].split()
cmds = {
    f"leaseagent --authority {url.split(':')[0]}:// -- true": [agent, "--authority", url, *la_tls, "--task", "x", "--", "true"],
    "etcdctl lock x true": ["etcdctl", f"--endpoints={endpoint}", *ctl_tls, "lock", "x", "true"],
}
res = {k: [] for k in cmds}
devnull = os.open(os.devnull, os.O_WRONLY)
for _ in range(runs):
    for name, argv in cmds.items():
        t0 = time.perf_counter()
        pid = os.posix_spawnp(argv[0], argv, os.environ,
                              file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)])
        _, status, ru = os.wait4(pid, 0)
        dt = (time.perf_counter() - t0) * 1000
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"{name} failed: {status}")
        res[name].append(dt)
print(f"{os.cpu_count()} cores, {runs} runs each, alternating")
for name, r in res.items():
    t = sorted(r)
    print(f"{name:<40} median {statistics.median(t):6.1f} ms  min {t[0]:6.1f}  max {t[-1]:6.1f}")
PY
command -v /usr/bin/time >/dev/null || { echo "GNU time missing (apt-get install time)" >&2; exit 1; }
for i in 1 2 3 4 5; do
    /usr/bin/time -f "%M" -o "$DIR/rss-agent-$i" "$AGENT" --authority "$LA_URL" "${LA_TLS[@]}" --task x -- true >/dev/null 2>&1
    /usr/bin/time -f "%M" -o "$DIR/rss-etcdctl-$i" etcdctl --endpoints="$SCHEME://127.0.0.1:$PORT" "${CTL_TLS[@]}" lock x true >/dev/null 2>&1
done
/usr/bin/time -f "%M" -o "$DIR/rss-true" true
echo "peak RSS (max of 5, GNU time %M): leaseagent $(sort -n "$DIR"/rss-agent-* | tail -n1) KiB, etcdctl $(sort -n "$DIR"/rss-etcdctl-* | tail -n1) KiB (floor: \`true\` $(cat "$DIR/rss-true") KiB)"
echo "etcd $(etcd --version | head -n1 | awk '{print $3}')"
