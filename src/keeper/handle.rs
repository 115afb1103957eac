//! The agent's side of the keeper: starting it, asking it to stop the job's
//! tree, and turning its reports into events.
//!
//! Stops go to the keeper, which signals the whole tree (see `keeper/mod.rs`):
//! SIGTERM and SIGKILL reach every descendant whatever its group or
//! session, and relayed signals reach the members of the job's group. The
//! ctl pipe is non-blocking on our side, so a frozen keeper can never block
//! the supervisor loop. After every grant and renewal the keeper gets the
//! deadline ([`Keeper::arm`]) and enforces it alone if need be.
//!
//! The agent keeps the keeper honest. With every SIGTERM and SIGKILL it
//! sends the keeper SIGCONT (through a pidfd: the keeper is our unreaped
//! child, so the pidfd is the keeper), and with SIGKILL it also walks the
//! tree itself, from its own pid down (the agent is a child subreaper too:
//! if the keeper dies, its orphans re-parent to the agent, and the walk
//! still finds them), sparing only the keeper. Each process is signalled
//! through a pidfd whose parent is checked after the open (`keeper::tree`),
//! so the agent never signals a bare pid or process group that may have
//! been reaped and reused.
//!
//! The report pipe is read on a thread of its own; this module never waits
//! on a process itself (except the bounded reap of the keeper at the end),
//! so the supervisor loop cannot block on the job.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use rustix::event::{PollFd, PollFlags};
use rustix::io::{FdFlags, fcntl_setfd};
use rustix::pipe::{PipeFlags, pipe_with};
use std::os::fd::OwnedFd;

use rustix::process::{Pid, PidfdFlags, Signal};

use crate::keeper::KEEPER_ARG;
use crate::keeper::protocol::{Arm, Command as Ctl, Report};
use crate::sys::signal::Sig;
use crate::time::deadline::Deadline;

/// What the report reader has learnt, shared with the handle.
#[derive(Default)]
struct Seen {
    /// The job's pid (= its process group id), 0 until started.
    job_pid: AtomicI32,
    /// The keeper reported the whole tree gone.
    tree_gone: AtomicBool,
}

/// The running keeper.
pub struct Keeper {
    child: Child,
    /// The keeper itself, for SIGCONT; opened while it is our unreaped child.
    pidfd: Option<OwnedFd>,
    ctl: Option<std::fs::File>,
    seen: Arc<Seen>,
}

/// What the agent hears from its keeper: the reports that change the run
/// (the others, survivors and notes, are logged by the reader), and the
/// report pipe's end without `TreeGone` (the keeper died).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum News {
    Report(Report),
    Lost,
}

/// A keeper started before the grant, waiting for the job's environment
/// ([`Pending::start`]). Its start-up (an `exec` of this binary, its
/// handlers, session, subreaper and job cgroup) runs on the other CPU while
/// the agent acquires, instead of after the grant, on the way to the job.
/// Dropped without `start`, it sees its ctl pipe close and exits; no job
/// ever runs.
pub struct Pending {
    child: Child,
    pidfd: Option<OwnedFd>,
    ctl: std::fs::File,
    reports: std::fs::File,
}

/// Starts the keeper for `command`, with `env_remove` taken out of the
/// agent's environment; it waits for [`Pending::start`] before it starts
/// the job, as `options` say.
pub fn prestart_keeper(
    command: &[OsString],
    env_remove: &[String],
    options: &crate::keeper::JobOptions,
) -> std::io::Result<Pending> {
    let (ctl_r, ctl_w) = pipe_with(PipeFlags::CLOEXEC)?;
    let (rep_r, rep_w) = pipe_with(PipeFlags::CLOEXEC)?;
    // Only the keeper's ends are inherited, and only by this one spawn: the
    // agent starts no other process.
    fcntl_setfd(&ctl_r, FdFlags::empty())?;
    fcntl_setfd(&rep_w, FdFlags::empty())?;
    // Our end never blocks: a stopped keeper cannot stall the loop.
    rustix::fs::fcntl_setfl(&ctl_w, rustix::fs::OFlags::NONBLOCK)?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("leaseagent-keeper")
        .arg(KEEPER_ARG)
        .arg(ctl_r.as_raw_fd().to_string())
        .arg(rep_w.as_raw_fd().to_string())
        .args(options.to_args())
        .arg("--")
        .args(command);
    for k in env_remove {
        cmd.env_remove(k);
    }
    let child = cmd.spawn()?;
    let pidfd = i32::try_from(child.id())
        .ok()
        .and_then(Pid::from_raw)
        .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
    drop(ctl_r);
    drop(rep_w);
    Ok(Pending {
        child,
        pidfd,
        ctl: std::fs::File::from(ctl_w),
        reports: std::fs::File::from(rep_r),
    })
}

