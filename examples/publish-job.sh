#!/bin/sh
# A job that writes its output to a temporary file and commits it with
# `leaseagent publish`, so a paused-then-resumed (zombie) attempt can never
# overwrite a later attempt's output.
#
#   leaseagent --task nightly-report -- ./examples/publish-job.sh /srv/reports/nightly.csv
#
# Exit status: 0 published; 1 superseded by a later attempt (nothing
# written); 2 publish failed; anything else: the report failed.
set -eu

out=${1:?usage: publish-job.sh OUTPUT}
: "${LEASE_TOKEN:?run me under leaseagent}"

# 1. Write next to the destination: same filesystem, so the move is atomic.
tmp=$(mktemp "$(dirname -- "$out")/.$(basename -- "$out").XXXXXX")
trap 'rm -f -- "$tmp"' EXIT

# 2. The work itself (a stand-in here).
{
    echo "token,line"
    for i in 1 2 3; do echo "$LEASE_TOKEN,$i"; done
} >"$tmp"

# 3. Optional and advisory: don't start a commit with too little lease left.
#    (The fence in step 4 is what actually protects the output.)
if [ -n "${LEASEAGENT_STATE_FILE:-}" ]; then
    leaseagent check --min-remaining 2s
fi

# 4. The fenced commit: refused with "token N superseded by M" (exit 1) if a
#    later attempt has already published to "$out".
leaseagent publish "$tmp" "$out"
