//! The operator calls of lease protocol v1 (`GET /v1/leases`,
//! `POST /v1/revoke`, `POST /v1/clear`) for HTTP authorities, as free
//! functions so the HTTP authority and `leaseagent leases|revoke|clear` share
//! them. Every call is bounded by its timeout (ureq's global timeout); an
//! answer is read up to 64 KiB (the listing, which may be long, up to 64 MiB).

use std::time::Duration;

use super::transport::BODY_LIMIT;
use super::trust::ClientTrust;
use super::{Attempt, LeaseInfo, OperatorError};
use crate::protocol::v1::{ClearBody, ErrorBody, ErrorCode, HistoryBody, LeasesBody, RevokeBody};

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
    .map_err(|f| {
        OperatorError::Failed(
            super::transport::trust_failure(base, &f, timeout).unwrap_or(f.message),
        )
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
        _ if ErrorCode::from_status(status) == Some(ErrorCode::Unauthenticated) => {
            OperatorError::Failed(format!(
                "{}: HTTP {status}: {msg} (see --auth-token-file, --client-cert)",
                ErrorCode::Unauthenticated.as_str()
            ))
        }
        _ if ErrorCode::from_status(status) == Some(ErrorCode::Forbidden) => OperatorError::Failed(
            format!("{}: HTTP {status}: {msg}", ErrorCode::Forbidden.as_str()),
        ),
        _ => OperatorError::Failed(format!("HTTP {status} {code}: {msg}")),
    }
}

/// Most pages one listing follows (1,000 leases each on `serve`).
pub const MAX_PAGES: usize = 1000;

/// The whole listing: follows `next_after` page by page (each call within
/// `timeout`) until the authority gives none, at most [`MAX_PAGES`] pages.
/// A `next_after` that does not move forward is an error, not a loop.
pub fn leases(
    base: &str,
    trust: &ClientTrust,
    timeout: Duration,
) -> Result<Vec<LeaseInfo>, OperatorError> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let path = match &after {
            None => "/v1/leases".to_string(),
            Some(task) => format!("/v1/leases?after={}", percent_encode(task)),
        };
        let (status, text) = call(base, trust, &path, None, timeout, 64 << 20)?;
        if status != 200 {
            return Err(failure(status, &text));
        }
        let page = serde_json::from_str::<LeasesBody>(&text)
            .map_err(|e| OperatorError::Failed(format!("malformed lease listing: {e}")))?;
        all.extend(page.leases);
        match page.next_after {
            None => return Ok(all),
            Some(next) if after.as_ref().is_some_and(|a| next.as_str() <= a.as_str()) => {
                return Err(OperatorError::Failed(format!(
                    "malformed lease listing: next_after {next:?} does not move past {:?}",
                    after.unwrap_or_default()
                )));
            }
            Some(next) => after = Some(next),
        }
    }
    Err(OperatorError::Failed(format!(
        "the lease listing has more than {MAX_PAGES} pages; stopped"
    )))
}

/// `GET /v1/history`, page by page (each call within `timeout`), until
/// an attempt acquired before `since_ms`, the last page, or
/// [`super::MAX_HISTORY`] attempts. A cursor that does not move back is an
/// error, not a loop.
pub fn history(
    base: &str,
    trust: &ClientTrust,
    task: Option<&str>,
    since_ms: u64,
    timeout: Duration,
) -> Result<Vec<Attempt>, OperatorError> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    let task_q = task
        .map(|t| format!("task={}&", percent_encode(t)))
        .unwrap_or_default();
    for _ in 0..MAX_PAGES {
        let path = match &after {
            None => format!("/v1/history?{task_q}limit=1000"),
            Some(c) => format!("/v1/history?{task_q}limit=1000&after={}", percent_encode(c)),
        };
        let (status, text) = call(base, trust, &path, None, timeout, 64 << 20)?;
        if status != 200 {
            return Err(failure(status, &text));
        }
        let page = serde_json::from_str::<HistoryBody>(&text)
            .map_err(|e| OperatorError::Failed(format!("malformed history: {e}")))?;
        for a in page.attempts {
            if super::acquired_ms(&a) < since_ms || all.len() >= super::MAX_HISTORY {
                return Ok(all);
            }
            all.push(a);
        }
        match page.next_after {
            None => return Ok(all),
            Some(next) if after.as_ref() == Some(&next) => {
                return Err(OperatorError::Failed(format!(
                    "malformed history: next_after {next:?} repeats"
                )));
            }
            Some(next) => after = Some(next),
        }
    }
    Ok(all)
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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
    post_expecting_200(base, trust, "/v1/revoke", &body, timeout)
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
    post_expecting_200(base, trust, "/v1/clear", &body, timeout)
}

/// POSTs `body` to `path`: any answer but 200 is the authority's error.
fn post_expecting_200(
    base: &str,
    trust: &ClientTrust,
    path: &str,
    body: &impl serde::Serialize,
    timeout: Duration,
) -> Result<(), OperatorError> {
    let (status, text) = call(base, trust, path, Some(json(body)?), timeout, BODY_LIMIT)?;
    if status != 200 {
        return Err(failure(status, &text));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_encode_keeps_unreserved_only() {
        assert_eq!(
            super::percent_encode("etl/a b@c:1.x_y-z~"),
            "etl%2Fa%20b%40c%3A1.x_y-z~"
        );
    }
}
