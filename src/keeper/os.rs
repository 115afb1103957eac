//! The keeper's loop and the system, apart: [`Os`] is everything the loop
//! (`event_loop.rs`) asks of the kernel (reap, signal the tree, cgroup.kill,
//! the ctl pipe, the deadline timer, the report pipe, the clock), one method
//! each; [`System`] is the real one. The loop keeps every decision (what
//! the reports say, when a kill round is due, what the agent's commands and
//! the guard mean), so unit tests drive it through a fake without a single
//! process, as the agent's machine is driven without one.
//!
//! What stays behind the seam, and why it is not the loop's business:
//! - how the tree is found and signalled (`tree.rs`: pidfds, parents
//!   re-checked) and the cgroup's members (`cgroup.rs`);
//! - `waitpid(-1, WNOHANG | WUNTRACED)` and how a wait status becomes a
//!   [`ChildStatus`] (or a stop, reported once per stop by the kernel);
//! - the `poll` on the SIGCHLD self-pipe, the timerfd and the ctl socket,
//!   and draining the first two;
//! - how the tree is stopped in one operation where it can be: `kill(-1)`
//!   from the init of the job's PID namespace (every process of it but the
//!   keeper; no walk), `cgroup.kill` through a descriptor opened at start;
//! - how the tree is sampled for the kill lead ([`Os::sample`]).
//!
//! Resource failures are not news about the agent or the tree: a `poll`
//! that fails (EINVAL once `RLIMIT_NOFILE` is below its descriptor count,
//! ENOMEM) is a [`Woken::failed`], which the loop answers by stopping the
//! tree now; an unreadable `cgroup.events` is never "empty"; only ECHILD is
//! "no child left".

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::process::WaitOptions;

use crate::exit::ChildStatus;
use crate::keeper::cgroup::JobCgroup;
use crate::keeper::protocol::{Report, Survival};
use crate::keeper::tree;
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;
use crate::time::deadline::TreeSize;

/// What one reap found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reaped {
    /// A child ended (and is reaped now).
    Ended { pid: i32, status: ChildStatus },
    /// A child stopped (it is still there).
    Stopped { pid: i32 },
    /// Children are left, none has ended.
    Running,
    /// No child is left below the keeper (`ECHILD`).
    NoChild,
}

/// What woke a wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woken {
    /// The ctl socket has bytes (or its end) to read.
    pub ctl: bool,
    /// The wait itself failed (a resource failure: EINVAL from a lowered
    /// `RLIMIT_NOFILE`, ENOMEM): the keeper can no longer watch, so it
    /// stops the tree now. Never taken for the agent's end.
    pub failed: bool,
}

/// A process of the tree that outlived SIGKILL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Survivor {
    pub pid: i32,
    pub command: String,
    pub why: Survival,
}

/// Everything the keeper's loop asks of the system.
pub trait Os {
    /// Now, on `CLOCK_BOOTTIME` (the clock of the agent's deadlines).
    fn now(&self) -> BootInstant;
    /// Reaps one child that ended, never waiting.
    fn reap(&mut self) -> Reaped;
    /// Whether the job's cgroup, if there is one, has no member left.
    fn cgroup_empty(&self) -> bool;
    /// One try at removing the (empty) job cgroup; whether it is gone.
    fn remove_cgroup(&mut self) -> bool;
    /// `sig` to every descendant (`leader`, unreaped, without a check) and
    /// to every member of the job's cgroup.
    fn signal_tree(&mut self, sig: Sig, leader: Option<i32>);
    /// `sig` to the descendants in process group `pgid`.
    fn relay(&mut self, sig: Sig, pgid: i32, leader: Option<i32>);
    /// One round of SIGKILL: `cgroup.kill`, then every descendant. `Err`:
    /// `cgroup.kill` failed (the walk went on), in words.
    fn kill_tree(&mut self, leader: Option<i32>) -> Result<(), String>;
    /// Every process still below the keeper or in its cgroup, and why it
    /// lives.
    fn survivors(&mut self) -> Vec<Survivor>;
    /// What the agent queued on the ctl pipe, never waiting; and whether
    /// the pipe ended (the agent is gone).
    fn read_ctl(&mut self) -> (Vec<u8>, bool);
    /// No more reading the ctl pipe (its end, `Done`, or a failed wait).
    fn close_ctl(&mut self);
    /// The deadline timer fires at `at` (an absolute time); `None` disarms.
    fn set_timer(&mut self, at: Option<BootInstant>);
    /// Queues a report for the agent.
    fn report(&mut self, report: Report);
    /// Writes the queued reports, in one write.
    fn flush(&mut self);
    /// Waits for a child's end, a ctl byte, the timer, or `until`.
    fn wait(&mut self, until: Option<BootInstant>) -> Woken;
    /// The tree's size now, for the kill lead; `None`: not sampled (the
    /// loop then stops asking).
    fn sample(&mut self) -> Option<TreeSize>;
}

