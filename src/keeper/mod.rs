//! The keeper: a tiny process between the agent and the job that stops the
//! job's whole tree, whatever its group or session, on every stop, and
//! makes "no orphans" hold even when the agent is SIGKILLed.
//!
//! Why a process: a parent-death signal (`PR_SET_PDEATHSIG`) reaches only the
//! direct child, and nothing in the kernel kills a process tree when some
//! unrelated process dies. So the agent starts `leaseagent __keeper`
//! (re-executing `/proc/self/exe`); the keeper becomes a child subreaper,
//! starts the job in a new process group and watches a pipe from the agent.
//! The agent holds the only write end; when the agent dies for any reason
//! the kernel closes it, the keeper reads EOF and kills the whole tree.
//!
//! ```text
//!   agent ──ctl pipe: Relay(sig) Term Kill Done Arm; EOF = agent died──▶ keeper ──fork/exec──▶ job
//!   agent ◀──report pipe: Started SpawnFailed Exited TreeGone Survivor Warning Info── keeper
//! ```
//! (both ends typed in [`protocol`]).
//!
//! The keeper is the deadline's second guardian: after every grant and
//! renewal the agent sends `Arm` (deadline, grace, kill lead), and the
//! keeper stops the tree by it on its own ([`guard`]) if no newer one comes,
//! so an agent that is stopped, blocked on a filesystem or not scheduled
//! cannot let the deadline pass.
//!
//! One loop, in tini's manner: `poll` on the ctl pipe, a SIGCHLD self-pipe
//! and a `CLOCK_BOOTTIME` timerfd together, then `waitpid(-1, WNOHANG)`
//! until nothing is left to reap. No helper thread, no sleep-polling. The
//! timed wake-ups are the armed deadline's SIGTERM and SIGKILL and the next
//! round of SIGKILL while a kill is in progress (backing off to
//! `KILL_ROUND_SURVIVORS` once survivors were reported).
//!
//! Invariants and races it guards against:
//! - The keeper is a child subreaper, so every descendant of the job stays
//!   below it (orphans re-parent to it), and "no child left" (`ECHILD`,
//!   plus an empty job cgroup when there is one) proves the whole tree is
//!   gone; it reports that as `TreeGone` and exits. The agent releases the
//!   lease only after it.
//! - Stops reach the whole tree ([`tree`]): every descendant is signalled
//!   through a pidfd whose parent is re-checked, so a recycled pid is never
//!   signalled. Where a cgroup of our own is available, [`cgroup`]'s
//!   `cgroup.kill` takes everything in it too.
//! - The keeper never signals a process group id: a relayed signal goes to
//!   the tree's members whose group is the job's. After the tree is gone
//!   there is nothing left to signal, so a recycled group id is never hit.
//! - The agent's end of the ctl pipe is close-on-exec, so neither the keeper
//!   nor the job holds a write end: EOF means exactly "the agent is gone".
//!   The keeper marks its own pipe ends close-on-exec before starting the
//!   job, so the job inherits neither.
//! - The keeper ignores (by handling) every signal the agent catches, so a
//!   Ctrl-C to the terminal's foreground group (agent + keeper) reaches the
//!   job only through the agent's relay: exactly once. Handled (not ignored)
//!   signals are reset to their defaults by `exec`, so the job starts clean.
//! - A failed `setsid` is reported as a warning; a failed subreaper call is
//!   reported and the job is not started (the tree could not be followed).

pub mod cgroup;
pub mod guard;
pub mod handle;
pub mod protocol;
pub mod tree;

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::io::{FdFlags, fcntl_setfd};
use rustix::process::{Signal, WaitOptions, set_child_subreaper};

use crate::exit::ChildStatus;
use crate::sys::signal::Sig;
use protocol::{Command as Ctl, Report, SpawnFailure};

/// The hidden first argument that selects keeper mode.
pub const KEEPER_ARG: &str = "__keeper";

