//! Lease protocol v1 on the wire: the JSON bodies both ends exchange, and
//! the error codes with the HTTP status each one travels with.
//!
//! The client (`authority::http`) and the server (`serve::api`) both use
//! these, so a code's spelling and its status are written here once: a
//! refusal answered by the server with one status and expected by the client
//! with another cannot happen.
//!
//! Answers are decoded into these structs only after the body was checked to
//! be a JSON object; the server decodes requests field by field (so its 400s
//! name the field) and then builds these same types.

use serde::{Deserialize, Serialize};

use crate::lease::{Attempt, LeaseInfo, RefusalReason};

/// `POST /v1/acquire`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireBody {
    pub task: String,
    pub holder: String,
    pub ttl_ms: u64,
    pub on_expiry: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
    /// The caller's id while it waits ("Waiting"): 16 to 64 bytes of
    /// `A-Z a-z 0-9 - _`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiter: Option<String>,
}

/// `POST /v1/renew` (and the lease part of release).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRefBody {
    pub lease_id: String,
    pub token: u64,
}

/// `POST /v1/release`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseBody {
    pub lease_id: String,
    pub token: u64,
    pub outcome: String,
    pub exit_code: Option<i32>,
}

/// `POST /v1/revoke`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeBody {
    pub task: String,
    pub force: bool,
}

/// `POST /v1/clear`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearBody {
    pub task: String,
}

/// `200` to acquire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantBody {
    pub lease_id: String,
    #[serde(default)]
    pub task: Option<String>,
    pub token: u64,
    pub ttl_ms: u64,
}

/// `200` to renew.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewBody {
    pub ttl_ms: u64,
}

/// `200` to `GET /v1/leases[?limit=N&after=TASK]`: one page, sorted by
/// task. `next_after` is present when more leases may follow: ask again with
/// `after=` that task. A page may hold fewer than `limit` leases (the server
/// filters it to the caller's scope), even none, and still have a next one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasesBody {
    pub leases: Vec<LeaseInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// `200` to `GET /v1/history[?task=T&after=CURSOR&limit=N]`: attempts,
/// newest first. `next_after` is an opaque cursor (null on the last page);
/// like the listing, a page filtered to the caller's scope may hold fewer
/// than `limit` attempts and still have a next one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryBody {
    pub attempts: Vec<Attempt>,
    #[serde(default)]
    pub next_after: Option<String>,
}

/// Every error answer: `{"error": CODE, "message": TEXT, ...}`; `held` adds
/// `holder` and `retry_after_ms`, `held_for_operator` adds `holder` and
/// `lease_id`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// `not_leader`: the leader's URL as the replica knows it (`null`:
    /// unknown). Outside input to a client: it follows only a URL it was
    /// configured with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<Option<String>>,
    /// `/healthz` of a replica that does not lead: `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<bool>,
    /// A waiter's place in the task's queue, 1 for the first ("Waiting").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
}

impl ErrorBody {
    /// A body with just a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            error: code.as_str().to_string(),
            message: Some(message.into()),
            ..Default::default()
        }
    }

    /// The code, if it is one this protocol defines.
    pub fn code(&self) -> Option<ErrorCode> {
        ErrorCode::parse(&self.error)
    }
}

/// The `error` codes of lease protocol v1, each with its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// Another holder's lease is live (acquire).
    Held,
    /// Expired under policy hold; an operator must clear it (acquire).
    HeldForOperator,
    /// Refusals of renew/release: the lease is gone for good.
    Refused(RefusalReason),
    /// Operator call with nothing to act on, or no such endpoint.
    NotFound,
    BadRequest,
    MethodNotAllowed,
    /// The server cannot answer now (storage failed); retry.
    Unavailable,
    /// No credential, or an unknown one (`WWW-Authenticate: Bearer`).
    Unauthenticated,
    /// A known principal whose role or task scope does not allow the call,
    /// or not the principal that acquired the lease.
    Forbidden,
    /// Too many open connections from this address or in all; retry.
    Overloaded,
    /// The principal holds as many leases as its cap allows (acquire).
    TooManyLeases,
    /// A replica that does not lead (any lease call): transient, try the
    /// leader it names or another replica.
    NotLeader,
}

impl ErrorCode {
    /// The code carried by an answer with this HTTP status when the status
    /// alone names it (401, 403), whatever the body says.
    pub fn from_status(status: u16) -> Option<Self> {
        match status {
            401 => Some(ErrorCode::Unauthenticated),
            403 => Some(ErrorCode::Forbidden),
            _ => None,
        }
    }

