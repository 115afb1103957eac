#!/usr/bin/env bash
# Installs Debian's etcd server and client (etcd, etcdctl) for the etcd tests.
# Idempotent: does nothing when both are already there. The package's own
# service is not used (tests start their own etcd processes on loopback ports).
set -euo pipefail
if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
    echo "etcd already installed: $(etcd --version | head -n1)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y etcd-server etcd-client
# Where there is no systemd, the package may still have started a daemon on
# the default ports; the tests use their own ports, so it is left alone.
etcd --version | head -n1
etcdctl version | head -n1
