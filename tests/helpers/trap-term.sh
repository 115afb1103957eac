#!/bin/bash
# Traps SIGTERM: prints "got TERM" to $OUT and exits 7 after a short cleanup.
# Forks a grandchild (sleep) in the same group; writes "pid" lines to $PIDS.
trap 'echo "got TERM" >> "${OUT:-/dev/null}"; kill $gc 2>/dev/null; exit 7' TERM
sleep 1000 & gc=$!
echo $$ >> "${PIDS:-/dev/null}"; echo $gc >> "${PIDS:-/dev/null}"
echo ready >> "${OUT:-/dev/null}"
while :; do wait; done
