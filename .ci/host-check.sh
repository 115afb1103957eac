#!/usr/bin/env bash
# What the test suite needs of the machine beyond packages, checked before a
# run (scripts/test runs this once the packages are installed). Each check
# that fails names the dependency, which tests need it and what to do; all
# are reported, then the exit status is 1. Cleaned up here: empty cgroups
# an earlier run left (their owner is gone). See docs/testing.md, "What the
# run needs of the machine".
set -uo pipefail

failed=0
problem() {
    echo "scripts/test: $*" >&2
    failed=1
}

# Root: namespaces, cgroups, loop mounts, ns_last_pid, playing root against nobody.
[ "$(id -u)" = 0 ] || problem "must run as root (the systemd, partition, cgroup and guardian tests create namespaces, cgroups and mounts)"

# The user and group the tests run things as (agent_files, serve_attack,
# agent_guardians, agent_pressure: files and processes of uid/gid 65534).
[ "$(id -u nobody 2>/dev/null)" = 65534 ] ||
    problem "the user nobody with uid 65534 is needed (agent_files::, serve_attack::, agent_guardians::, agent_pressure::): Debian's base-passwd has it"
[ "$(getent group nogroup | cut -d: -f3)" = 65534 ] ||
    problem "the group nogroup with gid 65534 is needed (agent_pressure::): Debian's base-passwd has it"

# The leaseagent package itself: the package test's fresh root is an overlay
# of the machine's / and would have it installed already.
if dpkg-query -W -f '${Status}' leaseagent 2>/dev/null | grep -q ' installed'; then
    problem "the leaseagent package is installed on this machine; the install test (systemd_deb::) needs a root without it: apt-get purge leaseagent"
fi

# The browser and its WebDriver must be one version (status_page::): a
# chromium from elsewhere beside Debian's chromium-driver fails there.
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    browser=$(chromium --version 2>/dev/null | grep -oE '[0-9]+(\.[0-9]+)+' | head -n1)
    driver=$(chromedriver --version 2>/dev/null | grep -oE '[0-9]+(\.[0-9]+)+' | head -n1)
    [ -n "$browser" ] && [ "$browser" = "$driver" ] ||
        problem "chromium ($browser) and chromedriver ($driver) differ: status_page:: needs one version of both (Debian's chromium and chromium-driver)"
fi

# cgroup v2 (unified, or /sys/fs/cgroup/unified on a hybrid v1 machine),
# writable by root, with cgroup.kill (Linux 5.14+): the keeper's job cgroup
# and the tests that assert it (agent_tree::, support::stop::).
v2=$(awk '{ split($0, a, " - "); split(a[2], b, " "); split(a[1], c, " ");
            if (b[1] == "cgroup2") { print c[5]; exit } }' /proc/self/mountinfo)
if [ -z "$v2" ]; then
    problem "no cgroup v2 hierarchy is mounted (neither unified at /sys/fs/cgroup nor hybrid at /sys/fs/cgroup/unified): agent_tree:: and the keeper's job cgroup need it"
else
    probe="$v2/leaseagent-ci-probe-$$"
    if mkdir "$probe" 2>/dev/null; then
        [ -e "$probe/cgroup.kill" ] ||
            problem "cgroup v2 at $v2 has no cgroup.kill (Linux 5.14 or later is needed: agent_tree::)"
        rmdir "$probe"
    else
        problem "cannot create a cgroup in $v2 (as root): agent_tree:: and the cgroup tests need it"
    fi
fi

# Recycling a pid on purpose (agent_tree::, agent_guardians::, support::stop::).
[ -w /proc/sys/kernel/ns_last_pid ] ||
    problem "/proc/sys/kernel/ns_last_pid is not writable (read-only /proc/sys, as in some containers): the recycled-pid tests need it"

# A loop device for the frozen ext4 of agent_guardians::.
losetup -f >/dev/null 2>&1 ||
    problem "no free loop device (losetup -f; /dev/loop-control): agent_guardians:: mounts a small ext4 image"

