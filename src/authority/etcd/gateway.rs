//! Deadline-bounded JSON calls to etcd's v3 gateway, over several endpoints.
//!
//! Why: the heartbeat thread hands every renewal a timeout below the time its
//! lease has left; a call that outlives it could let the lease run out while
//! the agent still believes it is renewing. So every call here takes an
//! absolute deadline, and no single HTTP attempt is given more than what is
//! left of it.
//!
//! Endpoint rotation: a connection error, a timeout, a 5xx (etcd answers 503
//! while it has no leader) or an answer we cannot read moves the cursor to the
//! next endpoint, and the call is retried there at once if time remains and
//! that endpoint was not tried yet in this call. While other endpoints remain
//! untried an attempt gets at most half the time left, so one hung member
//! cannot eat the whole budget and a leader election costs a retry, not the
//! lease. Every etcd request we send is safe to repeat: keepalive, range and
//! revoke are idempotent, and the acquire txn is guarded by
//! `create_revision == 0` with a read of our own key on the failure branch.
//!
//! What counts as an answer: a 4xx carrying a gRPC status is a definite
//! answer from etcd ([`CallError::Status`]); anything else that is not a
//! readable JSON body of the expected shape is [`CallError::Transient`],
//! never a success.
//!
//! Trust: `etcds://` speaks TLS with the [`ClientTrust`]'s roots and client
//! certificate (a certificate problem at one endpoint moves to the next, as
//! any transport failure does, and is reported as [`CallError::Tls`] when no
//! endpoint answered). With an etcd login, the gateway authenticates
//! (`/v3/auth/authenticate`) before its first call and sends the token in the
//! `Authorization` header of every call. etcd's simple tokens expire; when
//! etcd answers "invalid auth token" (or "revision of auth store is old"),
//! the call authenticates again and is retried once, within the same
//! deadline. Wrong credentials and RBAC refusals are [`CallError::Denied`].
//! The password is only ever in the authenticate request's body.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::wire::{
    AuthenticateRequest, AuthenticateResponse, GRPC_INVALID_ARGUMENT, GRPC_PERMISSION_DENIED,
    GRPC_UNAUTHENTICATED, GatewayError, Known, StreamError,
};
use crate::authority::error::{Failure, FailureKind, TrustCause};
use crate::authority::trust::ClientTrust;

// Answers larger than the protocol's limit are not answers we asked for.
use crate::authority::transport::BODY_LIMIT;

/// Why a gateway call gave no answer of the expected shape.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// Unreachable, timed out, 5xx, or unreadable: the state is unknown.
    #[error("{0}")]
    Transient(Failure),
    /// No endpoint answered, and at least one failed for TLS trust.
    #[error("{cause}: {message}")]
    Tls { cause: TrustCause, message: String },
    /// etcd answered with a gRPC status (HTTP 4xx): a definite answer.
    #[error("etcd answered {http}: {} (grpc code {})", status.message, status.code)]
    Status { http: u16, status: GatewayError },
    /// etcd refused our credentials or permissions: `cause` is
    /// `authentication failed`, `unauthenticated` or `permission denied`.
    #[error("{cause}: {message}")]
    Denied {
        cause: &'static str,
        message: String,
    },
}

impl CallError {
    /// Whether the failure is about TLS or credentials.
    pub fn is_trust(&self) -> bool {
        matches!(self, CallError::Tls { .. } | CallError::Denied { .. })
    }

    /// The failure as the lease client reports it (the same words).
    pub fn into_failure(self) -> Failure {
        let kind = match &self {
            CallError::Transient(f) => f.kind,
            CallError::Tls { cause, .. } => FailureKind::Trust(*cause),
            CallError::Status { http, .. } => FailureKind::Status(*http),
            CallError::Denied { .. } => FailureKind::Denied,
        };
        match self {
            CallError::Transient(f) => f,
            other => Failure::new(kind, other.to_string()),
        }
    }
}

/// A failure of the gateway itself (not of one call on the wire).
fn transient(kind: FailureKind, message: impl Into<String>) -> CallError {
    CallError::Transient(Failure::new(kind, message))
}

/// A client for one etcd cluster, owned by one thread.
pub struct Gateway {
    endpoints: Vec<String>,
    /// `https` for `etcds://`, else `http`.
    scheme: &'static str,
    /// The endpoint the next call starts with.
    cursor: usize,
    agent: ureq::Agent,
    trust: Arc<ClientTrust>,
    /// etcd's auth token (a credential: never logged), once authenticated.
    token: Option<String>,
    /// etcd said authentication is not enabled: the login is not needed.
    auth_disabled: bool,
}

