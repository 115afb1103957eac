//! The engine's errors: what a call answers when it does not succeed
//! ([`EngineError`]), what a store reports ([`StoreError`]) and which
//! request field the protocol refuses ([`RequestError`]).
//!
//! Why a file of their own: every other file of the engine needs them (the
//! rules refuse, the stores fail, both engines answer), so they must import
//! none of those files; when the store's error lived with the rows and the
//! history's schema with the history, the two files imported each other.
//!
//! Bad stored data is an error, never a default: a value that cannot be
//! what was written is [`StoreError::Corrupt`] (naming the task and the
//! column), and the call fails instead of granting.

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;

use rusqlite::ErrorCode;

use crate::lease::{MAX_GRACE_MS, MAX_TTL_MS, MIN_TTL_MS, NameError, RefusalReason};

use super::gate::GateError;

/// Which limit on live leases an acquire ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapScope {
    /// The acquiring principal's own `max_leases`: HTTP 429 (the client
    /// should slow down; the agent treats it as transient).
    Principal,
    /// The authority's limit on live leases overall: HTTP 503 (the server
    /// is full; transient for the agent too).
    Global,
}

/// Why an engine call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Another holder's lease is live or in its grace period.
    #[error("held by {holder} (free in {retry_after_ms} ms)")]
    Held { holder: String, retry_after_ms: u64 },
    /// The previous lease expired under policy hold.
    #[error(
        "lease {lease_id} of {holder} expired under policy hold; an operator must clear the task"
    )]
    HeldForOperator { holder: String, lease_id: String },
    /// Renewal or release refused: the lease is gone for good.
    #[error("lease refused: {0}")]
    Refused(RefusalReason),
    /// Renewal or release of a lease that another principal acquired
    /// (HTTP 403 `forbidden`; not a refusal of the lease).
    #[error("the lease of task `{task}` belongs to another principal")]
    NotOwner { task: String },
    /// An acquire would exceed a limit on live leases (HTTP 429 for the
    /// principal's own limit, 503 for the global one; see [`CapScope`]).
    #[error("too many live leases: {} is {limit}", match scope {
        CapScope::Principal => "this principal's limit",
        CapScope::Global => "the authority's limit",
    })]
    TooManyLeases { scope: CapScope, limit: u64 },
    /// An acquire would create a task (no row exists) past the principal's
    /// limit of distinct new tasks in an hour (HTTP 429, like its own lease
    /// cap): made-up task names cannot grow the tables, the status page and
    /// `/metrics` faster than that.
    #[error("too many new tasks: this principal created {limit} distinct tasks in the last hour")]
    TooManyNewTasks { limit: u64 },
    /// Operator call with nothing to act on.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed (names the field).
    #[error("{0}")]
    BadRequest(#[from] RequestError),
    /// The next token of the sequence is not above a task's last token: the
    /// stored data is inconsistent, and granting could reuse a token.
    #[error("token sequence at {next} is not above task `{task}`'s last token {last}")]
    SequenceBehind { task: String, next: u64, last: u64 },
    /// The database failed, is corrupt or is busy; the answer is unknown.
    #[error("{}", chain(.0))]
    Storage(#[from] StoreError),
    /// A queued commit failed (serve's writer thread).
    #[error("{}", chain(.0.as_ref()))]
    Commit(Arc<StoreError>),
    /// The engine cannot answer (names why); retry later.
    #[error("{0}")]
    Unavailable(&'static str),
}

impl EngineError {
    /// Another process held the database's write lock past the deadline.
    pub fn is_busy(&self) -> bool {
        matches!(self, EngineError::Storage(e) if e.is_busy())
    }
}

/// An error and its causes on one line (`a: b: c`).
pub fn chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A request field the protocol does not accept; the message names the
/// field as it is spelled on the wire.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("`task` {0}")]
    Task(#[source] NameError),
    #[error("`holder` {0}")]
    Holder(#[source] NameError),
    #[error("`ttl_ms` must be from {MIN_TTL_MS} to {MAX_TTL_MS} (got {0})")]
    Ttl(u64),
    #[error("`grace_ms` must be from 0 to {MAX_GRACE_MS} (got {0})")]
    Grace(u64),
    #[error("`on_expiry` must be one of redispatch, grace, hold (got {0:?})")]
    Policy(String),
}

/// A store's failure (see [`super::store`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("lease database: {what}")]
    Sqlite {
        what: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("lease database: creating {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("lease database {path}: cannot switch to WAL mode (got {mode})")]
    NotWal { path: PathBuf, mode: String },
    #[error("lease database: waiting for the write lock")]
    Gate(#[from] GateError),
    #[error("lease database: the row of task {task:?} is corrupt: {column} {problem}")]
    Corrupt {
        task: String,
        column: &'static str,
        problem: String,
    },
    #[error("lease database: the token sequence (seq.last_token) is corrupt: it {0}")]
    CorruptSequence(String),
    #[error("lease database: the token ceiling (table meta) is corrupt: {0}")]
    CorruptCeiling(String),
    #[error("lease database: value {0} is too large to store")]
    TooLarge(u64),
    #[error("reading the boot id")]
    BootId(#[source] std::io::Error),
    #[error("lease database: making a lease id")]
    Random(#[source] std::io::Error),
    #[error("lease database: an earlier commit failed; restart the server")]
    Failed,
    #[error("lease database: syncing {path}")]
    SyncWal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The PostgreSQL store failed a call (the connection is dropped and
    /// made again on the next one).
    #[error("PostgreSQL store: {what}")]
    Postgres {
        what: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("PostgreSQL store: {what}: no answer within {} ms", after.as_millis())]
    PgTimeout {
        what: &'static str,
        after: std::time::Duration,
    },
    /// The store's schema was made by a newer leaseagent.
    #[error(
        "PostgreSQL store: schema version {found} is newer than this leaseagent knows ({known}): \
         run the newer leaseagent-serve (or restore the database)"
    )]
    SchemaNewer { found: i64, known: i64 },
    /// A newer leader exists: this replica's writes are refused, in the
    /// same transaction that would have made them.
    #[error(
        "PostgreSQL store: another replica leads now (leader epoch {current}, this replica led \
         epoch {mine}); nothing of this transaction was committed"
    )]
    Deposed { mine: u64, current: u64 },
    /// The store could promote a standby that misses acknowledged commits.
    #[error("PostgreSQL store: {0}")]
    Replication(String),
}

impl StoreError {
    /// Another process held the database's write lock: worth retrying.
    pub fn is_busy(&self) -> bool {
        match self {
            StoreError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
            ),
            StoreError::Gate(GateError::Timeout { .. }) => true,
            _ => false,
        }
    }
}

/// Attaches what was being done to a SQLite error.
pub trait Context<T> {
    fn ctx(self, what: &'static str) -> Result<T, StoreError>;
}

impl<T> Context<T> for rusqlite::Result<T> {
    fn ctx(self, what: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Sqlite { what, source })
    }
}

/// `v` as a database integer (SQLite's and PostgreSQL's are signed 64-bit):
/// a value above `i64::MAX` is refused, never wrapped negative.
pub fn to_i64(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::TooLarge(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_too_large_for_a_column_is_refused_not_wrapped() {
        assert_eq!(to_i64(7).unwrap(), 7);
        assert_eq!(to_i64(i64::MAX as u64).unwrap(), i64::MAX);
        let e = to_i64(u64::MAX).unwrap_err();
        assert!(matches!(e, StoreError::TooLarge(u64::MAX)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "lease database: value 18446744073709551615 is too large to store"
        );
    }
}
