#!/bin/sh
# Boots a real systemd as PID 1 of a private namespace set, for the tests of
# the shipped units. Run by the test harness as
#
#   SYSNS_CGROUPS="DIR..." unshare --pid --fork --mount --mount-proc --uts --ipc --net \
#       --propagation private sh systemd-boot.sh WORKDIR CGROUP_NAME BINARY UNIT_DIR
#
# Everything systemd could change on the machine is made private or masked
# first, because other people work on the same machine:
#   - pid, mount, uts (systemd sets the hostname), ipc (RemoveIPC= deletes the
#     IPC objects of a uid), net (systemd configures lo; units get loopback only);
#   - a copy of /etc bound over /etc (sysusers, unit files, machine-id change
#     the copy only); its own /tmp, /run, /var/{lib,log,tmp,cache,spool} and /srv
#     (the boot-time tmpfiles would otherwise empty the machine's /tmp, and a
#     persistent journal would be written to the machine's /var/log);
#   - /sys and /proc/sys read-only (no sysctl, no module or binfmt changes);
#     the cgroup mounts below /sys stay writable;
#   - a cgroup of its own, CGROUP_NAME, in the name=systemd and unified
#     hierarchies (or the one v2 hierarchy): systemd takes the cgroup it starts in as its root, so two
#     booted systemds never share a unit's cgroup;
#   - every unit that the sysinit/sockets/timers/... targets pull in by default
#     is masked (journald and its sockets excepted, for `journalctl`), every
#     enablement symlink of the machine is dropped, every generator masked, and
#     systemd boots test.target, which wants nothing.
# The binaries under test are bound over /usr/local/bin/leaseagent (the path
# the shipped units use) and /usr/local/bin/leaseagent-serve beside it, and the units of UNIT_DIR are installed verbatim.
#
# SYSNS_ROOT=overlay boots in a fresh root instead, for installing the Debian
# package: a copy-on-write overlay of the machine's / whose upper layer is a
# tmpfs of the mount namespace (it dies with it; nothing of the machine is
# written), pivoted into before the steps below. BINARY and UNIT_DIR are then
# "-": nothing is bound and no unit installed, the package brings its own.
# What the package's maintainer scripts consult is the root's own, whatever
# the machine has: no /usr/sbin/policy-rc.d (the test writes the one it
# needs), no leaseagent binaries, units, unit overrides or drop-ins,
# sysusers file, deb-systemd-helper state or leaseagent state, and its own
# /run (so /run/systemd/system is the booted systemd's). A machine with the
# package itself installed is refused (dpkg's database would say it is
# there): the boot fails naming it.
#
# Either way, leaseagent unit overrides and drop-ins the machine has in
# /etc/systemd/system, drop-ins for every service (service.d), manager
# settings (system.conf.d) and /etc/leaseagent are dropped from the booted
# system's /etc (a copy, or the overlay).
set -eu
W="$1"
NAME="$2"
BIN="$3"
UNITS="$4"

# Into our own cgroups before anything else ($$ is 1 here: the pid namespace's
# init). SYSNS_CGROUPS: the directories the harness created (name=systemd and
# unified on a hybrid machine, one directory on a pure cgroup v2 machine).
[ -n "${SYSNS_CGROUPS:-}" ] || { echo "SYSNS_CGROUPS not set" >&2; exit 2; }
for cg in $SYSNS_CGROUPS; do
    case "$cg" in
        */"$NAME") echo $$ > "$cg/cgroup.procs" ;;
        *) echo "not our cgroup: $cg" >&2; exit 2 ;;
    esac
done

mount --make-rprivate /

