#![deny(unsafe_code)]
//! leaseagent: run a command under a lease.
//!
//! See `docs/design.md` for the lifecycle, the timing diagram and the races
//! each module guards against.

pub mod authority;
pub mod check;
pub mod child;
pub mod cli;
pub mod clock;
pub mod config;
pub mod duration;
pub mod engine;
pub mod exit;
pub mod fence;
pub mod heartbeat;
pub mod keeper;
pub mod lease_state;
pub mod logging;
pub mod machine;
pub mod notify;
pub mod opcmd;
pub mod publish;
pub mod report;
pub mod run;
pub mod serve;
pub mod signals;
pub mod statedir;
pub mod supervisor;
#[allow(unsafe_code)]
mod sys;
