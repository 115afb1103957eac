//! The two calls the pressure defences need that rustix has no safe wrapper
//! for: `SO_PRIORITY` on a socket, and a change made in the child between
//! `fork` and `exec` (the command's `oom_score_adj`).

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// `setsockopt(fd, SOL_SOCKET, SO_PRIORITY, prio)`: the queueing priority of
/// the socket's packets on this host (0-6 for anyone, 7 with
/// CAP_NET_ADMIN). Set it after `IP_TOS`: setting the TOS resets it.
pub fn set_socket_priority(fd: impl AsFd, prio: u8) -> std::io::Result<()> {
    let value: libc::c_int = libc::c_int::from(prio);
    // SAFETY: the descriptor is borrowed for the call and valid; the option
    // value is a live c_int on this stack frame and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PRIORITY,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes the child of `cmd` write `adj` to its own `oom_score_adj` before
/// `exec`, so the command and everything it forks is the OOM killer's
/// choice from its first instruction (writing it after the spawn would
/// leave a window in which the command could already have forked). Best
/// effort: a failed write leaves the inherited value and the command runs.
pub fn oom_score_adj_on_exec(cmd: &mut Command, adj: i16) {
    // Formatted here, before the fork: the child only makes raw syscalls.
    let text = adj.to_string().into_bytes();
    let hook = move || {
        write_own_oom_score_adj(&text);
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec; it allocates
    // nothing, takes no lock and makes only the open/write/close system
    // calls (through rustix's raw syscalls), which are async-signal-safe.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Writes `text` (a formatted `oom_score_adj`) to this process's own; best
/// effort. Async-signal-safe (rustix's raw open/write/close, no
/// allocation): for a child between `fork` and `exec`.
///
/// The keeper is not dumpable (`PR_SET_DUMPABLE 0`, out of the job's
/// reach), and its child inherits that until `exec`: the child's
/// `/proc/self` files then belong to root (or to nobody in a user
/// namespace), and this write would fail. So the child, which is the job
/// about to be, makes itself dumpable first, as its `exec` would anyway.
pub fn write_own_oom_score_adj(text: &[u8]) {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable);
    if let Ok(fd) = rustix::fs::open(
        c"/proc/self/oom_score_adj",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        let _ = rustix::io::write(&fd, text);
    }
}
