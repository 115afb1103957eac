//! The lease domain: the words every part of leaseagent shares, and the rules
//! on them written once.
//!
//! The agent, the authority clients (HTTP, etcd, embedded), the engine behind
//! `serve` and the operator commands all speak of the same things: an expiry
//! policy, an outcome, a refusal reason, a granted lease, a row of the
//! operator view, and what makes a task name or holder acceptable. They live
//! here, in a module that imports nothing of the crate, so that none of those
//! parts has to import another to name them (the authority clients and the
//! engine used to import each other for these types).
//!
//! Wire spellings (`snake_case`) are those of lease protocol v1; the HTTP
//! bodies themselves are in `protocol::v1`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The variables the job gets (agent contract).
pub mod env {
    /// The fencing token of this grant, decimal.
    pub const TOKEN: &str = "LEASE_TOKEN";
    pub const ID: &str = "LEASE_ID";
    pub const TASK: &str = "LEASE_TASK";
    pub const AUTHORITY: &str = "LEASE_AUTHORITY";
    pub const TTL_MS: &str = "LEASE_TTL_MS";
}

/// The reference bounds on `ttl_ms` (lease protocol v1).
pub const MIN_TTL_MS: u64 = 1_000;
pub const MAX_TTL_MS: u64 = 86_400_000;
/// The same bounds as durations (what `--ttl` may ask).
pub const MIN_TTL: Duration = Duration::from_millis(MIN_TTL_MS);
pub const MAX_TTL: Duration = Duration::from_millis(MAX_TTL_MS);
/// The largest `grace_ms` accepted.
pub const MAX_GRACE_MS: u64 = 86_400_000;
/// The longest task name or holder, in bytes.
pub const MAX_NAME_BYTES: usize = 200;

/// What the authority does once a lease expires (sent with acquire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpiryPolicy {
    Redispatch,
    Grace,
    Hold,
}

impl ExpiryPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ExpiryPolicy::Redispatch => "redispatch",
            ExpiryPolicy::Grace => "grace",
            ExpiryPolicy::Hold => "hold",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "redispatch" => Some(ExpiryPolicy::Redispatch),
            "grace" => Some(ExpiryPolicy::Grace),
            "hold" => Some(ExpiryPolicy::Hold),
            _ => None,
        }
    }
}

/// How a run ended, as reported on release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    Failed,
    Cancelled,
    Lost,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Lost => "lost",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "succeeded" => Some(Outcome::Succeeded),
            "failed" => Some(Outcome::Failed),
            "cancelled" => Some(Outcome::Cancelled),
            "lost" => Some(Outcome::Lost),
            _ => None,
        }
    }
}

/// Why an authority refused a renewal: the lease is gone for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    Expired,
    Superseded,
    Revoked,
    UnknownLease,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Expired => "expired",
            RefusalReason::Superseded => "superseded",
            RefusalReason::Revoked => "revoked",
            RefusalReason::UnknownLease => "unknown_lease",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "expired" => Some(RefusalReason::Expired),
            "superseded" => Some(RefusalReason::Superseded),
            "revoked" => Some(RefusalReason::Revoked),
            "unknown_lease" => Some(RefusalReason::UnknownLease),
            _ => None,
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An acquire request, as the agent sends it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireRequest {
    pub task: String,
    pub holder: String,
    pub ttl: Duration,
    pub on_expiry: ExpiryPolicy,
    /// Only meaningful with [`ExpiryPolicy::Grace`].
    pub grace: Duration,
}

/// A granted lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub lease_id: String,
    pub task: String,
    /// The fencing token: strictly greater than every token issued before for
    /// this task.
    pub token: u64,
    /// The ttl the authority granted (it may clamp what was asked).
    pub ttl: Duration,
}

impl Grant {
    pub fn lease_ref(&self) -> LeaseRef {
        LeaseRef {
            lease_id: self.lease_id.clone(),
            token: self.token,
            task: self.task.clone(),
        }
    }
}

/// What renew and release need to name a lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRef {
    pub lease_id: String,
    pub token: u64,
    pub task: String,
}

/// A successful renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewed {
    /// The ttl now in force, counted from when the authority received the
    /// renewal (the agent counts it from when it *sent* it).
    pub ttl: Duration,
}

