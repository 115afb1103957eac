//! The lease engine on SQLite, shared by `leaseagent serve` and the embedded
//! default authority (issue #3).
//!
//! One set of rules ([`core`]) over one schema ([`store`]), run two ways:
//!
//! - [`batched::ServeEngine`] (behind `leaseagent serve`): every task's record
//!   lives in memory; the database holds the token counter and who holds
//!   what. Renewals only touch memory (expiry on the monotonic boot clock),
//!   which is what makes them cheap. A grant goes to a single writer thread
//!   that commits every pending grant in one transaction (WAL,
//!   `synchronous=FULL`, so the commit is fsync'd) and only then answers
//!   each of them: a grant is never answered before it is on disk, and under
//!   load one fsync covers many grants. After a restart every lease on record
//!   expires one ttl after the restart (the protocol's Restart rule).
//! - [`file::SharedEngine`] (the embedded default): each agent process
//!   opens the same file; every call is one `BEGIN IMMEDIATE` transaction,
//!   so concurrent agents are serialised by SQLite's write lock and exactly
//!   one of them gets a free task. The database is the only shared place, so
//!   expiry is a column: `CLOCK_BOOTTIME` milliseconds plus the boot id they
//!   are measured under; a different boot id means the lease has expired.
//!
//! Invariants: tokens strictly increase per task and are never reused,
//! whatever crashes, because the counter is committed in the same fsync'd
//! transaction as the grant it belongs to, before the grant is answered.

pub mod batched;
pub mod file;
pub mod rules;
pub mod store;

use std::fmt;

use crate::authority::{ExpiryPolicy, RefusalReason};

/// The reference bounds on `ttl_ms` (lease protocol v1).
pub const MIN_TTL_MS: u64 = 1_000;
pub const MAX_TTL_MS: u64 = 86_400_000;
/// The largest `grace_ms` accepted.
pub const MAX_GRACE_MS: u64 = 86_400_000;

/// Why an engine call did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineError {
    /// Another holder's lease is live or in its grace period.
    Held { holder: String, retry_after_ms: u64 },
    /// The previous lease expired under policy hold.
    HeldForOperator { holder: String, lease_id: String },
    /// Renewal or release refused: the lease is gone for good.
    Refused(RefusalReason),
    /// Operator call with nothing to act on.
    NotFound(String),
    /// The request is malformed (names the field).
    BadRequest(String),
    /// The database failed or is busy; the answer is unknown, retry.
    Storage(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Held {
                holder,
                retry_after_ms,
            } => write!(f, "held by {holder} (free in {retry_after_ms} ms)"),
            EngineError::HeldForOperator { holder, lease_id } => write!(
                f,
                "lease {lease_id} of {holder} expired under policy hold; an operator must clear the task"
            ),
            EngineError::Refused(r) => write!(f, "lease refused: {r}"),
            EngineError::NotFound(m) | EngineError::BadRequest(m) | EngineError::Storage(m) => {
                f.write_str(m)
            }
        }
    }
}

impl From<store::StoreError> for EngineError {
    fn from(e: store::StoreError) -> Self {
        EngineError::Storage(e.to_string())
    }
}

/// Checks a task name: 1 to 200 bytes of `A-Z a-z 0-9 . _ - : / @`.
pub fn validate_task(task: &str) -> Result<(), String> {
    if task.is_empty() || task.len() > 200 {
        return Err("`task` must be 1 to 200 bytes".into());
    }
    if let Some(c) = task
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/' | '@')))
    {
        return Err(format!(
            "`task` may only contain A-Z a-z 0-9 . _ - : / @ (found {c:?})"
        ));
    }
    Ok(())
}

/// Checks a holder: 1 to 200 bytes of printable UTF-8.
pub fn validate_holder(holder: &str) -> Result<(), String> {
    if holder.is_empty() || holder.len() > 200 {
        return Err("`holder` must be 1 to 200 bytes".into());
    }
    if holder.chars().any(|c| c.is_control()) {
        return Err("`holder` must be printable UTF-8 (no control characters)".into());
    }
    Ok(())
}

/// Checks `ttl_ms` against the reference bounds.
pub fn validate_ttl(ttl_ms: u64) -> Result<(), String> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(format!(
            "`ttl_ms` must be from {MIN_TTL_MS} to {MAX_TTL_MS} (got {ttl_ms})"
        ));
    }
    Ok(())
}

/// Checks `grace_ms`.
pub fn validate_grace(grace_ms: u64) -> Result<(), String> {
    if grace_ms > MAX_GRACE_MS {
        return Err(format!(
            "`grace_ms` must be from 0 to {MAX_GRACE_MS} (got {grace_ms})"
        ));
    }
    Ok(())
}

/// Validates a whole acquire request.
pub fn validate_acquire(spec: &rules::AcquireSpec) -> Result<(), EngineError> {
    validate_task(&spec.task)
        .and_then(|_| validate_holder(&spec.holder))
        .and_then(|_| validate_ttl(spec.ttl_ms))
        .and_then(|_| validate_grace(spec.grace_ms))
        .map_err(EngineError::BadRequest)
}

/// Now, in milliseconds on the boot clock (monotonic, counts suspend).
pub fn now_ms() -> u64 {
    u64::try_from(
        crate::time::clock::BootInstant::now()
            .since_boot()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

/// The expiry policy's wire name, or an error naming the field.
pub fn parse_policy(s: &str) -> Result<ExpiryPolicy, String> {
    ExpiryPolicy::parse(s)
        .ok_or_else(|| format!("`on_expiry` must be one of redispatch, grace, hold (got {s:?})"))
}