impl Gateway {
    /// Plain HTTP, no credentials.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self::with_trust(endpoints, false, Arc::new(ClientTrust::none()))
    }

    pub fn with_trust(endpoints: Vec<String>, tls: bool, trust: Arc<ClientTrust>) -> Self {
        Gateway {
            endpoints,
            scheme: if tls { "https" } else { "http" },
            cursor: 0,
            agent: crate::authority::transport::agent(&trust),
            trust,
            token: None,
            auth_disabled: false,
        }
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub fn tls(&self) -> bool {
        self.scheme == "https"
    }

    pub fn trust(&self) -> &Arc<ClientTrust> {
        &self.trust
    }

    fn needs_login(&self) -> bool {
        self.trust.etcd_login().is_some() && !self.auth_disabled
    }

    /// POSTs `body` to `path` (e.g. `/v3/kv/range`) and reads the first JSON
    /// value of the answer as `R`, finishing by `deadline`. Authenticates
    /// first (and again when etcd says the token is no longer valid).
    pub fn call<B: Serialize, R: DeserializeOwned>(
        &mut self,
        path: &str,
        body: &B,
        deadline: Instant,
    ) -> Result<R, CallError> {
        self.call_limited(path, body, deadline, BODY_LIMIT)
    }

    /// [`Gateway::call`] with an answer size limit other than the protocol's.
    pub fn call_limited<B: Serialize, R: DeserializeOwned>(
        &mut self,
        path: &str,
        body: &B,
        deadline: Instant,
        limit: u64,
    ) -> Result<R, CallError> {
        let body =
            serde_json::to_vec(body).map_err(|e| transient(FailureKind::Encode, e.to_string()))?;
        if self.needs_login() && self.token.is_none() {
            self.authenticate(deadline)?;
        }
        let first = self.rotate(path, &body, true, deadline, limit);
        let answer = match first {
            Err(CallError::Status { status, .. })
                if self.needs_login() && token_expired(&status) =>
            {
                // Debug: with short token ttls this happens at every renewal,
                // and the log's info level is one line per state change.
                log::debug!(
                    "etcd: auth token no longer valid ({}); authenticating again",
                    status.message
                );
                self.token = None;
                self.authenticate(deadline)?;
                self.rotate(path, &body, true, deadline, limit)
            }
            other => other,
        };
        answer.map_err(denied)
    }

    /// Gets a fresh token for the login (`/v3/auth/authenticate`).
    fn authenticate(&mut self, deadline: Instant) -> Result<(), CallError> {
        let Some(login) = self.trust.etcd_login() else {
            return Ok(());
        };
        let body = serde_json::to_vec(&AuthenticateRequest {
            name: &login.user,
            password: login.password.expose(),
        })
        .map_err(|e| transient(FailureKind::Encode, e.to_string()))?;
        let user = login.user.clone();
        match self.rotate::<AuthenticateResponse>(
            "/v3/auth/authenticate",
            &body,
            false,
            deadline,
            BODY_LIMIT,
        ) {
            Ok(r) if !r.token.is_empty() => {
                self.token = Some(r.token);
                Ok(())
            }
            Ok(_) => Err(transient(
                FailureKind::Malformed,
                "etcd /v3/auth/authenticate answered without a token",
            )),
            Err(CallError::Status { status, .. })
                if status.known() == Some(Known::AuthNotEnabled) =>
            {
                log::info!("etcd: authentication is not enabled; --etcd-user is not needed");
                self.auth_disabled = true;
                Ok(())
            }
            Err(CallError::Status { http, status }) if status.code == GRPC_INVALID_ARGUMENT => {
                Err(CallError::Denied {
                    cause: "authentication failed",
                    message: format!(
                        "etcd refused the login of user {user} (--etcd-user, --etcd-password-file): {} (HTTP {http})",
                        status.message
                    ),
                })
            }
            Err(e) => Err(denied(e)),
        }
    }

    /// One request, trying the endpoints in turn until one answers.
    fn rotate<R: DeserializeOwned>(
        &mut self,
        path: &str,
        body: &[u8],
        with_token: bool,
        deadline: Instant,
        limit: u64,
    ) -> Result<R, CallError> {
        let n = self.endpoints.len().max(1);
        let mut last = transient(FailureKind::Other, "etcd: no endpoint configured");
        let mut tls_failure: Option<CallError> = None;
        for tried in 0..n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left < Duration::from_millis(1) {
                if tried == 0 {
                    last = transient(
                        FailureKind::Timeout,
                        format!("etcd {path}: no time left for the call"),
                    );
                }
                break;
            }
            let untried_after_this = n - tried - 1;
            let budget = if untried_after_this > 0 {
                left / 2
            } else {
                left
            };
            let Some(endpoint) = self.endpoints.get(self.cursor % n).cloned() else {
                break;
            };
            let token = if with_token { self.token.clone() } else { None };
            match self.attempt(&endpoint, path, body, token.as_deref(), budget, limit) {
                Ok(r) => return Ok(r),
                Err(e @ CallError::Status { .. }) | Err(e @ CallError::Denied { .. }) => {
                    return Err(e);
                }
                Err(CallError::Tls { cause, message }) => {
                    log::debug!(
                        "etcd {endpoint}{path}: {message}; next call goes to the next endpoint"
                    );
                    self.cursor = (self.cursor + 1) % n;
                    let e = CallError::Tls {
                        cause,
                        message: format!("etcd {endpoint}{path}: {message}"),
                    };
                    tls_failure = Some(e.clone());
                    last = e;
                }
                Err(CallError::Transient(f)) => {
                    log::debug!("etcd {endpoint}{path}: {f}; next call goes to the next endpoint");
                    self.cursor = (self.cursor + 1) % n;
                    last = CallError::Transient(f.context(format_args!("etcd {endpoint}{path}")));
                }
            }
        }
        Err(tls_failure.unwrap_or(last))
    }

    fn attempt<R: DeserializeOwned>(
        &self,
        endpoint: &str,
        path: &str,
        body: &[u8],
        token: Option<&str>,
        budget: Duration,
        limit: u64,
    ) -> Result<R, CallError> {
        let url = format!("{}://{endpoint}{path}", self.scheme);
        let (status, bytes) =
            crate::authority::transport::call(&self.agent, &url, Some(body), token, budget, limit)
                .map_err(|f| match f.trust() {
                    Some(cause) => CallError::Tls {
                        cause,
                        message: f.message,
                    },
                    None => CallError::Transient(f),
                })?;
        if !(200..300).contains(&status) && !(400..500).contains(&status) {
            return Err(transient(
                FailureKind::Status(status),
                format!("HTTP {status}: {}", snippet(&bytes)),
            ));
        }
        if status >= 400 {
            return match first_json::<GatewayError>(&bytes) {
                Some(g) if g.code != 0 => Err(CallError::Status {
                    http: status,
                    status: g,
                }),
                // etcd's gateway refuses client certificates with a Common
                // Name when it checks client certificates (CVE-2018-16886).
                _ if super::wire::refuses_common_name(&bytes) => Err(CallError::Tls {
                    cause: TrustCause::Certificate,
                    message: format!(
                        "HTTP {status}: {}: etcd's JSON gateway refuses client certificates that carry a Common Name; use one whose subject has no CN (names in subjectAltName only)",
                        snippet(&bytes)
                    ),
                }),
                // A 4xx without a gRPC status is not etcd's gateway talking.
                _ => Err(transient(
                    FailureKind::Status(status),
                    format!("HTTP {status}: {}", snippet(&bytes)),
                )),
            };
        }
        // A stream (keepalive) reports errors inside a 200.
        if let Some(StreamError { error }) = first_json::<StreamError>(&bytes) {
            if error.code != 0 {
                return Err(CallError::Status {
                    http: status,
                    status: error,
                });
            }
        }
        first_json::<R>(&bytes).ok_or_else(|| {
            transient(
                FailureKind::Malformed,
                format!("malformed answer: {}", snippet(&bytes)),
            )
        })
    }
}

