//! The heartbeat thread: renews the lease and does nothing else.
//!
//! It is an OS thread of its own: no async runtime, no shared
//! lock, nothing the job or the supervisor loop does can delay it. It owns its
//! own authority handle (a [`Renewer`]) and reports every answer to the
//! supervisor as an event the moment the handle has it (whatever the handle
//! tidies afterwards waits behind the event, never in front of it); it
//! decides nothing about the job.
//!
//! Timing rules:
//! - A renewal is sent every `heartbeat` after the previous successful one's
//!   send time; after a transient failure it retries sooner (a quarter of the
//!   heartbeat, at least 50 ms), so two lost heartbeats in a row do not cost
//!   the lease with default flags.
//! - Each try's timeout is a third of the heartbeat ([`try_timeout`]) and
//!   never reaches past the local deadline (`last successful send + ttl`,
//!   tracked here with the same rule the supervisor uses): an answer that
//!   could only arrive after the deadline is useless anyway. A try that
//!   timed out is followed by the next one at once (it already waited longer
//!   than the retry pause), so a request that hangs (the authority accepts
//!   and never answers) or a lost packet costs a third of a heartbeat, not a
//!   whole one: with default proportions (heartbeat ttl/3, grace ttl/6) the
//!   tries go out at 1, 1.33 and 1.67 heartbeats and SIGTERM is due at 2.5,
//!   so two hung renewals in a row are survived with room to spare.
//! - The send instant is read on the boot clock *before* the request goes
//!   out; that instant, not the answer's arrival, is what the deadline counts
//!   from.
//! - Waits are capped at [`crate::time::clock::MAX_WAIT`] and the boot clock re-read,
//!   so a suspend does not push the next renewal out by the suspend's length.
//! - Every successful renewal sets the local deadline to that renewal's
//!   [`Settings::deadline`] and refits the heartbeat to the granted ttl
//!   (a renewal may grant less, or more, than before).
//! - A refusal ends the thread: the lease is gone for good.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::agent::machine::{Event, Settings};
use crate::authority::{LeaseRef, RenewError, Renewer};
use crate::time::clock::{BootInstant, MAX_WAIT};

/// Timing of the renewals.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// The user's timing and the deadline rule (shared with the machine).
    pub settings: Settings,
    /// The grant's ttl.
    pub ttl: Duration,
    /// The grant's send time (the first renewal is due a heartbeat after it).
    pub granted_at: BootInstant,
}

/// The pause before retrying after a transient failure.
pub fn retry_interval(heartbeat: Duration) -> Duration {
    (heartbeat / 4)
        .max(Duration::from_millis(50))
        .min(heartbeat)
}

/// The timeout of one renewal try (module doc).
pub fn try_timeout(heartbeat: Duration) -> Duration {
    heartbeat / 3
}

/// Handle to stop the thread: dropping it stops renewals. An in-flight
/// request finishes within its timeout; nobody waits for it.
pub struct Heartbeat {
    _stop: Sender<()>,
}

/// Starts the heartbeat thread.
pub fn spawn(
    mut authority: Box<dyn Renewer>,
    lease: LeaseRef,
    schedule: Schedule,
    events: Sender<Event>,
) -> std::io::Result<Heartbeat> {
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || run(&mut *authority, &lease, schedule, &events, &stop_rx))?;
    Ok(Heartbeat { _stop: stop_tx })
}

/// Sleeps until `until` on the boot clock; false when told to stop.
fn sleep_until(until: BootInstant, stop: &Receiver<()>) -> bool {
    loop {
        let left = BootInstant::now().until(until);
        if left.is_zero() {
            return true;
        }
        match stop.recv_timeout(left.min(MAX_WAIT)) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return false,
        }
    }
}

fn run(
    authority: &mut dyn Renewer,
    lease: &LeaseRef,
    s: Schedule,
    events: &Sender<Event>,
    stop: &Receiver<()>,
) {
    let mut deadline = s.settings.deadline(s.granted_at, s.ttl);
    let mut heartbeat = s.settings.fitted(s.ttl).0;
    let mut next = s.granted_at + heartbeat;
    loop {
        if !sleep_until(next, stop) {
            return;
        }
        let sent_at = BootInstant::now();
        let left = sent_at.until(deadline);
        if left.is_zero() {
            // Past the deadline: the supervisor has killed the job; any answer
            // now would be `expired`. Wait to be stopped.
            next = sent_at + heartbeat;
            continue;
        }
        let timeout = try_timeout(heartbeat).min(left);
        let mut done = false;
        let mut answered = false;
        authority.renew(lease, timeout, &mut |answer| {
            answered = true;
            let event = match answer {
                Ok(r) => {
                    // The same rule as the machine: the latest answer counts,
                    // longer or shorter than before.
                    deadline = s.settings.deadline(sent_at, r.ttl);
                    heartbeat = s.settings.fitted(r.ttl).0;
                    next = sent_at + heartbeat;
                    log::debug!(
                        "renewed task {} token {}: ttl {}",
                        lease.task,
                        lease.token,
                        crate::time::duration::format(r.ttl)
                    );
                    Event::Renewed {
                        sent_at,
                        ttl: r.ttl,
                    }
                }
                Err(RenewError::Refused { reason, message }) => {
                    // The lease is gone for good: nothing more to renew.
                    done = true;
                    Event::Refused { reason, message }
                }
                Err(RenewError::Transient(error)) => {
                    // The pause counts from the try's send: a try that timed out
                    // has waited longer already and the next goes out at once.
                    next = (sent_at + retry_interval(heartbeat)).max(BootInstant::now());
                    Event::RenewFailed {
                        error: error.to_string(),
                    }
                }
            };
            if events.send(event).is_err() {
                done = true;
            }
        });
        if done {
            return;
        }
        if !answered {
            // A client that broke its contract: retried like a failure,
            // never in a tight loop.
            log::error!(
                "renewal of task {}: the authority client gave no answer",
                lease.task
            );
            next = (sent_at + retry_interval(heartbeat)).max(BootInstant::now());
        }
    }
}