/// The report pipe; once the agent is gone, reports go to stderr instead.
///
/// Reports are queued and written together before the keeper next waits
/// ([`Reporter::flush`], and on drop): the pipe is unbuffered, and every
/// write wakes the agent's reader, so the reports of one step (the job's
/// start and where it runs; its exit and the tree's end) cost one wake-up,
/// not one per report or per formatted piece.
pub struct Reporter {
    pipe: Option<std::fs::File>,
    queued: Vec<Report>,
}

impl Reporter {
    pub fn new(pipe: std::fs::File) -> Self {
        Reporter {
            pipe: Some(pipe),
            queued: Vec::new(),
        }
    }

    pub fn send(&mut self, r: &Report) {
        self.queued.push(r.clone());
    }

    /// Writes what is queued, in one write.
    pub fn flush(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let reports = std::mem::take(&mut self.queued);
        if let Some(p) = self.pipe.as_mut() {
            let text: String = reports.iter().map(|r| format!("{r}\n")).collect();
            if p.write_all(text.as_bytes()).is_ok() {
                return;
            }
            self.pipe = None;
        }
        for r in &reports {
            match r {
                Report::Survivor { pid, command, why } => stderr_line(&format!(
                    "leaseagent: keeper: error: process {pid} ({}) is still alive: {}",
                    crate::escape::escape(command),
                    why.describe()
                )),
                Report::Warning(m) => stderr_line(&format!(
                    "leaseagent: keeper: warn: {}",
                    crate::escape::escape(m)
                )),
                _ => {}
            }
        }
    }
}

/// At most this much of one line goes to stderr: `PIPE_BUF`, what a pipe
/// with room takes in one write.
const STDERR_LINE_MAX: usize = 4096;

/// One line to stderr, best effort: written only if stderr takes it now
/// (`poll` says writable), in one write that does not wait for room
/// ([`write_now`]), and any failure ignored.
///
/// Why not `eprintln!`: once the agent is gone the keeper is the job's last
/// guardian, and `eprintln!` panics when the write fails (EPIPE on a pipe
/// whose reader is gone; the release build aborts with SIGABRT), leaving
/// the tree and its cgroup behind. Nor may it block on a full pipe or a
/// stopped terminal past the deadline. SIGPIPE is ignored (Rust's runtime
/// does it before `main`; the job gets it back at `exec`), so EPIPE is an
/// error here, not a death. A job that fills the pipe between the poll and
/// the write does not make the write block either: [`write_now`].
pub fn stderr_line(text: &str) {
    use std::os::fd::AsFd;
    let line = line_bytes(text);
    let err = std::io::stderr();
    let fd = err.as_fd();
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::OUT,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut fds, Some(&zero)) {
        Ok(1) if fds[0].revents().contains(rustix::event::PollFlags::OUT) => {
            write_now(fd, &line);
        }
        _ => {}
    }
}

/// One write of `line` to `fd` that never waits for room:
/// `pwritev2(RWF_NOWAIT)` at the current offset, which a pipe or a socket
/// answers with EAGAIN when full (a job that shares the pipe may have
/// filled it since the poll) instead of blocking. `O_NONBLOCK` would do
/// the same, but it is a flag of the open file description, which the job
/// shares: the job would see EAGAIN on its own stderr. Where the file does
/// not take the flag (a terminal; a regular file, whose writes never wait
/// for a reader), or a kernel before it, a plain write after the poll.
fn write_now(fd: std::os::fd::BorrowedFd<'_>, line: &[u8]) {
    use rustix::io::{Errno, ReadWriteFlags};
    // `u64::MAX`: the current offset, as a plain write.
    let written = rustix::io::pwritev2(
        fd,
        &[std::io::IoSlice::new(line)],
        u64::MAX,
        ReadWriteFlags::NOWAIT,
    );
    if let Err(Errno::OPNOTSUPP | Errno::INVAL | Errno::NOSYS) = written {
        let _ = rustix::io::write(fd, line);
    }
}

