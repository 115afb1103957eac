//! Operator subcommands against any authority: `leases`, `revoke`, `clear` (issue #3).

use std::process::ExitCode;

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

pub fn leases(_a: LeasesArgs) -> ExitCode {
    eprintln!("leaseagent leases: not built yet");
    ExitCode::from(crate::exit::AGENT_FAILED)
}

pub fn revoke(_a: RevokeArgs) -> ExitCode {
    eprintln!("leaseagent revoke: not built yet");
    ExitCode::from(crate::exit::AGENT_FAILED)
}

pub fn clear(_a: ClearArgs) -> ExitCode {
    eprintln!("leaseagent clear: not built yet");
    ExitCode::from(crate::exit::AGENT_FAILED)
}
