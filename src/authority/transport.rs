//! The one HTTP transport of every lease client (protocol v1, its operator
//! calls, and etcd's JSON gateway).
//!
//! What it guarantees, once for all of them:
//! - every request is bounded by the timeout it is given (ureq's global
//!   timeout: connect, send, and reading the whole answer);
//! - an answer body is read up to a cap and never further, so a hostile or
//!   broken server cannot make the agent buffer without bound;
//! - HTTP statuses are returned, not turned into errors: each client
//!   classifies them by its own protocol's rules;
//! - no proxy from the environment stands between an agent and its lease
//!   authority (a proxy's own timeouts and buffering would void the first
//!   two points);
//! - no redirect is ever followed: a 3xx is returned as the answer (and is
//!   no grant), so an authority cannot send the agent to another host.

use std::time::Duration;

/// The protocol's body size limit.
pub const BODY_LIMIT: u64 = 64 * 1024;

/// A connection-pooling client configured as above.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        // Never follow a redirect: an authority's 3xx is its answer.
        .max_redirects(0)
        .max_redirects_will_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .max_idle_connections_per_host(2)
        .user_agent(concat!("leaseagent/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// One request: `GET` when `json_body` is `None`, else `POST` of that JSON.
/// Returns the status and the body (read up to `limit`), or a description
/// of what failed that names the URL.
pub fn call(
    agent: &ureq::Agent,
    url: &str,
    json_body: Option<&[u8]>,
    timeout: Duration,
    limit: u64,
) -> Result<(u16, Vec<u8>), String> {
    let timeout = Some(timeout.max(Duration::from_millis(1)));
    let sent = match json_body {
        None => agent
            .get(url)
            .config()
            .timeout_global(timeout)
            .build()
            .call(),
        Some(body) => agent
            .post(url)
            .config()
            .timeout_global(timeout)
            .build()
            .header("content-type", "application/json")
            .send(body),
    };
    let mut resp = sent.map_err(|e| describe(url, e))?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(limit)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => format!("{url}: answer body over {limit} bytes"),
            e => describe(url, e),
        })?;
    Ok((status, body))
}

fn describe(url: &str, e: ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => format!("{url}: timed out"),
        ureq::Error::Io(io) => format!("{url}: {io}"),
        e => format!("{url}: {e}"),
    }
}
