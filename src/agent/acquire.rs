//! Acquire, and `--wait`: asking for the task until it is granted, the wait
//! runs out, or a stop signal comes.
//!
//! Why its own file: the wait is a policy (when to ask again, what to tell
//! the user meanwhile, when to give up) that the run's wiring in `mod.rs`
//! need not know. Its decisions are made in one place,
//! [`Waiting::after_refusal`]: every answer that is not a grant goes there,
//! and it says whether the agent exits (with which status) or asks again
//! (after which pause). A change to when `--wait` retries is a change there.
//!
//! An authority with a queue (etcd) is driven through its [`Waiter`](crate::authority::Waiter)
//! capability: it keeps the waiter's place between calls, so a waiter is
//! not sent to the back each time it asks again; every way out of the wait
//! that is not a grant gives the place up ([`Waiting::abandon`]), or it
//! would block the next holder. An authority without a queue is asked with
//! a plain acquire each time, the pause between asks ours.
//!
//! Invariants:
//! - The send instant of the attempt that was granted is read on the boot
//!   clock *before* the request goes out; the first local deadline counts
//!   from it.
//! - Each call is bounded ([`acquire_timeout`]); with a queue, each call
//!   waits in it at most a second, so a stop signal or the end of `--wait`
//!   is noticed within about a second plus one call.
//! - Only stop signals end a wait (128+N); other signals have no job to go
//!   to yet and are dropped.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::agent::config::RunConfig;
use crate::agent::machine::Event;
use crate::authority::{AcquireError, AcquireRequest, Grant, LeaseClient};
use crate::exit;
use crate::sys::notify::Notifier;
use crate::time::clock::BootInstant;

/// The longest one acquire call may take.
pub fn acquire_timeout(cfg: &RunConfig) -> Duration {
    (cfg.ttl / 2).clamp(Duration::from_millis(1), Duration::from_secs(10))
}

/// How the acquire ended.
pub enum Acquired {
    /// The grant, and the send instant of the request that got it.
    Granted(Grant, BootInstant),
    /// Not granted: the agent exits with this status (already said why).
    Exit(u8),
}

/// What the agent does after an answer that is not a grant.
enum Next {
    /// Exits with this status (already said why).
    Exit(u8),
    /// Asks again after this pause, watching for stop signals.
    AskAgain(Duration),
}

/// The state of an acquire between attempts.
struct Waiting {
    started: BootInstant,
    /// `None`: no `--wait`. `Some(None)`: forever.
    until: Option<Option<BootInstant>>,
    backoff: Duration,
    last_note: String,
    timeout: Duration,
}

/// Acquires the task, waiting while it is held if `--wait` says so.
pub fn acquire(
    cfg: &RunConfig,
    auth: &mut dyn LeaseClient,
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
    let mut waiting = Waiting {
        started,
        until: cfg.wait.map(|d| d.map(|d| started + d)),
        backoff: Duration::from_millis(100),
        last_note: String::new(),
        timeout: acquire_timeout(cfg),
    };
    loop {
        let sent = BootInstant::now();
        let refusal = match waiting.attempt(auth, &req, sent) {
            Ok(g) => return Acquired::Granted(g, sent),
            Err(e) => e,
        };
        let pause = match waiting.after_refusal(cfg, auth, refusal, notifier) {
            Next::Exit(code) => return Acquired::Exit(code),
            Next::AskAgain(pause) => pause,
        };
        if let Some(code) = waiting.pause(cfg, auth, pause, events) {
            return Acquired::Exit(code);
        }
    }
}

impl Waiting {
    /// One acquire call: through the authority's queue while waiting (a
    /// slice of at most a second of waiting in it), else a plain acquire.
    fn attempt(
        &self,
        auth: &mut dyn LeaseClient,
        req: &AcquireRequest,
        sent: BootInstant,
    ) -> Result<Grant, AcquireError> {
        if let Some(until) = self.until {
            if let Some(mut queue) = auth.waiter() {
                // Slices of at most a second keep signals and our own
                // deadline noticed.
                let slice = until.map_or(Duration::from_secs(1), |u| {
                    sent.until(u).min(Duration::from_secs(1))
                });
                return queue.acquire_wait(req, slice, self.timeout);
            }
        }
        auth.acquire(req, self.timeout)
    }

