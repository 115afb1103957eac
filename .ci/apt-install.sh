#!/usr/bin/env bash
# Installs Debian packages for the test run without starting their services:
#
#   .ci/apt-install.sh [--no-install-recommends] PACKAGE...
#
# A package such as etcd-server or prometheus enables and starts its daemon
# on install; the tests start their own processes and need none of them
# running. Service actions of maintainer scripts go through
# /usr/sbin/policy-rc.d: when the machine has none, a temporary one that
# forbids them (exit 101) is put there for the install and removed after,
# on every exit of this script. A machine's own policy-rc.d is never
# touched, whatever it says (then scripts/test stops what it knows may have
# started). Runs `apt-get update` first.
set -euo pipefail

opts=()
if [ "${1:-}" = --no-install-recommends ]; then
    opts+=(--no-install-recommends)
    shift
fi
[ $# -gt 0 ] || { echo "usage: $0 [--no-install-recommends] PACKAGE..." >&2; exit 2; }

policy=/usr/sbin/policy-rc.d
own_policy=""
cleanup() {
    if [ -n "$own_policy" ]; then
        rm -f "$policy"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ ! -e "$policy" ] && [ ! -L "$policy" ]; then
    own_policy=1
    printf '#!/bin/sh\n# scripts/test (.ci/apt-install.sh): no service starts during its installs; removed after.\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y "${opts[@]}" "$@"
