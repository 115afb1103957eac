//! The agent's side of the keeper: starting it (in a PID namespace of its
//! own where the kernel allows), asking it to stop the job's tree, turning
//! its reports into events, and confirming the tree gone itself.
//!
//! **Starting it** ([`prestart_keeper`]): `sys::keeper_spawn` creates the
//! keeper as PID 1 of a new PID and mount namespace (root), or of a user
//! namespace too (anyone else), and falls back to no namespace where none
//! can be had (EPERM, EINVAL, ENOSPC, a seccomp filter, user namespaces
//! disabled) or where `--no-pid-namespace` asks; [`Pending::fallback`] says
//! why. The channels are two socket pairs at the keeper's fds 3 and 4.
//!
//! **Stops**: SIGTERM and relayed signals go to the keeper, which signals
//! the tree. SIGKILL is the agent's own act too: with a namespace, one
//! SIGKILL to the keeper (its init, through our pidfd) kills every process
//! of it, whatever the keeper is doing (stopped, traced, blocked); without
//! one, the agent sends the keeper SIGCONT and walks the tree itself from
//! its own pid down (the agent is a child subreaper too: if the keeper
//! dies, its orphans re-parent to the agent), sparing only the keeper,
//! each process signalled through a pidfd whose parent is checked after
//! the open (`keeper::tree`). Our end of the ctl socket is written with
//! `MSG_DONTWAIT`, so a frozen keeper can never block the supervisor loop.
//! After every grant and renewal the keeper gets the deadline
//! ([`Keeper::arm`]) and enforces it alone if need be.
//!
//! **The tree's end is the agent's own finding, never a report's.** The
//! report reader, once the report socket ends, reaps the keeper (a blocking
//! `waitid` on its pidfd) and then checks that the agent has no child left
//! ([`News::Reaped`]). With a namespace, the keeper's reaping alone proves
//! the tree is gone: the kernel kills every process of the namespace when
//! its init dies, and the init's exit completes only once they are all
//! gone. Without one, the keeper's orphans (if it died with any) are the
//! agent's children, so "no child left" proves it. Neither needs a new
//! descriptor (`waitid` on the pidfd opened at the clone), so a lowered
//! `RLIMIT_NOFILE` cannot turn it into a false "gone". A `TreeGone` report
//! alone never releases the lease (`agent::machine`).
//!
//! This module never waits on a process in the supervisor loop; the reader
//! thread does the blocking reads and the reaping.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rustix::event::{PollFd, PollFlags};
use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};
use rustix::process::Signal;

use crate::keeper::KEEPER_ARG;
use crate::keeper::protocol::{Arm, Command as Ctl, Report};
use crate::sys::keeper_spawn::{Namespaces, Prepared, SpawnError};
use crate::sys::signal::Sig;
use crate::time::deadline::Deadline;

/// The running keeper.
pub struct Keeper {
    pid: i32,
    /// The keeper itself (CLONE_PIDFD): SIGCONT, and with a namespace
    /// SIGKILL; the reader thread reaps through it.
    pidfd: Option<Arc<OwnedFd>>,
    ns: Namespaces,
    ctl: Option<OwnedFd>,
    /// The keeper said the tree is gone (nothing left to signal).
    tree_gone: Arc<AtomicBool>,
    /// The keeper was reaped (whether it exited 0).
    reaped: Receiver<bool>,
    /// A child of the agent that is not of the job's tree (its scribe,
    /// when the agent is an init and so adopted it).
    spared: Option<i32>,
}

/// What the agent hears from its keeper: the reports that change the run
/// (the others, survivors and notes, are logged by the reader), and the
/// agent's own finding once the keeper is reaped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum News {
    Report(Report),
    /// The keeper was reaped; `tree_empty`: and no process of the tree is
    /// left (see the module doc).
    Reaped {
        tree_empty: bool,
    },
}

/// A keeper started before the grant, waiting for the job's environment
/// ([`Pending::start`]). Its start-up (an `exec` of this binary, its
/// handlers, session, subreaper and job cgroup) runs on the other CPU while
/// the agent acquires, instead of after the grant, on the way to the job.
/// Dropped without `start`, it sees its ctl socket close and exits; no job
/// ever runs.
pub struct Pending {
    pid: i32,
    pidfd: Option<Arc<OwnedFd>>,
    ns: Namespaces,
    ctl: OwnedFd,
    reports: OwnedFd,
    fallback: Option<String>,
}

/// The namespaces to try, in order, for an agent with `euid`, when a
/// namespace is wanted at all.
fn attempts(want_namespace: bool, root: bool) -> &'static [Namespaces] {
    match (want_namespace, root) {
        (false, _) => &[Namespaces::None],
        // Root without CAP_SYS_ADMIN (a container) may still have a user
        // namespace.
        (true, true) => &[Namespaces::Pid, Namespaces::UserPid, Namespaces::None],
        (true, false) => &[Namespaces::UserPid, Namespaces::None],
    }
}

