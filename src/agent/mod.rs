//! `leaseagent [OPTIONS] -- COMMAND`: acquire (and `--wait`, in
//! [`acquire`]), then hand over to the supervisor loop. This module only
//! wires the pieces together.
//!
//! Order matters:
//! 0. While the agent has one thread: the front (at a terminal), then the
//!    scribe (`scribe.rs`), which makes every filesystem write of the run,
//!    so that no thread of the agent ever sleeps on a stalled filesystem.
//! 1. Signal handlers first, so a SIGTERM during acquire or `--wait` ends the
//!    agent cleanly instead of killing it between "granted" and "job started"
//!    (which would leave a lease to expire by itself).
//! 2. Acquire. The send instant is read before the request: the first local
//!    deadline counts from it.
//! 3. Signals that arrived before the job exists: a stop signal releases the
//!    lease and exits 128+N without starting the command; any other signal
//!    had no job to go to and is dropped (a SIGHUP sent during acquire must
//!    not hit the job that starts afterwards).
//! 4. The grant goes to the machine first (`Event::Granted`): one that came
//!    with less than grace left is released as lost and the command never
//!    starts. Then keeper and job (the job's environment: `env.rs`), the
//!    heartbeat thread, and the loop. Every end of the run after the grant
//!    is the machine's decision, carried out by the supervisor.

pub mod acquire;
pub mod config;
pub mod env;
pub mod front;
pub mod heartbeat;
pub mod logging;
pub mod machine;
pub mod release;
pub mod report;
pub mod resolve;
pub mod scribe;
pub mod signals;
pub mod state_file;
pub mod supervisor;
pub mod timing;

use std::process::ExitCode;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::agent::acquire::Acquired;
use crate::agent::config::{RunAs, RunConfig};
use crate::agent::env::{job_env, keeper_env_remove};
use crate::agent::machine::{Event, Machine};
use crate::agent::scribe::Scribe;
use crate::agent::state_file::StateSink;
use crate::agent::supervisor::Supervisor;
use crate::authority::{self, Grant, LeaseClient, Outcome};
use crate::exit;
use crate::keeper::handle::News;
use crate::keeper::protocol::{Report, SpawnFailure};
use crate::sys::notify::Notifier;
use crate::time::clock::BootInstant;

/// Runs the command under a lease; the whole life of the agent.
pub fn main(cfg: RunConfig) -> ExitCode {
    // Before anything else, while this process has one thread: at a
    // terminal, the pid the shell waits on becomes the front process.
    // A job of another user gets no terminal of the caller's (it could push
    // input into it, TIOCSTI, which the caller's shell would then run): no
    // front, so the keeper and the job take sessions of their own.
    let other_user = cfg.user.as_ref().is_some_and(|u| u.switch.is_some());
    let split = if other_user {
        crate::agent::front::Role::Alone
    } else {
        crate::agent::front::split()
    };
    let front = match split {
        crate::agent::front::Role::Front(code) => return ExitCode::from(code),
        crate::agent::front::Role::Agent(link) => Some(link),
        crate::agent::front::Role::Alone => None,
    };
    // Out of the job's reach before the job exists: no ptrace, no
    // /proc/PID/fd, mem or oom_score_adj for another process of our uid.
    // Before the scribe's fork, which inherits it.
    let dumpable = crate::sys::keeper_spawn::not_dumpable();
    // Before the scribe's fork: it logs at the same level.
    crate::agent::logging::configure(cfg.log);
    crate::agent::logging::set_task(&cfg.task);
    // Still one thread: the scribe, which makes every filesystem write of
    // the run, forks now (`scribe.rs`), with the malloc arena cap.
    crate::sys::malloc::one_arena();
    let db = match &cfg.authority {
        authority::AuthoritySpec::Sqlite(path) => Some(path.clone()),
        _ => None,
    };
    let (scribe, ending) =
        match crate::agent::scribe::Scribe::start(db, state_group(cfg.user.as_ref())) {
            Ok((s, e)) => (Ok(s), Some(e)),
            Err(e) => (Err(e), None),
        };
    crate::agent::logging::init();
    let code = match dumpable {
        Ok(()) => run(cfg, front, scribe),
        Err(e) => {
            log::error!("cannot make the agent non-dumpable (PR_SET_DUMPABLE): {e}");
            exit::AGENT_FAILED
        }
    };
    // Bounded: the scribe's files closed before the agent's exit is seen,
    // unless its filesystem stalls.
    if let Some(e) = ending
        && !e.wait_gone(SCRIBE_END_WITHIN)
    {
        log::debug!("the agent's store process had not finished at the agent's exit");
    }
    // Bounded: a stalled stderr delays the exit by at most this much.
    crate::agent::logging::flush(Duration::from_millis(500));
    ExitCode::from(code)
}

