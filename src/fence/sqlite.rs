//! The SQLite store: the fence table and the caller's rows in one
//! transaction.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS leaseagent_fence (
//!     partition TEXT PRIMARY KEY,
//!     token     INTEGER NOT NULL
//! );
//! ```
//!
//! [`SqliteStore::write`] opens `BEGIN IMMEDIATE` (the database write lock is
//! taken at once, so no other writer can run between the check and the
//! update), reads the partition's token, refuses a lower one, upserts the
//! fence row with a `WHERE excluded.token >= token` guard, runs the caller's
//! closure on the same transaction, and commits. A refusal, an error from the
//! closure, or a panic rolls everything back: no partial rows, fence
//! unchanged.
//!
//! Tokens are stored as SQLite's signed 64-bit integers; a token above
//! `i64::MAX` is refused ([`Error::TokenTooLarge`]) rather than wrapped. The
//! connection waits at most [`BUSY_TIMEOUT`] for another writer's lock.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use super::{FenceError, FencedStore, Superseded, admit};

/// The fence table's name.
pub const FENCE_TABLE: &str = "leaseagent_fence";
/// How long a write waits for another connection's write lock.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the SQLite store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A higher token was already accepted: nothing was written.
    #[error("{0}")]
    Superseded(Superseded),
    /// The token does not fit SQLite's signed integer.
    #[error("token {0} is above {max} and cannot be stored", max = i64::MAX)]
    TokenTooLarge(u64),
    /// The fence table holds a negative token for the partition.
    #[error("{FENCE_TABLE} row for `{partition}` holds {value}, not a token")]
    CorruptFence { partition: String, value: i64 },
    #[error("sqlite: {0}")]
    Sqlite(#[source] rusqlite::Error),
}

impl FenceError for Error {
    fn superseded(&self) -> Option<Superseded> {
        match self {
            Error::Superseded(s) => Some(*s),
            _ => None,
        }
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Sqlite(e)
    }
}

impl From<Superseded> for Error {
    fn from(s: Superseded) -> Self {
        Error::Superseded(s)
    }
}

/// A SQLite database whose writes are fenced per partition.
pub struct SqliteStore {
    conn: Connection,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, in WAL mode.
    pub fn open(path: &Path) -> Result<Self, Error> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        Self::new(conn)
    }

    /// Wraps an open connection, creating the fence table if needed.
    pub fn new(conn: Connection) -> Result<Self, Error> {
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {FENCE_TABLE} (
                partition TEXT PRIMARY KEY,
                token     INTEGER NOT NULL
            )"
        ))?;
        Ok(SqliteStore { conn })
    }

    /// The connection, for reads and schema set-up.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    fn read_fence(conn: &Connection, partition: &str) -> Result<Option<u64>, Error> {
        let v: Option<i64> = conn
            .query_row(
                &format!("SELECT token FROM {FENCE_TABLE} WHERE partition = ?1"),
                params![partition],
                |r| r.get(0),
            )
            .optional()?;
        v.map(|value| {
            u64::try_from(value).map_err(|_| Error::CorruptFence {
                partition: partition.to_string(),
                value,
            })
        })
        .transpose()
    }
}

impl FencedStore for SqliteStore {
    type Txn<'a> = Transaction<'a>;
    type Error = Error;

    fn highest(&mut self, partition: &str) -> Result<Option<u64>, Error> {
        Self::read_fence(&self.conn, partition)
    }

    fn write<R, E>(
        &mut self,
        partition: &str,
        token: u64,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<Error>,
    {
        let stored = i64::try_from(token).map_err(|_| Error::TokenTooLarge(token))?;
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Error::from)?;
        let highest = Self::read_fence(&tx, partition)?;
        admit(token, highest).map_err(Error::from)?;
        let changed = tx
            .execute(
                &format!(
                    "INSERT INTO {FENCE_TABLE} (partition, token) VALUES (?1, ?2)
                     ON CONFLICT (partition) DO UPDATE SET token = excluded.token
                     WHERE excluded.token >= {FENCE_TABLE}.token"
                ),
                params![partition, stored],
            )
            .map_err(Error::from)?;
        if changed != 1 {
            // Unreachable under the write lock; refuse rather than write.
            let highest = Self::read_fence(&tx, partition)?.unwrap_or(token);
            return Err(Error::Superseded(Superseded { token, highest }).into());
        }
        // An error from `f` drops `tx`, which rolls back.
        let out = f(&mut tx)?;
        tx.commit().map_err(Error::from)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> SqliteStore {
        let s = SqliteStore::new(Connection::open_in_memory().unwrap()).unwrap();
        s.connection()
            .execute_batch("CREATE TABLE rows (k TEXT, v INTEGER)")
            .unwrap();
        s
    }

    fn count(s: &SqliteStore) -> i64 {
        s.connection()
            .query_row("SELECT count(*) FROM rows", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn lower_token_rejected_without_rows() {
        let mut s = store();
        let r: Result<(), Error> = s.write("p", 5, |tx| {
            tx.execute("INSERT INTO rows VALUES ('a', 5)", [])?;
            Ok(())
        });
        r.unwrap();
        let mut called = false;
        let r: Result<(), Error> = s.write("p", 4, |tx| {
            called = true;
            tx.execute("INSERT INTO rows VALUES ('b', 4)", [])?;
            Ok(())
        });
        let e = r.unwrap_err();
        assert_eq!(
            e.superseded(),
            Some(Superseded {
                token: 4,
                highest: 5
            })
        );
        assert!(!called);
        assert_eq!(count(&s), 1);
        // Equal is allowed; another partition is independent.
        let r: Result<(), Error> = s.write("p", 5, |tx| {
            tx.execute("INSERT INTO rows VALUES ('c', 5)", [])?;
            Ok(())
        });
        r.unwrap();
        let r: Result<(), Error> = s.write("q", 1, |_| Ok(()));
        r.unwrap();
        assert_eq!(count(&s), 2);
        assert_eq!(s.highest("p").unwrap(), Some(5));
        assert_eq!(s.highest("q").unwrap(), Some(1));
    }

    #[test]
    fn failing_closure_rolls_back_rows_and_fence() {
        let mut s = store();
        let r: Result<(), Error> = s.write("p", 7, |tx| {
            tx.execute("INSERT INTO rows VALUES ('a', 7)", [])?;
            tx.execute("INSERT INTO no_such_table VALUES (1)", [])?;
            Ok(())
        });
        assert!(matches!(r, Err(Error::Sqlite(_))));
        assert_eq!(count(&s), 0);
        assert_eq!(s.highest("p").unwrap(), None);
    }

    #[test]
    fn huge_token_is_refused() {
        let mut s = store();
        let r: Result<(), Error> = s.write("p", u64::MAX, |_| Ok(()));
        assert!(matches!(r, Err(Error::TokenTooLarge(_))));
    }
}
