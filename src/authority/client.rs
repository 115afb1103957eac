//! The traits every authority implements ([`LeaseClient`], [`Renewer`])
//! and the capabilities only some have ([`Waiter`], [`Operator`]), with the
//! domain and error types they speak. They live apart from `mod.rs` so that
//! the clients (`embedded`, `http`, `etcd`, `untrusted`) import them from
//! here while `mod.rs`'s `open` names the clients: imports go one way.

use std::time::Duration;

pub use super::error::{AcquireError, Failure, FailureKind, OperatorError, RenewError};
pub use crate::lease::{
    AcquireRequest, Attempt, ExpiryPolicy, Grant, LeaseInfo, LeaseRef, LeaseState, Outcome,
    RefusalReason, Renewed,
};

/// A lease authority, as the agent sees it: one lease's life.
pub trait LeaseClient: Send {
    /// The URL given to the job as `LEASE_AUTHORITY`.
    fn url(&self) -> String;

    /// Asks for the task once; a held task is [`AcquireError::Held`] at once.
    fn acquire(&mut self, req: &AcquireRequest, timeout: Duration) -> Result<Grant, AcquireError>;

    fn renew(&mut self, lease: &LeaseRef, timeout: Duration) -> Result<Renewed, RenewError>;

    fn release(
        &mut self,
        lease: &LeaseRef,
        outcome: Outcome,
        exit_code: Option<i32>,
        timeout: Duration,
    ) -> Result<(), RenewError>;

    /// The heartbeat thread's own handle on this authority, made once per
    /// grant; this handle stays with the supervisor, which releases. The
    /// client decides which of the two keeps what it has open: a network
    /// client hands its warm connection to the renewer (it serves the
    /// renewals), the embedded one keeps its database connection for the
    /// release (its open is the costly part, and a short run never renews).
    fn renewer(&mut self) -> Box<dyn Renewer>;

    /// The authority's queue of waiters, if it keeps one (etcd): a `--wait`
    /// then keeps its place between calls instead of asking anew each time.
    fn waiter(&mut self) -> Option<Box<dyn Waiter + '_>>;

    /// The operator calls, if the authority has them.
    fn operator(&mut self) -> Option<Box<dyn Operator + '_>>;
}

/// What the heartbeat thread holds: renewals of one lease.
pub trait Renewer: Send {
    /// Renews, handing the answer to `report` as soon as it is known (the
    /// heartbeat sends it to the supervisor from there), then returns. What
    /// the client does between the two (the embedded database checkpoints
    /// its WAL once it has grown) delays no one waiting for the answer,
    /// only the next renewal's start, which is a heartbeat away.
    fn renew(
        &mut self,
        lease: &LeaseRef,
        timeout: Duration,
        report: &mut dyn FnMut(Result<Renewed, RenewError>),
    );
}

/// A [`LeaseClient`] as a [`Renewer`]: the answer is reported as soon as
/// `renew` returns, and there is nothing to do after it.
pub struct Renewing<C: LeaseClient>(pub C);

impl<C: LeaseClient> Renewer for Renewing<C> {
    fn renew(
        &mut self,
        lease: &LeaseRef,
        timeout: Duration,
        report: &mut dyn FnMut(Result<Renewed, RenewError>),
    ) {
        report(self.0.renew(lease, timeout));
    }
}