fn run(
    cfg: RunConfig,
    front: Option<crate::agent::front::FrontLink>,
    scribe: std::io::Result<Scribe>,
) -> u8 {
    // Before the lease is asked for: a command that cannot run spends no
    // token and leaves no attempt in the history (`resolve.rs`).
    if let Some(program) = cfg.command.first()
        && let Err(e) = crate::agent::resolve::check(program, std::env::var_os("PATH").as_deref())
    {
        log::error!("{e}");
        return e.exit_code();
    }
    let mut scribe = match scribe {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn!(
                "no store process for the agent's filesystem writes ({e}): the agent writes \
                 itself, and a stalled filesystem can hold its exit"
            );
            None
        }
    };
    // A child subreaper, like the keeper: if the keeper dies, the job's
    // processes re-parent to the agent, which can still see and kill them.
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        log::warn!(
            "cannot become a child subreaper ({e}): a dead keeper's orphans escape the agent"
        );
    }
    // The keeper starts first: its start-up (an exec, its handlers, the job
    // cgroup) overlaps everything up to the grant. It starts the job only
    // once `start` hands it the grant's environment.
    // Run from a shell in the foreground of a terminal (a front process
    // in front of us): the job gets that terminal (its controlling
    // terminal, its process group the foreground), and the front's group
    // gets it back before the agent exits, by whatever path (the link's
    // drop).
    let terminal = front.is_some();
    let options = crate::keeper::JobOptions {
        user: cfg.user.as_ref().and_then(|u| u.switch.clone()),
        terminal,
        full_root: cfg.full_root,
        allow_new_privs: cfg.allow_new_privs,
    };
    let keeper = match crate::keeper::handle::prestart_keeper(
        &cfg.command,
        &keeper_env_remove(),
        &options,
        !cfg.no_pid_namespace,
    ) {
        Ok(k) => k,
        Err(e) => {
            log::error!("cannot start the keeper process: {e}");
            return exit::AGENT_FAILED;
        }
    };
    match (keeper.fallback(), cfg.no_pid_namespace) {
        (Some(why), false) => log::warn!(
            "no PID namespace for the command: {why}; its tree is held by a cgroup or the process tree alone"
        ),
        (Some(_), true) => log::info!("no PID namespace for the command (--no-pid-namespace)"),
        (None, _) => {}
    }
    let memory = crate::sys::memory::protect();
    log::debug!("oom_score_adj {:?}", memory.oom_score_adj);
    if let Err(why) = memory.locked {
        log::info!(
            "memory not locked: {why}; renewals may wait on page faults under memory pressure"
        );
    }
    let (tx, rx) = crossbeam_channel::unbounded::<Event>();
    if let Err(e) = crate::agent::signals::spawn(tx.clone()) {
        log::error!("cannot install signal handlers: {e}");
        return exit::AGENT_FAILED;
    }
    authority::netpath::set_marks(cfg.renew_marks);
    let opened = authority::open_via(&cfg.authority, &cfg.trust, |path| match scribe.as_mut() {
        Some(s) => s
            .embedded(path, OPEN_WITHIN)
            .map(|a| Box::new(a) as Box<dyn LeaseClient>)
            .map_err(authority::OpenError::Scribed),
        None => authority::open_embedded(path),
    });
    let mut auth = match opened {
        Ok(a) => a,
        Err(e) => {
            log::error!("{e}");
            return exit::AGENT_FAILED;
        }
    };
    let mut notifier = Notifier::from_env();
    notifier.status(&format!("acquiring task {}", cfg.task));
    let (grant, sent) = match acquire::acquire(&cfg, &mut *auth, &rx, &mut notifier) {
        Acquired::Granted(g, sent) => (g, sent),
        Acquired::Exit(code) => return code,
    };
    if let Some(sig) = stop_before_start(&rx) {
        return release_unstarted(&grant, auth, sig);
    }
    start(
        &cfg,
        grant,
        sent,
        auth,
        (keeper, front, scribe),
        (tx, rx),
        notifier,
    )
}