if [ "${SYSNS_ROOT:-}" = overlay ]; then
    R="$W/root"
    L="$W/layers"
    mkdir -p "$R" "$L"
    mount -t tmpfs -o mode=0755 tmpfs "$L"
    mkdir -p "$L/upper" "$L/work"
    mount -t overlay overlay -o "lowerdir=/,upperdir=$L/upper,workdir=$L/work" "$R"
    if [ -e "$R/var/lib/dpkg/info/leaseagent.list" ]; then
        echo "the machine has the leaseagent package installed (dpkg -l leaseagent): the fresh root is an overlay of the machine's /, so it would have it too; purge it first (apt-get purge leaseagent)" >&2
        exit 2
    fi
    # Whiteouts in the upper layer: the machine's own files stay.
    rm -rf "$R/var/lib/leaseagent" "$R/var/lib/leaseagent-serve" \
        "$R/var/lib/private/leaseagent-serve" "$R/etc/leaseagent" \
        "$R/usr/local/bin/leaseagent" "$R/usr/local/bin/leaseagent-serve" \
        "$R/usr/bin/leaseagent" "$R/usr/bin/leaseagent-serve" \
        "$R/usr/sbin/policy-rc.d" \
        "$R/etc/sysusers.d/leaseagent.conf" "$R/usr/lib/sysusers.d/leaseagent.conf" \
        "$R"/usr/lib/systemd/system/leaseagent* \
        "$R"/var/lib/systemd/deb-systemd-helper-enabled/*leaseagent* \
        "$R"/var/lib/systemd/deb-systemd-helper-masked/*leaseagent*
    mount -t proc proc "$R/proc"
    mount --rbind /sys "$R/sys"
    mount --rbind /dev "$R/dev"
    mkdir -p "$R$W"
    mount --bind "$W" "$R$W"
    cp "$0" "$R/sysns-boot.sh"
    cd "$R"
    mkdir -p oldroot
    pivot_root . oldroot
    umount -l /oldroot
    rmdir /oldroot
    exec env -u SYSNS_ROOT SYSNS_FRESH=1 sh /sysns-boot.sh "$W" "$NAME" "$BIN" "$UNITS"
fi
FRESH="${SYSNS_FRESH:-}"

if [ -z "$FRESH" ]; then
    rm -rf "$W/etc"
    cp -a /etc "$W/etc"
    mount --bind "$W/etc" /etc
fi

# The binary under test where the units expect it, and the harness's work
# directory and the shipped units at /mnt: done before /tmp and the other
# directories below are covered, since the checkout (and so the binary, the
# units and the work directory) may itself live under one of them.
if [ "$BIN" != - ]; then
    mount -t tmpfs -o mode=0755 tmpfs /usr/local/bin
    touch /usr/local/bin/leaseagent /usr/local/bin/leaseagent-serve
    mount --bind "$BIN" /usr/local/bin/leaseagent
    # `leaseagent serve` runs the server binary installed next to leaseagent.
    mount --bind "$(dirname "$BIN")/leaseagent-serve" /usr/local/bin/leaseagent-serve
fi
if [ "$UNITS" != - ]; then
    rm -rf "$W/units"
    cp -R "$UNITS" "$W/units"
fi
mkdir -p /mnt
mount --bind "$W" /mnt
W=/mnt
private="/tmp /run /var/lib /var/log /var/tmp /var/cache /var/spool /srv"
# A fresh root is already private; dpkg and apt need its /var/lib and /var/cache.
[ -z "$FRESH" ] || private="/tmp /run /var/tmp /srv"
for d in $private; do
    mkdir -p "$d"
    mount -t tmpfs -o mode=0755 tmpfs "$d"
done
chmod 1777 /tmp /var/tmp
mkdir -p /run/lock
mount -o remount,bind,ro /sys
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys

# Nothing of the machine starts: drop enablement, mask what targets pull in.
S=/etc/systemd/system
# Nor do the machine's overrides apply: its leaseagent units and drop-ins,
# its drop-ins for every service, its manager settings, its env files.
rm -rf "$S"/leaseagent* "$S/service.d" /etc/systemd/system.conf.d /etc/leaseagent
for w in "$S"/*.wants "$S"/*.requires; do
    [ -e "$w" ] && rm -rf "$w"
done
for u in /usr/lib/systemd/system/*.target.wants/* /usr/lib/systemd/system/*.target.requires/*; do
    [ -e "$u" ] || [ -L "$u" ] || continue
    n=$(basename "$u")
    case "$n" in
        systemd-journald.service | systemd-journald.socket | systemd-journald-dev-log.socket) continue ;;
    esac
    ln -sfn /dev/null "$S/$n"
done
for n in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service \
    systemd-tmpfiles-clean.service systemd-tmpfiles-clean.timer systemd-remount-fs.service \
    systemd-sysctl.service systemd-modules-load.service systemd-binfmt.service \
    systemd-udevd.service systemd-udev-trigger.service systemd-update-utmp.service \
    systemd-journal-flush.service systemd-random-seed.service systemd-hwdb-update.service \
    systemd-timesyncd.service systemd-networkd.service systemd-resolved.service \
    systemd-logind.service dbus.service dbus.socket getty.target swap.target \
    systemd-journald-audit.socket systemd-networkd-wait-online.service \
    proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount; do
    ln -sfn /dev/null "$S/$n"
done
mkdir -p /etc/systemd/system-generators
for g in /usr/lib/systemd/system-generators/* /lib/systemd/system-generators/*; do
    [ -e "$g" ] || continue
    ln -sfn /dev/null "/etc/systemd/system-generators/$(basename "$g")"
done
: > /etc/fstab
mkdir -p /etc/systemd/system.conf.d
cat > /etc/systemd/system.conf.d/test.conf <<'C'
[Manager]
LogTarget=journal
ShowStatus=no
DefaultCPUAccounting=no
DefaultIOAccounting=no
DefaultIPAccounting=no
DefaultBlockIOAccounting=no
DefaultMemoryAccounting=no
DefaultTasksAccounting=no
C
cat > "$S/test.target" <<'U'
[Unit]
Description=test target: starts nothing by itself
U

# The shipped units, verbatim.
if [ "$UNITS" != - ]; then
    cp -R "$W/units"/. "$S"/
    mkdir -p /etc/sysusers.d /etc/leaseagent
    cp "$W/units/leaseagent.sysusers" /etc/sysusers.d/leaseagent.conf
    systemd-sysusers /etc/sysusers.d/leaseagent.conf
fi

# Test-specific files the harness staged (env files, drop-ins, scripts).
if [ -d "$W/stage/etc" ]; then cp -R "$W/stage/etc"/. /etc/; fi
if [ -d "$W/stage/srv" ]; then cp -R "$W/stage/srv"/. /srv/; fi
mkdir -p /srv/out
chmod 0777 /srv/out

# Shared propagation inside, as systemd sets it up on a host (it leaves it
# alone in a container, which container= below makes it believe): without
# it the ramfs systemd mounts for a unit's credentials (LoadCredential=) in
# a child namespace never reaches the unit, which finds an empty
# /run/credentials/UNIT. Every mount here was made private first (above):
# sharing them makes peer groups of this namespace and its children only,
# never with the machine's mounts.
mount --make-rshared /

echo booting
exec env container=leaseagent-test /lib/systemd/systemd --system --unit=test.target
