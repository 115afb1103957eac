//! `leaseagent check [--min-remaining DUR]` (issue #4).

use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// Succeed only if the lease is valid for at least this much longer
    #[arg(long = "min-remaining", value_name = "DUR", default_value = "0s", value_parser = crate::duration::parse)]
    pub min_remaining: Duration,
}

pub fn main(_a: CheckArgs) -> ExitCode {
    eprintln!("leaseagent check: not built yet");
    ExitCode::from(1)
}
