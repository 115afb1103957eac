//! The rows of the PostgreSQL store as the engine sees them: a task's row
//! and an attempt of the run history read back (every surprise is
//! [`StoreError::Corrupt`], never a default: tokens must never restart
//! because of bad data), and the statements that write them with their
//! parameters ([`Write`], sent pipelined by `mod.rs`).
//!
//! What each column means is SQLite's (`sqlite/rows.rs`, `sqlite/history.rs`);
//! the history's pruning is the same rule, applied once per transaction for
//! all the grants in it (`engine/history.rs`: bounded work per grant).

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::engine::error::{StoreError, to_i64};
use crate::engine::history::{AGE_PRUNE_BATCH, Bounds, Op, Record, TOTAL_PRUNE_EVERY};
use crate::engine::rules::{Lease, TaskRow};
use crate::lease::{Ended, ExpiryPolicy, Outcome, RefusalReason};
use crate::time::ms;

pub const SELECT_ROWS: &str = "SELECT task, last_token, token, holder, ttl_ms, policy, grace_ms, revoked, held, \
     ended_token, ended_reason, principal, lease_key FROM leaseagent.tasks ORDER BY task";
pub const SELECT_ROW: &str = "SELECT task, last_token, token, holder, ttl_ms, policy, grace_ms, revoked, held, \
     ended_token, ended_reason, principal, lease_key FROM leaseagent.tasks WHERE task = $1";
pub const UPSERT: &str =
    "INSERT INTO leaseagent.tasks(task, last_token, token, holder, ttl_ms, policy, \
     grace_ms, revoked, held, ended_token, ended_reason, principal, lease_key)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
     ON CONFLICT (task) DO UPDATE SET last_token = excluded.last_token, token = excluded.token,
       holder = excluded.holder, ttl_ms = excluded.ttl_ms, policy = excluded.policy,
       grace_ms = excluded.grace_ms, revoked = excluded.revoked, held = excluded.held,
       ended_token = excluded.ended_token, ended_reason = excluded.ended_reason,
       principal = excluded.principal, lease_key = excluded.lease_key";
pub const DELETE: &str = "DELETE FROM leaseagent.tasks WHERE task = $1";
pub const SEQ_GET: &str = "SELECT last_token FROM leaseagent.seq WHERE id = 1";
pub const SEQ_SET: &str =
    "UPDATE leaseagent.seq SET last_token = GREATEST(last_token, $1) WHERE id = 1";
pub const HIST_BEGIN: &str =
    "INSERT INTO leaseagent.history(token, task, holder, principal, acquired_at, pseq)
     VALUES ($1, $2, $3, $4, $5, (SELECT COALESCE(MAX(pseq), 0) + 1
       FROM leaseagent.history WHERE principal = $4))
     ON CONFLICT (token) DO UPDATE SET task = excluded.task, holder = excluded.holder,
       principal = excluded.principal, acquired_at = excluded.acquired_at, ended_at = NULL,
       ended = NULL, outcome = NULL, exit_code = NULL, held_ms = NULL, pseq = excluded.pseq";
/// A principal's attempts more than `$2` older than its newest (the
/// per-principal bound; an index range, usually one row).
pub const PRUNE_PRINCIPAL: &str = "DELETE FROM leaseagent.history WHERE principal = $1
     AND pseq <= (SELECT MAX(pseq) FROM leaseagent.history WHERE principal = $1) - $2";
pub const HIST_END: &str = "UPDATE leaseagent.history SET ended = $2, ended_at = $3,
       held_ms = GREATEST(0, $3 - acquired_at), outcome = $4, exit_code = $5
     WHERE token = $1 AND ($6 OR ended IS NULL)";
/// The oldest rows past `$1` in all (the total bound; run every
/// [`TOTAL_PRUNE_EVERY`]th token, as SQLite's: counting is not free).
pub const PRUNE_COUNT: &str = "DELETE FROM leaseagent.history WHERE token IN
       (SELECT token FROM leaseagent.history ORDER BY token
        LIMIT GREATEST(0, (SELECT COUNT(*) FROM leaseagent.history) - $1))";
pub const PRUNE_AGE: &str = "DELETE FROM leaseagent.history WHERE token IN
       (SELECT token FROM leaseagent.history ORDER BY token LIMIT $2)
     AND ended IS NOT NULL AND acquired_at < $1";
pub const HIST_PAGE: &str =
    "SELECT token, task, holder, principal, acquired_at, ended_at, ended, outcome, \
     exit_code, held_ms FROM leaseagent.history
     WHERE ($1::text IS NULL OR task = $1) AND ($2::bigint IS NULL OR token < $2)
     ORDER BY token DESC LIMIT $3";
pub const HIST_TIMES: &str =
    "SELECT acquired_at, ended_at FROM leaseagent.history WHERE token = $1";
pub const LAST_SUCCESSES: &str = "SELECT task, MAX(ended_at) FROM leaseagent.history
     WHERE outcome = 'succeeded' AND ended_at IS NOT NULL GROUP BY task";

/// A statement's parameters, owned (they outlive the pipelined calls).
pub type Params = Vec<Box<dyn ToSql + Sync + Send>>;

