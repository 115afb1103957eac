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

/// Runs `body` in a process of its own, detached ([`detach`], keeping
/// `keep`) and not a child of the caller: forked twice, the middle process
/// ending at once, so the caller never has it to reap and, once orphaned,
/// it goes to the nearest subreaper above the caller or to init (the agent
/// proves its job's tree gone by having no child left). The one exception:
/// a caller that is itself an init (PID 1 of a namespace, a container's
/// first process) or a subreaper adopts it. Returns its pid, which the
/// middle process passes up a pipe before it exits.
///
/// Only while the caller has one thread (checked: [`super::terminal::fork`]).
pub fn spawn_detached(keep: &[RawFd], body: impl FnOnce() -> i32) -> std::io::Result<i32> {
    use super::terminal::{Forked, fork};
    use std::io::{Read, Write};
    let (from_middle, to_parent) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    match fork()? {
        Forked::Parent(middle) => {
            drop(to_parent);
            let middle = rustix::process::Pid::from_raw(middle)
                .ok_or_else(|| std::io::Error::other("fork answered pid 0"))?;
            // The middle process forks once and exits: this wait is as
            // long as one fork.
            loop {
                match rustix::process::waitpid(Some(middle), rustix::process::WaitOptions::empty())
                {
                    Err(rustix::io::Errno::INTR) => {}
                    Ok(Some((_, status))) if status.exit_status() == Some(0) => break,
                    Ok(_) => return Err(std::io::Error::other("the forked process failed")),
                    Err(e) => return Err(e.into()),
                }
            }
            // Written before the middle exited: there, or never.
            let mut pid = [0u8; 4];
            std::fs::File::from(from_middle).read_exact(&mut pid)?;
            Ok(i32::from_ne_bytes(pid))
        }
        Forked::Child => {
            drop(from_middle);
            match fork() {
                Ok(Forked::Parent(pid)) => {
                    let sent = std::fs::File::from(to_parent).write_all(&pid.to_ne_bytes());
                    exit_now(if sent.is_ok() { 0 } else { 1 })
                }
                Ok(Forked::Child) => {
                    drop(to_parent);
                    if detach(keep).is_err() {
                        exit_now(1);
                    }
                    exit_now(body())
                }
                Err(_) => exit_now(1),
            }
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