/// How long the agent's exit waits for its scribe to be gone (its last
/// call answered, its files closed): more than a SQLite close takes by far;
/// on a stalled filesystem, what the exit costs at most.
const SCRIBE_END_WITHIN: Duration = Duration::from_secs(1);

/// How long the scribe's answer to opening the embedded database is
/// waited for (a directory checked, perhaps made: microseconds on a
/// working filesystem).
const OPEN_WITHIN: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- start

/// Signals that reached the agent before the job exists (during acquire):
/// a stop signal among them ends the run without starting the command
/// ([`release_unstarted`]); relayable ones are dropped, since there was no
/// job to relay them to when they came.
fn stop_before_start(events: &Receiver<Event>) -> Option<crate::sys::signal::Sig> {
    let mut stop = None;
    while let Ok(event) = events.try_recv() {
        match event {
            Event::Signal(sig) if sig.ends_run() => {
                stop.get_or_insert(sig);
            }
            Event::Signal(sig) => {
                log::debug!("signal {sig} arrived before the command started; not relayed to it")
            }
            _ => {}
        }
    }
    stop
}

/// A stop signal `sig` came before the command started: the lease is
/// released (on a thread, waited for a bounded time: `release.rs`) and the
/// agent ends with 128+N.
fn release_unstarted(
    grant: &Grant,
    auth: Box<dyn LeaseClient>,
    sig: crate::sys::signal::Sig,
) -> u8 {
    log::warn!(
        "signal {sig} received before the command started: releasing task {} token {} without starting it",
        grant.task,
        grant.token
    );
    let timeout = crate::agent::release::release_timeout(grant.ttl);
    let notice = crate::agent::release::release_within(
        auth,
        grant.lease_ref(),
        Outcome::Cancelled,
        None,
        timeout,
    );
    if !matches!(notice, crate::agent::report::Notice::Released { .. }) {
        crate::agent::report::Reporter::new(&grant.task, grant.token).report(&notice);
    }
    sig.exit_status()
}

/// The group of the state file's own directory: a job of another uid
/// cannot enter the agent's 0700 runtime dir, so it gets a directory of
/// the run's own, of the job's group. `None`: the runtime dir.
fn state_group(user: Option<&RunAs>) -> Option<u32> {
    let me = rustix::process::geteuid().as_raw();
    user.and_then(|u| u.switch.as_ref())
        .filter(|id| id.uid != me)
        .map(|id| id.gid)
}

