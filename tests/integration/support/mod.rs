//! Support for the integration tests: the shared test kit
//! (`leaseagent-testkit`: fake authority, proxy, `/proc` checks), the path of
//! the binary under test, and one module per area.

pub mod authority;
pub mod etcd;
pub mod fence;
pub mod netns;
pub mod sysns;
pub mod systemd;
pub mod tls;

use std::path::PathBuf;
use std::process::{Command, Stdio};

pub use leaseagent_testkit::*;

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_leaseagent"))
}

pub fn helper(name: &str) -> String {
    format!("{}/tests/helpers/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A `leaseagent` command against `authority` with test-friendly defaults.
pub fn agent(authority: &str, task: &str) -> Command {
    let mut c = Command::new(bin());
    c.arg("--authority").arg(authority).arg("--task").arg(task);
    c.env("RUST_LOG", "leaseagent=debug");
    c.stdin(Stdio::null());
    c
}
