//! Run history: one row per attempt (grant) of a task, kept by the
//! authority in the same database as the leases.
//!
//! Why here and not in a log: an operator asks "who held `nightly-export`
//! at 02:00, with which token, how did it end, for how long" after the
//! lease is gone, and the authority is the one place that saw every grant
//! and every end.
//!
//! Invariants and the races they guard against:
//! - A row is written in the *same transaction* as the change that makes
//!   it true: the grant inserts it (the token is its key: tokens come from
//!   one global sequence, so they are unique across tasks), the release,
//!   forced revoke or clear that ends the attempt updates it. No extra
//!   fsync, and a crash can never leave a release on disk without its
//!   history or the reverse.
//! - An expiry is not a request: it is recorded when the authority first
//!   sees it (serve's sweeper, or the next call that touches the task on
//!   the embedded authority), with the time the lease expired, not the time
//!   it was noticed. Such an "expired" end never overwrites an end that a
//!   request wrote (`overwrite: false`); a release, revoke or clear does
//!   overwrite (a revoked lease released late keeps its outcome; a held
//!   task that is cleared reads `cleared`).
//! - Times in rows are wall-clock milliseconds since the Unix epoch, for
//!   people only; lease arithmetic stays on the boot clock. An expiry's
//!   wall time is derived from the boot clock (`now - how long ago it
//!   expired`), so a wall-clock jump shifts displayed times, never leases.
//! - Bounded per principal and in total, so one principal's churn cannot
//!   push out another's records (a principal granting in a loop used to
//!   delete everyone's history, since the bound was global). Each row
//!   carries its principal's attempt number (`pseq`, one more than that
//!   principal's newest row): a grant deletes its principal's rows more
//!   than `max_rows_per_principal` attempts older (an index range, usually
//!   one row). Every [`TOTAL_PRUNE_EVERY`]th token, the grant also counts
//!   all rows and deletes the oldest past `max_rows` (the total can exceed
//!   `max_rows` only when many principals keep many rows; then the oldest
//!   go, whoever's they are). And each grant deletes up to
//!   [`AGE_PRUNE_BATCH`] of the oldest finished rows older than `max_age`.
//!   All in the grant's transaction: the table never grows past its bounds
//!   by more than a batch, and no call pays for a large cleanup.
//!
//! This file is the history's rules ([`ops`]: which writes a change of a
//! task's row makes) and its shapes; a store keeps them (`Txn::record`,
//! `HistoryRead` in [`super::store`]; SQLite's table is
//! `sqlite/history.rs`).

use std::time::{Duration, UNIX_EPOCH};

use crate::lease::{Attempt, Ended, Outcome};
use crate::time::wall_ms;

use super::rules::{Lease, Phase, TaskRow};

/// How much history is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Finished attempts older than this (by acquire time) are deleted.
    pub max_age: Duration,
    /// At most this many attempts are kept (give or take
    /// [`TOTAL_PRUNE_EVERY`]).
    pub max_rows: u64,
    /// At most this many attempts of one principal are kept.
    pub max_rows_per_principal: u64,
}

/// The defaults: 30 days, 100,000 attempts (about 10 MB, see
/// docs/history.md), 25,000 of one principal.
pub const DEFAULT_BOUNDS: Bounds = Bounds {
    max_age: Duration::from_secs(30 * 24 * 3600),
    max_rows: 100_000,
    max_rows_per_principal: 25_000,
};

/// How often (in tokens) a grant counts the whole history for `max_rows`.
pub const TOTAL_PRUNE_EVERY: u64 = 64;

impl Default for Bounds {
    fn default() -> Self {
        DEFAULT_BOUNDS
    }
}

/// Most old rows one grant deletes for age.
pub const AGE_PRUNE_BATCH: u64 = 64;

/// What caused a change of a task's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Acquire,
    Renew,
    /// With what the agent reported (`None`: nothing reported).
    Release(Option<Outcome>, Option<i32>),
    Revoke,
    Clear,
    /// The authority noticed an expiry (sweeper, listing) or dropped an
    /// expired lease.
    Sweep,
}

/// A write to the history table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Begin {
        task: String,
        token: u64,
        holder: String,
        principal: String,
        at_ms: u64,
    },
    End {
        token: u64,
        ended: Ended,
        at_ms: u64,
        outcome: Option<Outcome>,
        exit_code: Option<i32>,
        /// Replace an end already recorded (see the module doc).
        overwrite: bool,
    },
}

/// RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The end of lease `l`, found expired at `now_boot`: when it expired, in
/// wall-clock time.
pub fn expired(l: &Lease, now_boot: u64, now_wall: u64) -> Op {
    let ago = now_boot.saturating_sub(l.expires_ms);
    Op::End {
        token: l.token,
        ended: if l.revoked {
            Ended::Revoked
        } else {
            Ended::Expired
        },
        at_ms: if l.expires_ms == 0 {
            now_wall
        } else {
            now_wall.saturating_sub(ago)
        },
        outcome: None,
        exit_code: None,
        overwrite: false,
    }
}

/// The history writes for one change of a task's row: `before` is the
/// lease the row had, `after` the row now.
pub fn ops(before: Option<&Lease>, after: &TaskRow, cause: Cause, now_boot: u64) -> Vec<Op> {
    let now_wall = wall_ms();
    let mut out = Vec::new();
    let after_token = after.lease.as_ref().map(|l| l.token);
    if let Some(b) = before {
        if after_token != Some(b.token) {
            let end = |ended, outcome, exit_code| Op::End {
                token: b.token,
                ended,
                at_ms: now_wall,
                outcome,
                exit_code,
                overwrite: true,
            };
            out.push(match cause {
                Cause::Release(o, c) if b.revoked => end(Ended::Revoked, o, c),
                Cause::Release(o, c) => end(Ended::Released, o, c),
                Cause::Revoke => end(Ended::Revoked, None, None),
                Cause::Clear => end(Ended::Cleared, None, None),
                Cause::Acquire | Cause::Renew | Cause::Sweep => expired(b, now_boot, now_wall),
            });
        } else if !matches!(b.phase(now_boot), Phase::Active { .. }) {
            out.push(expired(b, now_boot, now_wall));
        }
    }
    if let Some(a) = &after.lease {
        if before.map(|b| b.token) != Some(a.token) {
            out.push(Op::Begin {
                task: after.task.clone(),
                token: a.token,
                holder: a.holder.clone(),
                principal: a.principal.clone(),
                at_ms: now_wall,
            });
        }
    }
    out
}

/// One stored attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub token: u64,
    pub task: String,
    pub holder: String,
    pub principal: String,
    pub acquired_ms: u64,
    pub ended_ms: Option<u64>,
    pub ended: Option<Ended>,
    pub outcome: Option<Outcome>,
    pub exit_code: Option<i32>,
    pub held_ms: Option<u64>,
}

impl Record {
    /// The wire shape (no principal, no lease id).
    pub fn attempt(&self) -> Attempt {
        Attempt {
            task: self.task.clone(),
            token: self.token,
            holder: self.holder.clone(),
            acquired_at: rfc3339(self.acquired_ms),
            ended_at: self.ended_ms.map(rfc3339),
            ended: self.ended,
            outcome: self.outcome,
            exit_code: self.exit_code,
            held_ms: self.held_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::ExpiryPolicy;

    fn lease(token: u64, expires_ms: u64) -> Lease {
        Lease {
            token,
            key: "k".into(),
            principal: "p".into(),
            holder: "h".into(),
            ttl_ms: 1000,
            policy: ExpiryPolicy::Redispatch,
            grace_ms: 0,
            expires_ms,
            revoked: false,
            held: false,
        }
    }

    #[test]
    fn ops_follow_the_lease_and_the_cause() {
        let mut after = TaskRow::new("t");
        after.lease = Some(lease(2, 5000));
        // A grant over an expired lease: the old one expired, the new begins.
        let o = ops(Some(&lease(1, 1000)), &after, Cause::Acquire, 3000);
        assert!(matches!(
            o[0],
            Op::End {
                token: 1,
                ended: Ended::Expired,
                overwrite: false,
                ..
            }
        ));
        assert!(matches!(o[1], Op::Begin { token: 2, .. }));
        // A release ends it with the reported outcome.
        let empty = TaskRow::new("t");
        let o = ops(
            Some(&lease(2, 5000)),
            &empty,
            Cause::Release(Some(Outcome::Failed), Some(3)),
            3000,
        );
        assert_eq!(o.len(), 1);
        assert!(matches!(
            o[0],
            Op::End {
                token: 2,
                ended: Ended::Released,
                outcome: Some(Outcome::Failed),
                exit_code: Some(3),
                overwrite: true,
                ..
            }
        ));
        // A live renewal writes nothing; an expired lease on record ends.
        assert!(ops(Some(&lease(2, 5000)), &after, Cause::Renew, 3000).is_empty());
        let o = ops(Some(&lease(2, 5000)), &after, Cause::Sweep, 9000);
        assert!(matches!(
            o[0],
            Op::End {
                ended: Ended::Expired,
                ..
            }
        ));
    }
}
