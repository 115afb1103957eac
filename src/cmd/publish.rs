//! `leaseagent publish [--token N] SRC DEST`: the job's fenced commit.
//!
//! Moves the file or directory SRC to DEST atomically, only if the token is
//! at least the highest token ever published to DEST, recording the token
//! durably before the move. The mechanics (record file next to DEST, flock,
//! fsync order, `RENAME_EXCHANGE` for directories) are in
//! [`crate::fence::dir`]; this module is the command line around it.
//!
//! Exit status:
//!
//! | status | meaning |
//! |---|---|
//! | 0 | published |
//! | 1 | refused: `token N superseded by M`; DEST and the record untouched, SRC left in place |
//! | 2 | could not publish: no token, bad `LEASE_TOKEN`, missing SRC, SRC on another filesystem, lock timeout, I/O error |
//! | 125 | malformed command line (as for every subcommand) |
//!
//! With status 2 DEST is untouched, except for a failed `fsync` after the
//! move (the message says so).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::fence::FenceError;
use crate::fence::dir::{self, DirStore};

/// Refused by the fence.
pub const EXIT_SUPERSEDED: u8 = 1;
/// Could not publish for another reason.
pub const EXIT_FAILED: u8 = 2;

/// Test-only fault injection: with this variable set to `after-record`,
/// publish aborts right after the record is durable, before the move.
#[doc(hidden)]
pub const FAULT_ENV: &str = "LEASEAGENT_TEST_FAULT";

/// `leaseagent publish` (flags and help: `cmd::defs::PUBLISH`).
#[derive(Debug, Clone, Default)]
pub struct PublishArgs {
    /// `--token`; `None`: `$LEASE_TOKEN`.
    pub token: Option<u64>,
    /// `--lock-timeout`: longest wait for another publisher of DEST.
    pub lock_timeout: Duration,
    /// The file or directory to publish.
    pub src: PathBuf,
    /// Where it becomes visible.
    pub dest: PathBuf,
}

pub fn main(a: PublishArgs) -> ExitCode {
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("leaseagent publish: {msg}");
            ExitCode::from(code)
        }
    }
}

fn run(a: &PublishArgs) -> Result<(), (u8, String)> {
    let token = match a.token {
        Some(t) => t,
        None => crate::fence::token_from_env().map_err(|e| {
            (
                EXIT_FAILED,
                format!("no token: pass --token N or run under leaseagent ({e})"),
            )
        })?,
    };
    let (root, name) = dir::split_dest(&a.dest).map_err(|e| (EXIT_FAILED, e.to_string()))?;
    let crash = std::env::var(FAULT_ENV).is_ok_and(|v| v == "after-record");
    let store = DirStore::new(root)
        .lock_timeout(a.lock_timeout)
        .crash_after_record(crash);
    match store.publish(&a.src, &name, token) {
        Ok(p) => {
            if let Some((path, e)) = p.leftover {
                eprintln!(
                    "leaseagent publish: published; the previous content is left at {}: {e}",
                    path.display()
                );
            }
            Ok(())
        }
        Err(e) => {
            let code = if e.superseded().is_some() {
                EXIT_SUPERSEDED
            } else {
                EXIT_FAILED
            };
            let msg = match &e {
                dir::Error::Superseded(_) => format!(
                    "refused: {e}; {} left unchanged (a later attempt has published)",
                    a.dest.display()
                ),
                _ => e.to_string(),
            };
            Err((code, msg))
        }
    }
}
