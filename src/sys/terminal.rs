//! The terminal on stdin, as a shell handles it: whose foreground it is,
//! and handing it over.
//!
//! Why: a job run from an interactive shell expects the shell's terminal
//! as its controlling terminal (`ssh`, `sudo` and `git` open `/dev/tty`
//! for their prompts; it fails with ENXIO in a session without one). The
//! agent hands the job the terminal when it was started in the terminal's
//! foreground ([`foreground_terminal`]): the keeper then stays in the
//! agent's session and the job's process group becomes the terminal's
//! foreground, as a shell's job does. The agent gives the foreground back
//! before it exits, so the shell finds the terminal where it left it; and
//! the process the shell waits on is a small front process, [`fork`]ed
//! first thing, that stops when the job stops (`agent/front.rs`).
//!
//! `tcsetpgrp` from a process group that is not the foreground one sends
//! `SIGTTOU` to that group, which would stop the agent (or, since the
//! agent catches it, be relayed to the job); the signal is blocked in the
//! calling thread around the call, as a shell does, which makes the kernel
//! allow it. Only the calling thread's mask matters to the kernel's check.

/// The agent's stdin is a terminal, the agent's process group is its
/// foreground, and the agent leads that group: a person runs us from an
/// interactive shell with job control, in the foreground. Started in the
/// background (`cmd &`), the job must not take the terminal from the
/// shell; started by a script (no job control: the script's group, led by
/// the script), the script's own shell would not see the front stop, so
/// Ctrl-Z keeps its old way (the whole group stops, the agent relays).
pub fn foreground_terminal() -> bool {
    let group = own_group();
    group == rustix::process::getpid().as_raw_nonzero().get()
        && foreground().is_some_and(|fg| fg == group)
}

/// The foreground process group of the terminal on stdin; `None`: stdin
/// is no terminal, or none of our session, or its group is not visible.
pub fn foreground() -> Option<libc::pid_t> {
    // SAFETY: tcgetpgrp takes a descriptor number only; 0 may be closed
    // (an error, answered as `None`).
    let fg = unsafe { libc::tcgetpgrp(0) };
    (fg > 0).then_some(fg)
}

/// This process's group id, 0 when the group's leader is outside this
/// process's PID namespace (`unshare --pid --fork`, `nsenter` into a
/// container, a job started by a parent outside): not rustix's
/// `getpgrp`, which takes the id for non-zero (a debug assertion, and a
/// zero `NonZero` in a release build).
pub fn own_group() -> libc::pid_t {
    // SAFETY: getpgrp takes no argument and cannot fail.
    unsafe { libc::getpgrp() }
}

/// This process's session id (its leader's pid), 0 when the leader is
/// outside this process's PID namespace (as for [`own_group`]). In an
/// interactive shell's session: the shell's own process group.
pub fn own_session() -> libc::pid_t {
    // SAFETY: getsid takes a number only; 0 names the caller, which
    // exists (an error is answered as -1, which no group has).
    unsafe { libc::getsid(0) }
}

/// Whether this process has one thread: [`fork`] may be used.
pub fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|st| {
        st.lines()
            .any(|l| l.split_whitespace().eq(["Threads:", "1"]))
    })
}

/// What [`fork`] made of this process.
pub enum Forked {
    /// The parent, with the child's pid.
    Parent(libc::pid_t),
    /// The child.
    Child,
}

/// `fork()`, for the agent's front process (`agent/front.rs`). Only for
/// a process with one thread ([`single_threaded`]), so the child is a
/// whole copy with no lock held by a thread that is not there.
pub fn fork() -> std::io::Result<Forked> {
    if !single_threaded() {
        return Err(std::io::Error::other("more than one thread"));
    }
    // SAFETY: this process has one thread (checked just above, and the
    // caller creates none meanwhile): the child may run any code.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// SIGTTOU blocked in the calling thread for good: its writes to the
/// terminal from a background group go through under `stty tostop`.
pub fn block_ttou_in_this_thread() {
    // SAFETY: pthread_sigmask on a set that is a live local of this frame.
    unsafe {
        let mut ttou: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut ttou);
        libc::sigaddset(&mut ttou, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &ttou, std::ptr::null_mut());
    }
}

/// `tcsetpgrp(0, pgrp)` with `SIGTTOU` blocked in this thread meanwhile.
/// A failure (the group gone, the terminal not ours) leaves it as it was.
/// Async-signal-safe and allocation-free: the job's child calls it
/// between `fork`/`clone` and `exec` too (`spawn`), to take the terminal
/// for the job's group.
pub fn set_foreground(pgrp: libc::pid_t) {
    // SAFETY: pthread_sigmask on sets that are live locals of this frame,
    // the old mask put back right after; tcsetpgrp takes numbers only (an
    // ioctl, TIOCSPGRP, on a local). sigemptyset, sigaddset,
    // pthread_sigmask and tcsetpgrp are all async-signal-safe.
    unsafe {
        let mut ttou: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut ttou);
        libc::sigaddset(&mut ttou, libc::SIGTTOU);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &ttou, &mut old);
        libc::tcsetpgrp(0, pgrp);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}
