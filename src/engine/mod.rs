//! The lease engine on SQLite, shared by `leaseagent serve` and the embedded
//! default authority.
//!
//! One set of rules ([`rules`]) over one schema ([`store`]), run two ways:
//!
//! - [`batched::ServeEngine`] (behind `leaseagent serve`): every task's record
//!   lives in memory; the database holds the token sequence and who holds
//!   what. Renewals only touch memory (expiry on the monotonic boot clock),
//!   which is what makes them cheap. A grant goes to a single writer thread
//!   that commits every pending grant in one transaction (WAL,
//!   `synchronous=FULL`, so the commit is fsync'd) and only then answers
//!   each of them: a grant is never answered before it is on disk, and under
//!   load one fsync covers many grants. After a restart every lease on record
//!   expires one ttl after the restart (the protocol's Restart rule), except
//!   one recorded as held for an operator.
//! - [`file::SharedEngine`] (the embedded default): each agent process
//!   opens the same file; every call is one immediate transaction, so
//!   concurrent agents are serialised by SQLite's write lock (taken in turns,
//!   see [`gate`]) and exactly one of them gets a free task. The database is
//!   the only shared place, so expiry is a column: `CLOCK_BOOTTIME`
//!   milliseconds plus the boot id they are measured under; a different boot
//!   id means the lease has expired.
//!
//! Invariants: tokens strictly increase per task and are never reused,
//! whatever crashes, because they come from one global sequence that is
//! committed in the same fsync'd transaction as the grant it belongs to,
//! before the grant is answered, and never decreases (so released rows can
//! be deleted). Bad stored data is an error, never a default. A lease is
//! renewed or released only by the principal that acquired it, with an id
//! carrying 128 random bits.

pub mod ack;
pub mod batched;
pub mod file;
pub mod gate;
pub mod history;
pub mod rules;
pub mod store;

use std::error::Error;
use std::sync::Arc;

use crate::lease::{ExpiryPolicy, NameError, RefusalReason};

pub use crate::lease::{MAX_GRACE_MS, MAX_TTL_MS, MIN_TTL_MS};

/// A granted lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    pub lease_id: String,
    pub token: u64,
    pub ttl_ms: u64,
}

/// One page of the operator listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// Leases that matter (active, grace, held), in task order.
    pub leases: Vec<crate::lease::LeaseInfo>,
    /// Pass as `after` for the next page; `None` when this was the last.
    pub next_after: Option<String>,
}

/// The most leases one page holds (a larger `limit` is cut to this).
pub const MAX_PAGE: usize = 1000;

/// Which limit on live leases an acquire ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapScope {
    /// The acquiring principal's own `max_leases`: HTTP 429 (the client
    /// should slow down; the agent treats it as transient).
    Principal,
    /// The authority's limit on live leases overall: HTTP 503 (the server
    /// is full; transient for the agent too).
    Global,
}

