//! What a job is started without: the capabilities that reach its
//! guardians (a root job), the privileges a set-uid program would give it,
//! and the descriptors its caller happened to hold (a `--user` job).
//!
//! **The model for a root job**, as container runtimes draw it: the job
//! keeps root over its own work (files, ownership, devices, the network,
//! its own processes and their uids), and loses what names, traces, limits
//! or remounts things outside its namespaces, where its guardians are:
//! [`DROPPED`] leaves its bounding set (so no `exec` of a set-uid or
//! file-capability program brings them back) and its effective, permitted
//! and inheritable sets (the ambient set with them). What that closes, for
//! a job whose keeper is PID 1 of its PID namespace:
//!
//! - `CAP_SYS_PTRACE`: the keeper is non-dumpable, so without it the job can
//!   neither trace it nor open its `/proc/1/{mem,fd,environ}`;
//! - `CAP_SYS_ADMIN`: no mount or unmount, so the `/proc` the keeper
//!   mounted (which shows the job's namespace only) stays; no `setns`, no
//!   cgroup moves, no `TIOCSTI` into a terminal it does not control;
//! - `CAP_SYS_RESOURCE`: `prlimit` of a process whose ids differ from the
//!   caller's; the keeper's saved gid is made to differ
//!   ([`differ_saved_gid`]), so the job, root as the keeper is, may not
//!   change the keeper's limits;
//! - `CAP_SYS_NICE`: a real-time class for the job, which would starve the
//!   agent's renewals and the keeper on every core (guarantee 1);
//! - the kernel's own doors (`CAP_SYS_MODULE`, `CAP_SYS_RAWIO`,
//!   `CAP_SYS_BOOT`, `CAP_BPF`, `CAP_PERFMON`, `CAP_CHECKPOINT_RESTORE`,
//!   `CAP_MAC_ADMIN`, `CAP_MAC_OVERRIDE`) and `CAP_DAC_READ_SEARCH`
//!   (`open_by_handle_at` opens files by handle, past the mount namespace).
//!
//! The keeper's `/proc` is mounted with `hidepid=ptraceable`
//! (`keeper_spawn`), so the non-dumpable keeper is not even listed there:
//! its `oom_score_adj` (a root-owned file, which a root job could write) is
//! not found. `CAP_KILL` is kept: the keeper as PID 1 takes no SIGKILL or
//! SIGSTOP from its namespace whatever the job holds, and the job needs it
//! to signal its own children of other uids.
//!
//! Everything the child does here is a raw system call on memory made
//! before the fork: async-signal-safe, allocation-free.

/// The capabilities a root job goes without (see the module doc).
pub const DROPPED: [u32; 13] = [
    2,  // CAP_DAC_READ_SEARCH
    16, // CAP_SYS_MODULE
    17, // CAP_SYS_RAWIO
    19, // CAP_SYS_PTRACE
    21, // CAP_SYS_ADMIN
    22, // CAP_SYS_BOOT
    23, // CAP_SYS_NICE
    24, // CAP_SYS_RESOURCE
    32, // CAP_MAC_OVERRIDE
    33, // CAP_MAC_ADMIN
    38, // CAP_PERFMON
    39, // CAP_BPF
    40, // CAP_CHECKPOINT_RESTORE
];

const CAP_SETPCAP: u32 = 8;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// This thread's capability sets, as 64-bit masks (effective, permitted,
/// inheritable); `None` if `capget` failed. Async-signal-safe (also the
/// check after a `--user` switch, `sys::user`).
pub fn sets() -> Option<[u64; 3]> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `header` and the two `data` entries are the layout capget(2)
    // takes for version 3; both are live locals.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    (rc == 0).then(|| {
        let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        [
            join(data[0].effective, data[1].effective),
            join(data[0].permitted, data[1].permitted),
            join(data[0].inheritable, data[1].inheritable),
        ]
    })
}

/// Whether this process may drop capabilities from a bounding set
/// (`CAP_SETPCAP` effective): a root keeper, or one in a user namespace
/// of its own. An unprivileged keeper has nothing to drop.
pub fn may_drop() -> bool {
    sets().is_some_and(|[eff, _, _]| eff & (1 << CAP_SETPCAP) != 0)
}

/// In the job's child, before the uid switch (which may clear what is
/// needed here): [`DROPPED`] out of the bounding set, then out of the
/// effective, permitted and inheritable sets (the ambient set follows).
/// `Err(errno)`: the job must not run with them. A capability the kernel
/// does not know (`EINVAL`, an older kernel) is not there to drop.
pub fn drop_capabilities() -> Result<(), i32> {
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let mut mask = 0u64;
    for cap in DROPPED {
        mask |= 1 << cap;
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 && errno() != libc::EINVAL {
            return Err(errno());
        }
    }
    let [eff, prm, inh] = sets().ok_or_else(errno)?;
    let keep = |set: u64| set & !mask;
    let split = |set: u64| (set as u32, (set >> 32) as u32);
    let (e, p, i) = (split(keep(eff)), split(keep(prm)), split(keep(inh)));
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: e.0,
            permitted: p.0,
            inheritable: i.0,
        },
        CapData {
            effective: e.1,
            permitted: p.1,
            inheritable: i.1,
        },
    ];
    // SAFETY: `header` and `data` are the version-3 layout capset(2) reads,
    // live locals of this frame.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(errno());
    }
    // Read back: none of them may be left in any set.
    match sets() {
        Some(left) if left.iter().all(|s| s & mask == 0) => Ok(()),
        _ => Err(0),
    }
}

/// In the job's child: `PR_SET_NO_NEW_PRIVS`, so no `exec` (set-uid,
/// set-gid, file capabilities) gives the job more than it has.
pub fn no_new_privs() -> Result<(), i32> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// In the job's child: every descriptor above stderr marked close-on-exec
/// (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`, Linux 5.11; before it, each
/// one up to the soft `RLIMIT_NOFILE` by `fcntl`), so the job starts with
/// stdin, stdout and stderr alone, whatever its caller left open. Marked,
/// not closed: the child's own report pipe must stay open until the exec.
pub fn close_others_on_exec() {
    // SAFETY: raw system calls with integer arguments only; `limit` is a
    // live local of the size getrlimit writes.
    unsafe {
        let rc = libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        );
        if rc == 0 {
            return;
        }
        let mut limit: libc::rlimit = std::mem::zeroed();
        let top = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(1 << 20) as libc::c_int
        } else {
            1024
        };
        for fd in 3..top {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

/// The saved gid the keeper takes (`(gid_t)-2`, the kernel's traditional
/// overflow id, which no job is run as): see [`differ_saved_gid`].
pub const KEEPER_SAVED_GID: u32 = u32::MAX - 1;

/// The keeper, root, sets its saved gid to [`KEEPER_SAVED_GID`] (its real
/// and effective gids stay), so that a root job's ids no longer all equal
/// the keeper's: `prlimit` on another process needs that equality or
/// `CAP_SYS_RESOURCE`, which the job has not. The job's own child gets its
/// saved gid back from its effective one at `exec`. Per thread (the raw
/// call): the keeper has one.
pub fn differ_saved_gid() -> std::io::Result<()> {
    let keep = libc::gid_t::MAX; // -1: unchanged
    // SAFETY: setresgid with integer arguments only.
    let rc = unsafe { libc::syscall(libc::SYS_setresgid, keep, keep, KEEPER_SAVED_GID) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
