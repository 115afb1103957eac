//! Where per-host state lives: the embedded authority's database and the
//! lease state files that `leaseagent check` reads.
//!
//! Order, as the contract fixes it: `LEASEAGENT_STATE_DIR`, else
//! `$XDG_STATE_HOME/leaseagent`, else `~/.local/state/leaseagent`;
//! `/var/lib/leaseagent` for root. Every agent on the host computes the same
//! directory for the same user, which is what makes the embedded default a
//! shared authority.

use std::path::PathBuf;

/// The state directory (not created).
pub fn state_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("LEASEAGENT_STATE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/leaseagent"));
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("leaseagent"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(h).join(".local/state/leaseagent"));
    }
    Err("no state directory: set LEASEAGENT_STATE_DIR (or HOME)".into())
}