/// Starts the keeper for `command`, with `env_remove` taken out of the
/// agent's environment, in a PID namespace of its own unless
/// `want_namespace` is false or none can be had; it waits for
/// [`Pending::start`] before it starts the job, as `options` say.
pub fn prestart_keeper(
    command: &[OsString],
    env_remove: &[String],
    options: &crate::keeper::JobOptions,
    want_namespace: bool,
) -> std::io::Result<Pending> {
    let pair = || {
        rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
    };
    // Job cgroups of dead runs (their keepers killed) beside ours.
    crate::keeper::cgroup::remove_stale(std::process::id());
    let (ctl_ours, ctl_theirs) = pair()?;
    let (rep_theirs, rep_ours) = pair()?;
    let mut argv: Vec<&std::ffi::OsStr> = vec!["leaseagent-keeper".as_ref(), KEEPER_ARG.as_ref()];
    let option_args = options.to_args();
    argv.extend(option_args.iter().map(std::ffi::OsStr::new));
    argv.push("--".as_ref());
    argv.extend(command.iter().map(|c| c.as_os_str()));
    // The agent's pid reaches the keeper in its environment, never on its
    // command line, which the job may read (`sys::keeper_spawn`).
    let agent_env = crate::sys::keeper_spawn::AGENT_PID_ENV;
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k != agent_env && !env_remove.iter().any(|r| k == r.as_str()))
        .collect();
    env.push((agent_env.into(), std::process::id().to_string().into()));
    let prep = Prepared::new(
        &argv,
        &env,
        ctl_theirs.as_fd(),
        rep_theirs.as_fd(),
        !options.full_root,
    )?;
    let root = rustix::process::geteuid().is_root();
    let mut first_failure: Option<(Namespaces, SpawnError)> = None;
    let mut started = None;
    for &ns in attempts(want_namespace, root) {
        match crate::sys::keeper_spawn::spawn(&prep, ns) {
            Ok(s) => {
                started = Some((s, ns));
                break;
            }
            Err(e) => {
                first_failure.get_or_insert((ns, e));
            }
        }
    }
    let Some((spawned, ns)) = started else {
        let e = first_failure
            .map(|(_, e)| e.to_string())
            .unwrap_or_default();
        return Err(std::io::Error::other(e));
    };
    let fallback = match (want_namespace, ns) {
        (false, _) => Some("--no-pid-namespace".to_string()),
        (true, Namespaces::None) => first_failure.map(|(tried, e)| {
            let what = match tried {
                Namespaces::Pid => "a PID namespace",
                _ => "a user and PID namespace",
            };
            format!("{what} could not be made ({e})")
        }),
        _ => None,
    };
    Ok(Pending {
        pid: spawned.pid,
        pidfd: spawned.pidfd.map(Arc::new),
        ns,
        ctl: ctl_ours,
        reports: rep_ours,
        fallback,
    })
}

/// How long [`Pending::start`] waits for room in the ctl socket (only an
/// environment over the socket's buffer could ever need to wait).
const GO_WRITE_LIMIT: Duration = Duration::from_secs(2);

impl Pending {
    /// Why the keeper has no PID namespace, if it has none.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Lets the keeper start the job with `env` added to its environment.
    /// Its news arrive on `events`, turned into the channel's own messages
    /// by `wrap` (the keeper knows nothing of the agent's event type). The
    /// reader runs before the frame goes out, so no job ever runs unread.
    ///
    /// `spared`: a process that may be the agent's child without being of
    /// the job's tree (the agent's scribe), neither counted as a child
    /// left nor killed with the tree.
    pub fn start<T: Send + 'static>(
        self,
        env: &[(String, String)],
        events: Sender<T>,
        wrap: fn(News) -> Option<T>,
        spared: Option<i32>,
    ) -> std::io::Result<Keeper> {
        let Pending {
            pid,
            pidfd,
            ns,
            ctl,
            reports,
            fallback: _,
        } = self;
        let tree_gone = Arc::new(AtomicBool::new(false));
        let (reaped_tx, reaped) = crossbeam_channel::bounded(1);
        {
            let tree_gone = tree_gone.clone();
            let pidfd = pidfd.clone();
            std::thread::Builder::new()
                .name("keeper-reports".into())
                .spawn(move || {
                    let send = |n| match wrap(n) {
                        Some(m) => events.send(m).is_ok(),
                        None => true,
                    };
                    let keeper = (pid, pidfd.as_deref());
                    read_reports(reports, &tree_gone, keeper, spared, reaped_tx, send)
                })?;
        }
        let frame = crate::keeper::protocol::encode_go(env);
        match send_within(&ctl, &frame, GO_WRITE_LIMIT) {
            Ok(()) => {}
            // The keeper is gone already: its report (a failed set-up) or
            // its reaping says why, through the reader as always.
            Err(rustix::io::Errno::PIPE) | Err(rustix::io::Errno::CONNRESET) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Keeper {
            pid,
            pidfd,
            ns,
            ctl: Some(ctl),
            tree_gone,
            reaped,
            spared,
        })
    }
}

