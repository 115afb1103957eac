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
//! One loop, in tini's manner ([`event_loop`]): `poll` on the ctl pipe, a
//! SIGCHLD self-pipe and a `CLOCK_BOOTTIME` timerfd together, then
//! `waitpid(-1, WNOHANG)` until nothing is left to reap. No helper thread,
//! no sleep-polling. The timed wake-ups are the armed deadline's SIGTERM and
//! SIGKILL and the next round of SIGKILL while a kill is in progress.
//!
//! The keeper by role, one a file:
//! - `mod.rs` (this file): the lifecycle, in order: claim the pipes, set up
//!   (name, handlers, SIGCHLD, session, subreaper, cgroup), wait for the
//!   agent's "go" frame, start the job, run the loop, clean up;
//! - [`spawn`]: how the job is started (born in its cgroup, by moving, or
//!   plain);
//! - [`event_loop`]: the loop, its decisions only, over the [`os`] seam
//!   (the real system, or a fake in its unit tests);
//! - [`guard`]: the deadline as a pure decision core; [`tree`] and
//!   [`cgroup`]: finding and signalling the tree; [`protocol`]: both pipes,
//!   typed; [`handle`]: the agent's side of all this.
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
//!   signal to the agent's group (agent + keeper) reaches the job only
//!   through the agent's relay: exactly once. Handled (not ignored)
//!   signals are reset to their defaults by `exec`, so the job starts clean.
//!   At a terminal (`--terminal`) the job's own group is the terminal's
//!   foreground: Ctrl-C and Ctrl-Z reach it directly, as under a shell, and
//!   the keeper reports the leader's stops (`Stopped`) for the agent's
//!   front process.
//! - A failed `setsid` is reported as a warning; a failed subreaper call is
//!   reported and the job is not started (the tree could not be followed).

pub mod cgroup;
pub mod event_loop;
pub mod guard;
pub mod handle;
pub mod lateness;
pub mod os;
pub mod protocol;
pub mod spawn;
pub mod tree;

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use rustix::event::{PollFd, PollFlags};
use rustix::io::{FdFlags, fcntl_setfd};
use rustix::process::set_child_subreaper;

use crate::sys::signal::Sig;
use os::{Reporter, System};
use protocol::{Report, SpawnFailure};

/// The hidden first argument that selects keeper mode.
pub const KEEPER_ARG: &str = "__keeper";

/// The keeper's name in `ps`, `pgrep` and OOM reports: `comm` holds at most
/// 15 bytes, so `leaseagent-keeper` (its `argv[0]`) shows as this.
pub const KEEPER_COMM: &str = "leaseagent-keep";

/// How the agent wants the job started, beyond its command: the keeper's
/// arguments before `--`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobOptions {
    /// `--user`: the ids the job's child switches to.
    pub user: Option<crate::sys::user::Identity>,
    /// The job gets the agent's terminal (stdin): the keeper stays in the
    /// agent's session and the job's group becomes the terminal's
    /// foreground (see `sys/terminal.rs` and `agent/front.rs`).
    pub terminal: bool,
    /// `--full-root`: a root job keeps every capability (`sys::confine`).
    pub full_root: bool,
    /// `--allow-new-privs`: a `--user` job runs without NoNewPrivs.
    pub allow_new_privs: bool,
}

impl JobOptions {
    /// The arguments that say these options.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(id) = &self.user {
            args.push("--user".to_string());
            args.push(id.to_arg());
        }
        if self.terminal {
            args.push("--terminal".to_string());
        }
        if self.full_root {
            args.push("--full-root".to_string());
        }
        if self.allow_new_privs {
            args.push("--allow-new-privs".to_string());
        }
        args
    }

    /// The options up to `--`, and what follows it. `None`: not arguments
    /// the agent writes.
    fn parse(args: &[OsString]) -> Option<(JobOptions, &[OsString])> {
        let mut options = JobOptions::default();
        let mut rest = args;
        loop {
            let (first, tail) = rest.split_first()?;
            match first.to_str()? {
                "--" => return Some((options, tail)),
                "--user" => {
                    let (id, tail) = tail.split_first()?;
                    options.user = Some(crate::sys::user::Identity::from_arg(id.to_str()?)?);
                    rest = tail;
                }
                "--terminal" => {
                    options.terminal = true;
                    rest = tail;
                }
                "--full-root" => {
                    options.full_root = true;
                    rest = tail;
                }
                "--allow-new-privs" => {
                    options.allow_new_privs = true;
                    rest = tail;
                }
                _ => return None,
            }
        }
    }
}

