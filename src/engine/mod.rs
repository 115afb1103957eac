//! The lease engine on SQLite, shared by `leaseagent serve` and the embedded
//! default authority.
//!
//! One set of rules ([`rules`]) over one storage seam ([`store`]; SQLite,
//! [`sqlite`], is its implementation), run two ways:
//!
//! - [`batched::BatchedEngine`] (behind `leaseagent serve`): every task's record
//!   lives in memory; the database holds the token sequence and who holds
//!   what. Renewals only touch memory (expiry on the monotonic boot clock),
//!   which is what makes them cheap. A grant goes to a single writer thread
//!   that commits every pending grant in one transaction (WAL,
//!   `synchronous=FULL`, so the commit is fsync'd) and only then answers
//!   each of them: a grant is never answered before it is on disk, and under
//!   load one fsync covers many grants. After a restart every lease on record
//!   expires one ttl after the restart (the protocol's Restart rule), except
//!   one recorded as held for an operator.
//! - [`file::FileEngine`] (the embedded default): each agent process
//!   opens the same file; every call is one immediate transaction, so
//!   concurrent agents are serialised by SQLite's write lock (taken in turns,
//!   see [`gate`]) and exactly one of them gets a free task. The database is
//!   the only shared place, so expiry is a column: `CLOCK_BOOTTIME`
//!   milliseconds plus the boot id they are measured under; a different boot
//!   id means the lease has expired.
//!
//! Invariants: tokens strictly increase per task and are never reused,
//! whatever crashes, because they come from one global sequence that is
//! committed in the same fsync'd transaction as the grant it belongs to,
//! before the grant is answered, and never decreases (so released rows can
//! be deleted). Bad stored data is an error, never a default. A lease is
//! renewed or released only by the principal that acquired it, with an id
//! carrying 128 random bits.
//!
//! Inside this folder files name each other (`super::error::EngineError`),
//! never this file, which only re-exports what the rest of the crate uses:
//! a file that both named and was named by its neighbours would close an
//! import circle (`tests/integration/layout.rs` fails on any).

pub mod ack;
pub mod api;
pub mod batched;
pub mod error;
pub mod file;
pub mod gate;
pub mod history;
pub mod postgres;
pub mod rules;
pub mod sqlite;
pub mod store;
pub mod witness;

pub use api::{
    Granted, MAX_PAGE, parse_policy, validate_acquire, validate_grace, validate_holder,
    validate_task, validate_ttl,
};
pub use error::{CapScope, EngineError, RequestError};