/// An authority's queue of waiters for a task (etcd's: the keys of
/// `etcdctl lock`), for `--wait`.
pub trait Waiter {
    /// Like [`LeaseClient::acquire`], but waits up to `wait` for the task
    /// and keeps the place in the queue between calls, so a waiter is not
    /// sent to the back each time it asks again. Each network call inside
    /// still finishes within `timeout`; the whole call returns within about
    /// `wait + timeout`.
    ///
    /// `Err(Held { retry_after: Some(ZERO), .. })` means "still queued, call
    /// again (right away)". A client that polls its authority may ask once
    /// and return `Held` with a short `retry_after` instead of waiting
    /// ([`ask_in_turn`]). Whatever a call waits inside, a grant it returns
    /// must carry its full ttl from the moment the call was made (the agent
    /// counts from then): etcd's place is refreshed first. The agent's `--wait` loop calls this in slices
    /// (so it can notice signals and its own deadline) and calls
    /// [`Waiter::abandon_wait`] when it stops waiting without a grant.
    fn acquire_wait(
        &mut self,
        req: &AcquireRequest,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Grant, AcquireError>;

    /// Gives up the place kept by [`Waiter::acquire_wait`] (best effort,
    /// within `timeout`).
    fn abandon_wait(&mut self, timeout: Duration);
}

impl<W: Waiter + ?Sized> Waiter for &mut W {
    fn acquire_wait(
        &mut self,
        req: &AcquireRequest,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        (**self).acquire_wait(req, wait, timeout)
    }

    fn abandon_wait(&mut self, timeout: Duration) {
        (**self).abandon_wait(timeout)
    }
}

/// When a revoked task can be granted again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoked {
    /// At once (`--force`, or an authority that frees it at once: etcd).
    Now,
    /// Once the lease's current expiry has passed.
    AtExpiry,
}

impl Revoked {
    /// What an authority that keeps a revoked lease until its expiry
    /// unless forced did.
    pub fn forced(force: bool) -> Self {
        if force {
            Revoked::Now
        } else {
            Revoked::AtExpiry
        }
    }
}

/// The operator calls (`leaseagent leases|revoke|clear|history`).
pub trait Operator {
    /// Every lease on record.
    fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError>;

    /// Refuses the task's current lease at its next renewal.
    fn revoke(
        &mut self,
        task: &str,
        force: bool,
        timeout: Duration,
    ) -> Result<Revoked, OperatorError>;

    /// Ends a `held_for_operator` state.
    fn clear(&mut self, task: &str, timeout: Duration) -> Result<(), OperatorError>;

    /// The attempts of `task` (or of every task) acquired at or after
    /// `since_ms` (wall-clock ms; 0: all that are kept), newest first.
    fn history(
        &mut self,
        task: Option<&str>,
        since_ms: u64,
        timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError>;
}

impl<O: Operator + ?Sized> Operator for &mut O {
    fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError> {
        (**self).leases(timeout)
    }

    fn revoke(
        &mut self,
        task: &str,
        force: bool,
        timeout: Duration,
    ) -> Result<Revoked, OperatorError> {
        (**self).revoke(task, force, timeout)
    }

    fn clear(&mut self, task: &str, timeout: Duration) -> Result<(), OperatorError> {
        (**self).clear(task, timeout)
    }

