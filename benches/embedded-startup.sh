#!/usr/bin/env bash
# Start-up of `leaseagent --task t -- true` on the embedded authority, on a
# fresh state directory and on one that has seen 10,000 runs, next to
# `flock FILE true` (the floor: one process that takes a lock and runs
# `true`), with the state directories' sizes.
#
#   cargo build --release && bash benches/embedded-startup.sh [FILL] [ROUNDS] [RUNS]
#
# FILL (default 10000) runs fill the old state directory first, spread over
# 7 tasks as a host's cron jobs would be. Then hyperfine (-N: no shell)
# times the commands ROUNDS times (default 100) with RUNS runs each
# (default 2, after one warm-up run), and the medians are taken over all
# rounds: hyperfine runs one command's runs back to back, so on a shared
# machine only short rounds spread a burst of someone else's load over all
# the commands instead of one. The fresh state directory is new when the measurement
# starts (its only history is the measured runs themselves). One more line,
# a fresh state directory on tmpfs (/dev/shm: fsync costs nothing there),
# shows how much of a run is the disk's flush, and one more, a fresh state
# directory with --no-pid-namespace, what the job's own PID namespace costs.
#
# LEASEAGENT_BEFORE=/path/to/an/older/leaseagent adds that binary's fresh
# and filled runs to every round ("fresh, before", "after N runs, before"),
# so a change is measured side by side with what it replaces.
set -euo pipefail
FILL=${1:-10000}
ROUNDS=${2:-100}
RUNS=${3:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AGENT=${LEASEAGENT:-$ROOT/target/$(rustc -vV | sed -n 's/^host: //p')/release/leaseagent}
command -v hyperfine >/dev/null || { echo "hyperfine missing: apt-get install hyperfine" >&2; exit 1; }
command -v flock >/dev/null || { echo "flock missing: apt-get install util-linux" >&2; exit 1; }
[ -x "$AGENT" ] || { echo "$AGENT missing: cargo build --release" >&2; exit 1; }
BEFORE=${LEASEAGENT_BEFORE:-}
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || { echo "LEASEAGENT_BEFORE=$BEFORE is not executable" >&2; exit 1; }

DIR=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
trap 'rm -rf "$DIR" "$SHM"' EXIT
# Both binaries run from copies, as an installed binary (dpkg, `cargo
# install`, cp) would: a file fresh from the linker sits in the page cache
# in 4 KiB pieces, as the linker wrote it, where a copied or installed one
# is held in large folios; every fault, lock (the agent and the keeper lock
# their pages) and unmap of its code then costs more, about 0.5 ms a run on
# this machine's kernel (6.18) for the same bytes. Measuring the build
# output against a copy of the old binary would favour the old one.
mkdir "$DIR/bin"
cp "$AGENT" "$DIR/bin/leaseagent"
AGENT=$DIR/bin/leaseagent
if [ -n "$BEFORE" ]; then
    cp "$BEFORE" "$DIR/bin/leaseagent-before"
    BEFORE=$DIR/bin/leaseagent-before
fi
OLD=$DIR/old
FRESH=$DIR/fresh
NOPIDNS=$DIR/fresh-nopidns
mkdir -m 700 "$OLD" "$FRESH" "$NOPIDNS" "$SHM/fresh" "$DIR/old-before" "$DIR/fresh-before"

size() { du -sk --apparent-size "$1" | cut -f1; }
files() { (cd "$1" && for f in *; do printf '%s %s B, ' "$f" "$(stat -c %s "$f")"; done) | sed 's/, $//'; }

fill() { # BINARY DIR
    echo "filling $2 with $FILL runs over 7 tasks…"
    SECONDS=0
    for i in $(seq "$FILL"); do
        "$1" --authority "sqlite:$2/leases.sqlite3" --task "cron-$((i % 7))" -- true 2>/dev/null ||
            { echo "run $i failed" >&2; exit 1; }
    done
    echo "filled in $SECONDS s; old state directory: $(size "$2") KiB ($(files "$2"))"
    # The fill's writes are flushed now, not during the measurement.
    sync
}
fill "$AGENT" "$OLD"
EXTRA=()
if [ -n "$BEFORE" ]; then
    fill "$BEFORE" "$DIR/old-before"
    EXTRA=(-n fresh-before "$BEFORE --authority sqlite:$DIR/fresh-before/leases.sqlite3 --task t -- true"
           -n after-before "$BEFORE --authority sqlite:$DIR/old-before/leases.sqlite3 --task t -- true")
fi

for r in $(seq "$ROUNDS"); do
    hyperfine -N --warmup 1 --runs "$RUNS" --style none --export-json "$DIR/round-$r.json" \
        -n flock "flock $DIR/lockfile true" \
        -n fresh "$AGENT --authority sqlite:$FRESH/leases.sqlite3 --task t -- true" \
        -n tmpfs "$AGENT --authority sqlite:$SHM/fresh/leases.sqlite3 --task t -- true" \
        -n after "$AGENT --authority sqlite:$OLD/leases.sqlite3 --task t -- true" \
        -n nopidns "$AGENT --no-pid-namespace --authority sqlite:$NOPIDNS/leases.sqlite3 --task t -- true" \
        "${EXTRA[@]}" >/dev/null 2>&1
done

python3 - "$DIR" "$ROUNDS" "$FILL" <<'PY'
import json, os, statistics, sys
d, rounds, fill = sys.argv[1], int(sys.argv[2]), sys.argv[3]
times = {}
for r in range(1, rounds + 1):
    for res in json.load(open(f"{d}/round-{r}.json"))["results"]:
        times.setdefault(res["command"], []).extend(res["times"])
med = {k: statistics.median(v) * 1000 for k, v in times.items()}
print(f"{os.cpu_count()} cores, {len(times['flock'])} runs each ({rounds} rounds of hyperfine)")
for k, label in [("flock", "flock FILE true"), ("fresh", "leaseagent -- true, fresh state dir"),
                 ("after", f"leaseagent -- true, after {fill} runs"),
                 ("tmpfs", "leaseagent -- true, fresh, on tmpfs"),
                 ("nopidns", "the same, fresh, --no-pid-namespace"),
                 ("fresh-before", "the same, fresh, before"),
                 ("after-before", f"the same, after {fill} runs, before")]:
    if k not in times:
        continue
    t = sorted(times[k])
    p90 = t[int(len(t) * 0.9)] * 1000
    mean = statistics.mean(t) * 1000
    ratio = "" if k == "flock" else f"  = {med[k] / med['flock']:.2f} x flock"
    print(f"{label:<42} median {med[k]:5.2f} ms  p90 {p90:5.2f}  mean {mean:5.2f}  max {t[-1] * 1000:6.2f}{ratio}")
PY
echo "fresh state directory after the measurement: $(size "$FRESH") KiB ($(files "$FRESH"))"
echo "old state directory after the measurement:   $(size "$OLD") KiB ($(files "$OLD"))"
