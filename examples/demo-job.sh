#!/bin/sh
# A demo job for leaseagent: prints what a job running under a lease sees.
#   cargo run --release -- --task demo -- examples/demo-job.sh
set -eu
echo "demo-job: task ${LEASE_TASK} granted with fencing token ${LEASE_TOKEN} (lease ${LEASE_ID}, ttl ${LEASE_TTL_MS:-?} ms)"
echo "demo-job: authority ${LEASE_AUTHORITY}"
i=1
while [ "$i" -le 3 ]; do
    echo "demo-job: working ($i/3); a sink would reject writes fenced with a token below ${LEASE_TOKEN}"
    sleep 1
    i=$((i + 1))
done
echo "demo-job: done"