    fn history(
        &mut self,
        task: Option<&str>,
        since_ms: u64,
        timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError> {
        (**self).history(task, since_ms, timeout)
    }
}

/// Most attempts one `history` call collects.
pub const MAX_HISTORY: usize = 100_000;

/// The wall-clock ms an attempt's `acquired_at` names (0 if unreadable).
pub fn acquired_ms(a: &Attempt) -> u64 {
    humantime::parse_rfc3339_weak(&a.acquired_at)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// This handle's waiter id (lease protocol v1, "Waiting": 32 hex digits
/// from `/dev/urandom`, so no other caller can take its place), made at the
/// first ask.
pub fn waiter_id(slot: &mut Option<String>) -> Result<String, AcquireError> {
    if let Some(id) = slot {
        return Ok(id.clone());
    }
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| {
            AcquireError::Transient(Failure::new(
                FailureKind::Connect,
                format!("making a waiter id: {e}"),
            ))
        })?;
    let id: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(slot.insert(id).clone())
}

/// One ask per call, as this handle's waiter (its id kept in `slot`, made
/// at the first ask: [`waiter_id`]), for a client whose authority queues
/// waiters by an id sent with each ask and has no push (the embedded
/// authority, a lease server): it waits in the queue by asking again, as
/// the same waiter each time (its [`Waiter::acquire_wait`]). `ask` is the
/// client's acquire as that waiter; `held` comes back with a `retry_after`
/// of at most `ask_every`, so the agent's `--wait` loop asks again that
/// soon.
///
/// One ask, not a loop of them inside the call: the agent counts a
/// grant's ttl from the moment it sent the call, so a grant answered to
/// the fourth ask of a one-second loop would reach it with the ttl less
/// the time spent in the loop (a 1 s lease granted 900 ms in arrived
/// with less than its grace left, and the command was not started).
pub fn ask_in_turn(
    slot: &mut Option<String>,
    ask_every: Duration,
    ask: impl FnOnce(&str) -> Result<Grant, AcquireError>,
) -> Result<Grant, AcquireError> {
    let id = waiter_id(slot)?;
    match ask(&id) {
        Err(AcquireError::Held {
            holder,
            retry_after,
        }) => Err(AcquireError::Held {
            holder,
            retry_after: Some(retry_after.map_or(ask_every, |r| r.min(ask_every))),
        }),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: Duration = Duration::from_millis(100);

    fn held(retry_after: Option<Duration>) -> AcquireError {
        AcquireError::Held {
            holder: "host-b:42".into(),
            retry_after,
        }
    }

    /// One ask through `ask_in_turn` answering `answer`: what it returned
    /// and the waiter id it asked as.
    fn ask_once(
        slot: &mut Option<String>,
        answer: Result<Grant, AcquireError>,
    ) -> (Result<Grant, AcquireError>, String) {
        let mut asked_as = None;
        let got = ask_in_turn(slot, EVERY, |id| {
            asked_as = Some(id.to_owned());
            answer
        });
        (got, asked_as.expect("ask_in_turn did not ask"))
    }

    #[test]
    fn a_held_answer_asks_again_within_ask_every_as_the_same_waiter() {
        let mut slot = None;
        let (got, first) = ask_once(&mut slot, Err(held(Some(Duration::from_secs(30)))));
        assert_eq!(
            got,
            Err(held(Some(EVERY))),
            "a longer retry_after is capped"
        );
        assert_eq!(first.len(), 32, "waiter id {first:?}");
        assert!(
            first
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "waiter id {first:?}"
        );
        assert_eq!(slot.as_deref(), Some(first.as_str()), "the id is kept");

        for (said, expected) in [
            (None, Some(EVERY)),
            (
                Some(Duration::from_millis(20)),
                Some(Duration::from_millis(20)),
            ),
            (Some(EVERY), Some(EVERY)),
            (Some(Duration::ZERO), Some(Duration::ZERO)),
        ] {
            let (got, id) = ask_once(&mut slot, Err(held(said)));
            assert_eq!(got, Err(held(expected)), "retry_after {said:?}");
            assert_eq!(id, first, "asked as another waiter");
            assert_eq!(slot.as_deref(), Some(first.as_str()));
        }
    }

    #[test]
    fn answers_other_than_held_come_back_as_they_were() {
        let grant = Grant {
            lease_id: "l-1".into(),
            task: "backup".into(),
            token: 7,
            ttl: Duration::from_secs(30),
        };
        let mut slot = Some("0123456789abcdef0123456789abcdef".to_owned());
        for answer in [
            Ok(grant),
            Err(AcquireError::HeldForOperator {
                holder: "host-b:42".into(),
                lease_id: "l-0".into(),
            }),
            Err(AcquireError::Rejected("ttl_ms must be > 0".into())),
            Err(AcquireError::Trust("403 forbidden".into())),
            Err(AcquireError::Transient(Failure::new(
                FailureKind::Connect,
                "connection refused",
            ))),
        ] {
            let (got, id) = ask_once(&mut slot, answer.clone());
            assert_eq!(got, answer);
            assert_eq!(
                id, "0123456789abcdef0123456789abcdef",
                "a kept id is asked as, not replaced"
            );
            assert_eq!(slot.as_deref(), Some(id.as_str()));
        }
    }
}