    /// The body of an answer that carries only this code, e.g.
    /// `{"error":"forbidden"}` (the trust answers have no message).
    pub fn bare_body(self) -> String {
        format!("{{\"error\":\"{}\"}}", self.as_str())
    }

    /// The HTTP status this code travels with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::Held | ErrorCode::HeldForOperator | ErrorCode::Refused(_) => 409,
            ErrorCode::NotFound => 404,
            ErrorCode::BadRequest => 400,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Unavailable | ErrorCode::Overloaded | ErrorCode::NotLeader => 503,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::TooManyLeases => 429,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Held => "held",
            ErrorCode::HeldForOperator => "held_for_operator",
            ErrorCode::Refused(r) => r.as_str(),
            ErrorCode::NotFound => "not_found",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::TooManyLeases => "too_many_leases",
            ErrorCode::NotLeader => "not_leader",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        if let Some(r) = RefusalReason::parse(s) {
            return Some(ErrorCode::Refused(r));
        }
        Some(match s {
            "held" => ErrorCode::Held,
            "held_for_operator" => ErrorCode::HeldForOperator,
            "not_found" => ErrorCode::NotFound,
            "bad_request" => ErrorCode::BadRequest,
            "method_not_allowed" => ErrorCode::MethodNotAllowed,
            "unavailable" => ErrorCode::Unavailable,
            "unauthenticated" => ErrorCode::Unauthenticated,
            "forbidden" => ErrorCode::Forbidden,
            "overloaded" => ErrorCode::Overloaded,
            "too_many_leases" => ErrorCode::TooManyLeases,
            "not_leader" => ErrorCode::NotLeader,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_with_their_status() {
        let all = [
            (ErrorCode::Held, 409),
            (ErrorCode::HeldForOperator, 409),
            (ErrorCode::Refused(RefusalReason::Expired), 409),
            (ErrorCode::Refused(RefusalReason::Superseded), 409),
            (ErrorCode::Refused(RefusalReason::Revoked), 409),
            (ErrorCode::Refused(RefusalReason::UnknownLease), 409),
            (ErrorCode::NotFound, 404),
            (ErrorCode::BadRequest, 400),
            (ErrorCode::MethodNotAllowed, 405),
            (ErrorCode::Unavailable, 503),
            (ErrorCode::Unauthenticated, 401),
            (ErrorCode::Forbidden, 403),
            (ErrorCode::Overloaded, 503),
            (ErrorCode::TooManyLeases, 429),
            (ErrorCode::NotLeader, 503),
        ];
        for (code, status) in all {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert_eq!(code.status(), status, "{}", code.as_str());
        }
        assert_eq!(ErrorCode::parse("teapot"), None);
        assert_eq!(
            ErrorCode::from_status(401),
            Some(ErrorCode::Unauthenticated)
        );
        assert_eq!(ErrorCode::from_status(403), Some(ErrorCode::Forbidden));
        assert_eq!(ErrorCode::from_status(409), None);
        assert_eq!(ErrorCode::Forbidden.bare_body(), r#"{"error":"forbidden"}"#);
    }

    #[test]
    fn error_body_shapes() {
        let b = ErrorBody::new(ErrorCode::BadRequest, "`task` is missing");
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"error":"bad_request","message":"`task` is missing"}"#
        );
        let held: ErrorBody =
            serde_json::from_str(r#"{"error":"held","holder":"h","retry_after_ms":5}"#).unwrap();
        assert_eq!(held.code(), Some(ErrorCode::Held));
        assert_eq!(held.retry_after_ms, Some(5));
        let nl: ErrorBody =
            serde_json::from_str(r#"{"error":"not_leader","leader":"https://b:7878"}"#).unwrap();
        assert_eq!(nl.code(), Some(ErrorCode::NotLeader));
        assert_eq!(nl.leader, Some(Some("https://b:7878".into())));
        let unknown: ErrorBody =
            serde_json::from_str(r#"{"error":"not_leader","leader":null}"#).unwrap();
        assert_eq!(
            unknown.leader, None,
            "null reads as absent: no leader to try"
        );
        let b = ErrorBody {
            leader: Some(None),
            ..ErrorBody::new(ErrorCode::NotLeader, "m")
        };
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"error":"not_leader","message":"m","leader":null}"#
        );
    }
}
