//! `leaseagent publish [--token N] SRC DEST` (issue #4).

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct PublishArgs {
    /// Fencing token of this attempt [default: $LEASE_TOKEN]
    #[arg(long, value_name = "N")]
    pub token: Option<u64>,
    /// The file or directory to publish
    #[arg(value_name = "SRC")]
    pub src: PathBuf,
    /// Where it becomes visible
    #[arg(value_name = "DEST")]
    pub dest: PathBuf,
}

pub fn main(_a: PublishArgs) -> ExitCode {
    eprintln!("leaseagent publish: not built yet");
    ExitCode::from(crate::exit::AGENT_FAILED)
}
