#!/bin/sh
# Validates every systemd unit of leaseagent offline (no running systemd needed).
#
#   .ci/check-units.sh PATH/TO/leaseagent [UNIT_DIR]
#
# UNIT_DIR defaults to systemd/ next to this script. The units are copied to a
# temporary directory with ExecStart= pointed at the given binary, then, for
# every unit to check:
#   - `systemd-analyze verify` must exit 0 and print nothing at all (systemd
#     prints unknown keys, bad values, missing binaries as warnings and still
#     exits 0, so any output is a failure);
#   - `systemd-analyze security --offline=true --threshold=20` must stay at or
#     below an overall exposure of 2.0 (systemd's scale: 0 = locked down,
#     10 = unprotected). THRESHOLD overrides it (same unit: tenths). A unit
#     file may set its own with a comment line `# check-units: threshold N`
#     (tenths), saying why next to it; an instance takes its template's.
# A template is checked through an instance (leaseagent@check.service), and a
# timer through the service it starts, with the drop-ins next to it.
# Exit status: 0 all good; 1 a unit failed; 2 usage or a missing program.
set -u

THRESHOLD=${THRESHOLD:-20}
bin=${1:-}
here=$(cd "$(dirname "$0")/.." && pwd)
src=${2:-$here/systemd}

if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "check-units: usage: $0 PATH/TO/leaseagent [UNIT_DIR] (the binary must exist and be executable)" >&2
    exit 2
fi
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "check-units: systemd-analyze not found (apt-get install systemd)" >&2
    exit 2
fi
if [ ! -d "$src" ]; then
    echo "check-units: no unit directory $src" >&2
    exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -R "$src"/. "$tmp"/
for f in "$tmp"/*.service "$tmp"/*.d/*.conf; do
    [ -f "$f" ] || continue
    sed -i "s#/usr/local/bin/leaseagent#$bin#g" "$f"
done

# What to check: plain units as they are, templates through an instance.
units=""
for f in "$tmp"/*.service "$tmp"/*.timer "$tmp"/*.socket "$tmp"/*.path; do
    [ -f "$f" ] || continue
    name=$(basename "$f")
    case "$name" in
        *@.service) units="$units ${name%@.service}@check.service" ;;
        *) units="$units $name" ;;
    esac
done
# Instances with drop-ins get their own security review (the drop-in may
# change the service type or the hardening).
for d in "$tmp"/*@?*.service.d; do
    [ -d "$d" ] || continue
    units="$units $(basename "${d%.d}")"
done
if [ -z "$units" ]; then
    echo "check-units: no units in $src" >&2
    exit 2
fi

failed=0
cd "$tmp" || exit 2
for u in $units; do
    out=$(SYSTEMD_UNIT_PATH="$tmp:" systemd-analyze verify --man=no "$tmp/$u" 2>&1)
    rc=$?
    if [ $rc -ne 0 ] || [ -n "$out" ]; then
        echo "FAIL verify $u (exit $rc):"
        printf '%s\n' "$out" | sed 's/^/    /'
        failed=1
    else
        echo "ok   verify $u"
    fi
    case "$u" in
        *.service) ;;
        *) continue ;;
    esac
    file="$tmp/$u"
    [ -f "$file" ] || file="$tmp/${u%%@*}@.service"
    threshold=$(sed -n 's/^# check-units: threshold \([0-9][0-9]*\).*/\1/p' "$file" | head -n 1)
    threshold=${threshold:-$THRESHOLD}
    out=$(SYSTEMD_UNIT_PATH="$tmp:" systemd-analyze security --offline=true --no-pager \
        --threshold="$threshold" "$tmp/$u" 2>&1)
    rc=$?
    level=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
    if [ $rc -ne 0 ] || [ -z "$level" ]; then
        echo "FAIL security $u: exposure ${level:-unknown}, threshold $threshold/10 (exit $rc)"
        printf '%s\n' "$out" | grep -E '✗|Overall|rror' | sed 's/^/    /'
        failed=1
    else
        echo "ok   security $u: exposure $level (threshold $threshold/10)"
    fi
done
exit $failed
