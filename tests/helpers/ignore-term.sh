#!/bin/bash
# Ignores SIGTERM (and so does its grandchild): only SIGKILL stops them.
trap '' TERM
bash -c 'trap "" TERM; while :; do sleep 1; done' & gc=$!
echo $$ >> "${PIDS:-/dev/null}"; echo $gc >> "${PIDS:-/dev/null}"
echo ready >> "${OUT:-/dev/null}"
while :; do sleep 1; done
