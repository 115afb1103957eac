//! `leaseagent [OPTIONS] -- COMMAND`: acquire (and `--wait`), then hand over
//! to the supervisor loop. This module only wires the pieces together.
//!
//! Order matters:
//! 1. Signal handlers first, so a SIGTERM during acquire or `--wait` ends the
//!    agent cleanly instead of killing it between "granted" and "job started"
//!    (which would leave a lease to expire by itself).
//! 2. Acquire. The send instant is read before the request: the first local
//!    deadline is `acquire sent + granted ttl`.
//! 3. Keeper and job, then the heartbeat thread, then the loop.

pub mod config;
pub mod heartbeat;
pub mod machine;
pub mod signals;
pub mod state_file;
pub mod supervisor;

use std::process::ExitCode;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::agent::config::RunConfig;
use crate::agent::machine::{Event, Machine};
use crate::agent::supervisor::Supervisor;
use crate::authority::{self, AcquireError, AcquireRequest, Authority, Grant};
use crate::exit;
use crate::sys::notify::Notifier;
use crate::time::clock::BootInstant;

/// Sets up stderr logging: `RUST_LOG` sets the level, `info` by default.
pub fn init_logging() {
    let env = env_logger::Env::default().filter_or("RUST_LOG", "info");
    let _ = env_logger::Builder::from_env(env)
        .format(|buf, record| {
            use std::io::Write;
            writeln!(
                buf,
                "leaseagent: {}: {}",
                record.level().as_str().to_lowercase(),
                record.args()
            )
        })
        .try_init();
}

/// The longest acquire may take.
fn acquire_timeout(cfg: &RunConfig) -> Duration {
    (cfg.ttl / 2).clamp(Duration::from_millis(1), Duration::from_secs(10))
}

enum Acquired {
    Granted(Grant, BootInstant),
    Exit(u8),
}

/// Acquires the task, waiting while it is held if `--wait` says so.
fn acquire(
    cfg: &RunConfig,
    auth: &mut dyn Authority,
    events: &Receiver<Event>,
    notifier: &mut Notifier,
) -> Acquired {
    let req = AcquireRequest {
        task: cfg.task.clone(),
        holder: cfg.holder.clone(),
        ttl: cfg.ttl,
        on_expiry: cfg.on_expiry,
        grace: cfg.expiry_grace,
    };
    let started = BootInstant::now();
    let wait_until = cfg.wait.map(|d| d.map(|d| started + d));
    let mut backoff = Duration::from_millis(100);
    let mut last_note = String::new();
    loop {
        let sent = BootInstant::now();
        let answer = match wait_until {
            // Waiting: an authority with a queue (etcd) keeps our place
            // between calls; slices of at most a second keep signals and our
            // own deadline noticed.
            Some(until) => {
                let slice = until.map_or(Duration::from_secs(1), |u| {
                    sent.until(u).min(Duration::from_secs(1))
                });
                auth.acquire_wait(&req, slice, acquire_timeout(cfg))
            }
            None => auth.acquire(&req, acquire_timeout(cfg)),
        };
        let (holder_note, retry_after) = match answer {
            Ok(g) => return Acquired::Granted(g, sent),
            Err(AcquireError::Rejected(m)) => {
                log::error!("cannot acquire task {}: {m}", cfg.task);
                return Acquired::Exit(exit::AGENT_FAILED);
            }
            Err(AcquireError::Trust(m)) => {
                log::error!("cannot acquire task {}: {m}", cfg.task);
                return Acquired::Exit(exit::AGENT_FAILED);
            }
            Err(AcquireError::Transient(m)) => {
                log::error!(
                    "cannot acquire task {}: authority {} unreachable or broken: {m}",
                    cfg.task,
                    auth.url()
                );
                return Acquired::Exit(exit::AGENT_FAILED);
            }
            Err(e @ AcquireError::Held { .. }) | Err(e @ AcquireError::HeldForOperator { .. }) => {
                let retry_after = match &e {
                    AcquireError::Held { retry_after, .. } => *retry_after,
                    _ => None,
                };
                (e.to_string(), retry_after)
            }
        };
        let now = BootInstant::now();
        let Some(until) = wait_until else {
            log::error!(
                "task {} is {holder_note}; not acquired (use --wait to wait for it)",
                cfg.task
            );
            return Acquired::Exit(exit::HELD);
        };
        if until.is_some_and(|u| now >= u) {
            auth.abandon_wait(acquire_timeout(cfg));
            log::error!(
                "task {} is still {holder_note} after waiting {}; giving up",
                cfg.task,
                crate::time::duration::format(now.saturating_since(started))
            );
            return Acquired::Exit(exit::HELD);
        }
        if holder_note != last_note {
            let limit = match until {
                Some(u) => format!("up to {} more", crate::time::duration::format(now.until(u))),
                None => "with no limit".into(),
            };
            log::info!("task {} is {holder_note}; waiting ({limit})", cfg.task);
            notifier.status(&format!("waiting for task {}: {holder_note}", cfg.task));
            last_note = holder_note;
        }
        // Poll again soon: a release frees the task at once, and retry_after
        // only says when it frees at the latest. Jitter spreads waiters.
        let mut pause = backoff;
        if let Some(r) = retry_after {
            pause = pause.min(r.max(Duration::from_millis(20)));
        }
        let jitter = 0.8 + fastrand::f64() * 0.4;
        pause = pause.mul_f64(jitter);
        if let Some(u) = until {
            pause = pause.min(now.until(u));
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
        let pause_until = BootInstant::now() + pause;
        loop {
            let left = BootInstant::now().until(pause_until);
            if left.is_zero() {
                break;
            }
            match events.recv_timeout(left.min(crate::time::clock::MAX_WAIT)) {
                Ok(Event::Signal(sig)) if crate::agent::signals::is_stop_signal(sig) => {
                    auth.abandon_wait(acquire_timeout(cfg));
                    log::warn!(
                        "signal {sig} while waiting for task {}; not acquired",
                        cfg.task
                    );
                    return Acquired::Exit((128 + sig) as u8);
                }
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
}

/// Where the agent publishes its view of the lease for `leaseagent check`.
fn state_writer() -> Option<crate::agent::state_file::StateWriter> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| std::path::PathBuf::from(d).join("leaseagent"))
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("leaseagent-{}", rustix::process::getuid().as_raw()))
        });
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&base);
    match crate::agent::state_file::StateWriter::in_dir(&base) {
        Ok(w) => Some(w),
        Err(e) => {
            log::warn!(
                "no lease state file for `leaseagent check` ({}: {e})",
                base.display()
            );
            None
        }
    }
}

