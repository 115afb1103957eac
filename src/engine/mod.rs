//! The lease engine on SQLite, shared by `leaseagent serve` and the embedded
//! default authority.
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

use crate::lease::{ExpiryPolicy, RefusalReason};

pub use crate::lease::{MAX_GRACE_MS, MAX_TTL_MS, MIN_TTL_MS};

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

/// Checks a task name (the protocol's rule, [`crate::lease::check_task`]).
pub fn validate_task(task: &str) -> Result<(), String> {
    crate::lease::check_task(task).map_err(|e| format!("`task` {e}"))
}

/// Checks a holder (the protocol's rule, [`crate::lease::check_holder`]).
pub fn validate_holder(holder: &str) -> Result<(), String> {
    crate::lease::check_holder(holder).map_err(|e| format!("`holder` {e}"))
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
