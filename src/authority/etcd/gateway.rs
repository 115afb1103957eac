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

use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::wire::GatewayError;

// Answers larger than the protocol's limit are not answers we asked for.
use crate::authority::transport::BODY_LIMIT;

/// Why a gateway call gave no answer of the expected shape.
#[derive(Debug, Clone)]
pub enum CallError {
    /// Unreachable, timed out, 5xx, or unreadable: the state is unknown.
    Transient(String),
    /// etcd answered with a gRPC status (HTTP 4xx): a definite answer.
    Status { http: u16, status: GatewayError },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transient(m) => f.write_str(m),
            CallError::Status { http, status } => write!(
                f,
                "etcd answered {http}: {} (grpc code {})",
                status.message, status.code
            ),
        }
    }
}

/// A client for one etcd cluster, owned by one thread.
pub struct Gateway {
    endpoints: Vec<String>,
    /// The endpoint the next call starts with.
    cursor: usize,
    agent: ureq::Agent,
}

impl Gateway {
    pub fn new(endpoints: Vec<String>) -> Self {
        Gateway {
            endpoints,
            cursor: 0,
            agent: crate::authority::transport::agent(),
        }
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// POSTs `body` to `path` (e.g. `/v3/kv/range`) and reads the first JSON
    /// value of the answer as `R`, finishing by `deadline`.
    pub fn call<B: Serialize, R: DeserializeOwned>(
        &mut self,
        path: &str,
        body: &B,
        deadline: Instant,
    ) -> Result<R, CallError> {
        let n = self.endpoints.len().max(1);
        let mut last = CallError::Transient("etcd: no endpoint configured".into());
        for tried in 0..n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left < Duration::from_millis(1) {
                if tried == 0 {
                    last = CallError::Transient(format!("etcd {path}: no time left for the call"));
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
            match self.attempt(&endpoint, path, body, budget) {
                Ok(r) => return Ok(r),
                Err(e @ CallError::Status { .. }) => return Err(e),
                Err(CallError::Transient(m)) => {
                    log::debug!("etcd {endpoint}{path}: {m}; next call goes to the next endpoint");
                    self.cursor = (self.cursor + 1) % n;
                    last = CallError::Transient(format!("etcd {endpoint}{path}: {m}"));
                }
            }
        }
        Err(last)
    }

    fn attempt<B: Serialize, R: DeserializeOwned>(
        &self,
        endpoint: &str,
        path: &str,
        body: &B,
        budget: Duration,
    ) -> Result<R, CallError> {
        let url = format!("http://{endpoint}{path}");
        let body = serde_json::to_vec(body).map_err(|e| CallError::Transient(e.to_string()))?;
        let (status, bytes) =
            crate::authority::transport::call(&self.agent, &url, Some(&body), budget, BODY_LIMIT)
                .map_err(CallError::Transient)?;
        if !(200..300).contains(&status) && !(400..500).contains(&status) {
            return Err(CallError::Transient(format!(
                "HTTP {status}: {}",
                snippet(&bytes)
            )));
        }
        if status >= 400 {
            return match first_json::<GatewayError>(&bytes) {
                Some(g) if g.code != 0 => Err(CallError::Status {
                    http: status,
                    status: g,
                }),
                // A 4xx without a gRPC status is not etcd's gateway talking.
                _ => Err(CallError::Transient(format!(
                    "HTTP {status}: {}",
                    snippet(&bytes)
                ))),
            };
        }
        first_json::<R>(&bytes)
            .ok_or_else(|| CallError::Transient(format!("malformed answer: {}", snippet(&bytes))))
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
