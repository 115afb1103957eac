//! The SQLite store: the one implementation of the storage seam
//! ([`super::store`]), for both engines.
//!
//! - `schema.rs`: opening a file (WAL, `synchronous=FULL`) and its schema;
//! - `rows.rs`: the tasks' rows, the token sequence, the token ceiling;
//! - `history.rs`: the run history's table;
//! - here: [`SqliteTxn`], one transaction of either engine, and
//!   [`SqliteStore`], the store `serve` runs on (one connection for the
//!   writer thread, a second, read-only one for the history: in WAL mode
//!   reads never wait for the writer).

pub mod history;
pub mod rows;
pub mod schema;
pub mod waiters;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::error::{Context, StoreError};
use super::history::{Bounds, Op, Record};
use super::rules::TaskRow;
use super::store::{HistoryRead, Snapshot, Store, Txn};
use rows::{Ceiling, Expiry};

/// How long serve's connections wait for SQLite's own locks (a checkpoint,
/// a `leaseagent` command reading the file) before a call fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// One transaction on a lease database, as [`Txn`]: expiries kept under
/// the embedded engine's boot id, or (serve) not kept at all. The token
/// ceiling, which only the embedded engine uses, is reached through it too.
pub struct SqliteTxn<'a> {
    tx: Transaction<'a>,
    expiry: Expiry<'a>,
}

impl<'a> SqliteTxn<'a> {
    /// The embedded engine's transaction: expiries are boot-clock ms, kept
    /// with the clock `view` (`time::clock::view`) and the write's wall
    /// time, and translated when read under another view.
    pub fn boot(tx: Transaction<'a>, view: &'a str) -> Self {
        SqliteTxn {
            tx,
            expiry: Expiry::Boot(view),
        }
    }

    /// Serve's transaction: no expiry is stored (memory holds them); a row
    /// read back expires one ttl after `restart_at_ms`.
    fn serve(tx: Transaction<'a>, restart_at_ms: u64) -> Self {
        SqliteTxn {
            tx,
            expiry: Expiry::RestartAt(restart_at_ms),
        }
    }

    pub fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().ctx("committing")
    }

    /// The embedded engine's token ceiling ([`rows::load_ceiling`]).
    pub fn ceiling(&self) -> Result<Option<Ceiling>, StoreError> {
        rows::load_ceiling(&self.tx)
    }

    /// The task's waiters still asking, oldest first ([`waiters::queue`]).
    pub fn waiters(&self, task: &str, now: waiters::Asking<'_>) -> Result<Vec<String>, StoreError> {
        waiters::queue(&self.tx, task, now)
    }

    /// `waiter` asked for `task` now ([`waiters::join`]).
    pub fn join_waiters(
        &self,
        task: &str,
        waiter: &str,
        now: waiters::Asking<'_>,
    ) -> Result<(), StoreError> {
        waiters::join(&self.tx, task, waiter, now)
    }

    /// `waiter` leaves `task`'s queue ([`waiters::leave`]).
    pub fn leave_waiters(&self, task: &str, waiter: &str) -> Result<(), StoreError> {
        waiters::leave(&self.tx, task, waiter)
    }

    /// Records a new token ceiling, pending ([`rows::save_ceiling`]).
    pub fn save_ceiling(&self, value: u64, boot_id: &str) -> Result<(), StoreError> {
        rows::save_ceiling(&self.tx, value, boot_id)
    }
}

impl Txn for SqliteTxn<'_> {
    fn load(&mut self, task: &str) -> Result<TaskRow, StoreError> {
        rows::load(&self.tx, task, self.expiry)
    }

    fn save(&mut self, row: &TaskRow) -> Result<(), StoreError> {
        let boot_id = match self.expiry {
            Expiry::Boot(id) => Some(id),
            Expiry::RestartAt(_) => None,
        };
        rows::save(&self.tx, row, boot_id)
    }

    fn last_issued(&mut self) -> Result<u64, StoreError> {
        rows::last_issued(&self.tx)
    }

    fn set_last_issued(&mut self, token: u64) -> Result<(), StoreError> {
        rows::set_last_issued(&self.tx, token)
    }

    fn record(&mut self, op: &Op, bounds: Bounds) -> Result<(), StoreError> {
        history::apply(&self.tx, op, bounds)
    }
}

/// A history reader is any connection to the file.
impl HistoryRead for Connection {
    fn page(
        &mut self,
        task: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        history::page(self, task, before, limit)
    }

    fn times(&mut self, token: u64) -> Result<Option<(u64, Option<u64>)>, StoreError> {
        history::times(self, token)
    }
}

/// The SQLite file `serve` runs on.
pub struct SqliteStore {
    path: PathBuf,
    conn: Connection,
    /// What [`Store::load`] was given: a row read back in a transaction
    /// expires one ttl after it, as the rows loaded then did.
    restart_at_ms: u64,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, in WAL mode with
    /// `synchronous=FULL`, its schema brought up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut conn = schema::connect(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .ctx("setting the busy timeout")?;
        schema::set_modes(&conn, path)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx("taking the write lock")?;
        schema::ensure_schema(&tx)?;
        tx.commit().ctx("committing the schema")?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            conn,
            restart_at_ms: 0,
        })
    }
}

impl Store for SqliteStore {
    fn load(&mut self, now_ms: u64) -> Result<Snapshot, StoreError> {
        self.restart_at_ms = now_ms;
        Ok(Snapshot {
            last_successes: history::last_successes(&self.conn)?,
            last_issued: rows::last_issued(&self.conn)?,
            rows: rows::load_all(&self.conn, Expiry::RestartAt(now_ms))?,
        })
    }

    fn transaction(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx("taking the write lock")?;
        let mut tx = SqliteTxn::serve(tx, self.restart_at_ms);
        f(&mut tx)?;
        tx.commit()
    }

    fn reader(&self) -> Result<Box<dyn HistoryRead>, StoreError> {
        let reader = schema::connect(&self.path)?;
        reader
            .busy_timeout(BUSY_TIMEOUT)
            .ctx("setting the busy timeout")?;
        reader
            .pragma_update(None, "query_only", true)
            .ctx("opening the history reader")?;
        Ok(Box::new(reader))
    }
}