/// Runs the keeper: `__keeper [--user UID:GID:GROUPS] [--terminal]
/// [--full-root] [--allow-new-privs] -- COMMAND [ARG...]`, its ctl socket
/// at fd 3 and its report socket at fd 4, the agent's pid in
/// `sys::keeper_spawn::AGENT_PID_ENV` (none of them on the command line,
/// which the job may read: `sys::keeper_spawn` put them there).
pub fn main(args: Vec<OsString>) -> ExitCode {
    // Before anything else, and long before the job exists: exec made us
    // dumpable again, and the job (same uid) must not be able to trace us,
    // open our descriptors through /proc or write our oom_score_adj.
    let dumpable = crate::sys::keeper_spawn::not_dumpable();
    crate::sys::malloc::one_arena();
    let Some(agent) = crate::sys::keeper_spawn::take_agent_pid() else {
        os::stderr_line("leaseagent: __keeper is internal to leaseagent");
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    let claimed = (
        crate::sys::fd::claim_inherited_fd(crate::sys::keeper_spawn::KEEPER_CTL_FD),
        crate::sys::fd::claim_inherited_fd(crate::sys::keeper_spawn::KEEPER_REPORT_FD),
    );
    let (Ok(ctl), Ok(report)) = claimed else {
        os::stderr_line("leaseagent: keeper: control descriptors missing");
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    let Some((options, command)) = JobOptions::parse(&args) else {
        os::stderr_line("leaseagent: __keeper is internal to leaseagent");
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    run(ctl, report, command.to_vec(), agent, dumpable, options)
}

/// The keeper's lifecycle: claim the channels, prepare (handlers, session,
/// subreaper, cgroup), start the job, run the loop, clean up.
fn run(
    ctl: OwnedFd,
    report: OwnedFd,
    command: Vec<OsString>,
    agent: u32,
    dumpable: std::io::Result<()>,
    options: JobOptions,
) -> ExitCode {
    let Some(mut out) = close_pipes_on_exec(&ctl, report) else {
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    if let Err(e) = dumpable {
        // The job is not started: it could reach us through /proc.
        out.send(&spawn_failed(format!(
            "keeper: cannot make itself non-dumpable (PR_SET_DUMPABLE): {e}"
        )));
        return ExitCode::SUCCESS;
    }
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
    // The kill path's descriptor, opened while we may: our own children,
    // read again from the start when nothing else can be opened.
    let children = rustix::fs::open(
        "/proc/thread-self/children",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok();
    let started = match prepare_and_spawn(&mut out, &ctl, &command, agent, &options) {
        Ok(Some(started)) => started,
        // The agent went away before the grant: no job.
        Ok(None) => return ExitCode::SUCCESS,
        Err(failed) => {
            // The agent reads this as the job's spawn failure.
            out.send(&failed);
            return ExitCode::SUCCESS;
        }
    };
    let Started {
        sigchld,
        cgroup,
        job_pid,
        carry,
        containment,
    } = started;
    out.send(&Report::Started {
        pid: job_pid,
        containment,
    });
    let system = System::new(out, ctl, sigchld, timer, cgroup, children);
    event_loop::EventLoop::new(system, job_pid, carry)
        .run()
        .finish();
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

/// Neither channel may reach the job; the report end becomes the
/// [`Reporter`]. `None`: cannot even report.
fn close_pipes_on_exec(ctl: &OwnedFd, report: OwnedFd) -> Option<Reporter> {
    if fcntl_setfd(ctl, FdFlags::CLOEXEC).is_err()
        || fcntl_setfd(&report, FdFlags::CLOEXEC).is_err()
        // Read to the end of what is queued, never waiting (`read_ctl`).
        || rustix::fs::fcntl_setfl(ctl, rustix::fs::OFlags::NONBLOCK).is_err()
    {
        return None;
    }
    Some(Reporter::new(std::fs::File::from(report)))
}

/// What the keeper has once the job runs.
struct Started {
    /// The SIGCHLD self-pipe.
    sigchld: UnixStream,
    /// The job's cgroup, if any.
    cgroup: Option<cgroup::JobCgroup>,
    job_pid: i32,
    /// Ctl bytes read past the "go" frame.
    carry: Vec<u8>,
    containment: protocol::Containment,
}

/// Every step before the loop, in order: set-up, the "go" frame with the
/// job's environment (`None`: the agent left without one), the job.
fn prepare_and_spawn(
    out: &mut Reporter,
    ctl: &OwnedFd,
    command: &[OsString],
    agent: u32,
    options: &JobOptions,
) -> Result<Option<Started>, Report> {
    handle_relayed_signals()?;
    let sigchld = watch_sigchld()?;
    differ_from_a_root_job(out, options);
    // With the agent's terminal, the job must share its session (a
    // controlling terminal belongs to one session).
    if !options.terminal {
        new_session(out);
    }
    become_subreaper()?;
    let Some((program, rest)) = command.split_first() else {
        return Err(spawn_failed("no command".into()));
    };
    // A cgroup of the job's own where one can be made; `None` is the usual
    // case outside a delegated cgroup: the tree walk alone.
    let mut cgroup = cgroup::JobCgroup::create(agent).ok();
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
    // Made now: it notes which signals this process ignores.
    let steps = crate::sys::spawn::ChildSteps::new(
        options.user.as_ref(),
        options.terminal,
        job_limits(options),
    );
    let job = spawn::Job {
        program,
        resolved: found.as_deref().filter(|_| !sets_path),
        rest,
        env: &env,
        oom_score_adj,
        steps: &steps,
    };
    let (job_pid, containment) = spawn::spawn_job(out, &job, &mut cgroup)?;
    Ok(Some(Started {
        sigchld,
        cgroup,
        job_pid,
        carry,
        containment,
    }))
}

/// What the job starts without (`sys::confine`): a job of another user
/// starts with stdio alone and NoNewPrivs (unless `--allow-new-privs`); a
/// job of a keeper that holds capabilities to drop loses the ones that
/// reach its guardians (unless `--full-root`).
fn job_limits(options: &JobOptions) -> crate::sys::spawn::Limits {
    let other_user = options.user.is_some();
    crate::sys::spawn::Limits {
        confine: !options.full_root && crate::sys::confine::may_drop(),
        no_new_privs: other_user && !options.allow_new_privs,
        stdio_only: other_user,
    }
}

/// A root keeper's saved gid made to differ from its job's ids, so a root
/// job may not `prlimit` it (`sys::confine::differ_saved_gid`). Only when
/// the job is confined and this keeper is root; a failure is a warning.
fn differ_from_a_root_job(out: &mut Reporter, options: &JobOptions) {
    if options.full_root || !rustix::process::geteuid().is_root() {
        return;
    }
    if let Err(e) = crate::sys::confine::differ_saved_gid() {
        out.send(&Report::Warning(format!(
            "keeper: cannot set its saved gid ({e}): a root command may change the keeper's limits"
        )));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_options_round_trip_through_the_keepers_arguments() {
        let all = JobOptions {
            user: Some(crate::sys::user::Identity::new(65534, 65534, vec![7])),
            terminal: true,
            full_root: true,
            allow_new_privs: true,
        };
        for options in [JobOptions::default(), all] {
            let mut args: Vec<OsString> = options.to_args().into_iter().map(Into::into).collect();
            args.extend(["--".into(), "job".into(), "--full-root".into()]);
            let (parsed, command) = JobOptions::parse(&args).unwrap();
            assert_eq!(parsed, options);
            // What follows `--` is the command's, whatever it looks like.
            assert_eq!(command, [OsString::from("job"), "--full-root".into()]);
        }
        // The agent's pid is no argument any more: a number is refused.
        assert_eq!(JobOptions::parse(&["4242".into(), "--".into()]), None);
    }

    #[test]
    fn a_job_of_another_user_starts_with_stdio_and_no_new_privs_unless_allowed() {
        let user = Some(crate::sys::user::Identity::new(65534, 65534, vec![]));
        let limits = |allow_new_privs| {
            job_limits(&JobOptions {
                user: user.clone(),
                allow_new_privs,
                ..JobOptions::default()
            })
        };
        assert!(limits(false).no_new_privs && limits(false).stdio_only);
        assert!(!limits(true).no_new_privs && limits(true).stdio_only);
        let own = job_limits(&JobOptions::default());
        assert!(!own.no_new_privs && !own.stdio_only);
        let full = job_limits(&JobOptions {
            full_root: true,
            ..JobOptions::default()
        });
        assert!(!full.confine);
    }
}