/// Where the agent publishes its view of the lease for `leaseagent check`:
/// through the scribe, its answer waited for `within`, or (no scribe)
/// by this process.
fn state_sink(
    user: Option<&RunAs>,
    scribe: Option<&mut Scribe>,
    within: Duration,
) -> Option<Box<dyn StateSink>> {
    use crate::agent::state_file::StateWriter;
    let group = state_group(user);
    let made: Result<Box<dyn StateSink>, String> = match (scribe, group) {
        (Some(s), group) => s
            .state_file(group, within)
            .map(|w| Box::new(w) as Box<dyn StateSink>),
        (None, Some(gid)) => StateWriter::for_group(gid, std::process::id())
            .map(|w| Box::new(w) as Box<dyn StateSink>)
            .map_err(|e| e.to_string()),
        // The runtime dir (see `sys::paths::runtime_dir`), checked: never
        // written through if another user could have prepared it.
        (None, None) => crate::sys::paths::runtime_dir()
            .map(|(path, fd)| {
                Box::new(StateWriter::in_checked_dir(&path, fd, std::process::id()))
                    as Box<dyn StateSink>
            })
            .map_err(|e| e.to_string()),
    };
    match made {
        Ok(w) => Some(w),
        Err(e) if group.is_some() => {
            log::warn!("no lease state file for `leaseagent check` by the command: {e}");
            None
        }
        Err(e) => {
            log::warn!("no lease state file for `leaseagent check`: {e}");
            None
        }
    }
}

/// Says what was granted (and what was scaled to fit a clamped ttl).
fn log_grant(cfg: &RunConfig, grant: &Grant, auth: &dyn LeaseClient) {
    let (heartbeat, grace) = cfg.settings().fitted(grant.ttl);
    if grant.ttl < cfg.ttl && (heartbeat, grace) != (cfg.heartbeat, cfg.grace) {
        log::warn!(
            "authority granted a ttl of {} (asked {}); heartbeat {} and grace {} scaled to fit",
            crate::time::duration::format(grant.ttl),
            crate::time::duration::format(cfg.ttl),
            crate::time::duration::format(heartbeat),
            crate::time::duration::format(grace)
        );
    }
    crate::agent::logging::set_grant(grant.token, &grant.lease_id);
    log::info!(
        "acquired task {} token {} (lease {}, ttl {}, heartbeat {}, grace {}) from {}",
        grant.task,
        grant.token,
        grant.lease_id,
        crate::time::duration::format(grant.ttl),
        crate::time::duration::format(heartbeat),
        crate::time::duration::format(grace),
        auth.url()
    );
}

/// Starts the keeper (and through it the job) and the heartbeat, then runs
/// the supervisor loop to the end.
fn start(
    cfg: &RunConfig,
    grant: Grant,
    sent: BootInstant,
    mut auth: Box<dyn LeaseClient>,
    // The keeper, the front process at a terminal, and the scribe.
    (keeper, front, mut scribe): (
        crate::keeper::handle::Pending,
        Option<crate::agent::front::FrontLink>,
        Option<Scribe>,
    ),
    events: (Sender<Event>, Receiver<Event>),
    notifier: Notifier,
) -> u8 {
    log_grant(cfg, &grant, &*auth);
    let settings = cfg.settings();
    let machine = Machine::new(sent, grant.ttl, settings);
    let tx = events.0.clone();
    // The heartbeat thread's handle; `auth` goes to the supervisor, which
    // releases (the client decides which keeps its open connection).
    let renewer = auth.renewer();
    let url = auth.url();
    let mut sup = Supervisor::new(machine, grant.clone(), auth, events, notifier);
    sup.set_front(front);
    // A grant that came with less than grace left: released as lost, the
    // command never started.
    if let Some(code) = sup.step(Event::Granted) {
        return code;
    }
    // Bounded: a state directory on a stalled filesystem costs the job its
    // state file, not its start while the lease runs out.
    let within = (grant.ttl / 2).min(Duration::from_secs(5));
    let state = state_sink(cfg.user.as_ref(), scribe.as_mut(), within);
    // Lanes not handed out close: the scribe's threads for them end.
    let scribe_pid = scribe.as_ref().map(Scribe::pid);
    drop(scribe);
    let env = job_env(&grant, &url, state.as_deref(), cfg.user.as_ref());
    // Publish before the job starts so `check` works from its first line.
    sup.publish_initial(state);
    match keeper.start(&env, tx.clone(), event_of, scribe_pid) {
        Ok(k) => sup.set_keeper(k),
        Err(e) => {
            let error = e.to_string();
            return match sup.step(Event::KeeperNotStarted { error }) {
                Some(code) => code,
                None => sup.run(),
            };
        }
    }
    let schedule = crate::agent::heartbeat::Schedule {
        settings,
        ttl: grant.ttl,
        granted_at: sent,
    };
    match crate::agent::heartbeat::spawn(renewer, grant.lease_ref(), schedule, tx) {
        Ok(h) => sup.set_heartbeat(h),
        Err(e) => {
            // No renewals: the machine stops the job before the deadline.
            log::error!("cannot start the heartbeat thread: {e}");
        }
    }
    sup.start_state_queue();
    sup.run()
}

