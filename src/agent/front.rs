//! The front process: what an interactive shell waits on, so Ctrl-Z gives
//! the shell its prompt back while the lease is still renewed.
//!
//! Why a process of its own: a shell prints its prompt after Ctrl-Z only
//! once the process it waits on (the pid it started, `leaseagent`) stops,
//! and `fg` continues that process's group. But the agent must never stop:
//! it renews the lease, and the job, paused or not, stays guarded. So when
//! the agent runs in the foreground of a terminal it forks first thing
//! (one thread then): the parent, with the pid the shell knows, becomes the
//! front; the child, in a process group of its own, is the agent, which
//! hands the job the terminal (`sys/terminal.rs`).
//!
//! ```text
//!  shell ─waits on─▶ front (shell's job group) ◀─pipe: J pgid, S─ agent (own group) ─▶ keeper ─▶ job (own group, terminal's foreground)
//! ```
//!
//! - Ctrl-Z reaches the job's group (the terminal's foreground); the
//!   keeper sees the job stop and says so, the agent tells the front
//!   (`S`), and the front stops itself (SIGSTOP): the shell shows it
//!   Stopped and takes the terminal. The agent renews on; the keeper's
//!   own deadline stands.
//! - `fg`: the shell gives the front's group the terminal and continues
//!   it; the front, continued after its own stop and in the foreground,
//!   gives the terminal to the job's group (`J` told it which: a host pgid,
//!   the agent looks it up outside the keeper's PID namespace), then sends
//!   SIGCONT to the agent, which relays it to the job. `bg` continues the
//!   job without the terminal. The terminal goes over before the job
//!   resumes, so a job that reads at once is not stopped again by SIGTTIN.
//! - Every other signal the shell sends its job (`kill %1`: SIGTERM, the
//!   shell's SIGHUP on exit, Ctrl-C while the agent acquires) reaches the
//!   front alone, which passes it to the agent: the agent decides, as for
//!   any signal.
//! - The agent's end of the pipe is close-on-exec (neither the keeper nor
//!   the job holds it): end of file means the agent is exiting; the front
//!   reaps it and exits with its status (128+N for a signal), so the shell
//!   sees the agent's exit code. Before it exits, the agent gives the
//!   terminal back to the front's group when the job's group still has it,
//!   and continues the front, so a front stopped at the shell's prompt
//!   ends too (the shell says "Exit N") instead of waiting for `fg`.
//! - An agent that dies without a word (SIGKILL, the OOM killer) gives
//!   nothing back: end of file all the same, and the job's group would
//!   keep the terminal (the keeper SIGKILLs the tree at once; a dead group
//!   keeps it too) until the shell noticed the front's exit. So the front,
//!   once the agent is reaped, takes the terminal for its own group itself
//!   (`tcsetpgrp` with SIGTTOU blocked, as a background process may) when
//!   the job's group has it, or an empty group, or any group but the
//!   shell's (the session leader's) while the job's tree has it as far as
//!   the front knows (since the start or `fg`; not after `S` or `bg`: the
//!   shell's, never taken). Races: the front and the keeper's kill go in
//!   either order, so the front takes it again every 10 ms until no member
//!   of the job's group runs (zombies left to a slow reaper do not count,
//!   nor a process of another session that got the group's id; at most
//!   2 s, the keeper's own bound for a tree that survives SIGKILL): a
//!   member still alive that took it back, or a group the job made (a
//!   shell inside it), loses it again, and no reader of the job's sees
//!   what is typed after the shell's prompt (an agent killed before its
//!   `J` leaves no group to wait for: one take only). Then the front exits
//!   with the agent's status (128+9), and the shell takes the terminal
//!   from the front's group, never from an empty one. After a normal exit this
//!   finds the terminal already the front's (the agent gave it back) and
//!   does nothing.
//! - The front's wait for the agent's end has no deadline: its pipe ends
//!   only with the agent's exit (or `exec`, which it never does).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::sys::terminal;