/// While killing: the first rounds of SIGKILL come this fast, then slower,
/// up to the longest pause between rounds once survivors were reported (a
/// process the keeper cannot kill costs a walk of the tree every few
/// seconds, not a busy loop).
const KILL_ROUND_FIRST: Duration = Duration::from_millis(10);
const KILL_ROUND_MAX: Duration = Duration::from_millis(500);
const KILL_ROUND_SURVIVORS: Duration = Duration::from_secs(5);
/// The keeper's name in `ps`, `pgrep` and OOM reports: `comm` holds at most
/// 15 bytes, so `leaseagent-keeper` (its `argv[0]`) shows as this.
pub const KEEPER_COMM: &str = "leaseagent-keep";
/// Survivors of SIGKILL this long are reported (once) with pid and command.
const SURVIVOR_REPORT_AFTER: Duration = Duration::from_secs(1);

fn parse_fd(s: Option<&OsString>) -> Option<RawFd> {
    s?.to_str()?.parse().ok()
}

/// Runs the keeper: `__keeper CTL_FD REPORT_FD -- COMMAND [ARG...]`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    crate::sys::malloc::one_arena();
    let fds = (parse_fd(args.first()), parse_fd(args.get(1)));
    let (Some(ctl_fd), Some(report_fd)) = fds else {
        eprintln!("leaseagent: __keeper is internal to leaseagent");
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    let claimed = (
        crate::sys::fd::claim_inherited_fd(ctl_fd),
        crate::sys::fd::claim_inherited_fd(report_fd),
    );
    let (Ok(ctl), Ok(report)) = claimed else {
        eprintln!("leaseagent: keeper: control descriptors missing");
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    let command: Vec<OsString> = args.iter().skip(3).cloned().collect();
    run(ctl, report, command)
}

/// The report pipe; once the agent is gone, reports go to stderr instead.
///
/// Reports are queued and written together before the keeper next waits
/// ([`Reporter::flush`], and on drop): the pipe is unbuffered, and every
/// write wakes the agent's reader, so the reports of one step (the job's
/// start and where it runs; its exit and the tree's end) cost one wake-up,
/// not one per report or per formatted piece.
struct Reporter {
    pipe: Option<std::fs::File>,
    queued: Vec<Report>,
}

impl Reporter {
    fn send(&mut self, r: &Report) {
        self.queued.push(r.clone());
    }

    /// Writes what is queued, in one write.
    fn flush(&mut self) {
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
                Report::Survivor { pid, command, why } => eprintln!(
                    "leaseagent: keeper: error: process {pid} ({}) is still alive: {}",
                    crate::escape::escape(command),
                    why.describe()
                ),
                Report::Warning(m) => {
                    eprintln!("leaseagent: keeper: warn: {}", crate::escape::escape(m))
                }
                _ => {}
            }
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The keeper's lifecycle: claim the pipes, prepare (handlers, session,
/// subreaper, cgroup), start the job, run the loop, clean up.
fn run(ctl: OwnedFd, report: OwnedFd, command: Vec<OsString>) -> ExitCode {
    let Some(mut out) = close_pipes_on_exec(&ctl, report) else {
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    name_self(&mut out);
    // Lowered like the agent's own oom_score_adj (the keeper starts before
    // the agent lowers its own); the agent logged whether memory could be
    // locked, the same holds here.
    let _ = crate::sys::memory::protect();
    let timer = match deadline_timer() {
        Ok(t) => t,
        Err(e) => {
            out.send(&spawn_failed(format!(
                "keeper: cannot create its deadline timer: {e}"
            )));
            return ExitCode::SUCCESS;
        }
    };
    let (sigchld, cgroup, job_pid, carry) = match prepare_and_spawn(&mut out, &ctl, &command) {
        Ok(Some(started)) => started,
        // The agent went away before the grant: no job.
        Ok(None) => return ExitCode::SUCCESS,
        Err(failed) => {
            // The agent reads this as the job's spawn failure.
            out.send(&failed);
            return ExitCode::SUCCESS;
        }
    };
    out.send(&Report::Started { pid: job_pid });
    let mut k = Keeper {
        me: rustix::process::getpid().as_raw_nonzero().get(),
        job_pid,
        leader_reaped: false,
        ctl: Some(std::fs::File::from(ctl)),
        finishing: false,
        killing: None,
        cgroup,
        out,
        guard: guard::Guard::default(),
        decoder: protocol::Decoder::default(),
        carry,
        timer,
    };
    k.run_loop(&sigchld);
    if let Some(cg) = &k.cgroup {
        cg.remove();
    }
    ExitCode::SUCCESS
}

/// `comm` = [`KEEPER_COMM`] (it would be `exe`, from `/proc/self/exe`), so
/// `ps`, `pgrep` and the OOM killer's report name the keeper. A failure is
/// only a warning.
fn name_self(out: &mut Reporter) {
    let name = std::ffi::CString::new(KEEPER_COMM).unwrap_or_default();
    if let Err(e) = rustix::thread::set_name(&name) {
        out.send(&Report::Warning(format!(
            "keeper: cannot set its name: {e}"
        )));
    }
}

/// The timer of the keeper's own deadline: on `CLOCK_BOOTTIME`, which keeps
/// counting through suspend, set to absolute times, polled with the pipes.
fn deadline_timer() -> std::io::Result<OwnedFd> {
    use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
    Ok(timerfd_create(
        TimerfdClockId::Boottime,
        TimerfdFlags::CLOEXEC | TimerfdFlags::NONBLOCK,
    )?)
}

/// Neither pipe end may reach the job; the report end becomes the
/// [`Reporter`]. `None`: cannot even report.
fn close_pipes_on_exec(ctl: &OwnedFd, report: OwnedFd) -> Option<Reporter> {
    if fcntl_setfd(ctl, FdFlags::CLOEXEC).is_err()
        || fcntl_setfd(&report, FdFlags::CLOEXEC).is_err()
        // Read to the end of what is queued, never waiting (`read_ctl`).
        || rustix::fs::fcntl_setfl(ctl, rustix::fs::OFlags::NONBLOCK).is_err()
    {
        return None;
    }
    Some(Reporter {
        pipe: Some(std::fs::File::from(report)),
        queued: Vec::new(),
    })
}

/// What the keeper has once the job runs: the SIGCHLD self-pipe, the job's
/// cgroup (if any), the job's pid, and ctl bytes read past the "go" frame.
type Started = (UnixStream, Option<cgroup::JobCgroup>, i32, Vec<u8>);

/// Every step before the loop, in order: set-up, the "go" frame with the
/// job's environment (`None`: the agent left without one), the job.
fn prepare_and_spawn(
    out: &mut Reporter,
    ctl: &OwnedFd,
    command: &[OsString],
) -> Result<Option<Started>, Report> {
    handle_relayed_signals()?;
    let sigchld = watch_sigchld()?;
    new_session(out);
    become_subreaper()?;
    let Some((program, rest)) = command.split_first() else {
        return Err(spawn_failed("no command".into()));
    };
    let mut cgroup = job_cgroup();
    // Looked up now, while the agent acquires (see `find_in_path`), like
    // the job's `oom_score_adj` (it depends on the keeper's own only).
    let found = crate::sys::spawn::find_in_path(program, std::env::var_os("PATH").as_deref());
    let oom_score_adj = crate::sys::memory::job_oom_score_adj();
    out.flush();
    let (env, carry) = match wait_for_go(ctl) {
        Ok(Some(go)) => go,
        Ok(None) => {
            if let Some(cg) = &cgroup {
                cg.remove();
            }
            return Ok(None);
        }
        Err(e) => {
            if let Some(cg) = &cgroup {
                cg.remove();
            }
            return Err(spawn_failed(format!("keeper: {e}")));
        }
    };
    // The grant's variables never set PATH; if they ever did, the search
    // would be the child's own, under the new value.
    let sets_path = env.iter().any(|(k, _)| k == "PATH");
    let job = Job {
        program,
        resolved: found.as_deref().filter(|_| !sets_path),
        rest,
        env: &env,
        oom_score_adj,
    };
    let job_pid = spawn_job(out, &job, &mut cgroup)?;
    Ok(Some((sigchld, cgroup, job_pid, carry)))
}

/// The job's environment from the agent's "go" frame, and any bytes read
/// past it. `None`: the ctl pipe ended first (the agent exited, or was
/// refused the lease). No deadline of its own: the agent's life bounds it
/// (its end closes the pipe, even under SIGKILL).
#[allow(clippy::type_complexity)]
fn wait_for_go(
    ctl: &OwnedFd,
) -> Result<Option<(Vec<(OsString, OsString)>, Vec<u8>)>, protocol::BadGo> {
    let mut reader = protocol::GoReader::default();
    let mut buf = [0u8; 4096];
    loop {
        match rustix::io::read(ctl, &mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => {
                if let Some(go) = reader.push(&buf[..n])? {
                    return Ok(Some(go));
                }
            }
            Err(rustix::io::Errno::AGAIN) => {
                let mut fds = [PollFd::new(ctl, PollFlags::IN)];
                let _ = rustix::event::poll(&mut fds, None);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return Ok(None),
        }
    }
}

fn spawn_failed(message: String) -> Report {
    Report::SpawnFailed {
        kind: SpawnFailure::Other,
        message,
    }
}

/// The signals the agent relays: the keeper must not die of them. Handled,
/// not ignored: the disposition resets to default in the job.
fn handle_relayed_signals() -> Result<(), Report> {
    for sig in Sig::caught().map(Sig::number) {
        signal_hook::flag::register(sig, Arc::new(AtomicBool::new(false)))
            .map_err(|e| spawn_failed(format!("keeper: cannot handle signal {sig}: {e}")))?;
    }
    Ok(())
}

/// SIGCHLD wakes the poll through a self-pipe; installed before the job
/// exists so no exit is missed.
fn watch_sigchld() -> Result<UnixStream, Report> {
    let failed = |e: std::io::Error| spawn_failed(format!("keeper: cannot watch SIGCHLD: {e}"));
    let (r, w) = UnixStream::pair().map_err(failed)?;
    match (
        r.set_nonblocking(true),
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGCHLD, w),
    ) {
        (Ok(()), Ok(_)) => Ok(r),
        (Err(e), _) | (_, Err(e)) => Err(failed(e)),
    }
}

/// A session of our own (and so, with CONFIG_SCHED_AUTOGROUP, a CPU
/// scheduling group of our own): the job and everything it starts compete
/// for CPU as one entity against the agent, so a job that forks a hundred
/// busy processes cannot starve the heartbeat thread. It also takes the
/// job off the agent's controlling terminal: terminal signals reach it
/// only through the agent's relay, and it never gets SIGTTIN/SIGTTOU.
/// A failure is only a warning.
fn new_session(out: &mut Reporter) {
    if let Err(e) = rustix::process::setsid() {
        out.send(&Report::Warning(format!(
            "keeper: setsid failed ({e}): the job shares the agent's session and CPU scheduling group"
        )));
    }
}

/// Orphaned descendants of the job are re-parented to us, so we reap them
/// and know when the whole tree is gone. Without it the tree cannot be
/// followed: refuse to run the job.
fn become_subreaper() -> Result<(), Report> {
    set_child_subreaper(Some(rustix::process::getpid())).map_err(|e| {
        spawn_failed(format!(
            "keeper: cannot become a child subreaper ({e}); the job's tree could not be stopped"
        ))
    })
}

/// A cgroup of the job's own where one can be made; `None` is the usual
/// case outside a delegated cgroup: the tree walk alone.
fn job_cgroup() -> Option<cgroup::JobCgroup> {
    cgroup::JobCgroup::create().ok()
}

/// What the job is started with.
struct Job<'a> {
    program: &'a OsString,
    /// The file `program` names along `PATH`, when found beforehand.
    resolved: Option<&'a std::path::Path>,
    rest: &'a [OsString],
    /// Set over the keeper's environment: the grant's variables.
    env: &'a [(OsString, OsString)],
    oom_score_adj: i16,
}

/// Starts the job in a process group of its own, inside its cgroup if any
/// (said in a report once it runs there); returns its pid. We reap through
/// `waitpid`.
fn spawn_job(
    out: &mut Reporter,
    job: &Job<'_>,
    cgroup: &mut Option<cgroup::JobCgroup>,
) -> Result<i32, Report> {
    let mut how = String::new();
    let spawned = match cgroup.as_ref() {
        Some(cg) => match spawn_into(cg, job) {
            Ok(result) => result,
            // The kernel cannot clone into a cgroup: move there instead.
            Err(refused) => match cg.probe_moves() {
                Ok(()) => {
                    how = format!(" (moved there: {refused})");
                    spawn_by_moving(cg, job)
                }
                Err(_) => {
                    *cgroup = None;
                    spawn_plain(job)
                }
            },
        },
        None => spawn_plain(job),
    };
    match spawned {
        Ok(pid) => {
            if let Some(cg) = cgroup.as_ref() {
                out.send(&Report::Info(format!(
                    "the job runs in cgroup {}{how}; stops use cgroup.kill and the process tree",
                    cg.dir().display()
                )));
            }
            Ok(pid)
        }
        Err(e) => {
            if let Some(cg) = cgroup.take() {
                cg.remove();
            }
            let kind = match e.kind() {
                std::io::ErrorKind::NotFound => SpawnFailure::NotFound,
                std::io::ErrorKind::PermissionDenied => SpawnFailure::Permission,
                _ => SpawnFailure::Other,
            };
            Err(Report::SpawnFailed {
                kind,
                message: e.to_string(),
            })
        }
    }
}

/// The job born in its cgroup (`clone3(CLONE_INTO_CGROUP)`). `Err`: the
/// kernel refused the clone (or the directory cannot be opened); nothing
/// was started.
fn spawn_into(cg: &cgroup::JobCgroup, job: &Job<'_>) -> Result<std::io::Result<i32>, String> {
    use std::os::fd::AsFd;
    let dir = cg
        .open()
        .map_err(|e| format!("cannot open {}: {e}", cg.dir().display()))?;
    match crate::sys::spawn::spawn_in_cgroup(
        job.program,
        job.resolved,
        job.rest,
        job.env,
        dir.as_fd(),
        job.oom_score_adj,
    ) {
        Ok(pid) => Ok(Ok(pid)),
        Err(crate::sys::spawn::Failure::Exec(e)) => Ok(Err(e)),
        Err(crate::sys::spawn::Failure::Clone(e)) => Err(format!("clone3 into it refused: {e}")),
    }
}

/// The fallback before Linux 5.7: the keeper moves into the job's cgroup,
/// starts the job there, and moves back out.
fn spawn_by_moving(cg: &cgroup::JobCgroup, job: &Job<'_>) -> std::io::Result<i32> {
    // Kind `Other`: not the command's problem (exit 126/127 would say it was).
    cg.enter().map_err(|e| {
        std::io::Error::other(format!("keeper: cannot enter the job's cgroup: {e}"))
    })?;
    let spawned = spawn_plain(job);
    if let Err(e) = cg.leave() {
        // We are inside the job's cgroup: cgroup.kill would kill us too.
        if spawned.is_ok() {
            tree::kill_all(rustix::process::getpid().as_raw_nonzero().get(), None);
        }
        return Err(std::io::Error::other(format!(
            "keeper: cannot leave the job's cgroup: {e}"
        )));
    }
    spawned
}

/// The job started by std, in a process group of its own.
fn spawn_plain(job: &Job<'_>) -> std::io::Result<i32> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(job.program);
    cmd.args(job.rest)
        .envs(job.env.iter().cloned())
        .process_group(0);
    crate::sys::priority::oom_score_adj_on_exec(&mut cmd, job.oom_score_adj);
    // The std handle is dropped: we reap through `waitpid`.
    cmd.spawn().map(|child| child.id() as i32)
}

/// A kill in progress: rounds of SIGKILL until the tree is gone.
struct Killing {
    since: Instant,
    next_round: Instant,
    round: Duration,
    survivors_reported: bool,
}

struct Keeper {
    me: i32,
    job_pid: i32,
    leader_reaped: bool,
    /// `None` once the agent closed it (EOF) or said `Done`.
    ctl: Option<std::fs::File>,
    /// The agent is gone or done: exit once the tree is gone.
    finishing: bool,
    killing: Option<Killing>,
    cgroup: Option<cgroup::JobCgroup>,
    out: Reporter,
    /// The deadline the agent handed over, enforced by the keeper alone.
    guard: guard::Guard,
    decoder: protocol::Decoder,
    /// Commands that came right behind the "go" frame, read with it.
    carry: Vec<u8>,
    /// Fires at `guard.next_wake()`.
    timer: OwnedFd,
}

impl Keeper {
    /// The one loop: reap; once the tree is gone, say so and end; else run
    /// a due kill round, then wait for SIGCHLD, a control byte, or the next
    /// kill round.
    fn run_loop(&mut self, sigchld: &UnixStream) {
        loop {
            if self.reap_and_check_tree() {
                self.tree_gone();
                return;
            }
            // Does nothing unless a kill is in progress and a round is due.
            self.kill_round();
            // The newest deadline first: a keeper resumed after a stop has
            // the `Arm`s sent meanwhile queued (a read that finds nothing
            // costs one syscall).
            if self.ctl.is_some() {
                self.read_ctl();
            }
            self.deadline_due();
            let (chld_ready, ctl_ready) = self.wait_for_events(sigchld);
            if chld_ready {
                drain_sigchld(sigchld);
            }
            self.handle_ctl(ctl_ready);
        }
    }

    /// Reaps what ended; whether the whole tree is gone: no child left below
    /// us (so the leader, our child, was reaped too) and nothing left in the
    /// job's cgroup.
    fn reap_and_check_tree(&mut self) -> bool {
        self.reap() && self.cgroup_empty()
    }

    /// The end of the keeper's work, `Done` or not: no process is left to
    /// fork into the tree, and a subreaper's tree cannot gain members from
    /// outside. `TreeGone` goes out, and the empty cgroup is removed now,
    /// while the agent releases the lease, not after: the agent waits for
    /// this process's end.
    fn tree_gone(&mut self) {
        self.out.send(&Report::TreeGone);
        self.out.flush();
        if self.cgroup.as_ref().is_some_and(|cg| cg.try_remove()) {
            self.cgroup = None;
        }
    }

    /// Polls the SIGCHLD self-pipe and the ctl pipe, until the next kill
    /// round if one is pending; returns which is ready. A failed poll is
    /// taken as the agent being gone.
    fn wait_for_events(&mut self, sigchld: &UnixStream) -> (bool, bool) {
        self.out.flush();
        let timeout = self.killing.as_ref().map(|k| {
            let d = k.next_round.saturating_duration_since(Instant::now());
            rustix::event::Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: i64::from(d.subsec_nanos()),
            }
        });
        let mut fds = Vec::with_capacity(3);
        fds.push(PollFd::new(sigchld, PollFlags::IN));
        // The deadline timer wakes the poll; the loop then asks the guard.
        fds.push(PollFd::new(&self.timer, PollFlags::IN));
        if let Some(c) = &self.ctl {
            fds.push(PollFd::from_borrowed_fd(c.as_fd(), PollFlags::IN));
        }
        let poll_failed = match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => false,
            Err(_) => true,
        };
        let chld_ready = !fds[0].revents().is_empty();
        let timer_ready = !fds[1].revents().is_empty();
        let ctl_ready = fds.get(2).is_some_and(|f| !f.revents().is_empty());
        drop(fds);
        if timer_ready {
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(&self.timer, &mut buf);
        }
        if poll_failed {
            self.ctl = None;
        }
        (chld_ready, ctl_ready)
    }

    /// A control byte is waiting: act on it. No ctl pipe any more and not
    /// yet finishing: the agent is gone.
    fn handle_ctl(&mut self, ctl_ready: bool) {
        if ctl_ready {
            self.read_ctl();
        } else if self.ctl.is_none() && !self.finishing {
            self.agent_gone();
        }
    }

    /// Reaps every child that has ended; returns whether no child is left.
    fn reap(&mut self) -> bool {
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) => {
                    if pid.as_raw_nonzero().get() == self.job_pid && !self.leader_reaped {
                        self.leader_reaped = true;
                        let at_ms = crate::time::clock::BootInstant::now()
                            .since_boot()
                            .as_millis() as u64;
                        let status = match (status.exit_status(), status.terminating_signal()) {
                            (Some(code), _) => ChildStatus::Exited(code),
                            (None, Some(sig)) => ChildStatus::Signaled(sig),
                            (None, None) => ChildStatus::Exited(255),
                        };
                        self.out.send(&Report::Exited { status, at_ms });
                    }
                }
                Ok(None) => return false,
                Err(rustix::io::Errno::INTR) => {}
                // ECHILD: nothing left below us.
                Err(_) => return true,
            }
        }
    }

    fn cgroup_empty(&self) -> bool {
        self.cgroup.as_ref().is_none_or(|cg| cg.pids().is_empty())
    }

    /// The keeper's own deadline: SIGTERM and SIGKILL when due, whatever
    /// the agent does; then the timer is set to the next time due.
    fn deadline_due(&mut self) {
        for due in self.guard.due(crate::time::clock::BootInstant::now()) {
            match due {
                guard::Due::Term => {
                    self.out.send(&Report::Info(
                        "the keeper's deadline timer fired: SIGTERM to the tree".into(),
                    ));
                    self.term();
                }
                guard::Due::Kill => self.start_kill(),
            }
        }
        self.set_timer();
    }

    /// Sets the timer to the guard's next wake-up (absolute), or disarms it.
    fn set_timer(&self) {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        let at = self.guard.next_wake();
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

    /// Reads everything the agent queued (non-blocking, to the end), then
    /// carries it out in order. All of it first: a keeper stopped for a
    /// while finds several `Arm`s queued, and acting on the first (an old
    /// deadline) before reading the last would stop a job whose lease was
    /// renewed since. The deadline itself is checked by the loop after.
    fn read_ctl(&mut self) {
        let Some(ctl) = self.ctl.as_mut() else { return };
        let mut bytes = std::mem::take(&mut self.carry);
        let mut eof = false;
        let mut buf = [0u8; 4096];
        loop {
            match ctl.read(&mut buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        let commands = self.decoder.push(&bytes);
        if commands.is_empty() && eof {
            self.ctl = None;
            self.agent_gone();
            return;
        }
        for cmd in commands {
            match cmd {
                Ctl::Relay(sig) => self.relay(sig),
                Ctl::Term => {
                    if self.guard.term_requested() {
                        self.term();
                    }
                }
                Ctl::Kill => self.start_kill(),
                Ctl::Arm(a) => self.guard.arm(a),
                Ctl::Done => {
                    self.ctl = None;
                    self.finishing = true;
                    // Normally nothing is left; if something is, it dies.
                    self.start_kill();
                    return;
                }
            }
        }
        if eof {
            self.ctl = None;
            self.agent_gone();
        }
    }

    /// The job's leader while it is ours to signal without a check: not
    /// yet reaped, so its pid cannot have been reused.
    fn leader(&self) -> Option<i32> {
        (!self.leader_reaped).then_some(self.job_pid)
    }

    /// EOF on the ctl pipe: the agent died. Kill the whole tree at once.
    fn agent_gone(&mut self) {
        self.finishing = true;
        self.start_kill();
    }

    /// A relayed signal: to the members of the job's process group, found
    /// in the tree (never `kill(-pgid)`, which could hit a recycled group).
    fn relay(&mut self, sig: Sig) {
        tree::signal_all(self.me, sig.to_rustix(), Some(self.job_pid), self.leader());
    }

    /// SIGTERM to every descendant, and to everything in the job's cgroup,
    /// then SIGCONT (as `timeout` and systemd do), so a job paused with
    /// SIGTSTP or SIGSTOP acts on it within its grace.
    fn term(&mut self) {
        for sig in [Signal::TERM, Signal::CONT] {
            let done: HashSet<i32> = tree::signal_all(self.me, sig, None, self.leader())
                .into_iter()
                .collect();
            if let Some(cg) = &self.cgroup {
                for pid in cg.pids() {
                    if !done.contains(&pid) {
                        signal_in_cgroup(pid, cg, sig);
                    }
                }
            }
        }
    }

    fn start_kill(&mut self) {
        if self.killing.is_none() {
            let now = Instant::now();
            self.killing = Some(Killing {
                since: now,
                next_round: now,
                round: KILL_ROUND_FIRST,
                survivors_reported: false,
            });
        }
        self.kill_round();
    }

    /// One round of SIGKILL: cgroup.kill, then the tree walk; survivors of
    /// earlier rounds are reported once.
    fn kill_round(&mut self) {
        let Some(k) = self.killing.as_mut() else {
            return;
        };
        let now = Instant::now();
        if now < k.next_round {
            return;
        }
        k.next_round = now + k.round;
        let max = if k.survivors_reported {
            KILL_ROUND_SURVIVORS
        } else {
            KILL_ROUND_MAX
        };
        k.round = (k.round * 2).min(max);
        let report_now = !k.survivors_reported && now >= k.since + SURVIVOR_REPORT_AFTER;
        if report_now {
            k.survivors_reported = true;
        }
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.kill() {
                self.out.send(&Report::Warning(format!(
                    "cgroup.kill in {} failed: {e}",
                    cg.dir().display()
                )));
            }
        }
        tree::kill_all(self.me, self.leader());
        if report_now {
            // Every process still below us, killed or not (one it may not
            // signal, EPERM, was never killed), with why it lives.
            let mut pids: Vec<i32> = tree::descendants(self.me).iter().map(|p| p.pid).collect();
            if let Some(cg) = &self.cgroup {
                pids.extend(cg.pids());
            }
            pids.sort_unstable();
            pids.dedup();
            for pid in pids {
                let command = tree::command_of(pid);
                let why = tree::why_alive(pid);
                self.out.send(&Report::Survivor { pid, command, why });
            }
        }
    }
}

/// Empties the SIGCHLD self-pipe (the reap comes next round).
fn drain_sigchld(sigchld: &UnixStream) {
    let mut buf = [0u8; 64];
    let mut r = sigchld;
    while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
}

/// Signals `pid` if (checked after the pidfd is open) it is still in the
/// job's cgroup.
fn signal_in_cgroup(pid: i32, cg: &cgroup::JobCgroup, sig: Signal) {
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        return;
    };
    let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    let name = cg
        .dir()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let inside = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
        c.lines()
            .any(|l| l.starts_with("0::") && l.ends_with(&name))
    });
    if inside {
        let _ = rustix::process::pidfd_send_signal(&fd, sig);
    }
}
