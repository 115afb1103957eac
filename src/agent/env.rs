//! The job's environment: what it gets on top of the agent's (the lease's
//! variables, the agent contract's `LEASE_*`), and what it goes without.
//!
//! Two moments, because the keeper starts before the grant: the variables
//! removed ([`keeper_env_remove`]) are taken out when the keeper is spawned,
//! so neither the keeper nor the job ever holds them; the variables added
//! ([`job_env`]) exist only once the grant is in hand, and go to the keeper
//! in its "go" frame, set over its environment for the job alone.
//!
//! Removed, and why:
//! - systemd's `NOTIFY_SOCKET`, every `WATCHDOG_*` and `LISTEN_*`: they
//!   describe the agent's own service, and a job acting on them would
//!   confuse systemd;
//! - an inherited `LEASEAGENT_STATE_FILE` (an outer agent's file; the
//!   variable is set again only when this agent made its own file);
//! - the trust flags' variables (CA file, client certificate and key, token
//!   file, etcd login): the job has no business with the agent's
//!   credentials.
//!
//! Credentials in `LEASEAGENT_AUTHORITY` (a `user:password@` in the URL)
//! never reach the job either: the variable is set again, redacted.

use crate::agent::config::RunAs;
use crate::agent::state_file::{ENV_STATE_FILE, StateSink};
use crate::authority::{self, Grant};

/// The variables the job gets on top of the agent's environment (and,
/// with `--user`, `HOME`, `USER`, `LOGNAME` as `runuser` sets them).
pub fn job_env(
    grant: &Grant,
    authority_url: &str,
    state: Option<&dyn StateSink>,
    user: Option<&RunAs>,
) -> Vec<(String, String)> {
    let mut env = vec![
        (
            crate::lease::env::TOKEN.to_string(),
            grant.token.to_string(),
        ),
        (crate::lease::env::ID.to_string(), grant.lease_id.clone()),
        (crate::lease::env::TASK.to_string(), grant.task.clone()),
        (
            crate::lease::env::AUTHORITY.to_string(),
            authority_url.to_string(),
        ),
        (
            crate::lease::env::TTL_MS.to_string(),
            grant.ttl.as_millis().to_string(),
        ),
    ];
    if let Some(s) = state {
        env.push((ENV_STATE_FILE.to_string(), s.path().display().to_string()));
    }
    if let Some(u) = user {
        env.extend(u.env.iter().cloned());
    }
    // Credentials in a URL never reach the job (the trust flags' own
    // variables are removed where the keeper is started).
    if let Some(url) = std::env::var("LEASEAGENT_AUTHORITY")
        .ok()
        .filter(|u| authority::trust::has_userinfo(u))
    {
        env.push((
            "LEASEAGENT_AUTHORITY".to_string(),
            authority::trust::redact_url(&url),
        ));
    }
    env
}

/// What the keeper's (and so the job's) environment goes without: the
/// agent's own service variables and the trust flags' variables.
pub fn keeper_env_remove() -> Vec<String> {
    let mut env_remove = job_env_remove();
    env_remove.extend(
        authority::trust::JOB_ENV_REMOVE
            .iter()
            .map(|v| v.to_string()),
    );
    env_remove
}

/// The agent's service variables (systemd's, every `WATCHDOG_*` and
/// `LISTEN_*`) and an inherited `LEASEAGENT_STATE_FILE`.
fn job_env_remove() -> Vec<String> {
    let mut out: Vec<String> = crate::sys::notify::JOB_ENV_REMOVE
        .iter()
        .map(|s| s.to_string())
        .collect();
    out.push(ENV_STATE_FILE.to_string());
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if k.starts_with("WATCHDOG_") || k.starts_with("LISTEN_") {
                out.push(k.to_string());
            }
        }
    }
    out
}
