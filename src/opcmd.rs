//! Operator subcommands against any authority: `leases`, `revoke`, `clear` (issue #3).
//!
//! HTTP authorities are called through `authority::http_operator` directly;
//! every other kind through its [`Authority`] operator methods (the embedded
//! default implements them; etcd says it cannot). Exit status: 0 done, 1
//! nothing to act on (no such lease, not held for an operator), 125 the
//! authority could not be reached or failed.

use std::process::ExitCode;
use std::time::Duration;

use crate::authority::{Authority, AuthoritySpec, LeaseInfo, OperatorError, http_operator};

use crate::cli::AuthorityArg;

#[derive(clap::Args, Debug, Clone)]
pub struct LeasesArgs {
    #[command(flatten)]
    pub authority: AuthorityArg,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct RevokeArgs {
    #[command(flatten)]
    pub authority: AuthorityArg,
    /// The task whose current lease is revoked
    #[arg(value_name = "TASK")]
    pub task: String,
    /// Free the task at once instead of after the lease's current expiry
    #[arg(long)]
    pub force: bool,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ClearArgs {
    #[command(flatten)]
    pub authority: AuthorityArg,
    /// The task held for an operator
    #[arg(value_name = "TASK")]
    pub task: String,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

/// How long an operator call may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Exit status when there is nothing to act on (no such lease, not held).
pub const NOTHING_TO_DO: u8 = 1;

/// The operator calls, whatever the authority.
enum Target {
    Http(String),
    Other(Box<dyn Authority>),
}

impl Target {
    fn open(a: &crate::cli::AuthorityArg) -> Result<Self, String> {
        match a.spec()? {
            AuthoritySpec::Http(base) => Ok(Target::Http(base)),
            spec => crate::authority::open(&spec).map(Target::Other),
        }
    }

    fn leases(&mut self) -> Result<Vec<LeaseInfo>, OperatorError> {
        match self {
            Target::Http(b) => http_operator::leases(b, TIMEOUT),
            Target::Other(a) => a.leases(TIMEOUT),
        }
    }

    fn revoke(&mut self, task: &str, force: bool) -> Result<(), OperatorError> {
        match self {
            Target::Http(b) => http_operator::revoke(b, task, force, TIMEOUT),
            Target::Other(a) => a.revoke(task, force, TIMEOUT),
        }
    }

    fn clear(&mut self, task: &str) -> Result<(), OperatorError> {
        match self {
            Target::Http(b) => http_operator::clear(b, task, TIMEOUT),
            Target::Other(a) => a.clear(task, TIMEOUT),
        }
    }
}

fn failed(cmd: &str, e: &OperatorError) -> ExitCode {
    eprintln!("leaseagent {cmd}: {e}");
    match e {
        OperatorError::NotFound(_) => ExitCode::from(NOTHING_TO_DO),
        _ => ExitCode::from(crate::exit::AGENT_FAILED),
    }
}

fn open_or_exit(cmd: &str, a: &crate::cli::AuthorityArg) -> Result<Target, ExitCode> {
    Target::open(a).map_err(|e| {
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
                l.state.clone(),
                l.token.to_string(),
                l.holder.clone(),
                l.expires_in_ms
                    .map(|ms| crate::duration::format(Duration::from_millis(ms)))
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
    match t.leases() {
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
    match t.revoke(&a.task, a.force) {
        Ok(()) => {
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"task": a.task, "revoked": true, "force": a.force})
                );
            } else if a.force {
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
    match t.clear(&a.task) {
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
