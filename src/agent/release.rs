//! The release, on a thread of its own, waited for with a deadline.
//!
//! Why: a release is the last call of a run, made once the job's tree is
//! gone, and nothing the agent does afterwards matters for safety: it only
//! lets the next holder in before the lease expires by itself. Yet on the
//! embedded authority it writes the SQLite database, and a filesystem that
//! stalls (`fsfreeze`, a hung NFS mount, a dying disk) holds `write` and
//! `fsync` in uninterruptible sleep: SQLite's busy timeout only bounds the
//! wait for its locks, not a system call. Made on the supervisor's thread,
//! such a release held the agent's exit until the filesystem came back,
//! with no bound at all. A network client has its timeout, but nothing
//! else guarantees it is kept.
//!
//! So the call runs on a `release` thread that owns the client, and the
//! caller waits for its answer only within the release's [`window`]: never
//! past the lease's deadline (after it the authority has dropped the lease
//! on its own, and a release could not change anything), and never longer
//! than [`release_timeout`]. Past the window the agent goes on to exit and
//! leaves the thread where it is blocked.
//!
//! Since the scribe (`scribe.rs`) makes the embedded authority's calls,
//! the `release` thread itself only waits in `poll` for the scribe's
//! answer: a release stalled on a frozen filesystem holds the scribe, not
//! a thread of the agent, and the agent is reaped at its deadline (before
//! the scribe, a thread asleep in the kernel kept the whole agent from
//! being reaped until the thaw). The scribe makes the release once the
//! filesystem comes back, if it still can. The job is dead before any of
//! this: the keeper stops it, not the release.

use std::time::Duration;

use crate::agent::report::Notice;
use crate::authority::{LeaseClient, LeaseRef, Outcome, RenewError};
use crate::time::clock::BootInstant;

/// How much longer than the call's own timeout its answer is waited for, so
/// that a client that keeps its timeout reports its own error rather than
/// "no answer".
pub const ANSWER_SLACK: Duration = Duration::from_millis(50);

/// Upper bound for the release call.
pub fn release_timeout(ttl: Duration) -> Duration {
    ttl.min(Duration::from_secs(5))
}

/// How long a release made at `now` may take, for a lease whose deadline
/// is `deadline` and whose ttl is `ttl`: `None` when the deadline has
/// passed (the lease is gone, a release would not matter).
pub fn window(now: BootInstant, deadline: BootInstant, ttl: Duration) -> Option<Duration> {
    let w = release_timeout(ttl).min(now.until(deadline));
    (!w.is_zero()).then_some(w)
}

/// Releases `lease` through `authority` on a thread of its own and waits
/// for the answer at most `window` (+ [`ANSWER_SLACK`]); the notice to log.
/// The client goes with the thread: a call still blocked when the wait
/// ends keeps it.
pub fn release_within(
    authority: Box<dyn LeaseClient>,
    lease: LeaseRef,
    outcome: Outcome,
    exit_code: Option<i32>,
    window: Duration,
) -> Notice {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name("release".into())
        .spawn(move || {
            let mut authority = authority;
            let _ = tx.send(authority.release(&lease, outcome, exit_code, window));
        });
    if let Err(e) = spawned {
        return Notice::ReleaseFailed {
            error: format!("no thread for the release: {e}"),
        };
    }
    let waited = window + ANSWER_SLACK;
    match rx.recv_timeout(waited) {
        Ok(Ok(())) => Notice::Released { outcome },
        Ok(Err(RenewError::Refused { reason, .. })) => Notice::ReleaseRefused { reason },
        Ok(Err(RenewError::Transient(e))) => Notice::ReleaseFailed {
            error: e.to_string(),
        },
        Err(_) => Notice::ReleaseUnanswered { waited },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::{
        AcquireError, AcquireRequest, Grant, Operator, Renewed, Renewer, Waiter,
    };
    use proptest::prelude::*;

    /// A client whose release blocks until `gate` is dropped or answers.
    struct Stuck {
        gate: crossbeam_channel::Receiver<()>,
    }

    impl LeaseClient for Stuck {
        fn url(&self) -> String {
            "stuck:".into()
        }
        fn acquire(&mut self, _: &AcquireRequest, _: Duration) -> Result<Grant, AcquireError> {
            unreachable!("not used")
        }
        fn renew(&mut self, _: &LeaseRef, _: Duration) -> Result<Renewed, RenewError> {
            unreachable!("not used")
        }
        fn release(
            &mut self,
            _: &LeaseRef,
            _: Outcome,
            _: Option<i32>,
            _: Duration,
        ) -> Result<(), RenewError> {
            let _ = self.gate.recv();
            Ok(())
        }
        fn renewer(&mut self) -> Box<dyn Renewer> {
            unreachable!("not used")
        }
        fn waiter(&mut self) -> Option<Box<dyn Waiter + '_>> {
            None
        }
        fn operator(&mut self) -> Option<Box<dyn Operator + '_>> {
            None
        }
    }

    fn lease() -> LeaseRef {
        LeaseRef {
            lease_id: "l".into(),
            token: 1,
            task: "t".into(),
        }
    }

    #[test]
    fn a_release_that_never_answers_is_given_up_at_the_window() {
        let (keep, gate) = crossbeam_channel::bounded::<()>(0);
        let started = std::time::Instant::now();
        let notice = release_within(
            Box::new(Stuck { gate }),
            lease(),
            Outcome::Succeeded,
            Some(0),
            Duration::from_millis(200),
        );
        let took = started.elapsed();
        assert_eq!(
            notice,
            Notice::ReleaseUnanswered {
                waited: Duration::from_millis(200) + ANSWER_SLACK
            }
        );
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        drop(keep);
    }

    #[test]
    fn a_release_that_answers_is_reported_as_it_answered() {
        let (keep, gate) = crossbeam_channel::bounded::<()>(1);
        keep.send(()).unwrap();
        let notice = release_within(
            Box::new(Stuck { gate }),
            lease(),
            Outcome::Failed,
            Some(3),
            Duration::from_secs(10),
        );
        assert_eq!(
            notice,
            Notice::Released {
                outcome: Outcome::Failed
            }
        );
    }

    proptest! {
        /// The window never reaches past the lease's deadline nor past the
        /// release timeout, and is there whenever the deadline is ahead.
        #[test]
        fn the_window_ends_by_the_deadline(
            now_ms in 0u64..1_000_000,
            ahead_ms in -100_000i64..100_000,
            ttl_ms in 1u64..600_000,
        ) {
            let now = BootInstant::from_since_boot(Duration::from_millis(now_ms));
            let deadline = BootInstant::from_since_boot(Duration::from_millis(
                now_ms.saturating_add_signed(ahead_ms),
            ));
            let ttl = Duration::from_millis(ttl_ms);
            match window(now, deadline, ttl) {
                Some(w) => {
                    prop_assert!(now + w <= deadline);
                    prop_assert!(w <= release_timeout(ttl));
                    prop_assert!(!w.is_zero());
                }
                None => prop_assert!(deadline <= now),
            }
        }
    }
}
