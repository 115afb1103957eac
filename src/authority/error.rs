//! The errors of every lease client, typed by their source.
//!
//! Why typed: what the agent does with a failure depends on what failed (a
//! call that timed out is not probed for a TLS mismatch; a TLS or
//! credential failure at acquire is final), and deciding that from an error
//! message's words breaks silently the day a message is reworded or a
//! server sends those words. So each failure carries its [`FailureKind`],
//! set where the failure happens, and its message only says it for people:
//! nothing reads a message back.
//!
//! Display output is the message exactly (log lines and what users see are
//! part of the contract); the kind never shows.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::lease::RefusalReason;

/// What a call that gave no usable answer met.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The call's deadline passed (connect, send, reading the answer, or no
    /// time left to start it).
    Timeout,
    /// No connection: refused, reset, unreachable, host not found.
    Connect,
    /// TLS trust: the certificate, or TLS against plain HTTP.
    Trust(TrustCause),
    /// Credentials or permissions refused (etcd's login, RBAC).
    Denied,
    /// An HTTP status the protocol reads as "no answer" (5xx, 408, 429, a
    /// 4xx of the wrong shape, any other status).
    Status(u16),
    /// An answer of the wrong shape: a body that is not the expected JSON,
    /// a grant with an empty lease id, a reply without the expected reads.
    Malformed,
    /// The answer's body was over the cap.
    TooLarge,
    /// The request could not be encoded.
    Encode,
    /// The embedded database failed, was busy past the deadline, or could
    /// not be opened.
    Store,
    /// Anything else.
    Other,
}

/// Why a TLS connection failed for trust reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrustCause {
    /// The peer's certificate was not accepted, or ours was refused.
    Certificate,
    /// One side speaks TLS and the other does not.
    Tls,
}

impl TrustCause {
    /// How messages and the exit-125 line name the cause.
    pub fn as_str(self) -> &'static str {
        match self {
            TrustCause::Certificate => "certificate",
            TrustCause::Tls => "TLS",
        }
    }
}

impl fmt::Display for TrustCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A call that gave no usable answer: what kind of failure, and what
/// failed in words (naming the URL, never a credential).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }

    /// The same failure with what was being done in front: `what: message`.
    pub fn context(self, what: impl fmt::Display) -> Self {
        Failure {
            message: format!("{what}: {}", self.message),
            ..self
        }
    }

    /// The same failure with its message rewritten (e.g. escaped).
    pub fn map_message(self, f: impl FnOnce(&str) -> String) -> Self {
        Failure {
            message: f(&self.message),
            ..self
        }
    }

    /// The trust cause, for a failure that is about TLS trust.
    pub fn trust(&self) -> Option<TrustCause> {
        match self.kind {
            FailureKind::Trust(cause) => Some(cause),
            _ => None,
        }
    }
}

/// Why an acquire did not give a lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AcquireError {
    /// Another holder's lease is live (or in its grace period).
    #[error("held by {holder}{}", free_in(*retry_after))]
    Held {
        holder: String,
        retry_after: Option<Duration>,
    },
    /// The previous lease expired under policy `hold`: nobody gets the task
    /// until an operator clears it.
    #[error(
        "held for an operator after lease {lease_id} of {holder} expired under policy hold (clear it with `leaseagent clear`)"
    )]
    HeldForOperator { holder: String, lease_id: String },
    /// The authority said the request itself is wrong (400): retrying the
    /// same request cannot help.
    #[error("authority rejected the request: {0}")]
    Rejected(String),
    /// A TLS or credential problem (certificate not accepted, TLS spoken to
    /// a plain port or the reverse, 401 unauthenticated, 403 forbidden, etcd
    /// "authentication failed" or "permission denied"): retrying the same
    /// request cannot help. The message names the cause.
    #[error("{0}")]
    Trust(String),
    /// Unreachable, timed out, 5xx, malformed answer.
    #[error("{0}")]
    Transient(Failure),
}

/// ` (free in about 5s)`, or nothing when the authority did not say.
fn free_in(retry_after: Option<Duration>) -> String {
    retry_after
        .map(|r| format!(" (free in about {})", crate::time::duration::format(r)))
        .unwrap_or_default()
}

/// Why a renewal or release did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RenewError {
    /// The lease is gone for good; the command must stop.
    #[error("refused ({reason}){}", colon(message))]
    Refused {
        reason: RefusalReason,
        message: String,
    },
    /// The lease may still be valid; retry until the local deadline.
    #[error("{0}")]
    Transient(Failure),
}

/// `: message`, or nothing for an empty message.
fn colon(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// Errors of the operator calls.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OperatorError {
    /// This kind of authority has no such operation.
    #[error("{0}")]
    Unsupported(String),
    /// There is nothing to act on (no lease for the task, not held for an operator).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Failed(Failure),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_shows_its_message_only() {
        let f = Failure::new(FailureKind::Timeout, "http://h/v1/renew: timed out");
        assert_eq!(f.to_string(), "http://h/v1/renew: timed out");
        let f = f.context("renewal");
        assert_eq!(f.to_string(), "renewal: http://h/v1/renew: timed out");
        assert_eq!(f.kind, FailureKind::Timeout);
        assert_eq!(
            RenewError::Transient(f.clone()).to_string(),
            f.message.as_str()
        );
        assert_eq!(
            Failure::new(FailureKind::Trust(TrustCause::Tls), "m").trust(),
            Some(TrustCause::Tls)
        );
        assert_eq!(f.trust(), None);
    }
}
