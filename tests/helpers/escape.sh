#!/bin/bash
# A job whose descendants leave its process group three ways: a new session
# (setsid), a process group of their own (job control), and a double fork
# into a new session (the intermediate shell exits, so the sleeper is
# orphaned). Writes their pids to $PIDS, then "ready" to $OUT, then lives
# for $HOLD seconds (0: ends at once, leaving them behind). Its own pid is
# the first line of $PIDS.
echo $$ >> "$PIDS"
setsid sleep 1001 </dev/null >/dev/null 2>&1 &
echo $! >> "$PIDS"
set -m
sleep 1002 </dev/null >/dev/null 2>&1 &
echo $! >> "$PIDS"
set +m
( setsid sleep 1003 </dev/null >/dev/null 2>&1 & echo $! >> "$PIDS" )
echo ready >> "$OUT"
sleep "${HOLD:-0}"
exit 0