/// The machine event a keeper's news stands for.
fn event_of(news: News) -> Option<Event> {
    let report = match news {
        News::Reaped { tree_empty } => return Some(Event::KeeperReaped { tree_empty }),
        News::Report(r) => r,
    };
    match report {
        Report::Started { pid, containment } => Some(Event::ChildStarted { pid, containment }),
        Report::Size {
            procs,
            private_kib,
            busy_milli,
            late_us,
        } => {
            // Sent only when the lead it sizes moved by 5 ms or more.
            log::debug!(
                "keeper: the tree has {procs} processes and {} KiB of private memory, the load is {}.{:03} a CPU, its timed wakes were up to {}.{:03} ms late",
                private_kib,
                busy_milli / 1000,
                busy_milli % 1000,
                late_us / 1000,
                late_us % 1000
            );
            Some(Event::TreeSized(crate::keeper::protocol::tree_size(
                procs,
                private_kib,
                busy_milli,
                late_us,
            )))
        }
        Report::SpawnFailed { kind, message } => Some(Event::SpawnFailed {
            not_found: kind == SpawnFailure::NotFound,
            message,
        }),
        Report::Exited { status, at_ms } => Some(Event::ChildExited {
            status,
            at: BootInstant::from_since_boot(Duration::from_millis(at_ms)),
        }),
        Report::TreeGone => Some(Event::TreeGone),
        Report::Stopped => Some(Event::JobStopped),
        Report::Survivor { .. } | Report::Warning(_) | Report::Info(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::ChildStatus;

    #[test]
    fn keeper_reports_become_events() {
        let ev = |l: &str| event_of(News::Report(l.parse::<Report>().unwrap()));
        assert_eq!(
            ev("P 42 pidns"),
            Some(Event::ChildStarted {
                pid: 42,
                containment: crate::keeper::protocol::Containment::Pidns
            })
        );
        assert_eq!(
            ev("Z 3 2048 7500"),
            Some(Event::TreeSized(crate::time::deadline::TreeSize {
                procs: 3,
                private_bytes: 2 << 20,
                busy_milli: 7500,
                late_us: 0,
            }))
        );
        assert_eq!(
            ev("Z 3 2048 7500 9000"),
            Some(Event::TreeSized(crate::time::deadline::TreeSize {
                procs: 3,
                private_bytes: 2 << 20,
                busy_milli: 7500,
                late_us: 9_000,
            }))
        );
        assert_eq!(ev("G"), Some(Event::TreeGone));
        assert_eq!(
            ev("E not_found No such file"),
            Some(Event::SpawnFailed {
                not_found: true,
                message: "No such file".into()
            })
        );
        assert_eq!(
            ev("X exit 3 1500"),
            Some(Event::ChildExited {
                status: ChildStatus::Exited(3),
                at: BootInstant::from_since_boot(Duration::from_millis(1500))
            })
        );
        assert_eq!(ev("S 7 eperm sleep 1001"), None);
        assert_eq!(
            event_of(News::Reaped { tree_empty: true }),
            Some(Event::KeeperReaped { tree_empty: true })
        );
    }
}