/// One pending write of a transaction: which statement, with what.
pub struct Write {
    pub sql: &'static str,
    pub params: Params,
    /// The write must change exactly one row (the token sequence).
    pub one_row: bool,
}

fn corrupt(task: &str, column: &'static str, problem: String) -> StoreError {
    StoreError::Corrupt {
        task: task.to_string(),
        column,
        problem,
    }
}

/// Reads column `i` as `T`, a type mismatch being corruption.
fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    r: &'a Row,
    i: usize,
    task: &str,
    column: &'static str,
) -> Result<T, StoreError> {
    r.try_get(i)
        .map_err(|e| corrupt(task, column, format!("cannot be read ({e})")))
}

fn nonneg(v: Option<i64>, task: &str, column: &'static str) -> Result<Option<u64>, StoreError> {
    v.map(|n| u64::try_from(n).map_err(|_| corrupt(task, column, format!("is negative ({n})"))))
        .transpose()
}

fn need<T>(v: Option<T>, task: &str, column: &'static str) -> Result<T, StoreError> {
    v.ok_or_else(|| corrupt(task, column, "is missing".into()))
}

/// A task's row as stored, checked; its lease (if any) expires one ttl
/// after `restart_at_ms` (the Restart rule), unless recorded as held.
pub fn task_row(r: &Row, restart_at_ms: u64) -> Result<TaskRow, StoreError> {
    let task: String = col(r, 0, "?", "task")?;
    let t = task.as_str();
    let last_token = need(
        nonneg(col(r, 1, t, "last_token")?, t, "last_token")?,
        t,
        "last_token",
    )?;
    let lease = match nonneg(col(r, 2, t, "token")?, t, "token")? {
        None => None,
        Some(token) => {
            if token == 0 || token > last_token {
                return Err(corrupt(
                    t,
                    "token",
                    format!("is {token}, outside 1..={last_token} (last_token)"),
                ));
            }
            let policy_name: String = need(col(r, 5, t, "policy")?, t, "policy")?;
            let policy = ExpiryPolicy::parse(&policy_name)
                .ok_or_else(|| corrupt(t, "policy", format!("is unknown ({policy_name:?})")))?;
            let ttl_ms = need(nonneg(col(r, 4, t, "ttl_ms")?, t, "ttl_ms")?, t, "ttl_ms")?;
            Some(Lease {
                token,
                key: col::<Option<String>>(r, 12, t, "lease_key")?.unwrap_or_default(),
                principal: col::<Option<String>>(r, 11, t, "principal")?.unwrap_or_default(),
                holder: need(col(r, 3, t, "holder")?, t, "holder")?,
                ttl_ms,
                policy,
                grace_ms: need(
                    nonneg(col(r, 6, t, "grace_ms")?, t, "grace_ms")?,
                    t,
                    "grace_ms",
                )?,
                expires_ms: restart_at_ms.saturating_add(ttl_ms),
                revoked: col(r, 7, t, "revoked")?,
                held: col(r, 8, t, "held")?,
            })
        }
    };
    let ended_token = nonneg(col(r, 9, t, "ended_token")?, t, "ended_token")?;
    let ended_reason: Option<String> = col(r, 10, t, "ended_reason")?;
    let ended = match (ended_token, ended_reason) {
        (None, None) => None,
        (Some(tok), Some(reason)) => Some((
            tok,
            RefusalReason::parse(&reason)
                .ok_or_else(|| corrupt(t, "ended_reason", format!("is unknown ({reason:?})")))?,
        )),
        _ => {
            return Err(corrupt(
                t,
                "ended_token",
                "and ended_reason must be both set or both empty".into(),
            ));
        }
    };
    let ended_by = if lease.is_none() && ended.is_some() {
        col::<Option<String>>(r, 11, t, "principal")?.unwrap_or_default()
    } else {
        String::new()
    };
    Ok(TaskRow {
        task,
        last_token,
        lease,
        ended,
        ended_by,
    })
}

/// The token sequence as read; missing or negative is corruption.
pub fn sequence(r: Option<Row>) -> Result<u64, StoreError> {
    let corrupt = StoreError::CorruptSequence;
    let Some(r) = r else {
        return Err(corrupt("is missing".into()));
    };
    let v: i64 = r
        .try_get(0)
        .map_err(|e| corrupt(format!("cannot be read ({e})")))?;
    u64::try_from(v).map_err(|_| corrupt(format!("is {v}")))
}

