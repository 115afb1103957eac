#![deny(unsafe_code)]
//! leaseagent: run a command under a lease.
//!
//! The one public API is [`fence`], for jobs that write through a fenced
//! store. Everything else is the `leaseagent` program, private to the crate;
//! see `docs/design.md` for the lifecycle, the timing diagram, the races each
//! module guards against, and the map of these folders.

mod agent;
mod authority;
mod cmd;
mod engine;
mod escape;
mod exit;
pub mod fence;
mod keeper;
mod lease;
mod protocol;
mod serve;
mod sys;
mod time;

use std::ffi::OsString;
use std::process::ExitCode;

/// The `leaseagent` program: argv to the chosen part (`src/main.rs` calls
/// this; not an API). `serve` is checked here and then runs as the server
/// binary (`cmd::server`), so the agent's binary carries no server code.
#[doc(hidden)]
pub fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    match cmd::parse(argv.clone()) {
        cmd::Command::Run(cfg) => agent::main(cfg),
        cmd::Command::Serve(_) => cmd::server::exec(argv.get(2..).unwrap_or_default()),
        cmd::Command::Publish(a) => cmd::publish::main(a),
        cmd::Command::Check(a) => cmd::check::main(a),
        cmd::Command::Leases(a) => cmd::operator::leases(a),
        cmd::Command::Revoke(a) => cmd::operator::revoke(a),
        cmd::Command::Clear(a) => cmd::operator::clear(a),
        cmd::Command::History(a) => cmd::operator::history(a),
        cmd::Command::TokenNew => serve::auth::token_new(),
        cmd::Command::Keeper(args) => keeper::main(args),
        cmd::Command::Exit(code) => ExitCode::from(code),
    }
}

/// The `leaseagent-serve` program (`src/bin/leaseagent-serve.rs` calls
/// this; not an API): `leaseagent-serve ARGS` is `leaseagent serve ARGS`,
/// parsed by the same table, so help and errors read the same.
#[doc(hidden)]
pub fn serve_main() -> ExitCode {
    let mut argv: Vec<OsString> = vec!["leaseagent".into(), "serve".into()];
    argv.extend(std::env::args_os().skip(1));
    match cmd::parse(argv) {
        cmd::Command::Serve(a) => serve::main(a),
        cmd::Command::Exit(code) => ExitCode::from(code),
        // `parse` reads "serve" first and so builds nothing else.
        _ => ExitCode::from(exit::AGENT_FAILED),
    }
}

/// What the integration tests drive below the command line: the authority
/// clients through their trait, and the agent's state file. Not an API.
#[doc(hidden)]
pub mod testing {
    pub use crate::agent::state_file::{LeaseStateFile, LeaseView, StateWriter};
    pub use crate::authority::embedded::EmbeddedAuthority;
    pub use crate::authority::etcd::EtcdAuthority;
    pub use crate::authority::trust::{ClientTrust, TrustFiles};
    pub use crate::authority::{
        AcquireError, AcquireRequest, ExpiryPolicy, Grant, LeaseClient, LeaseInfo, LeaseRef,
        LeaseState, Operator, OperatorError, Outcome, RefusalReason, RenewError, Renewed, Waiter,
    };
    pub use crate::time::clock::{BootInstant, boot_id};
}