/// Whether etcd's answer says our token expired (authenticate again).
fn token_expired(status: &GatewayError) -> bool {
    status.code == GRPC_UNAUTHENTICATED
        || matches!(
            status.known(),
            Some(Known::InvalidAuthToken | Known::AuthOldRevision)
        )
}

/// Turns etcd's refusals of credentials or permissions into
/// [`CallError::Denied`]; other errors pass through.
fn denied(e: CallError) -> CallError {
    match e {
        CallError::Status { http, status } if status.code == GRPC_PERMISSION_DENIED => {
            CallError::Denied {
                cause: "permission denied",
                message: format!(
                    "etcd: {} (HTTP {http}): the etcd user lacks read-write permission on the task's keys",
                    status.message
                ),
            }
        }
        CallError::Status { http, status }
            if status.code == GRPC_UNAUTHENTICATED
                || matches!(
                    status.known(),
                    Some(Known::UserNameEmpty | Known::InvalidAuthToken)
                ) =>
        {
            CallError::Denied {
                cause: "unauthenticated",
                message: format!(
                    "etcd: {} (HTTP {http}): etcd requires authentication (--etcd-user, --etcd-password-file)",
                    status.message
                ),
            }
        }
        e => e,
    }
}

/// The first JSON value of a body. Streaming endpoints (keepalive) send
/// newline-separated values; the others send one.
fn first_json<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    serde_json::Deserializer::from_slice(bytes)
        .into_iter::<T>()
        .next()
        .and_then(Result::ok)
}

fn snippet(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}