/// The agent's side: tells the front what the job does.
pub struct FrontLink {
    pipe: std::fs::File,
    front: i32,
    front_group: i32,
    /// The job's process group (host pid), once started.
    job_group: Option<i32>,
}

/// Who this process is after [`split`].
pub enum Role {
    /// No terminal in our foreground (or no fork possible): the agent alone.
    Alone,
    /// The agent, with its front.
    Agent(FrontLink),
    /// The front, done: exit with this status.
    Front(u8),
}

/// Forks the front when the agent runs in the foreground of a terminal.
/// First thing in the agent's life: one thread.
pub fn split() -> Role {
    if !terminal::foreground_terminal() {
        return Role::Alone;
    }
    let Ok((from_agent, to_front)) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
    else {
        return Role::Alone;
    };
    let front_group = terminal::own_group();
    match terminal::fork() {
        Err(_) => Role::Alone,
        Ok(terminal::Forked::Child) => {
            drop(from_agent);
            // Out of the shell's job group: the shell's signals reach the
            // front only, which passes them on.
            let _ = rustix::process::setpgid(None, None);
            Role::Agent(FrontLink {
                pipe: std::fs::File::from(to_front),
                front: rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get()),
                front_group,
                job_group: None,
            })
        }
        Ok(terminal::Forked::Parent(agent)) => {
            drop(to_front);
            Role::Front(run_front(agent, from_agent))
        }
    }
}

impl FrontLink {
    /// The job runs in process group `pgid` (a host pid).
    pub fn job_started(&mut self, pgid: i32) {
        self.job_group = Some(pgid);
        let mut msg = vec![b'J'];
        msg.extend_from_slice(&pgid.to_ne_bytes());
        let _ = self.pipe.write_all(&msg);
    }

    /// The job's leader stopped: the front stops too.
    pub fn job_stopped(&mut self) {
        let _ = self.pipe.write_all(b"S");
    }
}

impl Drop for FrontLink {
    fn drop(&mut self) {
        if let Some(job) = self.job_group
            && terminal::foreground() == Some(job)
        {
            terminal::set_foreground(self.front_group);
        }
        if let Some(front) = rustix::process::Pid::from_raw(self.front) {
            let _ = rustix::process::kill_process(front, rustix::process::Signal::CONT);
        }
    }
}

/// The signals the front passes to the agent (SIGCONT is its own: see the
/// module doc).
const PASSED: [i32; 9] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
];