/// `text` and a newline, cut to [`STDERR_LINE_MAX`] bytes (the newline kept).
fn line_bytes(text: &str) -> Vec<u8> {
    let mut line: Vec<u8> = text.as_bytes().to_vec();
    line.truncate(STDERR_LINE_MAX - 1);
    line.push(b'\n');
    line
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The real system: the keeper's channels, its SIGCHLD self-pipe, its
/// deadline timer and the job's cgroup.
pub struct System {
    me: i32,
    out: Reporter,
    /// `None` once closed.
    ctl: Option<std::fs::File>,
    sigchld: UnixStream,
    /// Fires at the guard's next time (`CLOCK_BOOTTIME`, absolute).
    timer: OwnedFd,
    cgroup: Option<JobCgroup>,
    /// The keeper is PID 1 of the job's PID namespace.
    pidns: bool,
    /// `/proc/thread-self/children`, opened at start (the kill path that
    /// needs no new descriptor).
    children: Option<OwnedFd>,
}

impl System {
    pub fn new(
        out: Reporter,
        ctl: OwnedFd,
        sigchld: UnixStream,
        timer: OwnedFd,
        cgroup: Option<JobCgroup>,
        children: Option<OwnedFd>,
    ) -> Self {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        System {
            me,
            out,
            ctl: Some(std::fs::File::from(ctl)),
            sigchld,
            timer,
            cgroup,
            pidns: me == 1,
            children,
        }
    }

    /// `sig` to every process of the keeper's PID namespace but the keeper:
    /// one system call, nothing to walk (only for the namespace's init).
    fn signal_namespace(&self, sig: rustix::process::Signal) {
        if self.pidns {
            let _ = kill_all_in_namespace(sig);
        }
    }

    /// After the loop: a cgroup that could not be removed at once (a
    /// just-reaped member still counted) is removed now, retried briefly.
    pub fn finish(self) {
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
    }

    /// Empties the SIGCHLD self-pipe (the reap comes next round).
    fn drain_sigchld(&self) {
        let mut buf = [0u8; 64];
        let mut r = &self.sigchld;
        while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
    }
}

impl Os for System {
    fn now(&self) -> BootInstant {
        BootInstant::now()
    }

    fn reap(&mut self) -> Reaped {
        loop {
            match rustix::process::wait(WaitOptions::NOHANG | WaitOptions::UNTRACED) {
                Ok(Some((pid, status))) if status.stopped() => {
                    let pid = pid.as_raw_nonzero().get();
                    return Reaped::Stopped { pid };
                }
                Ok(Some((pid, status))) => {
                    let status = match (status.exit_status(), status.terminating_signal()) {
                        (Some(code), _) => ChildStatus::Exited(code),
                        (None, Some(sig)) => ChildStatus::Signaled(sig),
                        (None, None) => ChildStatus::Exited(255),
                    };
                    let pid = pid.as_raw_nonzero().get();
                    return Reaped::Ended { pid, status };
                }
                Ok(None) => return Reaped::Running,
                Err(rustix::io::Errno::INTR) => {}
                // ECHILD: nothing left below us.
                Err(rustix::io::Errno::CHILD) => return Reaped::NoChild,
                // Anything else proves nothing: children may be left.
                Err(_) => return Reaped::Running,
            }
        }
    }

    fn cgroup_empty(&self) -> bool {
        // Unreadable (EMFILE cannot happen on the open descriptor, but any
        // error) is never taken for empty.
        self.cgroup
            .as_ref()
            .is_none_or(|cg| cg.populated() == Some(false))
    }

    fn remove_cgroup(&mut self) -> bool {
        if self.cgroup.as_ref().is_some_and(|cg| cg.try_remove()) {
            self.cgroup = None;
        }
        self.cgroup.is_none()
    }

    fn signal_tree(&mut self, sig: Sig, leader: Option<i32>) {
        let sig = sig.to_rustix();
        if self.pidns {
            // The whole namespace is the tree.
            self.signal_namespace(sig);
            return;
        }
        let done: HashSet<i32> = tree::signal_all(self.me, sig, None, leader)
            .into_iter()
            .collect();
        if let Some(cg) = &self.cgroup {
            for pid in cg.pids() {
                if !done.contains(&pid) {
                    cg.signal_member(pid, sig);
                }
            }
        }
    }

    fn relay(&mut self, sig: Sig, pgid: i32, leader: Option<i32>) {
        tree::signal_all(self.me, sig.to_rustix(), Some(pgid), leader);
    }

    fn kill_tree(&mut self, leader: Option<i32>) -> Result<(), String> {
        let mut result = Ok(());
        // One operation each where there is one: the namespace, the cgroup.
        self.signal_namespace(rustix::process::Signal::KILL);
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.kill() {
                result = Err(format!("cgroup.kill in {} failed: {e}", cg.dir().display()));
            }
        }
        if !self.pidns {
            tree::kill_all(self.me, leader);
        }
        // Whatever the walk could not open (EMFILE): our own children, by
        // pid, through the descriptor opened at start.
        if let Some(children) = &self.children {
            tree::kill_own_children(children);
        }
        result
    }

    fn survivors(&mut self) -> Vec<Survivor> {
        // Every process still below us, killed or not (one it may not
        // signal, EPERM, was never killed).
        let mut pids: Vec<i32> = tree::descendants(self.me).iter().map(|p| p.pid).collect();
        if let Some(cg) = &self.cgroup {
            pids.extend(cg.pids());
        }
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter()
            .map(|pid| Survivor {
                pid,
                command: tree::command_of(pid),
                why: tree::why_alive(pid),
            })
            .collect()
    }

    fn read_ctl(&mut self) -> (Vec<u8>, bool) {
        let mut bytes = Vec::new();
        let Some(ctl) = self.ctl.as_mut() else {
            return (bytes, false);
        };
        let mut buf = [0u8; 4096];
        loop {
            match ctl.read(&mut buf) {
                Ok(0) => return (bytes, true),
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return (bytes, false),
                Err(_) => return (bytes, true),
            }
        }
    }

    fn close_ctl(&mut self) {
        self.ctl = None;
    }

    fn set_timer(&mut self, at: Option<BootInstant>) {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        let ts = |d: Duration| Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        };
        let spec = Itimerspec {
            it_interval: ts(Duration::ZERO),
            // Zero disarms; an absolute time in the past fires at once.
            it_value: at.map_or(ts(Duration::ZERO), |t| {
                ts(t.since_boot().max(Duration::from_micros(1)))
            }),
        };
        let _ = timerfd_settime(&self.timer, TimerfdTimerFlags::ABSTIME, &spec);
    }

    fn report(&mut self, report: Report) {
        self.out.send(&report);
    }

    fn flush(&mut self) {
        self.out.flush();
    }

    fn wait(&mut self, until: Option<BootInstant>) -> Woken {
        let timeout = until.map(|u| {
            let d = BootInstant::now().until(u);
            rustix::event::Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: i64::from(d.subsec_nanos()),
            }
        });
        let mut fds = Vec::with_capacity(3);
        fds.push(PollFd::new(&self.sigchld, PollFlags::IN));
        // The deadline timer wakes the poll; the loop then asks the guard.
        fds.push(PollFd::new(&self.timer, PollFlags::IN));
        if let Some(c) = &self.ctl {
            fds.push(PollFd::from_borrowed_fd(c.as_fd(), PollFlags::IN));
        }
        let failed = match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => false,
            Err(_) => true,
        };
        if failed {
            drop(fds);
            // No poll (EINVAL under a lowered RLIMIT_NOFILE, ENOMEM): wait
            // without one, for the loop's next time or briefly, so the loop
            // goes on (reaping, kill rounds) without spinning.
            let pause = until.map_or(FAILED_POLL_PAUSE, |u| {
                BootInstant::now().until(u).min(FAILED_POLL_PAUSE)
            });
            let _ = rustix::thread::nanosleep(&rustix::thread::Timespec {
                tv_sec: 0,
                tv_nsec: i64::from(pause.max(Duration::from_millis(1)).subsec_nanos()),
            });
            return Woken {
                ctl: self.ctl.is_some(),
                failed: true,
            };
        }
        let chld_ready = !fds[0].revents().is_empty();
        let timer_ready = !fds[1].revents().is_empty();
        let ctl = fds.get(2).is_some_and(|f| !f.revents().is_empty());
        drop(fds);
        if timer_ready {
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(&self.timer, &mut buf);
        }
        if chld_ready {
            self.drain_sigchld();
        }
        Woken { ctl, failed }
    }

    fn sample(&mut self) -> Option<TreeSize> {
        let pids: Vec<i32> = if self.pidns {
            // Every process of the namespace but the keeper.
            std::fs::read_dir("/proc")
                .ok()?
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|&p| p != self.me)
                .collect()
        } else {
            tree::descendants(self.me).iter().map(|p| p.pid).collect()
        };
        let page = rustix::param::page_size() as u64;
        let private_pages: u64 = pids.iter().map(|&p| private_pages(p)).sum();
        Some(TreeSize {
            procs: u32::try_from(pids.len()).unwrap_or(u32::MAX),
            private_bytes: private_pages.saturating_mul(page),
            busy_milli: busy_milli(),
            // The loop's own measure (`keeper/lateness.rs`), not the OS's.
            late_us: 0,
        })
    }
}

