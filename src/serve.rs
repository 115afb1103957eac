//! `leaseagent serve`: the reference lease authority over HTTP (issue #3).

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `leaseagent serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on, e.g. 127.0.0.1:7878 or [::]:7878
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// SQLite database file holding tokens and leases (created if missing)
    #[arg(long, value_name = "PATH")]
    pub db: PathBuf,
}

pub fn main(_args: ServeArgs) -> ExitCode {
    eprintln!("leaseagent serve: not built yet");
    ExitCode::from(crate::exit::AGENT_FAILED)
}
