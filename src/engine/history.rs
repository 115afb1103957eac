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
//! - Bounded: each grant deletes rows more than `max_rows` tokens older
//!   than itself (tokens are dense: one per grant) and up to
//!   [`AGE_PRUNE_BATCH`] of the oldest finished rows older than `max_age`,
//!   in its own transaction, so the table never grows past its bounds by
//!   more than a batch and no call pays for a large cleanup.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::Value;
use rusqlite::{Connection, params};

use crate::lease::{Attempt, Ended, Outcome};

use super::rules::{Lease, Phase, TaskRow};
use super::store::{Context, StoreError};

/// How much history is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Finished attempts older than this (by acquire time) are deleted.
    pub max_age: Duration,
    /// At most this many attempts are kept.
    pub max_rows: u64,
}

/// The defaults: 30 days, 100,000 attempts (about 10 MB, see docs/history.md).
pub const DEFAULT_BOUNDS: Bounds = Bounds {
    max_age: Duration::from_secs(30 * 24 * 3600),
    max_rows: 100_000,
};

impl Default for Bounds {
    fn default() -> Self {
        DEFAULT_BOUNDS
    }
}

/// Most old rows one grant deletes for age.
pub const AGE_PRUNE_BATCH: i64 = 64;
/// The most attempts one page holds.
pub const MAX_PAGE: usize = 1000;

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS history(
  token INTEGER PRIMARY KEY,
  task TEXT NOT NULL,
  holder TEXT NOT NULL,
  principal TEXT NOT NULL,
  acquired_at INTEGER NOT NULL,
  ended_at INTEGER,
  ended TEXT,
  outcome TEXT,
  exit_code INTEGER,
  held_ms INTEGER
);
CREATE INDEX IF NOT EXISTS history_task ON history(task, token);";

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

/// Wall-clock milliseconds since the Unix epoch (for people only).
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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

fn to_i64(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::TooLarge(v))
}

/// Writes one op (inside the caller's transaction); a grant also prunes.
pub fn apply(conn: &Connection, op: &Op, bounds: Bounds) -> Result<(), StoreError> {
    match op {
        Op::Begin {
            task,
            token,
            holder,
            principal,
            at_ms,
        } => {
            let (t, at) = (to_i64(*token)?, to_i64(*at_ms)?);
            conn.prepare_cached(
                "INSERT OR REPLACE INTO history(token, task, holder, principal, acquired_at)
                 VALUES(?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut st| st.execute(params![t, task, holder, principal, at]))
            .ctx("recording an attempt")?;
            prune(conn, *token, *at_ms, bounds)
        }
        Op::End {
            token,
            ended,
            at_ms,
            outcome,
            exit_code,
            overwrite,
        } => {
            let (t, at) = (to_i64(*token)?, to_i64(*at_ms)?);
            conn.prepare_cached(
                "UPDATE history SET ended = ?2, ended_at = ?3, held_ms = MAX(0, ?3 - acquired_at),
                   outcome = ?4, exit_code = ?5
                 WHERE token = ?1 AND (?6 OR ended IS NULL)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    t,
                    ended.as_str(),
                    at,
                    outcome.map(Outcome::as_str),
                    exit_code,
                    overwrite
                ])
            })
            .map(|_| ())
            .ctx("recording the end of an attempt")
        }
    }
}

