//! Lease protocol v1 over HTTP(S), on ureq 3 with rustls.
//!
//! Every request carries its own timeout (the caller's, which the heartbeat
//! thread keeps below the time the lease has left) and every response body is
//! read with a 64 KiB cap: a slow or hostile authority can delay a renewal
//! only until the timeout, and can never make the agent buffer without bound.
//!
//! Answers are classified exactly as the protocol's "How the agent reads
//! answers" says. Only a `200` whose body is a JSON object of the expected
//! shape is a success; only a `409`/`404` whose body names one of the refusal
//! codes is a refusal; everything else (refused or reset connections,
//! timeouts, 5xx, 408, 429, bodies that are text, the wrong shape or too
//! large, any other status) is transient.
//!
//! Trust (`trust.md`): the bearer token from `--auth-token-file` goes with
//! every call. At acquire, 401, 403 and TLS failures are
//! [`AcquireError::Trust`] (exit 125 naming `unauthenticated`, `forbidden`
//! or `certificate`); during renewal and release they are transient like any
//! other failure, but logged at error level since they rarely heal alone.

use std::time::Duration;

use std::sync::Arc;

use super::transport::Failure;
use super::trust::ClientTrust;
use super::*;
use crate::protocol::v1::{
    AcquireBody, ErrorBody, ErrorCode, GrantBody, LeaseRefBody, ReleaseBody, RenewBody,
};

pub use super::transport::BODY_LIMIT;

/// A lease protocol v1 client.
pub struct HttpAuthority {
    base: String,
    agent: ureq::Agent,
    trust: Arc<ClientTrust>,
}

/// A response: status and (capped) body, or a transport failure.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl HttpAuthority {
    pub fn with_trust(base: &str, trust: Arc<ClientTrust>) -> Self {
        HttpAuthority {
            base: base.trim_end_matches('/').to_string(),
            agent: super::transport::agent(&trust),
            trust,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn call(
        &self,
        path: &str,
        body: impl serde::Serialize,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let bytes = serde_json::to_vec(&body).map_err(|e| Failure {
            kind: super::transport::FailureKind::Encode,
            trust: None,
            message: e.to_string(),
        })?;
        let url = self.url(path);
        let auth = self.trust.bearer_header();
        let (status, body) = super::transport::call(
            &self.agent,
            &url,
            Some(&bytes),
            auth.as_deref(),
            timeout,
            BODY_LIMIT,
        )?;
        Ok(Answer { status, body })
    }
}

/// The trust cause of a 401/403 answer.
fn denied(status: u16) -> Option<&'static str> {
    ErrorCode::from_status(status).map(ErrorCode::as_str)
}

/// A call failure at acquire: trust problems are final, including those
/// only a probe can name (`transport::trust_failure`).
fn acquire_failure(base: &str, f: Failure, timeout: Duration) -> AcquireError {
    match super::transport::trust_failure(base, &f, timeout) {
        Some(named) => AcquireError::Trust(named),
        None => AcquireError::Transient(f.message),
    }
}

/// A call failure during renewal or release: always transient, trust
/// problems logged at error level.
fn renew_failure(what: &str, f: Failure) -> RenewError {
    if let Some(cause) = f.trust {
        log::error!(
            "{what}: {cause}: {} (retried until the local deadline)",
            f.message
        );
    }
    RenewError::Transient(f.message)
}

/// A non-200 answer to renew or release that is not a refusal.
fn renew_status(what: &str, status: u16, body: &[u8]) -> RenewError {
    if let Some(r) = refusal(status, body) {
        return r;
    }
    let m = transient_status(status, body);
    if let Some(cause) = denied(status) {
        log::error!("{what}: {cause}: {m} (retried until the local deadline)");
    }
    RenewError::Transient(m)
}

/// A duration in whole milliseconds, as the protocol sends it.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if !v.is_object() {
        return None;
    }
    serde_json::from_value(v).ok()
}

fn transient_status(status: u16, body: &[u8]) -> String {
    let detail = parse::<ErrorBody>(body)
        .map(|e| format!(": {} {}", e.error, e.message.unwrap_or_default()))
        .unwrap_or_default();
    format!("authority answered HTTP {status}{detail}")
}

/// A refusal, if the answer is one: 409/404 with a refusal code.
fn refusal(status: u16, body: &[u8]) -> Option<RenewError> {
    if status != 409 && status != 404 {
        return None;
    }
    let e: ErrorBody = parse(body)?;
    let ErrorCode::Refused(reason) = e.code()? else {
        return None;
    };
    Some(RenewError::Refused {
        reason,
        message: e.message.unwrap_or_default(),
    })
}

impl Authority for HttpAuthority {
    fn url(&self) -> String {
        self.base.clone()
    }

    fn clone_box(&self) -> Box<dyn Authority> {
        Box::new(HttpAuthority::with_trust(&self.base, self.trust.clone()))
    }