/// How long [`Pending::start`] waits for room in the ctl pipe (only an
/// environment over the pipe's 64 KiB could ever need to wait).
const GO_WRITE_LIMIT: Duration = Duration::from_secs(2);

impl Pending {
    /// Lets the keeper start the job with `env` added to its environment.
    /// Its news arrive on `events`, turned into the channel's own messages
    /// by `wrap` (the keeper knows nothing of the agent's event type).
    pub fn start<T: Send + 'static>(
        self,
        env: &[(String, String)],
        events: Sender<T>,
        wrap: fn(News) -> Option<T>,
    ) -> std::io::Result<Keeper> {
        let Pending {
            child,
            pidfd,
            mut ctl,
            reports,
        } = self;
        let frame = crate::keeper::protocol::encode_go(env);
        match write_within(&mut ctl, &frame, GO_WRITE_LIMIT) {
            Ok(()) => {}
            // The keeper is gone already: its report (a failed set-up) or
            // the pipe's end says why, through the reader as always.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(e) => return Err(e),
        }
        let seen = Arc::new(Seen::default());
        {
            let seen = seen.clone();
            std::thread::Builder::new()
                .name("keeper-reports".into())
                .spawn(move || {
                    read_reports(reports, &seen, |n| match wrap(n) {
                        Some(m) => events.send(m).is_ok(),
                        None => true,
                    })
                })?;
        }
        Ok(Keeper {
            child,
            pidfd,
            ctl: Some(ctl),
            seen,
        })
    }
}

/// Writes all of `buf` to the non-blocking `file`, waiting for room at most
/// `limit` in all.
fn write_within(file: &mut std::fs::File, mut buf: &[u8], limit: Duration) -> std::io::Result<()> {
    let until = Instant::now() + limit;
    while !buf.is_empty() {
        match file.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the keeper does not read its control pipe",
                    ));
                }
                let timeout = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: i64::from(left.min(Duration::from_millis(100)).subsec_nanos()),
                };
                let mut fds = [PollFd::new(&*file, PollFlags::OUT)];
                let _ = rustix::event::poll(&mut fds, Some(&timeout));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads reports until the pipe ends; `send` returns false when nobody
/// listens any more.
fn read_reports(reader: std::fs::File, seen: &Seen, mut send: impl FnMut(News) -> bool) {
    use crate::escape::escape;
    let mut saw_gone = false;
    for line in BufReader::new(reader).lines() {
        let Ok(line) = line else { break };
        let report = match line.parse::<Report>() {
            Ok(r) => r,
            Err(e) => {
                log::warn!("{}", escape(&e.to_string()));
                continue;
            }
        };
        match &report {
            Report::Started { pid } => seen.job_pid.store(*pid, Ordering::SeqCst),
            Report::Exited { .. } => {}
            Report::TreeGone => seen.tree_gone.store(true, Ordering::SeqCst),
            Report::Survivor { pid, command, why } => log::error!(
                "process {pid} ({}) of the job's tree is still alive: {}",
                escape(command),
                why.describe()
            ),
            Report::Warning(m) => log::warn!("{}", escape(m)),
            Report::Info(m) => log::info!("{}", escape(m)),
            Report::SpawnFailed { .. } => {}
        }
        saw_gone |= matches!(report, Report::TreeGone | Report::SpawnFailed { .. });
        let significant = matches!(
            report,
            Report::Started { .. }
                | Report::SpawnFailed { .. }
                | Report::Exited { .. }
                | Report::TreeGone
        );
        if significant && !send(News::Report(report)) {
            return;
        }
    }
    if !saw_gone {
        send(News::Lost);
    }
}