/// Why an engine call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Another holder's lease is live or in its grace period.
    #[error("held by {holder} (free in {retry_after_ms} ms)")]
    Held { holder: String, retry_after_ms: u64 },
    /// The previous lease expired under policy hold.
    #[error(
        "lease {lease_id} of {holder} expired under policy hold; an operator must clear the task"
    )]
    HeldForOperator { holder: String, lease_id: String },
    /// Renewal or release refused: the lease is gone for good.
    #[error("lease refused: {0}")]
    Refused(RefusalReason),
    /// Renewal or release of a lease that another principal acquired
    /// (HTTP 403 `forbidden`; not a refusal of the lease).
    #[error("the lease of task `{task}` belongs to another principal")]
    NotOwner { task: String },
    /// An acquire would exceed a limit on live leases (HTTP 429 for the
    /// principal's own limit, 503 for the global one; see [`CapScope`]).
    #[error("too many live leases: {} is {limit}", match scope {
        CapScope::Principal => "this principal's limit",
        CapScope::Global => "the authority's limit",
    })]
    TooManyLeases { scope: CapScope, limit: u64 },
    /// Operator call with nothing to act on.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed (names the field).
    #[error("{0}")]
    BadRequest(#[from] RequestError),
    /// The next token of the sequence is not above a task's last token: the
    /// stored data is inconsistent, and granting could reuse a token.
    #[error("token sequence at {next} is not above task `{task}`'s last token {last}")]
    SequenceBehind { task: String, next: u64, last: u64 },
    /// The database failed, is corrupt or is busy; the answer is unknown.
    #[error("{}", chain(.0))]
    Storage(#[from] store::StoreError),
    /// A queued commit failed (serve's writer thread).
    #[error("{}", chain(.0.as_ref()))]
    Commit(Arc<store::StoreError>),
    /// The engine cannot answer (names why); retry later.
    #[error("{0}")]
    Unavailable(&'static str),
}

impl EngineError {
    /// Another process held the database's write lock past the deadline.
    pub fn is_busy(&self) -> bool {
        matches!(self, EngineError::Storage(e) if e.is_busy())
    }
}

/// An error and its causes on one line (`a: b: c`).
pub fn chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A request field the protocol does not accept; the message names the
/// field as it is spelled on the wire.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("`task` {0}")]
    Task(#[source] NameError),
    #[error("`holder` {0}")]
    Holder(#[source] NameError),
    #[error("`ttl_ms` must be from {MIN_TTL_MS} to {MAX_TTL_MS} (got {0})")]
    Ttl(u64),
    #[error("`grace_ms` must be from 0 to {MAX_GRACE_MS} (got {0})")]
    Grace(u64),
    #[error("`on_expiry` must be one of redispatch, grace, hold (got {0:?})")]
    Policy(String),
}

/// Checks a task name (the protocol's rule, [`crate::lease::check_task`]).
pub fn validate_task(task: &str) -> Result<(), RequestError> {
    crate::lease::check_task(task).map_err(RequestError::Task)
}

/// Checks a holder (the protocol's rule, [`crate::lease::check_holder`]).
pub fn validate_holder(holder: &str) -> Result<(), RequestError> {
    crate::lease::check_holder(holder).map_err(RequestError::Holder)
}

/// Checks `ttl_ms` against the reference bounds.
pub fn validate_ttl(ttl_ms: u64) -> Result<(), RequestError> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(RequestError::Ttl(ttl_ms));
    }
    Ok(())
}

/// Checks `grace_ms`.
pub fn validate_grace(grace_ms: u64) -> Result<(), RequestError> {
    if grace_ms > MAX_GRACE_MS {
        return Err(RequestError::Grace(grace_ms));
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
pub fn parse_policy(s: &str) -> Result<ExpiryPolicy, RequestError> {
    ExpiryPolicy::parse(s).ok_or_else(|| RequestError::Policy(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_errors_name_the_wire_field() {
        let msg = |r: Result<(), RequestError>| r.unwrap_err().to_string();
        assert_eq!(
            msg(validate_task("a b")),
            "`task` contains ' '; task names use only A-Z a-z 0-9 . _ - : / @"
        );
        assert_eq!(
            msg(validate_holder("")),
            "`holder` must be 1 to 200 bytes long (it is 0)"
        );
        assert_eq!(
            msg(validate_ttl(0)),
            format!("`ttl_ms` must be from {MIN_TTL_MS} to {MAX_TTL_MS} (got 0)")
        );
        assert_eq!(
            msg(validate_grace(MAX_GRACE_MS + 1)),
            format!(
                "`grace_ms` must be from 0 to {MAX_GRACE_MS} (got {})",
                MAX_GRACE_MS + 1
            )
        );
        assert_eq!(
            parse_policy("never").unwrap_err().to_string(),
            "`on_expiry` must be one of redispatch, grace, hold (got \"never\")"
        );
    }
}
