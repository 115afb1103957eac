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
                // deadline noticed; the first is an ask and no wait, so the
                // user is told at once that the task is held and we wait.
                let slice = if self.last_note.is_empty() {
                    Duration::ZERO
                } else {
                    until.map_or(Duration::from_secs(1), |u| {
                        sent.until(u).min(Duration::from_secs(1))
                    })
                };
                return queue.acquire_wait(req, slice, self.timeout);
            }
        }
        auth.acquire(req, self.timeout)
    }

    /// The one place that decides what follows an answer that is not a
    /// grant, and says so: a request the authority rejects or a trust
    /// problem ends the run (125), and so does an authority that cannot
    /// answer, unless `--wait` has time left (then it is asked again, and
    /// 125 if the wait runs out on such a failure); a held task ends it
    /// (75) without `--wait` or once `--wait` ran out,
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
            AcquireError::Transient(f) if !self.still_waiting() => {
                log::error!(
                    "cannot acquire task {}: authority {} unreachable or broken: {f}",
                    cfg.task,
                    auth.url()
                );
                self.abandon(auth);
                return Next::Exit(exit::AGENT_FAILED);
            }
            // `--wait` waits through the authority's failures too (the
            // contract): a restarting server or an etcd leader change must
            // not end a wait that has time left. The place in a queue is
            // kept.
            AcquireError::Transient(f) => {
                log::debug!("acquire of task {} failed: {f}", cfg.task);
                None
            }
            AcquireError::Held { retry_after, .. } => *retry_after,
            AcquireError::HeldForOperator { .. } => None,
        };
        let (note, ran_out) = match &refusal {
            AcquireError::Transient(_) => (
                format!(
                    "not answered: authority {} unreachable or broken",
                    auth.url()
                ),
                exit::AGENT_FAILED,
            ),
            _ => (refusal.to_string(), cfg.held_exit),
        };
        // Held elsewhere is an outcome, not a failure (the contract): info,
        // so `-q` under cron mails nothing; an authority that never
        // answered is an error.
        let level = match &refusal {
            AcquireError::Transient(_) => log::Level::Error,
            _ => log::Level::Info,
        };
        let Some(until) = self.until else {
            log::info!(
                "task {} is {note}; not acquired (use --wait to wait for it)",
                cfg.task
            );
            return Next::Exit(cfg.held_exit);
        };
        let now = BootInstant::now();
        if until.is_some_and(|u| now >= u) {
            self.abandon(auth);
            log::log!(
                level,
                "task {} is still {note} after waiting {}; giving up",
                cfg.task,
                crate::time::duration::format(now.saturating_since(self.started))
            );
            return Next::Exit(ran_out);
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

    /// Whether `--wait` was given and has time left.
    fn still_waiting(&self) -> bool {
        self.until
            .is_some_and(|u| u.is_none_or(|u| BootInstant::now() < u))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::error::{Failure, FailureKind};
    use crate::authority::scripted::{Scripted, grant, held};
    use crate::sys::signal::Sig;

    fn cfg(wait: Option<Option<Duration>>) -> RunConfig {
        crate::agent::config::RawRun {
            authority: Some("http://127.0.0.1:1".into()),
            task: Some("t".into()),
            ttl: Duration::from_secs(30),
            on_expiry: "redispatch".into(),
            command: vec!["true".into()],
            wait,
            ..Default::default()
        }
        .validate()
        .unwrap()
    }

    fn quiet() -> Notifier {
        Notifier::from_vars(None, None, None, std::process::id())
    }

    /// Runs the acquire against `auth` with `signals` already queued: the
    /// granted token, or the exit status.
    fn run(cfg: &RunConfig, auth: &mut Scripted, signals: &[Sig]) -> Result<u64, u8> {
        let (tx, rx) = crossbeam_channel::unbounded();
        for sig in signals {
            tx.send(Event::Signal(*sig)).unwrap();
        }
        match acquire(cfg, auth, &rx, &mut quiet()) {
            Acquired::Granted(g, _) => Ok(g.token),
            Acquired::Exit(code) => Err(code),
        }
    }

    fn failure() -> AcquireError {
        AcquireError::Transient(Failure::new(FailureKind::Connect, "refused"))
    }

    #[test]
    fn a_held_task_without_wait_is_75_and_asked_once() {
        let mut auth = Scripted {
            acquired: [Err(held(None))].into(),
            queue: true,
            ..Scripted::default()
        };
        assert_eq!(run(&cfg(None), &mut auth, &[]), Err(exit::HELD));
        assert_eq!(auth.calls, ["acquire"]);
    }

    #[test]
    fn a_queue_is_waited_in_until_the_grant() {
        let mut auth = Scripted {
            acquired: [
                Err(held(Some(Duration::ZERO))),
                Err(held(Some(Duration::ZERO))),
                Ok(grant(5, Duration::from_secs(30))),
            ]
            .into(),
            queue: true,
            ..Scripted::default()
        };
        let wait = cfg(Some(Some(Duration::from_secs(30))));
        // A relayable signal has no job to go to yet: dropped, not an end.
        assert_eq!(run(&wait, &mut auth, &[Sig::Hup]), Ok(5));
        assert_eq!(auth.calls, ["acquire_wait"; 3]);
    }

    #[test]
    fn without_a_queue_each_ask_is_a_plain_acquire() {
        let mut auth = Scripted {
            acquired: [Err(held(None)), Ok(grant(9, Duration::from_secs(30)))].into(),
            ..Scripted::default()
        };
        assert_eq!(run(&cfg(Some(None)), &mut auth, &[]), Ok(9));
        assert_eq!(auth.calls, ["acquire", "acquire"]);
    }

    #[test]
    fn every_way_out_of_a_wait_gives_the_place_up() {
        let wait = cfg(Some(Some(Duration::from_secs(30))));
        let ways: [(RunConfig, AcquireError, &[Sig], u8); 5] = [
            // The authority failing when the wait has run out.
            (
                cfg(Some(Some(Duration::ZERO))),
                failure(),
                &[],
                exit::AGENT_FAILED,
            ),
            (
                wait.clone(),
                AcquireError::Rejected("bad".into()),
                &[],
                exit::AGENT_FAILED,
            ),
            (
                wait.clone(),
                AcquireError::Trust("certificate: x".into()),
                &[],
                exit::AGENT_FAILED,
            ),
            // The wait's end.
            (cfg(Some(Some(Duration::ZERO))), held(None), &[], exit::HELD),
            (wait.clone(), held(None), &[Sig::Term], 143),
        ];
        for (cfg, answer, signals, code) in ways {
            let mut auth = Scripted {
                acquired: [Err(answer.clone())].into(),
                queue: true,
                ..Scripted::default()
            };
            assert_eq!(run(&cfg, &mut auth, signals), Err(code), "{answer:?}");
            assert_eq!(auth.calls, ["acquire_wait", "abandon_wait"], "{answer:?}");
        }
        // Without --wait there is no place to give up.
        let mut auth = Scripted {
            acquired: [Err(failure())].into(),
            queue: true,
            ..Scripted::default()
        };
        assert_eq!(run(&cfg(None), &mut auth, &[]), Err(exit::AGENT_FAILED));
        assert_eq!(auth.calls, ["acquire"]);
    }

    #[test]
    fn a_wait_goes_on_through_the_authoritys_failures_keeping_its_place() {
        let mut auth = Scripted {
            acquired: [
                Err(failure()),
                Err(held(Some(Duration::ZERO))),
                Err(failure()),
                Ok(grant(7, Duration::from_secs(30))),
            ]
            .into(),
            queue: true,
            ..Scripted::default()
        };
        let wait = cfg(Some(Some(Duration::from_secs(30))));
        assert_eq!(run(&wait, &mut auth, &[]), Ok(7));
        // Never abandoned: the place in the queue is kept.
        assert_eq!(auth.calls, ["acquire_wait"; 4]);
    }

    #[test]
    fn the_pause_backs_off_to_a_second_and_never_past_the_wait() {
        let started = BootInstant::now();
        let mut waiting = Waiting {
            started,
            until: Some(None),
            backoff: Duration::from_millis(100),
            last_note: String::new(),
            timeout: Duration::from_secs(1),
        };
        let cfg = cfg(Some(None));
        let mut auth = Scripted::default();
        let mut pause = |w: &mut Waiting, answer: AcquireError| match w.after_refusal(
            &cfg,
            &mut auth,
            answer,
            &mut quiet(),
        ) {
            Next::AskAgain(p) => p.as_millis(),
            Next::Exit(code) => panic!("exit {code}"),
        };
        // 100 ms doubling to 1 s, each ±20 %.
        for base in [100, 200, 400, 800, 1000, 1000] {
            let p = pause(&mut waiting, held(None));
            assert!(
                (base * 8 / 10..=base * 12 / 10).contains(&p),
                "{p} ms for {base}"
            );
        }
        // The authority's retry_after shortens it (to 20 ms at least).
        let p = pause(&mut waiting, held(Some(Duration::ZERO)));
        assert!((16..=24).contains(&p), "{p}");
        let p = pause(&mut waiting, held(Some(Duration::from_millis(300))));
        assert!((240..=360).contains(&p), "{p}");
        // Never past the end of the wait.
        waiting.until = Some(Some(BootInstant::now() + Duration::from_millis(50)));
        let p = pause(&mut waiting, held(None));
        assert!(p <= 50, "{p}");
    }
}
