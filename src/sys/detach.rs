//! What a process forked off the agent needs to live apart from it (the
//! scribe, `agent/scribe`): its own session, no terminal or standard
//! streams of the agent's, no descriptor but the ones it serves, and deaf
//! to the signals meant for the agent.
//!
//! Why each:
//! - A descriptor kept by mistake is a pipe someone waits on: the front's
//!   link (its end of file is how the front learns the agent is gone), a
//!   caller's `$(leaseagent …)` reading stdout to its end, a socket a
//!   service manager passed. A scribe asleep on a frozen filesystem would
//!   hold them all past the agent's exit.
//! - Its own session: a terminal's hangup and Ctrl-C, and a `kill` of the
//!   agent's process group, reach the agent, which decides; the scribe
//!   serves the agent's release after a SIGTERM, so it must not die of
//!   that SIGTERM itself (`systemctl stop` signals every process of the
//!   unit at once).
//!
//! The `unsafe` here (closing descriptors by number, `_exit`, setting a
//! signal's disposition) is only ever called in the forked child, on its
//! way to a life that never returns to the code that owned those numbers.

use std::os::fd::RawFd;

/// The signals the scribe ignores: it ends when the agent's side of its
/// sockets closes, never on a signal meant for the agent.
const IGNORED: [i32; 8] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGPIPE,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
];

/// Detaches the calling (forked, single-threaded) process: a new session,
/// `/dev/null` for its standard streams, every other descriptor but
/// `keep` closed, the agent's signals ignored.
///
/// Call only in a freshly forked child that will never return into the
/// code that owns the closed descriptors' Rust objects (it ends with
/// [`exit_now`]).
pub fn detach(keep: &[RawFd]) -> std::io::Result<()> {
    let _ = rustix::process::setsid();
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    drop(null);
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open {
        if fd > 2 && !keep.contains(&fd) {
            // SAFETY: this process is a fork that never returns to the
            // code owning these numbers (see the function's doc): no
            // object will use or close them again. A number that was the
            // directory listing's own, already closed, fails with EBADF.
            unsafe {
                libc::close(fd);
            }
        }
    }
    for sig in IGNORED {
        // SAFETY: SIG_IGN is a valid disposition for each of these
        // catchable signals; the process has one thread.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    Ok(())
}

/// Runs `body` in a child process of its own, detached ([`detach`],
/// keeping `keep`); returns its pid. One fork, not two: a double fork
/// (the middle process exiting at once so that init adopts the child)
/// cost the agent's start-up a second fork and a wait, and an agent that
/// is itself an init or a subreaper would adopt the child all the same.
/// The caller counts it out where it counts its children
/// (`keeper/handle.rs`).
///
/// Only while the caller has one thread (checked: [`super::terminal::fork`]).
pub fn spawn_child(keep: &[RawFd], body: impl FnOnce() -> i32) -> std::io::Result<i32> {
    use super::terminal::{Forked, fork};
    match fork()? {
        Forked::Parent(pid) => Ok(pid),
        Forked::Child => {
            if detach(keep).is_err() {
                exit_now(1);
            }
            exit_now(body())
        }
    }
}

/// Ends the calling process at once with `code`, running no exit handlers
/// and flushing no buffer: a forked child must not flush or tear down the
/// parent's copies (stdio buffers, atexit handlers).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` only ends the process.
    unsafe { libc::_exit(code) }
}
