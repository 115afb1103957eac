#![deny(unsafe_code)]
//! leaseagent: run a command under a lease.
//!
//! See `docs/design.md` for the lifecycle, the timing diagram and the races
//! each module guards against, and for the map of these folders.

pub mod agent;
pub mod authority;
pub mod cmd;
pub mod engine;
pub mod exit;
pub mod fence;
pub mod keeper;
pub mod lease;
pub mod protocol;

pub mod serve;
pub mod sys;
pub mod time;
