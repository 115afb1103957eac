//! The operator calls of lease protocol v1 (`GET /v1/leases`,
//! `POST /v1/revoke`, `POST /v1/clear`) for HTTP authorities, as free
//! functions so the HTTP authority and `leaseagent leases|revoke|clear` share
//! them. Every call is bounded by its timeout (ureq's global timeout); an
//! answer is read up to 64 KiB (the listing, which may be long, up to 64 MiB).

use std::time::Duration;

use super::transport::BODY_LIMIT;
use super::trust::ClientTrust;
use super::{LeaseInfo, OperatorError};
use crate::protocol::v1::{ClearBody, ErrorBody, ErrorCode, LeasesBody, RevokeBody};

/// (status, body) of one call.
fn call(
    base: &str,
    trust: &ClientTrust,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
    limit: u64,
) -> Result<(u16, String), OperatorError> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let auth = trust.bearer_header();
    let (status, body) = super::transport::call(
        &super::transport::agent(trust),
        &url,
        body.as_deref(),
        auth.as_deref(),
        timeout,
        limit,
    )
    .map_err(|f| match f.trust {
        Some(cause) => OperatorError::Failed(format!("{cause}: {}", f.message)),
        None => OperatorError::Failed(f.message),
    })?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn json(body: &impl serde::Serialize) -> Result<Vec<u8>, OperatorError> {
    serde_json::to_vec(body).map_err(|e| OperatorError::Failed(e.to_string()))
}

/// Turns a non-200 answer into an error carrying the authority's message.
fn failure(status: u16, text: &str) -> OperatorError {
    let body: Option<ErrorBody> = serde_json::from_str(text).ok();
    let code = body.as_ref().map(|b| b.error.as_str()).unwrap_or("");
    let msg = body
        .as_ref()
        .and_then(|b| b.message.clone())
        .unwrap_or_else(|| format!("HTTP {status}"));
    match (status, body.as_ref().and_then(ErrorBody::code)) {
        (404, Some(ErrorCode::NotFound)) => OperatorError::NotFound(msg),
        (404 | 405, _) => OperatorError::Unsupported(format!(
            "the authority does not support this operator call (HTTP {status})"
        )),
        (401, _) => OperatorError::Failed(format!(
            "unauthenticated: HTTP 401: {msg} (see --auth-token-file, --client-cert)"
        )),
        (403, _) => OperatorError::Failed(format!("forbidden: HTTP 403: {msg}")),
        _ => OperatorError::Failed(format!("HTTP {status} {code}: {msg}")),
    }
}

pub fn leases(
    base: &str,
    trust: &ClientTrust,
    timeout: Duration,
) -> Result<Vec<LeaseInfo>, OperatorError> {
    let (status, text) = call(base, trust, "/v1/leases", None, timeout, 64 << 20)?;
    if status != 200 {
        return Err(failure(status, &text));
    }
    serde_json::from_str::<LeasesBody>(&text)
        .map(|l| l.leases)
        .map_err(|e| OperatorError::Failed(format!("malformed lease listing: {e}")))
}

pub fn revoke(
    base: &str,
    trust: &ClientTrust,
    task: &str,
    force: bool,
    timeout: Duration,
) -> Result<(), OperatorError> {
    let body = RevokeBody {
        task: task.to_string(),
        force,
    };
    let (status, text) = call(
        base,
        trust,
        "/v1/revoke",
        Some(json(&body)?),
        timeout,
        BODY_LIMIT,
    )?;
    if status != 200 {
        return Err(failure(status, &text));
    }
    Ok(())
}

pub fn clear(
    base: &str,
    trust: &ClientTrust,
    task: &str,
    timeout: Duration,
) -> Result<(), OperatorError> {
    let body = ClearBody {
        task: task.to_string(),
    };
    let (status, text) = call(
        base,
        trust,
        "/v1/clear",
        Some(json(&body)?),
        timeout,
        BODY_LIMIT,
    )?;
    if status != 200 {
        return Err(failure(status, &text));
    }
    Ok(())
}