/// The host's 1-minute load average per online CPU, times 1,000 (0 when
/// unreadable): a dying process waits for a CPU to tear itself down, so a
/// busy host takes longer to reap a killed tree (`deadline::kill_lead`).
fn busy_milli() -> u32 {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_cpu = load / cpus as f64 * 1000.0;
    if per_cpu.is_finite() && per_cpu > 0.0 {
        per_cpu.min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// How long a wait without `poll` lasts at most.
const FAILED_POLL_PAUSE: Duration = Duration::from_millis(10);

/// `kill(-1, sig)`: from the init of a PID namespace, every other process
/// of the namespace.
fn kill_all_in_namespace(sig: rustix::process::Signal) -> rustix::io::Result<()> {
    crate::sys::keeper_spawn::kill_every_other(sig)
}

/// A process's resident pages less its shared ones (`/proc/PID/statm`):
/// roughly its anonymous memory, what the kernel frees page by page when
/// it dies. 0 for a process gone meanwhile.
fn private_pages(pid: i32) -> u64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/statm")) else {
        return 0;
    };
    let mut f = text.split_whitespace().skip(1);
    let resident: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let shared: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    resident.saturating_sub(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe nobody reads, filled to the last byte: the write of a whole
    /// line returns at once (EAGAIN, nothing written) instead of blocking,
    /// and the pipe's open file description stays blocking for the job.
    #[test]
    fn a_line_to_a_full_pipe_never_blocks() {
        use std::os::fd::AsFd;
        let (reader, writer) = rustix::pipe::pipe().unwrap();
        // Fill it through a second, non-blocking description of the same
        // pipe (as a job writing to the shared stderr would).
        let filler = rustix::fs::open(
            format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&writer)),
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::NONBLOCK,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let chunk = [b'x'; 4096];
        while rustix::io::write(filler.as_fd(), &chunk).is_ok() {}
        let one = [b'x'; 1];
        while rustix::io::write(filler.as_fd(), &one).is_ok() {}
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let w = writer.try_clone().unwrap();
        std::thread::spawn(move || {
            write_now(w.as_fd(), &line_bytes(&"y".repeat(5000)));
            let _ = done_tx.send(());
        });
        let answered = done_rx.recv_timeout(std::time::Duration::from_secs(10));
        let flags = rustix::fs::fcntl_getfl(&writer).unwrap();
        drop(reader);
        assert!(answered.is_ok(), "the write blocked on a full pipe");
        assert!(!flags.contains(rustix::fs::OFlags::NONBLOCK));
    }

    /// With room, the line goes out whole.
    #[test]
    fn a_line_to_a_pipe_with_room_is_written_whole() {
        use std::os::fd::AsFd;
        let (reader, writer) = rustix::pipe::pipe().unwrap();
        write_now(writer.as_fd(), &line_bytes("agent_died"));
        let mut buf = [0u8; 64];
        let n = rustix::io::read(&reader, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"agent_died\n");
    }

    #[test]
    fn a_stderr_line_ends_in_a_newline_and_fits_one_pipe_write() {
        assert_eq!(line_bytes("agent_died"), b"agent_died\n".to_vec());
        let long = line_bytes(&"x".repeat(10_000));
        assert_eq!(long.len(), STDERR_LINE_MAX);
        assert_eq!(long.last(), Some(&b'\n'));
    }
}