/// Deletes what is past the bounds, as seen from a grant of `token` at
/// wall time `now_ms` (bounded work, see the module doc).
fn prune(conn: &Connection, token: u64, now_ms: u64, bounds: Bounds) -> Result<(), StoreError> {
    let keep_from = token.saturating_sub(bounds.max_rows);
    if keep_from > 0 {
        let k = to_i64(keep_from)?;
        conn.prepare_cached("DELETE FROM history WHERE token <= ?1")
            .and_then(|mut st| st.execute(params![k]))
            .ctx("pruning history by count")?;
    }
    let age = u64::try_from(bounds.max_age.as_millis()).unwrap_or(u64::MAX);
    let cutoff = to_i64(now_ms.saturating_sub(age))?;
    conn.prepare_cached(
        "DELETE FROM history WHERE token IN
           (SELECT token FROM history ORDER BY token LIMIT ?2)
         AND ended IS NOT NULL AND acquired_at < ?1",
    )
    .and_then(|mut st| st.execute(params![cutoff, AGE_PRUNE_BATCH]))
    .map(|_| ())
    .ctx("pruning history by age")
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

const COLUMNS: &str =
    "token, task, holder, principal, acquired_at, ended_at, ended, outcome, exit_code, held_ms";

fn corrupt(task: &str, column: &'static str, problem: String) -> StoreError {
    StoreError::Corrupt {
        task: task.to_string(),
        column,
        problem,
    }
}

fn check(v: [Value; 10]) -> Result<Record, StoreError> {
    let text = |i: usize, col: &'static str, task: &str| match &v[i] {
        Value::Text(s) => Ok(Some(s.clone())),
        Value::Null => Ok(None),
        other => Err(corrupt(task, col, format!("is not text ({other:?})"))),
    };
    let num = |i: usize, col: &'static str, task: &str| match &v[i] {
        Value::Integer(n) => u64::try_from(*n)
            .map(Some)
            .map_err(|_| corrupt(task, col, format!("is negative ({n})"))),
        Value::Null => Ok(None),
        other => Err(corrupt(task, col, format!("is not an integer ({other:?})"))),
    };
    let task = text(1, "history.task", "?")?.unwrap_or_default();
    let need = |x: Option<u64>, col| x.ok_or_else(|| corrupt(&task, col, "is missing".into()));
    let ended = match text(6, "history.ended", &task)? {
        None => None,
        Some(s) => Some(
            Ended::parse(&s)
                .ok_or_else(|| corrupt(&task, "history.ended", format!("is unknown ({s:?})")))?,
        ),
    };
    let outcome = match text(7, "history.outcome", &task)? {
        None => None,
        Some(s) => Some(
            Outcome::parse(&s)
                .ok_or_else(|| corrupt(&task, "history.outcome", format!("is unknown ({s:?})")))?,
        ),
    };
    let exit_code = match &v[8] {
        Value::Null => None,
        Value::Integer(n) => Some(
            i32::try_from(*n)
                .map_err(|_| corrupt(&task, "history.exit_code", format!("is {n}")))?,
        ),
        other => {
            return Err(corrupt(
                &task,
                "history.exit_code",
                format!("is not an integer ({other:?})"),
            ));
        }
    };
    Ok(Record {
        token: need(num(0, "history.token", &task)?, "history.token")?,
        holder: text(2, "history.holder", &task)?.unwrap_or_default(),
        principal: text(3, "history.principal", &task)?.unwrap_or_default(),
        acquired_ms: need(num(4, "history.acquired_at", &task)?, "history.acquired_at")?,
        ended_ms: num(5, "history.ended_at", &task)?,
        ended,
        outcome,
        exit_code,
        held_ms: num(9, "history.held_ms", &task)?,
        task,
    })
}

