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
    wait_agent(agent_pid)
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
