//! Operator subcommands against any authority: `leases`, `revoke`, `clear`,
//! `history`.
//!
//! Every kind of authority is called through its [`Operator`] capability
//! (`LeaseClient::operator`: HTTP, the embedded default and etcd have one;
//! etcd answers `clear` and `history` with why it has nothing of the kind).
//! Exit status: 0 done, 1 nothing to act on (no such lease, not held for an
//! operator), 125 the authority could not be reached or failed, or has no
//! such call.

use std::process::ExitCode;
use std::time::Duration;

use crate::authority::{
    Attempt, AuthoritySpec, LeaseClient, LeaseInfo, Operator, OperatorError, Revoked,
};

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
#[derive(Debug, Clone, Default)]
pub struct LeasesArgs {
    pub authority: AuthorityArg,
    pub json: bool,
}

/// `leaseagent revoke` (flags: `cmd::defs::REVOKE`).
#[derive(Debug, Clone, Default)]
pub struct RevokeArgs {
    pub authority: AuthorityArg,
    pub task: String,
    pub force: bool,
    pub json: bool,
}

/// `leaseagent clear` (flags: `cmd::defs::CLEAR`).
#[derive(Debug, Clone, Default)]
pub struct ClearArgs {
    pub authority: AuthorityArg,
    pub task: String,
    pub json: bool,
}

/// `leaseagent history` (flags: `cmd::defs::HISTORY`).
#[derive(Debug, Clone, Default)]
pub struct HistoryArgs {
    pub authority: AuthorityArg,
    pub task: Option<String>,
    /// `--since`: only attempts acquired within this long ago.
    pub since: Option<Duration>,
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

/// The authority an operator command talks to (any kind).
fn open_target(a: &AuthorityArg) -> Result<Box<dyn LeaseClient>, TargetError> {
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

fn open_or_exit(cmd: &str, a: &AuthorityArg) -> Result<Box<dyn LeaseClient>, ExitCode> {
    open_target(a).map_err(|e| {
        eprintln!("leaseagent {cmd}: {e}");
        ExitCode::from(crate::exit::AGENT_FAILED)
    })
}

/// Runs `call` on the authority's operator; an authority without one
/// answers [`OperatorError::Unsupported`], worded by `missing` (given the
/// authority's URL).
fn with_operator<T>(
    t: &mut dyn LeaseClient,
    missing: impl FnOnce(&str) -> String,
    call: impl FnOnce(&mut dyn Operator) -> Result<T, OperatorError>,
) -> Result<T, OperatorError> {
    let url = t.url();
    match t.operator() {
        Some(mut op) => call(&mut *op),
        None => Err(OperatorError::Unsupported(missing(&url))),
    }
}

/// Lays out `rows` under `header`, columns padded to their widest cell.
fn columns<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
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
    for r in rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
}

/// The human table of `leaseagent history`, newest first: ages and
/// durations in human units, relative to `now_ms` (wall clock).
pub fn history_table(attempts: &[Attempt], now_ms: u64) -> String {
    let human = |ms: u64| crate::time::duration::format(Duration::from_millis(ms));
    let rows: Vec<[String; 8]> = attempts
        .iter()
        .map(|a| {
            let started = crate::authority::acquired_ms(a);
            [
                a.task.clone(),
                a.token.to_string(),
                a.holder.clone(),
                format!("{} ago", human(now_ms.saturating_sub(started))),
                a.held_ms.map_or_else(
                    || format!("{} so far", human(now_ms.saturating_sub(started))),
                    human,
                ),
                a.ended.map_or("running", |e| e.as_str()).to_string(),
                a.outcome.map_or("-", |o| o.as_str()).to_string(),
                a.exit_code.map_or_else(|| "-".into(), |c| c.to_string()),
            ]
        })
        .collect();
    columns(
        [
            "TASK", "TOKEN", "HOLDER", "STARTED", "HELD", "ENDED", "OUTCOME", "EXIT",
        ],
        &rows,
    )
}

pub fn history(a: HistoryArgs) -> ExitCode {
    let mut t = match open_or_exit("history", &a.authority) {
        Ok(t) => t,
        Err(c) => return c,
    };
    let now = crate::time::wall_ms();
    let since_ms = a.since.map_or(0, |d| {
        now.saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    });
    let answer = with_operator(
        &mut *t,
        |url| format!("{url} keeps no run history"),
        |op| op.history(a.task.as_deref(), since_ms, TIMEOUT),
    );
    match answer {
        Ok(list) => {
            if a.json {
                println!("{}", serde_json::json!({ "attempts": list }));
            } else if list.is_empty() {
                println!("no attempts");
            } else {
                print!("{}", history_table(&list, now));
            }
            ExitCode::SUCCESS
        }
        Err(e) => failed("history", &e),
    }
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
    columns(
        ["TASK", "STATE", "TOKEN", "HOLDER", "EXPIRES IN", "LEASE ID"],
        &rows,
    )
}

pub fn leases(a: LeasesArgs) -> ExitCode {
    let mut t = match open_or_exit("leases", &a.authority) {
        Ok(t) => t,
        Err(c) => return c,
    };
    let answer = with_operator(
        &mut *t,
        |url| format!("{url} has no lease listing"),
        |op| op.leases(TIMEOUT),
    );
    match answer {
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
    let answer = with_operator(
        &mut *t,
        |url| format!("{url} has no revoke"),
        |op| op.revoke(&a.task, a.force, TIMEOUT),
    );
    match answer {
        Ok(revoked) => {
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"task": a.task, "revoked": true, "force": a.force})
                );
            } else if revoked == Revoked::Now {
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
    let answer = with_operator(
        &mut *t,
        |url| format!("{url} has no clear"),
        |op| op.clear(&a.task, TIMEOUT),
    );
    match answer {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::scripted::Scripted;

    #[test]
    fn an_authority_without_operator_calls_says_so_by_name() {
        let mut t = Scripted::default();
        let e = with_operator(
            &mut t,
            |url| format!("{url} has no clear"),
            |op| op.clear("x", TIMEOUT),
        )
        .unwrap_err();
        assert_eq!(
            e,
            OperatorError::Unsupported("scripted: has no clear".into())
        );
        assert!(t.calls.is_empty());
        let mut t = Scripted {
            leases: Some(Vec::new()),
            ..Scripted::default()
        };
        let revoked = with_operator(
            &mut t,
            |_| unreachable!(),
            |op| op.revoke("x", true, TIMEOUT),
        );
        assert_eq!(revoked, Ok(Revoked::Now));
        assert_eq!(t.calls, ["revoke"]);
    }
}