/// The write of a row: an upsert, or a delete when it holds nothing worth
/// keeping (compaction).
pub fn save(row: &TaskRow) -> Result<Write, StoreError> {
    if row.lease.is_none() && row.ended.is_none() {
        return Ok(Write {
            sql: DELETE,
            params: vec![Box::new(row.task.clone())],
            one_row: false,
        });
    }
    let l = row.lease.as_ref();
    let opt = |v: Option<u64>| v.map(to_i64).transpose();
    let principal = l.map_or(row.ended.map(|_| row.ended_by.clone()), |l| {
        Some(l.principal.clone())
    });
    let params: Params = vec![
        Box::new(row.task.clone()),
        Box::new(to_i64(row.last_token)?),
        Box::new(opt(l.map(|l| l.token))?),
        Box::new(l.map(|l| l.holder.clone())),
        Box::new(opt(l.map(|l| l.ttl_ms))?),
        Box::new(l.map(|l| l.policy.as_str().to_string())),
        Box::new(opt(l.map(|l| l.grace_ms))?),
        Box::new(l.is_some_and(|l| l.revoked)),
        Box::new(l.is_some_and(|l| l.held)),
        Box::new(opt(row.ended.map(|e| e.0))?),
        Box::new(row.ended.map(|e| e.1.as_str().to_string())),
        Box::new(principal),
        Box::new(l.map(|l| l.key.clone())),
    ];
    Ok(Write {
        sql: UPSERT,
        params,
        one_row: false,
    })
}

/// The write of the token sequence (never lowered).
pub fn set_last_issued(token: u64) -> Result<Write, StoreError> {
    Ok(Write {
        sql: SEQ_SET,
        params: vec![Box::new(to_i64(token)?)],
        one_row: true,
    })
}

/// The write of one history op.
pub fn record(op: &Op) -> Result<Write, StoreError> {
    Ok(match op {
        Op::Begin {
            task,
            token,
            holder,
            principal,
            at_ms,
        } => Write {
            sql: HIST_BEGIN,
            params: vec![
                Box::new(to_i64(*token)?),
                Box::new(task.clone()),
                Box::new(holder.clone()),
                Box::new(principal.clone()),
                Box::new(to_i64(*at_ms)?),
            ],
            one_row: false,
        },
        Op::End {
            token,
            ended,
            at_ms,
            outcome,
            exit_code,
            overwrite,
        } => Write {
            sql: HIST_END,
            params: vec![
                Box::new(to_i64(*token)?),
                Box::new(ended.as_str().to_string()),
                Box::new(to_i64(*at_ms)?),
                Box::new(outcome.map(|o| o.as_str().to_string())),
                Box::new(*exit_code),
                Box::new(*overwrite),
            ],
            one_row: false,
        },
    })
}

/// The pruning after `begins` grants, the newest of token `token` at wall
/// time `now_ms`: by count, then a bounded batch by age.
pub fn prune(
    token: u64,
    now_ms: u64,
    begins: u64,
    bounds: Bounds,
) -> Result<Vec<Write>, StoreError> {
    let mut out = Vec::new();
    // A multiple of TOTAL_PRUNE_EVERY among this batch's tokens.
    if token / TOTAL_PRUNE_EVERY != token.saturating_sub(begins.max(1)) / TOTAL_PRUNE_EVERY {
        out.push(Write {
            sql: PRUNE_COUNT,
            params: vec![Box::new(to_i64(bounds.max_rows)?)],
            one_row: false,
        });
    }
    let cutoff = to_i64(now_ms.saturating_sub(ms(bounds.max_age)))?;
    out.push(Write {
        sql: PRUNE_AGE,
        params: vec![
            Box::new(cutoff),
            Box::new(to_i64(AGE_PRUNE_BATCH.saturating_mul(begins.max(1)))?),
        ],
        one_row: false,
    });
    Ok(out)
}

/// The per-principal bound after a grant to `principal`.
pub fn prune_principal(principal: &str, bounds: Bounds) -> Result<Write, StoreError> {
    Ok(Write {
        sql: PRUNE_PRINCIPAL,
        params: vec![
            Box::new(principal.to_string()),
            Box::new(to_i64(bounds.max_rows_per_principal.min(bounds.max_rows))?),
        ],
        one_row: false,
    })
}

/// An attempt of the run history as stored, checked.
pub fn record_of(r: &Row) -> Result<Record, StoreError> {
    let task: String = col(r, 1, "?", "history.task")?;
    let t = task.as_str();
    let num = |i: usize, c: &'static str| -> Result<Option<u64>, StoreError> {
        nonneg(col(r, i, t, c)?, t, c)
    };
    let ended = match col::<Option<String>>(r, 6, t, "history.ended")? {
        None => None,
        Some(s) => Some(
            Ended::parse(&s)
                .ok_or_else(|| corrupt(t, "history.ended", format!("is unknown ({s:?})")))?,
        ),
    };
    let outcome = match col::<Option<String>>(r, 7, t, "history.outcome")? {
        None => None,
        Some(s) => Some(
            Outcome::parse(&s)
                .ok_or_else(|| corrupt(t, "history.outcome", format!("is unknown ({s:?})")))?,
        ),
    };
    Ok(Record {
        token: need(num(0, "history.token")?, t, "history.token")?,
        holder: col(r, 2, t, "history.holder")?,
        principal: col(r, 3, t, "history.principal")?,
        acquired_ms: need(num(4, "history.acquired_at")?, t, "history.acquired_at")?,
        ended_ms: num(5, "history.ended_at")?,
        ended,
        outcome,
        exit_code: col(r, 8, t, "history.exit_code")?,
        held_ms: num(9, "history.held_ms")?,
        task,
    })
}