    fn acquire(&mut self, req: &AcquireRequest, timeout: Duration) -> Result<Grant, AcquireError> {
        let body = AcquireBody {
            task: req.task.clone(),
            holder: req.holder.clone(),
            ttl_ms: millis(req.ttl),
            on_expiry: req.on_expiry.as_str().to_string(),
            grace_ms: (req.on_expiry == ExpiryPolicy::Grace).then(|| millis(req.grace)),
        };
        let a = self
            .call("/v1/acquire", body, timeout)
            .map_err(|f| acquire_failure(&self.base, f, timeout))?;
        match a.status {
            200 => {
                let bytes = a.body;
                let g: GrantBody = parse(&bytes).ok_or_else(|| {
                    AcquireError::Transient(
                        "authority answered 200 to acquire with a malformed body".into(),
                    )
                })?;
                if g.lease_id.is_empty() || g.ttl_ms == 0 {
                    return Err(AcquireError::Transient(
                        "authority granted a lease with an empty lease_id or a zero ttl".into(),
                    ));
                }
                if g.task.as_deref().is_some_and(|t| t != req.task) {
                    return Err(AcquireError::Transient(
                        "authority granted a lease for another task".into(),
                    ));
                }
                Ok(Grant {
                    lease_id: g.lease_id,
                    task: req.task.clone(),
                    token: g.token,
                    ttl: Duration::from_millis(g.ttl_ms),
                })
            }
            409 => {
                let e: Option<ErrorBody> = parse(&a.body);
                match e {
                    Some(e) if e.code() == Some(ErrorCode::Held) => Err(AcquireError::Held {
                        holder: e.holder.unwrap_or_else(|| "another holder".into()),
                        retry_after: e.retry_after_ms.map(Duration::from_millis),
                    }),
                    Some(e) if e.code() == Some(ErrorCode::HeldForOperator) => {
                        Err(AcquireError::HeldForOperator {
                            holder: e.holder.unwrap_or_default(),
                            lease_id: e.lease_id.unwrap_or_default(),
                        })
                    }
                    _ => Err(AcquireError::Transient(transient_status(409, &a.body))),
                }
            }
            400 => {
                let msg = parse::<ErrorBody>(&a.body)
                    .map(|e| e.message.unwrap_or(e.error))
                    .unwrap_or_else(|| "bad request".into());
                Err(AcquireError::Rejected(msg))
            }
            s if denied(s).is_some() => Err(AcquireError::Trust(format!(
                "{}: {} (see --auth-token-file, --client-cert)",
                denied(s).unwrap_or_default(),
                transient_status(s, &a.body)
            ))),
            s => Err(AcquireError::Transient(transient_status(s, &a.body))),
        }
    }

    fn renew(&mut self, lease: &LeaseRef, timeout: Duration) -> Result<Renewed, RenewError> {
        let body = LeaseRefBody {
            lease_id: lease.lease_id.clone(),
            token: lease.token,
        };
        let what = format!("renewal of task {}", lease.task);
        let a = self
            .call("/v1/renew", body, timeout)
            .map_err(|f| renew_failure(&what, f))?;
        if a.status == 200 {
            let bytes = a.body;
            return match parse::<RenewBody>(&bytes) {
                Some(r) if r.ttl_ms > 0 => Ok(Renewed {
                    ttl: Duration::from_millis(r.ttl_ms),
                }),
                _ => Err(RenewError::Transient(
                    "authority answered 200 to renew with a malformed body".into(),
                )),
            };
        }
        Err(renew_status(&what, a.status, &a.body))
    }

    fn release(
        &mut self,
        lease: &LeaseRef,
        outcome: Outcome,
        exit_code: Option<i32>,
        timeout: Duration,
    ) -> Result<(), RenewError> {
        let body = ReleaseBody {
            lease_id: lease.lease_id.clone(),
            token: lease.token,
            outcome: outcome.as_str().to_string(),
            exit_code,
        };
        let what = format!("release of task {}", lease.task);
        let a = self
            .call("/v1/release", body, timeout)
            .map_err(|f| renew_failure(&what, f))?;
        if a.status == 200 {
            return Ok(());
        }
        Err(renew_status(&what, a.status, &a.body))
    }

    fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError> {
        super::http_operator::leases(&self.base, &self.trust, timeout)
    }

    fn revoke(&mut self, task: &str, force: bool, timeout: Duration) -> Result<(), OperatorError> {
        super::http_operator::revoke(&self.base, &self.trust, task, force, timeout)
    }

    fn clear(&mut self, task: &str, timeout: Duration) -> Result<(), OperatorError> {
        super::http_operator::clear(&self.base, &self.trust, task, timeout)
    }

    fn history(
        &mut self,
        task: Option<&str>,
        since_ms: u64,
        timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError> {
        super::http_operator::history(&self.base, &self.trust, task, since_ms, timeout)
    }
}
