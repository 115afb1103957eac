//! The storage seam: what the engines ask of a durable store, so that a
//! second store can stand where SQLite stands.
//!
//! Two levels:
//! - [`Txn`]: the reads and writes of one transaction (a task's row, the
//!   token sequence, the run history). Both engines apply the rules
//!   ([`super::rules`]) to rows and write them back through it: the embedded
//!   engine (`file.rs`) one call per transaction, serve's writer
//!   (`batched/writer.rs`) a whole group of changes per transaction.
//! - [`Store`]: a store `serve` runs on ([`super::batched::BatchedEngine`]):
//!   everything on record at start ([`Snapshot`]), transactions, and a
//!   second handle for reads ([`HistoryRead`]) that never wait for a
//!   commit. SQLite implements it (`sqlite/mod.rs`, `SqliteStore`); a
//!   PostgreSQL store for a fleet's replicas implements the same (tokens,
//!   leases with their policies and holds, the history; the principals'
//!   counts are derived from the rows on load).
//!
//! What a replicated store adds fits these calls: a leader's takeover is a
//! [`Store::load`] (the Restart rule gives every lease on record a full ttl
//! from then), and a store that fences leaders checks its leader epoch
//! inside each [`Store::transaction`], so a deposed leader's commit fails
//! like any failed commit: its writer is marked failed and it grants no
//! more.
//!
//! The embedded engine's transaction itself is SQLite's and stays so: its
//! turns at the write lock (`gate.rs`), its own `fdatasync` of the WAL and
//! the token ceiling that saves it most of them are that file's durability
//! on one host, not something another store would share.
//!
//! Synchronous, on purpose. Every call into a store is made from a thread
//! that may block: serve's writer thread (whose whole job is to wait for one
//! commit while the next group queues up), serve's blocking pool (the
//! history's pages, the status page, the metrics), or an agent's own call. The engine stays free of any
//! async runtime (the agent has none; `ack.rs` needs only `std`). A store
//! over an async client (`tokio-postgres` on serve's runtime) runs each call
//! to completion on that thread (`Handle::block_on`), or owns a
//! current-thread runtime of its own there.
//!
//! Invariants every store keeps (the engines rely on them):
//! - A transaction is all or nothing, and durable when
//!   [`Store::transaction`] returns `Ok` (serve answers a grant only then).
//!   A store may defer its writes to the commit (a client that pipelines
//!   them); then an error of any write fails the transaction.
//! - The token sequence never goes down ([`Txn::set_last_issued`] keeps the
//!   larger value), so a compacted row's next token is still higher.
//! - Bad stored data is an error ([`StoreError::Corrupt`] and its kin),
//!   never a default: tokens must never restart because of it.
//! - A row and the history of the attempts its change began or ended are
//!   written in the same transaction (the engines pass them together), so
//!   a crash never keeps one without the other.

use super::error::StoreError;
use super::history::{Bounds, Op, Record};
use super::rules::TaskRow;

/// The reads and writes of one transaction.
pub trait Txn {
    /// The task's row (a fresh one if the store has none). A store that
    /// keeps no expiries (serve's) gives its lease one ttl past the instant
    /// [`Store::load`] was given, as the Restart rule does.
    fn load(&mut self, task: &str) -> Result<TaskRow, StoreError>;

    /// Writes the row, or deletes it when it holds nothing worth keeping
    /// (no lease, no early end to report): compaction.
    fn save(&mut self, row: &TaskRow) -> Result<(), StoreError>;

    /// The last token issued for any task; missing or negative is
    /// corruption, never 0.
    fn last_issued(&mut self) -> Result<u64, StoreError>;

    /// Records that tokens up to `token` have been issued (never lowers it).
    fn set_last_issued(&mut self, token: u64) -> Result<(), StoreError>;

    /// One write of the run history ([`super::history::ops`]); a grant's
    /// also deletes what is past `bounds` (a bounded amount per grant).
    fn record(&mut self, op: &Op, bounds: Bounds) -> Result<(), StoreError>;
}

/// Everything on record, as an engine starting on a store sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The token sequence: every token issued is at most this.
    pub last_issued: u64,
    /// Every task's row, in task order.
    pub rows: Vec<TaskRow>,
    /// When each task last ended with a release reporting `succeeded`
    /// (wall-clock ms), from the history still kept.
    pub last_successes: Vec<(String, u64)>,
}

/// A store `serve`'s engine runs on. It lives on the engine's writer
/// thread (so `Send`); reads go through [`Store::reader`]'s handle.
pub trait Store: Send + 'static {
    /// Everything on record. The store keeps no expiries (memory does), so
    /// every lease on record expires one ttl after `now_ms` (boot-clock
    /// ms; the protocol's Restart rule), except one recorded as held.
    fn load(&mut self, now_ms: u64) -> Result<Snapshot, StoreError>;

    /// Runs `f` in one transaction and commits it durably; nothing of it is
    /// kept if `f` or the commit fails.
    fn transaction(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;

    /// A second handle for the history's reads, which must not wait for
    /// the writer's commits (serve answers them from its blocking pool).
    fn reader(&self) -> Result<Box<dyn HistoryRead>, StoreError>;
}

/// Reads of the run history (what has been committed).
pub trait HistoryRead: Send {
    /// Up to `limit` attempts (at most [`super::api::MAX_PAGE`]) of `task`,
    /// or of every task, newest first, with tokens below `before`.
    fn page(
        &mut self,
        task: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError>;

    /// When attempt `token` was acquired and when it ended (for a held
    /// task: when its lease expired), wall-clock ms; `None` if not kept.
    fn times(&mut self, token: u64) -> Result<Option<(u64, Option<u64>)>, StoreError>;
}
