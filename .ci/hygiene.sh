#!/usr/bin/env bash
# The test run's own hygiene: what a run leaves on the machine.
#
#   .ci/hygiene.sh snapshot DIR    before the tests (after the installs)
#   .ci/hygiene.sh compare DIR     after them: exit 1 naming what was left
#
# scripts/test takes the snapshot once the packages are installed and the
# Debian package built, exports LEASEAGENT_CI_RUN (every process the run
# starts inherits it), and compares when it exits, whether the tests passed
# or failed. Left behind means, after a settling time of up to 20 s:
#
#   - a process whose environment carries this run's LEASEAGENT_CI_RUN
#     (stopped or not: agents, keepers, jobs, etcd, serve, chromedriver,
#     a namespace's systemd);
#   - a cgroup named leaseagent-* (any hierarchy, any depth) that was not
#     there before, unless a number in its name is a live pid (the tests
#     name theirs after the test's or the keeper's pid: a live one is
#     another run's, in use);
#   - a mount point, a loop device, or a network namespace (ip netns) that
#     was not there before (the same live-pid rule for namespace names);
#   - a systemd unit of the machine active now and not before (when the
#     machine runs systemd);
#   - any change to: /usr/sbin/policy-rc.d (content, mode, presence),
#     /etc/passwd, /etc/group, /etc/hostname, /etc/machine-id, /etc/hosts,
#     the hostname, the cgroup v2 root's cgroup.subtree_control, the
#     presence of /var/lib/leaseagent, /var/lib/leaseagent-serve and
#     /etc/leaseagent, /usr/local/bin/leaseagent* and /usr/bin/leaseagent*
#     (with sizes and modes), entries of /tmp named leaseagent* or docs-links-* other than
#     the run's own directory, entries of the run's CARGO_TARGET_TMPDIR, and
#     the checkout's `git status` (files the tests wrote into the repository).
#
# Allowed (not compared): everything under target/ but its tmp directory
# (builds, the Python venv, the .deb), the run's own temporary directory
# (removed by scripts/test), apt's caches and lists, the packages and users
# the installs before the snapshot added, logs and journals. On a machine
# where other test runs go on at the same time their processes never carry
# this run's marker, and their cgroups and namespaces carry live pids; a
# mount or loop device of theirs held across the whole settling time would
# be reported (the message says so).
set -uo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
dir="${2:-}"
[ -n "$mode" ] && [ -n "$dir" ] || { echo "usage: $0 snapshot|compare DIR" >&2; exit 2; }
run="${LEASEAGENT_CI_RUN:-}"
[ -n "$run" ] || { echo "$0: LEASEAGENT_CI_RUN is not set" >&2; exit 2; }
triple=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p')
target_tmp="$PWD/target/$triple/tmp"

# Whether a number (of 2+ digits) in NAME is the pid of a live process.
names_live_pid() {
    local n
    for n in $(printf '%s\n' "$1" | grep -oE '[0-9]{2,}'); do
        [ -d "/proc/$n" ] && return 0
    done
    return 1
}

cgroups() {
    find /sys/fs/cgroup -mindepth 1 -type d -name 'leaseagent-*' -prune 2>/dev/null | sort
}

mounts() {
    # Mount point (field 5) and, after " - ", file system type and source.
    sed -E 's/^([^ ]+ ){4}([^ ]+) .* - ([^ ]+) ([^ ]+) .*/\2 \3 \4/' /proc/self/mountinfo | sort -u
}

loops() {
    losetup -l -n -O NAME,BACK-FILE 2>/dev/null | sort
}

netns() {
    ip netns list 2>/dev/null | awk '{ print $1 }' | sort
}

units() {
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl list-units --all --plain --no-legend --state=active 2>/dev/null \
            | awk '{ print $1 }' | sort
    fi
}

