//! What both engines take and answer: the checks of a request's fields,
//! a grant, a page of the listing, and the bound on a page.
//!
//! Here, apart from `mod.rs`, so that the engines (`file.rs`, `batched/`)
//! can name it without importing the folder's interface that names them.

use crate::lease::{ExpiryPolicy, LeaseInfo, MAX_GRACE_MS, MAX_TTL_MS, MIN_TTL_MS};

use super::error::{EngineError, RequestError};
use super::rules::AcquireSpec;

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
    pub leases: Vec<LeaseInfo>,
    /// Pass as `after` for the next page; `None` when this was the last.
    pub next_after: Option<String>,
}

/// The most leases, or attempts of the run history, one page holds (a
/// larger `limit` is cut to this; serve refuses one).
pub const MAX_PAGE: usize = 1000;

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
pub fn validate_acquire(spec: &AcquireSpec) -> Result<(), EngineError> {
    validate_task(&spec.task)
        .and_then(|_| validate_holder(&spec.holder))
        .and_then(|_| validate_ttl(spec.ttl_ms))
        .and_then(|_| validate_grace(spec.grace_ms))
        .map_err(EngineError::BadRequest)
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