/// Runs the command under a lease; the whole life of the agent.
pub fn main(cfg: RunConfig) -> ExitCode {
    init_logging();
    ExitCode::from(run(cfg))
}

fn run(cfg: RunConfig) -> u8 {
    let (tx, rx) = crossbeam_channel::unbounded::<Event>();
    if let Err(e) = crate::agent::signals::spawn(tx.clone()) {
        log::error!("cannot install signal handlers: {e}");
        return exit::AGENT_FAILED;
    }
    let mut auth = match authority::open(&cfg.authority, &cfg.trust) {
        Ok(a) => a,
        Err(e) => {
            log::error!("{e}");
            return exit::AGENT_FAILED;
        }
    };
    let mut notifier = Notifier::from_env();
    notifier.status(&format!("acquiring task {}", cfg.task));
    let (grant, sent) = match acquire(&cfg, &mut *auth, &rx, &mut notifier) {
        Acquired::Granted(g, sent) => (g, sent),
        Acquired::Exit(code) => return code,
    };
    let (heartbeat, grace) =
        crate::agent::config::fit_to_granted(cfg.ttl, cfg.heartbeat, cfg.grace, grant.ttl);
    if grant.ttl < cfg.ttl && (heartbeat, grace) != (cfg.heartbeat, cfg.grace) {
        log::warn!(
            "authority granted a ttl of {} (asked {}); heartbeat {} and grace {} scaled to fit",
            crate::time::duration::format(grant.ttl),
            crate::time::duration::format(cfg.ttl),
            crate::time::duration::format(heartbeat),
            crate::time::duration::format(grace)
        );
    }
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
    let machine = Machine::new(&grant.task, grant.token, sent, grant.ttl, grace);
    let state = state_writer();
    let mut env = vec![
        (
            crate::lease::env::TOKEN.to_string(),
            grant.token.to_string(),
        ),
        (crate::lease::env::ID.to_string(), grant.lease_id.clone()),
        (crate::lease::env::TASK.to_string(), grant.task.clone()),
        (crate::lease::env::AUTHORITY.to_string(), auth.url()),
        (
            crate::lease::env::TTL_MS.to_string(),
            grant.ttl.as_millis().to_string(),
        ),
    ];
    if let Some(s) = &state {
        env.push((
            crate::agent::state_file::ENV_STATE_FILE.to_string(),
            s.path().display().to_string(),
        ));
    }
    let boot_id = crate::time::clock::boot_id().unwrap_or_default();
    let mut sup = Supervisor {
        machine,
        grant: grant.clone(),
        authority: auth.clone_box(),
        events: rx,
        notifier,
        state,
        boot_id,
        heartbeat: None,
        keeper: None,
        _events_tx: tx.clone(),
        release_timeout: grant.ttl.min(Duration::from_secs(5)),
    };
    // Publish before the job starts so `check` works from its first line.
    let first = sup.machine.step(Event::Tick, BootInstant::now());
    debug_assert!(first.is_empty());
    sup.publish_initial();
    // Neither the trust flags' variables nor credentials in a URL reach the job.
    let env_remove: Vec<&str> = crate::sys::notify::JOB_ENV_REMOVE
        .iter()
        .chain(authority::trust::JOB_ENV_REMOVE)
        .copied()
        .collect();
    if let Some(url) = std::env::var("LEASEAGENT_AUTHORITY")
        .ok()
        .filter(|u| authority::trust::has_userinfo(u))
    {
        env.push((
            "LEASEAGENT_AUTHORITY".to_string(),
            authority::trust::redact_url(&url),
        ));
    }
    match crate::keeper::handle::spawn_keeper(&cfg.command, &env, &env_remove, tx.clone()) {
        Ok(k) => sup.keeper = Some(k),
        Err(e) => {
            log::error!("cannot start the keeper process: {e}");
            let _ = auth.release(
                &grant.lease_ref(),
                crate::lease::Outcome::Failed,
                None,
                sup.release_timeout,
            );
            return exit::AGENT_FAILED;
        }
    }
    let schedule = crate::agent::heartbeat::Schedule {
        heartbeat,
        deadline: sent + grant.ttl,
        granted_at: sent,
    };
    match crate::agent::heartbeat::spawn(auth, grant.lease_ref(), schedule, tx) {
        Ok(h) => sup.heartbeat = Some(h),
        Err(e) => {
            // No renewals: the machine stops the job before the deadline.
            log::error!("cannot start the heartbeat thread: {e}");
        }
    }
    sup.run()
}