# The state of every watched file and directory, one line each.
files() {
    local f
    for f in /usr/sbin/policy-rc.d /etc/passwd /etc/group /etc/hostname /etc/machine-id /etc/hosts; do
        if [ -e "$f" ] || [ -L "$f" ]; then
            echo "$f $(stat -c '%a %U:%G' "$f") $(sha256sum < "$f" | cut -c1-16)"
        else
            echo "$f absent"
        fi
    done
    echo "hostname $(hostname)"
    local v2
    v2=$(awk '{ split($0, a, " - "); split(a[2], b, " "); split(a[1], c, " ");
               if (b[1] == "cgroup2") { print c[5]; exit } }' /proc/self/mountinfo)
    [ -n "$v2" ] && echo "$v2/cgroup.subtree_control: $(cat "$v2/cgroup.subtree_control" 2>/dev/null)"
    # (Present or not: a `cargo test` run directly as root, without
    # scripts/test's LEASEAGENT_STATE_DIR, writes into /var/lib/leaseagent.)
    for f in /var/lib/leaseagent /var/lib/leaseagent-serve /etc/leaseagent; do
        [ -e "$f" ] && echo "$f present"
    done
    for f in /usr/local/bin/leaseagent* /usr/bin/leaseagent*; do
        [ -e "$f" ] && find "$f" -printf '%p %M %s\n' 2>/dev/null
    done
    find /tmp -mindepth 1 -maxdepth 1 \( -name 'leaseagent*' -o -name 'docs-links-*' \) \
        ! -path "$run" -printf '/tmp entry %f\n' 2>/dev/null | sort
    [ -d "$target_tmp" ] && find "$target_tmp" -mindepth 1 -maxdepth 1 -printf 'target tmp entry %f\n' | sort
    git status --porcelain 2>/dev/null | sed 's/^/checkout /'
}

ppid_of() {
    awk '/^PPid:/ { print $2 }' "/proc/$1/status" 2>/dev/null
}

# This run's processes: those carrying its marker, but this script, its
# ancestors (scripts/test) and its own subshells.
run_processes() {
    local ancestors=" " p=$$
    while [ -n "$p" ] && [ "$p" -gt 1 ]; do
        ancestors="$ancestors$p "
        p=$(ppid_of "$p")
    done
    local d pid q ours
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        case "$ancestors" in *" $pid "*) continue ;; esac
        { tr '\0' '\n' < "$d/environ" | grep -qxF "LEASEAGENT_CI_RUN=$run"; } 2>/dev/null || continue
        # A subshell of this script descends from it.
        ours="" q=$pid
        while [ -n "$q" ] && [ "$q" -gt 1 ]; do
            [ "$q" = $$ ] && { ours=1; break; }
            q=$(ppid_of "$q")
        done
        [ -n "$ours" ] && continue
        echo "$pid $(awk '{ print $3 }' "$d/stat" 2>/dev/null) $({ tr '\0' ' ' < "$d/cmdline"; } 2>/dev/null | cut -c1-160)"
    done
}

snapshot() {
    mkdir -p "$dir"
    cgroups > "$dir/cgroups"
    mounts > "$dir/mounts"
    loops > "$dir/loops"
    netns > "$dir/netns"
    units > "$dir/units"
    files > "$dir/files"
}

# Lines of the current LIST (a function) not in the snapshot's FILE.
new_since() {
    comm -13 "$dir/$2" <("$1")
}

# Everything left now, one "what: item" line each.
left_now() {
    run_processes | sed 's/^/process (pid state command): /'
    new_since cgroups cgroups | while read -r c; do
        names_live_pid "$(basename "$c")" || echo "cgroup: $c ($(wc -l < "$c/cgroup.procs" 2>/dev/null || echo ?) processes)"
    done
    new_since mounts mounts | sed 's/^/mount (point type source): /'
    new_since loops loops | sed 's/^/loop device: /'
    new_since netns netns | while read -r n; do
        names_live_pid "$n" || echo "network namespace: $n"
    done
    new_since units units | sed 's/^/systemd unit active: /'
    diff <(cat "$dir/files") <(files) | sed -n 's/^> /changed or new: /p; s/^< /was: /p'
}

compare() {
    [ -d "$dir" ] || { echo "$0: no snapshot in $dir" >&2; exit 2; }
    local until=$((SECONDS + 20)) left
    while :; do
        left=$(left_now)
        [ -z "$left" ] && { echo "hygiene: the run left nothing behind"; return 0; }
        [ "$SECONDS" -ge "$until" ] && break
        sleep 1
    done
    {
        echo "hygiene: the test run left this behind (or, for a mount or loop device, another run on this machine holds it):"
        sed 's/^/  /' <<< "$left"
    } >&2
    return 1
}

case "$mode" in
    snapshot) snapshot ;;
    compare) compare ;;
    *) echo "usage: $0 snapshot|compare DIR" >&2; exit 2 ;;
esac
