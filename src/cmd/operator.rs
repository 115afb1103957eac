//! Operator subcommands against any authority: `leases`, `revoke`, `clear`.
//!
//! Every kind of authority is called through its [`Authority`] operator
//! methods (HTTP and the embedded default implement them; etcd says it
//! cannot). Exit status: 0 done, 1
//! nothing to act on (no such lease, not held for an operator), 125 the
//! authority could not be reached or failed.

use std::process::ExitCode;
use std::time::Duration;

use crate::authority::{Authority, AuthoritySpec, LeaseInfo, OperatorError};

/// The authority flags every operator command shares (flag table:
/// `cmd::defs`, `AUTHORITY`).
#[derive(Debug, Clone, Default)]
pub struct AuthorityArg {
    /// `--authority`, or `LEASEAGENT_AUTHORITY`; `None`: the embedded default.
    pub authority: Option<String>,
    /// The trust flags (TLS roots, client certificate, credentials).
    pub trust: crate::authority::trust::TrustFiles,
}

/// `leaseagent leases` (flags: `cmd::defs::LEASES`).
#[derive(Debug, Clone)]
pub struct LeasesArgs {
    pub authority: AuthorityArg,
    pub json: bool,
}

/// `leaseagent revoke` (flags: `cmd::defs::REVOKE`).
#[derive(Debug, Clone)]
pub struct RevokeArgs {
    pub authority: AuthorityArg,
    pub task: String,
    pub force: bool,
    pub json: bool,
}

/// `leaseagent clear` (flags: `cmd::defs::CLEAR`).
#[derive(Debug, Clone)]
pub struct ClearArgs {
    pub authority: AuthorityArg,
    pub task: String,
    pub json: bool,
}

/// How long an operator call may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Exit status when there is nothing to act on (no such lease, not held).
pub const NOTHING_TO_DO: u8 = 1;

/// Why an operator command has no authority to talk to.
#[derive(Debug, thiserror::Error)]
enum TargetError {
    #[error(transparent)]
    Flag(#[from] crate::authority::AuthorityFlagError),
    #[error(transparent)]
    Open(#[from] crate::authority::OpenError),
}

/// The authority an operator command talks to (any kind: each implements
/// the operator methods of [`Authority`] or says it cannot).
fn open_target(a: &AuthorityArg) -> Result<Box<dyn Authority>, TargetError> {
    let spec = AuthoritySpec::from_flag(a.authority.as_deref())?;
    Ok(crate::authority::open(&spec, &a.trust)?)
}

fn failed(cmd: &str, e: &OperatorError) -> ExitCode {
    eprintln!("leaseagent {cmd}: {e}");
    match e {
        OperatorError::NotFound(_) => ExitCode::from(NOTHING_TO_DO),
        _ => ExitCode::from(crate::exit::AGENT_FAILED),
    }
}

fn open_or_exit(cmd: &str, a: &AuthorityArg) -> Result<Box<dyn Authority>, ExitCode> {
    open_target(a).map_err(|e| {
        eprintln!("leaseagent {cmd}: {e}");
        ExitCode::from(crate::exit::AGENT_FAILED)
    })
}

/// The human table of `leaseagent leases`.
pub fn table(leases: &[LeaseInfo]) -> String {
    let rows: Vec<[String; 6]> = leases
        .iter()
        .map(|l| {
            [
                l.task.clone(),
                l.state.to_string(),
                l.token.to_string(),
                l.holder.clone(),
                l.expires_in_ms
                    .map(|ms| crate::time::duration::format(Duration::from_millis(ms)))
                    .unwrap_or_else(|| "-".into()),
                l.lease_id.clone(),
            ]
        })
        .collect();
    let header = ["TASK", "STATE", "TOKEN", "HOLDER", "EXPIRES IN", "LEASE ID"];
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(&width).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}  "));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header);
    for r in &rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
}

pub fn leases(a: LeasesArgs) -> ExitCode {
    let mut t = match open_or_exit("leases", &a.authority) {
        Ok(t) => t,
        Err(c) => return c,
    };
    match t.leases(TIMEOUT) {
        Ok(list) => {
            if a.json {
                println!("{}", serde_json::json!({ "leases": list }));
            } else if list.is_empty() {
                println!("no leases");
            } else {
                print!("{}", table(&list));
            }
            ExitCode::SUCCESS
        }
        Err(e) => failed("leases", &e),
    }
}

pub fn revoke(a: RevokeArgs) -> ExitCode {
    let mut t = match open_or_exit("revoke", &a.authority) {
        Ok(t) => t,
        Err(c) => return c,
    };
    match t.revoke(&a.task, a.force, TIMEOUT) {
        Ok(()) => {
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"task": a.task, "revoked": true, "force": a.force})
                );
            } else if a.force || t.url().starts_with("etcd") {
                println!(
                    "revoked the lease on {}: the task is free now; its holder is refused at its next renewal",
                    a.task
                );
            } else {
                println!(
                    "revoked the lease on {}: its holder is refused at its next renewal; the task is free once the lease's current expiry has passed",
                    a.task
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => failed("revoke", &e),
    }
}

pub fn clear(a: ClearArgs) -> ExitCode {
    let mut t = match open_or_exit("clear", &a.authority) {
        Ok(t) => t,
        Err(c) => return c,
    };
    match t.clear(&a.task, TIMEOUT) {
        Ok(()) => {
            if a.json {
                println!("{}", serde_json::json!({"task": a.task, "cleared": true}));
            } else {
                println!("cleared {}: the task can be granted again", a.task);
            }
            ExitCode::SUCCESS
        }
        Err(e) => failed("clear", &e),
    }
}