/// The front's life: pass signals on, stop with the job, hand the
/// terminal to the job on `fg`, and end with the agent's status.
fn run_front(agent: i32, from_agent: OwnedFd) -> u8 {
    let Some(agent_pid) = rustix::process::Pid::from_raw(agent) else {
        return crate::exit::AGENT_FAILED;
    };
    let send = |sig: i32| {
        if let Some(s) = rustix::process::Signal::from_named_raw(sig) {
            let _ = rustix::process::kill_process(agent_pid, s);
        }
    };
    let mut watched: Vec<i32> = PASSED.to_vec();
    watched.push(libc::SIGCONT);
    let wake = UnixStream::pair().and_then(|(r, w)| {
        r.set_nonblocking(true)?;
        for &sig in &watched {
            signal_hook::low_level::pipe::register(sig, w.try_clone()?)?;
        }
        Ok(r)
    });
    let signals = signal_hook::iterator::Signals::new(&watched);
    let (Ok(mut wake), Ok(mut signals)) = (wake, signals) else {
        // Cannot pass signals on: the agent still runs and exits; wait.
        return wait_agent(agent_pid);
    };
    let mut pipe = std::fs::File::from(from_agent);
    let mut job_group: Option<i32> = None;
    let mut stopped = false;
    // Whether the job's tree has the terminal, as far as the front knows:
    // from the start (the job takes it as it starts, maybe before `J`
    // comes), not after `S` (the shell took it) or a `bg`.
    let mut lent = true;
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let (agent_ready, woken) = {
            let a = pipe.as_fd();
            let w = wake.as_fd();
            let mut fds = [
                rustix::event::PollFd::new(&a, rustix::event::PollFlags::IN),
                rustix::event::PollFd::new(&w, rustix::event::PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) => (!fds[0].revents().is_empty(), !fds[1].revents().is_empty()),
                Err(_) => (false, true),
            }
        };
        if woken {
            let mut buf = [0u8; 64];
            while matches!(wake.read(&mut buf), Ok(n) if n > 0) {}
            for sig in signals.pending() {
                if sig == libc::SIGCONT {
                    // Continued after our own stop, and in the foreground
                    // (`fg`, not `bg`): the job's group gets the terminal
                    // before the job goes on.
                    if std::mem::take(&mut stopped)
                        && terminal::foreground() == Some(terminal::own_group())
                        && let Some(job) = job_group
                    {
                        terminal::set_foreground(job);
                    }
                    // Lent again after `fg` (the job's), not after `bg`
                    // (the shell's).
                    lent = terminal::foreground().is_some_and(|fg| {
                        fg != terminal::own_group() && fg != terminal::own_session()
                    });
                }
                send(sig);
            }
        }
        if agent_ready {
            let mut buf = [0u8; 64];
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
            while let Some(&kind) = pending.first() {
                match kind {
                    b'J' if pending.len() >= 5 => {
                        let b = [pending[1], pending[2], pending[3], pending[4]];
                        job_group = Some(i32::from_ne_bytes(b));
                        pending.drain(..5);
                    }
                    b'J' => break,
                    b'S' => {
                        pending.drain(..1);
                        stopped = true;
                        lent = false;
                        // The shell sees us stopped and prints its prompt;
                        // `fg` continues us (SIGCONT, above).
                        let _ = rustix::process::kill_process(
                            rustix::process::getpid(),
                            rustix::process::Signal::STOP,
                        );
                    }
                    _ => {
                        pending.drain(..1);
                    }
                }
            }
        }
    }
    let status = wait_agent(agent_pid);
    take_back_terminal(job_group, lent);
    status
}

/// How long the front, its agent gone, waits for the job's group to be
/// gone (the keeper SIGKILLs the tree at once when its agent dies): the
/// keeper's own bound for a tree that survives SIGKILL.
const JOB_GONE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The agent is gone: the terminal back to the front's group if the job's
/// tree may still have it, then again until no member of the job's group
/// runs (or [`JOB_GONE_WAIT`]), so no dying member of it takes it back
/// or reads what is typed next. See the module doc.
fn take_back_terminal(job_group: Option<i32>, lent: bool) {
    let take = || {
        if should_take(
            terminal::foreground(),
            terminal::own_group(),
            terminal::own_session(),
            job_group,
            lent,
            group_alive,
        ) {
            terminal::set_foreground(terminal::own_group());
        }
    };
    take();
    let until = std::time::Instant::now() + JOB_GONE_WAIT;
    while let Some(job) = job_group
        && group_alive(job)
        && std::time::Instant::now() < until
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
        take();
    }
    take();
}

/// Whether group `pgrp` has a member that may still run: one that is no
/// zombie (a zombie neither reads nor takes the terminal; its reaper may
/// be slow), in the front's session (the job's is; a group id reused by
/// another session's process is not the job's).
fn group_alive(pgrp: i32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pgrp) else {
        return false;
    };
    if let Err(rustix::io::Errno::SRCH) = rustix::process::test_kill_process_group(p) {
        return false;
    }
    let session = terminal::own_session();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    dir.flatten().any(|e| {
        e.file_name()
            .to_str()
            .is_some_and(|n| n.parse::<u32>().is_ok())
            && std::fs::read_to_string(e.path().join("stat"))
                .is_ok_and(|st| runs_in(&st, pgrp, session))
    })
}