/// Where a task's lease stands, in the operator view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Held and live.
    Active,
    /// Expired under policy grace: blocked until the grace period ends.
    Grace,
    /// Expired under policy hold: blocked until an operator clears it.
    HeldForOperator,
    /// Queued behind the active holder (etcd lists waiters' keys): not
    /// holding the task.
    Waiting,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Active => "active",
            LeaseState::Grace => "grace",
            LeaseState::HeldForOperator => "held_for_operator",
            LeaseState::Waiting => "waiting",
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the operator view of an authority.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub task: String,
    /// `serve` does not list lease ids (one is a capability): empty then.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lease_id: String,
    pub token: u64,
    pub holder: String,
    /// The principal that acquired the lease (`""` without principals).
    #[serde(default)]
    pub principal: String,
    pub state: LeaseState,
    /// Milliseconds until expiry (for `grace`: until the task is free again;
    /// absent for `held_for_operator`).
    pub expires_in_ms: Option<u64>,
}

/// How an attempt ended (`GET /v1/history`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    /// Its holder released it.
    Released,
    /// It expired without a release (its holder stopped renewing).
    Expired,
    /// An operator revoked it.
    Revoked,
    /// It expired under policy hold and an operator cleared the task.
    Cleared,
}

impl Ended {
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Released => "released",
            Ended::Expired => "expired",
            Ended::Revoked => "revoked",
            Ended::Cleared => "cleared",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "released" => Some(Ended::Released),
            "expired" => Some(Ended::Expired),
            "revoked" => Some(Ended::Revoked),
            "cleared" => Some(Ended::Cleared),
            _ => None,
        }
    }
}

/// One attempt of a task, as `GET /v1/history` shows it: times are RFC 3339
/// UTC wall-clock strings, for people (lease arithmetic never uses them).
/// No lease id: one is a capability.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub task: String,
    pub token: u64,
    pub holder: String,
    pub acquired_at: String,
    /// `None` while the attempt holds the task.
    pub ended_at: Option<String>,
    pub ended: Option<Ended>,
    /// What the agent reported on release.
    pub outcome: Option<Outcome>,
    pub exit_code: Option<i32>,
    /// From acquired to ended; `None` while the attempt holds the task.
    pub held_ms: Option<u64>,
}

/// Why a task name or holder is not acceptable. The caller says which field
/// (a flag for the agent, a body field for the server).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must be 1 to {MAX_NAME_BYTES} bytes long (it is {0})")]
    Length(usize),
    #[error("contains {0:?}; task names use only A-Z a-z 0-9 . _ - : / @")]
    TaskChar(char),
    #[error("must be printable (no control characters)")]
    Control,
}

/// The protocol's rule for task names: 1 to 200 bytes of
/// `A-Z a-z 0-9 . _ - : / @`.
pub fn check_task(task: &str) -> Result<(), NameError> {
    if task.is_empty() || task.len() > MAX_NAME_BYTES {
        return Err(NameError::Length(task.len()));
    }
    match task
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/' | '@')))
    {
        Some(c) => Err(NameError::TaskChar(c)),
        None => Ok(()),
    }
}

/// The protocol's rule for holders: 1 to 200 bytes of printable UTF-8.
pub fn check_holder(holder: &str) -> Result<(), NameError> {
    if holder.is_empty() || holder.len() > MAX_NAME_BYTES {
        return Err(NameError::Length(holder.len()));
    }
    if holder.chars().any(char::is_control) {
        return Err(NameError::Control);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_rule() {
        assert!(check_task("nightly-export").is_ok());
        assert!(check_task("etl/a.b_c:d@e").is_ok());
        assert_eq!(check_task(""), Err(NameError::Length(0)));
        assert_eq!(check_task(&"a".repeat(201)), Err(NameError::Length(201)));
        assert!(check_task(&"a".repeat(200)).is_ok());
        assert_eq!(check_task("a b"), Err(NameError::TaskChar(' ')));
        assert_eq!(check_task("tâche"), Err(NameError::TaskChar('â')));
    }

    #[test]
    fn holder_rule() {
        assert!(check_holder("host-1/42 (büro)").is_ok());
        assert_eq!(check_holder("a\nb"), Err(NameError::Control));
        assert_eq!(check_holder("\u{1b}[2J"), Err(NameError::Control));
        assert_eq!(check_holder(""), Err(NameError::Length(0)));
    }

    #[test]
    fn wire_spellings_round_trip() {
        for s in [
            LeaseState::Active,
            LeaseState::Grace,
            LeaseState::HeldForOperator,
        ] {
            let j = serde_json::to_string(&s).unwrap();
            assert_eq!(j, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<LeaseState>(&j).unwrap(), s);
        }
        for o in [
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Cancelled,
            Outcome::Lost,
        ] {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
        for r in [
            RefusalReason::Expired,
            RefusalReason::Superseded,
            RefusalReason::Revoked,
            RefusalReason::UnknownLease,
        ] {
            assert_eq!(RefusalReason::parse(r.as_str()), Some(r));
        }
    }
}