# Network namespaces on a bridge, veth pairs and tbf shaping (partition_netns::,
# agent_pressure::, etcd partitions), tried in a throwaway network namespace.
if ! unshare --net sh -c 'ip link add la-probe-br type bridge &&
        ip link add la-probe-a type veth peer name la-probe-b &&
        ip link set lo up && tc qdisc add dev lo root tbf rate 1mbit burst 32kbit latency 400ms' \
        >/dev/null 2>&1; then
    problem "cannot make a bridge, a veth pair or a tbf qdisc in a network namespace (kernel modules bridge, veth, sch_tbf): partition_netns:: and agent_pressure:: need them"
fi

# A machine booted a minute ago (docs/testing.md, "A machine booted a
# minute ago"). The kernel's random pool: ring (TLS tests) and rustix's
# getrandom block until it is ready; on current kernels it is within a
# second of boot, and a machine where it is not would stall the TLS tests.
python3 -c 'import os; os.getrandom(1, os.GRND_NONBLOCK)' 2>/dev/null ||
    problem "the kernel's random pool is not ready yet (getrandom would block): the TLS tests (client_trust::, serve_trust::, etcd_trust::) would stall; wait a few seconds after boot or start an entropy source (rng-tools, virtio-rng)"
# /dev/shm: a tmpfs with room for the Patroni test's etcd data and the
# fence tests' directories (a container's default 64 MiB is too small).
shm_free_kib=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" != tmpfs ] || [ -z "$shm_free_kib" ] ||
        [ "$shm_free_kib" -lt 524288 ] || [ ! -w /dev/shm ]; then
    problem "/dev/shm must be a writable tmpfs with 512 MiB free (it has ${shm_free_kib:-no} KiB): serve_patroni:: keeps etcd's data there, fence_publish:: and partition_netns:: their directories; mount -o remount,size=1G /dev/shm"
fi

# What an earlier run left behind. Cgroups the tests name leaseagent-job-PID
# (a keeper's), leaseagent-test-...PID... and leaseagent-frozen-PID: one
# whose pids are all gone is a leftover (a live pid means a run in progress
# on this machine: left alone). Empty ones are removed; ones with processes
# are named, with how to end them.
while read -r cg; do
    [ -n "$cg" ] || continue
    live=""
    for n in $(basename "$cg" | grep -oE '[0-9]{2,}'); do
        [ -d "/proc/$n" ] && live=1
    done
    [ -n "$live" ] && continue
    # (A keeper that died a moment ago: its agent removes its cgroup now.)
    for _ in 1 2 3 4 5; do
        procs=$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | tr '\n' ' ')
        [ -d "$cg" ] && [ -n "${procs// /}" ] || break
        sleep 1
    done
    [ -d "$cg" ] || continue
    if [ -z "${procs// /}" ]; then
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
        if [ -d "$cg" ]; then
            problem "cannot remove the empty cgroup $cg an earlier run left"
        else
            echo "scripts/test: removed the empty cgroup $cg an earlier run left" >&2
        fi
    else
        procs=$(echo $procs)
        problem "cgroup $cg, left by an earlier run, still holds processes $procs (thaw a frozen one: echo THAWED > $cg/freezer.state; then kill -9 $procs; rmdir the cgroup)"
    fi
done < <(find /sys/fs/cgroup -mindepth 1 -type d \
    \( -name 'leaseagent-job-*' -o -name 'leaseagent-test-*' -o -name 'leaseagent-frozen-*' \) -prune 2>/dev/null)

# Stopped leaseagent processes whose test is gone (reparented): a run that
# failed while it had them stopped, before the tests' stop guard.
stopped=$(ps -eo pid=,ppid=,stat=,comm= | awk '$3 ~ /^T/ && $2 == 1 && $4 ~ /^leaseagent/ { print $1 }')
stopped=$(echo $stopped)
[ -z "$stopped" ] ||
    problem "stopped leaseagent processes left by an earlier run: $stopped (kill -9 $stopped)"

exit "$failed"
