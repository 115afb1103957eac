//! The agent's side of the keeper: starting it, asking it to stop the job's
//! tree, and turning its reports into events.
//!
//! Stops go to the keeper, which signals the whole tree (see `keeper/mod.rs`):
//! SIGTERM and SIGKILL reach every descendant whatever its group or
//! session, and relayed signals reach the members of the job's group. The
//! ctl pipe is non-blocking on our side, so a frozen keeper can never block
//! the supervisor loop.
//!
//! SIGKILL also goes straight to the job's process group from here, so the
//! deadline holds even when the keeper is stopped or gone. That is the only
//! group signal the agent sends, and only while the job's leader has not
//! been reported exited: an unreaped leader keeps its pid (the group id)
//! from being recycled, so `kill(-pgid)` cannot reach a stranger's group.
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
use rustix::process::{Pid, PidfdFlags, kill_process_group, test_kill_process_group};

use crate::keeper::KEEPER_ARG;
use crate::keeper::protocol::{Command as Ctl, Report};
use crate::sys::signal::Sig;

/// The job's process group, for the one question the agent asks of it
/// after a keeper loss: is it provably empty?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobGroup(Pid);

impl JobGroup {
    /// The group led by `pid` (the job runs with `pgid == pid`).
    pub fn for_kill(pid: i32) -> Option<Self> {
        Pid::from_raw(pid).map(JobGroup)
    }

    /// Whether the group provably has no member left (not even a zombie):
    /// `kill(-pgid, 0)` finds nobody.
    pub fn is_empty(&self) -> bool {
        matches!(
            test_kill_process_group(self.0),
            Err(rustix::io::Errno::SRCH)
        )
    }
}

/// What the report reader has learnt, shared with the handle.
#[derive(Default)]
struct Seen {
    /// The job's pid (= its process group id), 0 until started.
    job_pid: AtomicI32,
    /// The keeper reported the leader reaped: never signal `-pgid` again.
    leader_exited: AtomicBool,
    /// The keeper reported the whole tree gone.
    tree_gone: AtomicBool,
}

/// The running keeper.
pub struct Keeper {
    child: Child,
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

/// Starts the keeper, which starts `command` with `env` added to the agent's
/// environment and `env_remove` taken out. Its news arrive on `events`,
/// turned into the channel's own messages by `wrap` (the keeper knows
/// nothing of the agent's event type).
pub fn spawn_keeper<T: Send + 'static>(
    command: &[OsString],
    env: &[(String, String)],
    env_remove: &[String],
    events: Sender<T>,
    wrap: fn(News) -> Option<T>,
) -> std::io::Result<Keeper> {
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
        .arg("--")
        .args(command);
    for k in env_remove {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn()?;
    drop(ctl_r);
    drop(rep_w);
    let reader = std::fs::File::from(rep_r);
    let seen = Arc::new(Seen::default());
    {
        let seen = seen.clone();
        std::thread::Builder::new()
            .name("keeper-reports".into())
            .spawn(move || {
                read_reports(reader, &seen, |n| match wrap(n) {
                    Some(m) => events.send(m).is_ok(),
                    None => true,
                })
            })?;
    }
    Ok(Keeper {
        child,
        ctl: Some(std::fs::File::from(ctl_w)),
        seen,
    })
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
            Report::Exited { .. } => seen.leader_exited.store(true, Ordering::SeqCst),
            Report::TreeGone => seen.tree_gone.store(true, Ordering::SeqCst),
            Report::Survivor { pid, command } => log::error!(
                "process {pid} of the job's tree survived SIGKILL: {}",
                escape(command)
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
    /// Stops or signals the job: SIGTERM/SIGKILL to its whole tree (through
    /// the keeper), other signals to its group's members. SIGKILL also goes
    /// straight to the group while its leader lives; a failure of that is
    /// returned as `(pgid, error)` for the report.
    pub fn signal(&mut self, sig: Sig) -> Option<(i32, String)> {
        let cmd = match sig {
            Sig::Term => Ctl::Term,
            Sig::Kill => Ctl::Kill,
            s => Ctl::Relay(s),
        };
        let failed = if sig == Sig::Kill {
            self.kill_group_directly()
        } else {
            None
        };
        if self.seen.tree_gone.load(Ordering::SeqCst) {
            return failed;
        }
        if let Some(ctl) = self.ctl.as_mut() {
            match ctl.write(&[cmd.to_byte()]) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    log::warn!("the keeper is not reading its commands (stopped?)");
                }
                Err(_) => self.ctl = None,
            }
        }
        failed
    }

    /// `kill(-pgid, SIGKILL)` while the leader is not known to have exited.
    fn kill_group_directly(&self) -> Option<(i32, String)> {
        if self.seen.leader_exited.load(Ordering::SeqCst) {
            return None;
        }
        let pgid = Pid::from_raw(self.seen.job_pid.load(Ordering::SeqCst))?;
        match kill_process_group(pgid, Sig::Kill.to_rustix()) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => None,
            Err(e) => Some((pgid.as_raw_nonzero().get(), e.to_string())),
        }
    }

    /// Tells the keeper to finish (it kills whatever is left, normally
    /// nothing, then exits), and reaps it (bounded). Waits on the keeper's
    /// pidfd, which becomes readable when it exits, so the agent ends the
    /// moment the keeper does (a sleep-and-retry loop cost up to its period
    /// on every run).
    pub fn finish(mut self, within: Duration) {
        if let Some(mut ctl) = self.ctl.take() {
            let _ = ctl.write_all(&[Ctl::Done.to_byte()]);
        }
        let until = Instant::now() + within;
        let pidfd = i32::try_from(self.child.id())
            .ok()
            .and_then(Pid::from_raw)
            .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
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
