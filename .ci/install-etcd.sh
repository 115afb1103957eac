#!/usr/bin/env bash
# Installs Debian's etcd server and client (etcd, etcdctl) for the etcd tests.
# Idempotent: does nothing when both are already there. The package's own
# service is not used (tests start their own etcd processes on free loopback
# ports): it is not started during the install (.ci/apt-install.sh), and
# where the machine's own policy-rc.d let it start under systemd, it is
# stopped and disabled again.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
    echo "etcd already installed: $(etcd --version | head -n1)"
    exit 0
fi
bash .ci/apt-install.sh etcd-server etcd-client
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl disable --now etcd.service 2>/dev/null || true
fi
etcd --version | head -n1
etcdctl version | head -n1