/// Sends all of `buf` on the socket `fd` without blocking, waiting for
/// room at most `limit` in all.
fn send_within(fd: &OwnedFd, mut buf: &[u8], limit: Duration) -> rustix::io::Result<()> {
    let until = Instant::now() + limit;
    while !buf.is_empty() {
        match rustix::net::send(fd, buf, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(0) => return Err(rustix::io::Errno::PIPE),
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::AGAIN) => {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(rustix::io::Errno::TIMEDOUT);
                }
                let timeout = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: i64::from(left.min(Duration::from_millis(100)).subsec_nanos()),
                };
                let mut fds = [PollFd::new(fd, PollFlags::OUT)];
                let _ = rustix::event::poll(&mut fds, Some(&timeout));
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads reports until the socket ends, then reaps the keeper and checks
/// the tree is gone ([`News::Reaped`]); `send` returns false when nobody
/// listens any more.
fn read_reports(
    reader: OwnedFd,
    tree_gone: &AtomicBool,
    (pid, pidfd): (i32, Option<&OwnedFd>),
    spared: Option<i32>,
    reaped: Sender<bool>,
    mut send: impl FnMut(News) -> bool,
) {
    use crate::escape::escape;
    use std::io::BufRead;
    let reader = std::io::BufReader::new(std::fs::File::from(reader));
    for line in reader.lines() {
        // An error ends the stream as its end does: the reaping decides.
        let Ok(line) = line else { break };
        let report = match line.parse::<Report>() {
            Ok(r) => r,
            Err(e) => {
                log::warn!("{}", escape(&e.to_string()));
                continue;
            }
        };
        match &report {
            Report::TreeGone => tree_gone.store(true, Ordering::SeqCst),
            Report::Survivor { pid, command, why } => log::error!(
                "process {pid} ({}) of the job's tree is still alive: {}",
                escape(command),
                why.describe()
            ),
            Report::Warning(m) => log::warn!("{}", escape(m)),
            Report::Info(m) => log::info!("{}", escape(m)),
            Report::Stopped => log::info!("the command stopped; renewals go on"),
            Report::Started { .. }
            | Report::Exited { .. }
            | Report::SpawnFailed { .. }
            | Report::Size { .. } => {}
        }
        let significant = matches!(
            report,
            Report::Started { .. }
                | Report::SpawnFailed { .. }
                | Report::Exited { .. }
                | Report::TreeGone
                | Report::Size { .. }
                | Report::Stopped
        );
        if significant && !send(News::Report(report)) {
            return;
        }
    }
    let success = reap(pid, pidfd);
    let tree_empty = no_child_left(spared);
    let _ = reaped.send(success);
    send(News::Reaped { tree_empty });
}

/// Waits for the keeper's end and reaps it; whether it exited 0. With a
/// namespace this returns only once every process of it is gone.
fn reap(pid: i32, pidfd: Option<&OwnedFd>) -> bool {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    loop {
        let r = match pidfd {
            Some(fd) => waitid(WaitId::PidFd(fd.as_fd()), WaitIdOptions::EXITED),
            None => match rustix::process::Pid::from_raw(pid) {
                Some(p) => waitid(WaitId::Pid(p), WaitIdOptions::EXITED),
                None => return false,
            },
        };
        match r {
            Ok(Some(status)) => return status.exit_status() == Some(0),
            Ok(None) => return false,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
}

/// Whether this process (the agent, a child subreaper whose only child was
/// the keeper, now reaped) has no child left: the keeper's orphans would be
/// ours. Zombies among them are reaped on the way; any error but ECHILD
/// proves nothing and counts as a child left. `spared` (the agent's
/// scribe, adopted when the agent is an init) does not count: then the
/// proof is that it is the only child (counted in `/proc`; unreadable
/// counts as a child left).
pub fn no_child_left(spared: Option<i32>) -> bool {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    loop {
        match waitid(WaitId::All, WaitIdOptions::EXITED | WaitIdOptions::NOHANG) {
            // An orphan of the tree that already died: reaped, look again.
            Ok(Some(_)) => {}
            // Children, none of them ended: the spared one alone?
            Ok(None) => return spared.is_some_and(only_child),
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::CHILD) => return true,
            Err(_) => return false,
        }
    }
}

/// Whether `spared` is this process's child, not ended, and its only one.
fn only_child(spared: i32) -> bool {
    use rustix::process::{Pid, WaitId, WaitIdOptions, waitid};
    let Some(pid) = Pid::from_raw(spared) else {
        return false;
    };
    let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    // Ours and running (ECHILD: not ours; a status: it ended, and the
    // next look reaps it).
    if !matches!(waitid(WaitId::Pid(pid), opts), Ok(None)) {
        return false;
    }
    // One child in all: counted, since `/proc` may name them in another
    // PID namespace than the one `spared` is of.
    crate::keeper::tree::count_children_of_self().is_some_and(|n| n == 1)
}

impl Keeper {
    /// The host's pid of the keeper's child `pid` (as the keeper names it:
    /// in its PID namespace when it has one): the one whose last `NSpid`
    /// is `pid`. `None`: it is gone, or cannot be told. Asked right after
    /// `Started`, when the job is the keeper's only child.
    pub fn host_pid_of(&self, pid: i32) -> Option<i32> {
        if self.ns == Namespaces::None {
            return Some(pid);
        }
        let k = self.pid;
        let kids = std::fs::read_to_string(format!("/proc/{k}/task/{k}/children")).ok()?;
        kids.split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .find(|host| {
                std::fs::read_to_string(format!("/proc/{host}/status"))
                    .ok()
                    .and_then(|st| {
                        let line = st.lines().find(|l| l.starts_with("NSpid:"))?;
                        line.split_whitespace().last()?.parse::<i32>().ok()
                    })
                    == Some(pid)
            })
    }

    /// SIGTERM to the job's whole tree, through the keeper (woken with
    /// SIGCONT in case it was stopped).
    pub fn term(&mut self) {
        self.wake();
        self.send_unless_gone(Ctl::Term);
    }

    /// SIGKILL to the job's whole tree: with a namespace, SIGKILL to the
    /// keeper, its init (the kernel kills the rest); without, through the
    /// keeper (woken with SIGCONT) and by the agent's own walk.
    pub fn kill(&mut self) {
        if self.ns != Namespaces::None {
            self.signal(Signal::KILL);
            return;
        }
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
        if !self.tree_gone.load(Ordering::SeqCst) {
            self.send(cmd);
        }
    }

    /// One command on the ctl socket, never blocking (a frame this small is
    /// queued whole or not at all).
    fn send(&mut self, cmd: Ctl) {
        if let Some(ctl) = self.ctl.as_ref() {
            match rustix::net::send(
                ctl,
                &cmd.encode(),
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN) => {
                    log::warn!("the keeper is not reading its commands (stopped?)");
                }
                Err(_) => self.ctl = None,
            }
        }
    }

    /// `sig` to the keeper itself, through its pidfd (never by pid: the
    /// reader may have reaped it).
    fn signal(&self, sig: Signal) {
        if let Some(fd) = &self.pidfd {
            let _ = rustix::process::pidfd_send_signal(fd.as_fd(), sig);
        }
    }

    /// SIGCONT to the keeper: a keeper stopped by the job (or anyone) acts
    /// on its queue and its own timer again.
    fn wake(&self) {
        self.signal(Signal::CONT);
    }

    /// SIGKILL to every process below the agent but the keeper: the job's
    /// tree under the keeper and, once the keeper is gone, its orphans
    /// (re-parented to the agent, a child subreaper).
    fn kill_tree_directly(&self) {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let spare: Vec<i32> = std::iter::once(self.pid).chain(self.spared).collect();
        crate::keeper::tree::kill_all_except(me, None, &spare);
    }

    /// Tells the keeper to finish (it kills whatever is left, normally
    /// nothing, then exits); [`Keeper::finish`] waits for its reaping.
    pub fn done(&mut self) {
        if let Some(ctl) = self.ctl.take() {
            let _ = rustix::net::send(
                &ctl,
                &Ctl::Done.encode(),
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            );
        }
        // A stopped keeper could neither finish nor kill what is left.
        self.wake();
    }

    /// Tells the keeper to finish and waits (bounded) for the reader to
    /// have reaped it; a keeper that did not exit cleanly may have left the
    /// job's cgroup behind, which is removed here.
    pub fn finish(mut self, within: Duration) {
        self.done();
        match self.reaped.recv_timeout(within) {
            // A keeper that finished removed the job cgroup itself.
            Ok(true) => {}
            Ok(false) => crate::keeper::cgroup::remove_left_by(std::process::id()),
            // Left running: it keeps killing what is left of the tree and
            // exits when it is gone.
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_tries_a_pid_namespace_then_a_user_namespace_then_none() {
        assert_eq!(
            attempts(true, true),
            [Namespaces::Pid, Namespaces::UserPid, Namespaces::None]
        );
        assert_eq!(
            attempts(true, false),
            [Namespaces::UserPid, Namespaces::None]
        );
        assert_eq!(attempts(false, true), [Namespaces::None]);
        assert_eq!(attempts(false, false), [Namespaces::None]);
    }
}
