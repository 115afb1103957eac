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
//! to its own group before it exits ([`Foreground`]), so the shell finds
//! the terminal where it left it.
//!
//! `tcsetpgrp` from a process group that is not the foreground one sends
//! `SIGTTOU` to that group, which would stop the agent (or, since the
//! agent catches it, be relayed to the job); the signal is blocked in the
//! calling thread around the call, as a shell does, which makes the kernel
//! allow it. Only the calling thread's mask matters to the kernel's check.

/// The agent's stdin is a terminal and the agent's process group is its
/// foreground: a person runs us from an interactive shell, in the
/// foreground. (Started in the background, `cmd &`, the job must not take
/// the terminal from the shell.)
pub fn foreground_terminal() -> bool {
    foreground().is_some_and(|fg| fg == own_group())
}

/// The foreground process group of the terminal on stdin; `None`: stdin
/// is no terminal, or none of our session, or its group is not visible.
fn foreground() -> Option<libc::pid_t> {
    // SAFETY: tcgetpgrp takes a descriptor number only; 0 may be closed
    // (an error, answered as `None`).
    let fg = unsafe { libc::tcgetpgrp(0) };
    (fg > 0).then_some(fg)
}

fn own_group() -> libc::pid_t {
    rustix::process::getpgrp().as_raw_nonzero().get()
}

/// While held, the agent's process group was the terminal's foreground
/// when the job was handed it; dropping it gives the foreground back to
/// the agent's group (if the terminal is still ours to give: nothing
/// when it already is, or when stdin is no longer a terminal of our
/// session).
pub struct Foreground {
    own: libc::pid_t,
}

impl Foreground {
    /// Noted now, before the job takes the terminal.
    pub fn note() -> Foreground {
        Foreground { own: own_group() }
    }

    /// The foreground back to the agent's group now (also on drop).
    pub fn restore(&self) {
        if foreground().is_some_and(|fg| fg != self.own) {
            set_foreground(self.own);
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        self.restore();
    }
}

/// `tcsetpgrp(0, pgrp)` with `SIGTTOU` blocked in this thread meanwhile.
/// A failure (the group gone, the terminal not ours) leaves it as it was.
pub fn set_foreground(pgrp: libc::pid_t) {
    // SAFETY: pthread_sigmask on sets that are live locals of this frame,
    // the old mask put back right after; tcsetpgrp takes numbers only.
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
