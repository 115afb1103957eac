#!/bin/bash
# Records its pid (and a grandchild's) and sleeps; exits 0 on SIGTERM.
trap 'echo "got TERM" >> "${OUT:-/dev/null}"; exit 0' TERM
trap 'echo "got USR1" >> "${OUT:-/dev/null}"' USR1
trap 'echo "got HUP" >> "${OUT:-/dev/null}"' HUP
sleep 1000 & gc=$!
echo $$ >> "${PIDS:-/dev/null}"; echo $gc >> "${PIDS:-/dev/null}"
echo ready >> "${OUT:-/dev/null}"
while :; do wait; done