/// Up to `limit` attempts (of `task`, or of every task), newest first,
/// with tokens below `before`.
pub fn page(
    conn: &Connection,
    task: Option<&str>,
    before: Option<u64>,
    limit: usize,
) -> Result<Vec<Record>, StoreError> {
    let limit = i64::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(1);
    let before = before.map(to_i64).transpose()?;
    let sql = format!(
        "SELECT {COLUMNS} FROM history WHERE (?1 IS NULL OR task = ?1) AND (?2 IS NULL OR token < ?2)
         ORDER BY token DESC LIMIT ?3"
    );
    let raws = conn
        .prepare_cached(&sql)
        .and_then(|mut st| {
            st.query_map(params![task, before, limit], |r| {
                let mut v: [Value; 10] = std::array::from_fn(|_| Value::Null);
                for (i, slot) in v.iter_mut().enumerate() {
                    *slot = r.get(i)?;
                }
                Ok(v)
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .ctx("reading history")?;
    raws.into_iter().map(check).collect()
}

/// When each task last ended with a release reporting `succeeded`
/// (wall-clock ms), from the rows still kept.
pub fn last_successes(conn: &Connection) -> Result<Vec<(String, u64)>, StoreError> {
    conn.prepare(
        "SELECT task, MAX(ended_at) FROM history
         WHERE outcome = 'succeeded' AND ended_at IS NOT NULL GROUP BY task",
    )
    .and_then(|mut st| {
        st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()
    })
    .ctx("reading the last successes")
    .map(|v| {
        v.into_iter()
            .map(|(t, ms)| (t, u64::try_from(ms).unwrap_or(0)))
            .collect()
    })
}

/// When attempt `token` was acquired and when it ended (for a held task:
/// when its lease expired), wall-clock ms; `None` if it is not kept.
pub fn times(conn: &Connection, token: u64) -> Result<Option<(u64, Option<u64>)>, StoreError> {
    use rusqlite::OptionalExtension;
    let t = to_i64(token)?;
    let v: Option<(i64, Option<i64>)> = conn
        .prepare_cached("SELECT acquired_at, ended_at FROM history WHERE token = ?1")
        .and_then(|mut st| {
            st.query_row(params![t], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .ctx("reading an attempt")?;
    let ms = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(v.map(|(a, e)| (ms(a), e.map(ms))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::ExpiryPolicy;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c
    }

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

    #[test]
    fn rows_begin_end_page_and_stay_bounded() {
        let c = db();
        let bounds = Bounds {
            max_age: Duration::from_secs(3600),
            max_rows: 5,
        };
        for t in 1..=12u64 {
            let task = if t % 2 == 0 { "even" } else { "odd" };
            apply(
                &c,
                &Op::Begin {
                    task: task.into(),
                    token: t,
                    holder: "<h>".into(),
                    principal: "p".into(),
                    at_ms: 1_000_000 + t,
                },
                bounds,
            )
            .unwrap();
            apply(
                &c,
                &Op::End {
                    token: t,
                    ended: Ended::Released,
                    at_ms: 1_000_100 + t,
                    outcome: Some(Outcome::Succeeded),
                    exit_code: Some(0),
                    overwrite: true,
                },
                bounds,
            )
            .unwrap();
        }
        let all = page(&c, None, None, 100).unwrap();
        let tokens: Vec<u64> = all.iter().map(|r| r.token).collect();
        assert_eq!(
            tokens,
            vec![12, 11, 10, 9, 8],
            "newest first, at most max_rows"
        );
        assert_eq!(all[0].held_ms, Some(100));
        let even = page(&c, Some("even"), Some(12), 2).unwrap();
        assert_eq!(
            even.iter().map(|r| r.token).collect::<Vec<_>>(),
            vec![10, 8]
        );
        // An expiry noticed late does not overwrite a release.
        apply(
            &c,
            &Op::End {
                token: 12,
                ended: Ended::Expired,
                at_ms: 5,
                outcome: None,
                exit_code: None,
                overwrite: false,
            },
            bounds,
        )
        .unwrap();
        assert_eq!(
            page(&c, None, None, 1).unwrap()[0].ended,
            Some(Ended::Released)
        );
        // Old finished rows go by age, a bounded batch per grant.
        let later = 1_000_000 + 7_200_000;
        apply(
            &c,
            &Op::Begin {
                task: "odd".into(),
                token: 13,
                holder: "h".into(),
                principal: "".into(),
                at_ms: later,
            },
            bounds,
        )
        .unwrap();
        assert_eq!(page(&c, None, None, 100).unwrap().len(), 1);
        assert_eq!(
            page(&c, None, None, 100).unwrap()[0].attempt().acquired_at,
            rfc3339(later)
        );
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn a_bad_stored_value_is_corrupt() {
        let c = db();
        apply(
            &c,
            &Op::Begin {
                task: "t".into(),
                token: 1,
                holder: "h".into(),
                principal: "".into(),
                at_ms: 1,
            },
            DEFAULT_BOUNDS,
        )
        .unwrap();
        c.execute("UPDATE history SET ended = 'vanished'", [])
            .unwrap();
        assert!(matches!(
            page(&c, None, None, 10),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