    /// The one place that decides what follows an answer that is not a
    /// grant, and says so: a request the authority rejects, a trust
    /// problem or an authority that cannot answer ends the run (125); a
    /// held task ends it (75) without `--wait` or once `--wait` ran out,
    /// else it is asked for again after a pause (backoff from 100 ms
    /// doubling to 1 s, shortened to the authority's `retry_after`, ±20 %
    /// jitter, never past the end of the wait).
    fn after_refusal(
        &mut self,
        cfg: &RunConfig,
        auth: &mut dyn LeaseClient,
        refusal: AcquireError,
        notifier: &mut Notifier,
    ) -> Next {
        let retry_after = match &refusal {
            AcquireError::Rejected(m) | AcquireError::Trust(m) => {
                log::error!("cannot acquire task {}: {m}", cfg.task);
                self.abandon(auth);
                return Next::Exit(exit::AGENT_FAILED);
            }
            AcquireError::Transient(f) => {
                log::error!(
                    "cannot acquire task {}: authority {} unreachable or broken: {f}",
                    cfg.task,
                    auth.url()
                );
                self.abandon(auth);
                return Next::Exit(exit::AGENT_FAILED);
            }
            AcquireError::Held { retry_after, .. } => *retry_after,
            AcquireError::HeldForOperator { .. } => None,
        };
        let note = refusal.to_string();
        let Some(until) = self.until else {
            log::error!(
                "task {} is {note}; not acquired (use --wait to wait for it)",
                cfg.task
            );
            return Next::Exit(exit::HELD);
        };
        let now = BootInstant::now();
        if until.is_some_and(|u| now >= u) {
            self.abandon(auth);
            log::error!(
                "task {} is still {note} after waiting {}; giving up",
                cfg.task,
                crate::time::duration::format(now.saturating_since(self.started))
            );
            return Next::Exit(exit::HELD);
        }
        if note != self.last_note {
            let limit = match until {
                Some(u) => format!("up to {} more", crate::time::duration::format(now.until(u))),
                None => "with no limit".into(),
            };
            log::info!("task {} is {note}; waiting ({limit})", cfg.task);
            notifier.status(&format!("waiting for task {}: {note}", cfg.task));
            self.last_note = note;
        }
        // Ask again soon: a release frees the task at once, and
        // retry_after only says when it frees at the latest. Jitter
        // spreads waiters.
        let now = BootInstant::now();
        let mut pause = self.backoff;
        if let Some(r) = retry_after {
            pause = pause.min(r.max(Duration::from_millis(20)));
        }
        pause = pause.mul_f64(0.8 + fastrand::f64() * 0.4);
        if let Some(u) = until {
            pause = pause.min(now.until(u));
        }
        self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
        Next::AskAgain(pause)
    }

    /// Gives up the place in the authority's queue, if waiting kept one.
    fn abandon(&self, auth: &mut dyn LeaseClient) {
        if self.until.is_none() {
            return;
        }
        if let Some(mut queue) = auth.waiter() {
            queue.abandon_wait(self.timeout);
        }
    }

    /// Sleeps `pause`, watching for stop signals (`Some(128 + N)`).
    fn pause(
        &self,
        cfg: &RunConfig,
        auth: &mut dyn LeaseClient,
        pause: Duration,
        events: &Receiver<Event>,
    ) -> Option<u8> {
        let pause_until = BootInstant::now() + pause;
        loop {
            let left = BootInstant::now().until(pause_until);
            if left.is_zero() {
                return None;
            }
            match events.recv_timeout(left.min(crate::time::clock::MAX_WAIT)) {
                Ok(Event::Signal(sig)) if sig.ends_run() => {
                    self.abandon(auth);
                    log::warn!(
                        "signal {sig} while waiting for task {}; not acquired",
                        cfg.task
                    );
                    return Some(sig.exit_status());
                }
                // No job yet: other signals have nothing to go to.
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}
