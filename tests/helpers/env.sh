#!/bin/bash
# Prints the lease variables the job got.
echo "TOKEN=$LEASE_TOKEN"
echo "ID=$LEASE_ID"
echo "TASK=$LEASE_TASK"
echo "AUTH=$LEASE_AUTHORITY"
echo "TTL=$LEASE_TTL_MS"
echo "NOTIFY=${NOTIFY_SOCKET:-unset}"
echo "STATE=${LEASEAGENT_STATE_FILE:-unset}"
