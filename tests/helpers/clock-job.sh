#!/bin/bash
# Appends the boot clock (/proc/uptime: CLOCK_BOOTTIME, 10 ms resolution) to
# $OUT every ~10 ms while it lives, so a test can tell when it last ran.
# Ignores SIGTERM when IGNORE_TERM=1 (only SIGKILL stops it), else exits on it.
if [ "${IGNORE_TERM:-0}" = 1 ]; then trap '' TERM; else trap 'exit 0' TERM; fi
echo $$ >> "${PIDS:-/dev/null}"
while :; do
    read -r up _ < /proc/uptime
    echo "$up" >> "$OUT"
    sleep 0.01
done