/// Whether a `/proc/PID/stat` text is of a process in group `pgrp` and
/// session `session` that is not a zombie (state `Z` or `X`).
fn runs_in(stat: &str, pgrp: i32, session: i32) -> bool {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let f: Vec<&str> = rest.split_whitespace().take(4).collect();
    matches!(
        f.as_slice(),
        [state, _, g, s] if !matches!(*state, "Z" | "X")
            && g.parse() == Ok(pgrp)
            && s.parse() == Ok(session)
    )
}

/// Whether the front takes the terminal for its group `own`, the
/// terminal's foreground being `fg` (`None`: none we can see), in session
/// `session` (the shell's group), the job's group `job` if `J` told it,
/// `lent` whether the job's tree has had it since its start or `fg`. Never
/// from the shell (`bg`, or its prompt after a stop), nor when it is the
/// front's already; always from the job's group or an empty group; from
/// any other while lent (a group the job made, e.g. a shell inside it).
fn should_take(
    fg: Option<i32>,
    own: i32,
    session: i32,
    job: Option<i32>,
    lent: bool,
    alive: impl Fn(i32) -> bool,
) -> bool {
    match fg {
        None => lent,
        Some(fg) if fg == own || fg == session => false,
        Some(fg) => job == Some(fg) || lent || !alive(fg),
    }
}

/// The agent's exit status, as a shell would give it.
fn wait_agent(agent: rustix::process::Pid) -> u8 {
    loop {
        match rustix::process::waitpid(Some(agent), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => {
                if let Some(code) = status.exit_status() {
                    return code as u8;
                }
                if let Some(sig) = status.terminating_signal() {
                    return 128u8.saturating_add(sig as u8);
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            _ => return crate::exit::AGENT_FAILED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::should_take;

    const OWN: i32 = 100;
    const SHELL: i32 = 50;
    const JOB: i32 = 200;

    fn take(fg: Option<i32>, job: Option<i32>, lent: bool, alive: bool) -> bool {
        should_take(fg, OWN, SHELL, job, lent, |_| alive)
    }

    #[test]
    fn the_job_group_loses_the_terminal_alive_or_dead_lent_or_not() {
        for (lent, alive) in [(true, true), (true, false), (false, true), (false, false)] {
            assert!(take(Some(JOB), Some(JOB), lent, alive), "{lent} {alive}");
        }
    }

    #[test]
    fn before_j_a_lent_terminal_is_taken_from_whichever_group_has_it() {
        assert!(take(Some(JOB), None, true, true));
        assert!(take(Some(300), Some(JOB), true, true));
        assert!(take(None, None, true, true));
    }

    #[test]
    fn the_shell_and_the_front_keep_it() {
        for (lent, alive) in [(true, true), (true, false), (false, true), (false, false)] {
            assert!(!take(Some(SHELL), Some(JOB), lent, alive));
            assert!(!take(Some(OWN), Some(JOB), lent, alive));
        }
    }

    #[test]
    fn a_zombie_or_another_session_s_process_does_not_keep_a_group_alive() {
        let stat = |state: &str, g: i32, s: i32| {
            format!("7 (sh) a) {state} 1 {g} {s} 34816 7 0 0 0 0 0 0 0 0 20 0 1 0")
        };
        assert!(super::runs_in(&stat("S", JOB, SHELL), JOB, SHELL));
        assert!(super::runs_in(&stat("T", JOB, SHELL), JOB, SHELL));
        assert!(!super::runs_in(&stat("Z", JOB, SHELL), JOB, SHELL));
        assert!(!super::runs_in(&stat("X", JOB, SHELL), JOB, SHELL));
        assert!(!super::runs_in(&stat("S", JOB, 9), JOB, SHELL));
        assert!(!super::runs_in(&stat("S", 9, SHELL), JOB, SHELL));
        assert!(!super::runs_in("garbage", JOB, SHELL));
    }

    #[test]
    fn not_lent_only_an_empty_group_loses_it() {
        assert!(!take(Some(300), Some(JOB), false, true));
        assert!(take(Some(300), Some(JOB), false, false));
        assert!(!take(None, Some(JOB), false, true));
    }
}