impl Keeper {
    /// SIGTERM to the job's whole tree, through the keeper (woken with
    /// SIGCONT in case it was stopped).
    pub fn term(&mut self) {
        self.wake();
        self.send_unless_gone(Ctl::Term);
    }

    /// SIGKILL to the job's whole tree: through the keeper (woken with
    /// SIGCONT), and from here too (see the module doc).
    pub fn kill(&mut self) {
        self.wake();
        self.kill_tree_directly();
        self.send_unless_gone(Ctl::Kill);
    }

    /// `sig` to the members of the job's process group, through the keeper.
    pub fn relay(&mut self, sig: Sig) {
        self.send_unless_gone(Ctl::Relay(sig));
    }

    /// Hands the keeper the deadline of the latest grant or renewal.
    pub fn arm(&mut self, deadline: Deadline) {
        self.send(Ctl::Arm(Arm::of(deadline)));
    }

    /// A command about the tree, unless the keeper said it is gone.
    fn send_unless_gone(&mut self, cmd: Ctl) {
        if !self.seen.tree_gone.load(Ordering::SeqCst) {
            self.send(cmd);
        }
    }

    /// One command on the ctl pipe, never blocking (one frame is at most
    /// `PIPE_BUF`, so it goes whole or not at all).
    fn send(&mut self, cmd: Ctl) {
        if let Some(ctl) = self.ctl.as_mut() {
            match ctl.write(&cmd.encode()) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    log::warn!("the keeper is not reading its commands (stopped?)");
                }
                Err(_) => self.ctl = None,
            }
        }
    }

    /// SIGCONT to the keeper: a keeper stopped by the job (or anyone) acts
    /// on its queue and its own timer again.
    fn wake(&self) {
        if let Some(fd) = &self.pidfd {
            let _ = rustix::process::pidfd_send_signal(fd, Signal::CONT);
        }
    }

    /// SIGKILL to every process below the agent but the keeper: the job's
    /// tree under the keeper and, once the keeper is gone, its orphans
    /// (re-parented to the agent, a child subreaper).
    fn kill_tree_directly(&self) {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let keeper = i32::try_from(self.child.id()).ok();
        crate::keeper::tree::kill_all_except(me, None, keeper);
    }

    /// Tells the keeper to finish (it kills whatever is left, normally
    /// nothing, then exits); [`Keeper::finish`] reaps it.
    pub fn done(&mut self) {
        if let Some(mut ctl) = self.ctl.take() {
            let _ = ctl.write_all(&Ctl::Done.encode());
        }
        // A stopped keeper could neither finish nor kill what is left.
        self.wake();
    }

    /// Tells the keeper to finish (it kills whatever is left, normally
    /// nothing, then exits), and reaps it (bounded). Waits on the keeper's
    /// pidfd, which becomes readable when it exits, so the agent ends the
    /// moment the keeper does (a sleep-and-retry loop cost up to its period
    /// on every run).
    pub fn finish(mut self, within: Duration) {
        self.done();
        let until = Instant::now() + within;
        let pidfd = i32::try_from(self.child.id())
            .ok()
            .and_then(Pid::from_raw)
            .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
        loop {
            match self.child.try_wait() {
                // A keeper that finished removed the job cgroup itself.
                Ok(Some(status)) if status.success() => return,
                Ok(Some(_)) | Err(_) => {
                    crate::keeper::cgroup::remove_left_by(self.child.id());
                    return;
                }
                Ok(None) => {}
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Left running: it keeps killing what is left of the tree
                // and exits when it is gone.
                return;
            }
            match &pidfd {
                Some(fd) => {
                    let timeout = rustix::event::Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: i64::from(left.subsec_nanos()),
                    };
                    let mut fds = [PollFd::new(fd, PollFlags::IN)];
                    // Ready, timed out or interrupted: `try_wait` decides.
                    let _ = rustix::event::poll(&mut fds, Some(&timeout));
                }
                // No pidfd (a kernel before 5.3): bounded retries.
                None => std::thread::sleep(left.min(Duration::from_millis(2))),
            }
        }
    }
}
