//! The engine over a SQLite file shared by every agent process on a host
//! (the embedded default authority).
//!
//! Every call is one `BEGIN IMMEDIATE` transaction: read the task's row,
//! apply the rule from [`super::rules`], write it back, commit (fsync'd, WAL
//! with `synchronous=FULL`). SQLite's write lock serialises agents, so two
//! processes racing for a free task cannot both see it free: exactly one
//! grant. `busy_timeout` is set to the caller's timeout, so a call waits for
//! the lock at most that long and then fails as transient.
//!
//! Expiry is a column: boot-clock milliseconds plus the boot id they were
//! measured under (`CLOCK_BOOTTIME` is one clock for the whole host, and it
//! keeps counting through suspend). A row written under another boot id has
//! expired: nothing on this host can still be running under it.
//!
//! "Now" is read before waiting for the lock, so lock waits only make a
//! renewal's new expiry earlier and a lease look more alive to an acquirer:
//! both are the safe direction.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use crate::lease::{LeaseInfo, RefusalReason};

use super::rules::{AcquireSpec, TaskRow, lease_id, parse_lease_id};
use super::store::{self, Expiry};
use super::{EngineError, now_ms, validate_acquire};

/// A granted lease: (lease id, token, ttl ms).
pub type Granted = (String, u64, u64);

/// One process's handle on the shared database.
pub struct SharedEngine {
    conn: Connection,
    instance: String,
    boot_id: String,
}

impl SharedEngine {
    /// Opens (creating if needed) the database, waiting at most `busy` for
    /// another process that is creating it.
    pub fn open(path: &Path, busy: Duration) -> Result<Self, EngineError> {
        let boot_id = crate::time::clock::boot_id()
            .map_err(|e| EngineError::Storage(format!("reading the boot id: {e}")))?;
        let (conn, instance) = store::open(path, busy)?;
        Ok(SharedEngine {
            conn,
            instance,
            boot_id,
        })
    }

    /// Runs `f` on the task's row inside one immediate transaction; the row
    /// is written back when `f` returns `Ok((_, true))`.
    fn with_row<T>(
        &mut self,
        task: &str,
        timeout: Duration,
        f: impl FnOnce(&mut TaskRow, &str) -> Result<(T, bool), EngineError>,
    ) -> Result<T, EngineError> {
        self.conn
            .busy_timeout(timeout.max(Duration::from_millis(1)))
            .map_err(store::StoreError::from)?;
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(store::StoreError::from)?;
        let res = (|| {
            let mut row = store::load(&self.conn, task, Expiry::Boot(&self.boot_id))?;
            let (out, write) = f(&mut row, &self.instance)?;
            if write {
                store::save(&self.conn, &row, Some(&self.boot_id))?;
            }
            self.conn
                .execute_batch("COMMIT")
                .map_err(store::StoreError::from)?;
            Ok(out)
        })();
        if res.is_err() && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        res
    }

    pub fn acquire(
        &mut self,
        spec: &AcquireSpec,
        timeout: Duration,
    ) -> Result<Granted, EngineError> {
        validate_acquire(spec)?;
        let now = now_ms();
        self.with_row(&spec.task, timeout, |row, inst| {
            let token = row.acquire(spec, now, inst)?;
            Ok((
                (lease_id(inst, token, &spec.task), token, spec.ttl_ms),
                true,
            ))
        })
    }

    /// The task a lease id names, if it is one of this database's.
    fn task_of<'a>(&self, id: &'a str, token: u64) -> Result<&'a str, EngineError> {
        match parse_lease_id(id) {
            Some((inst, t, task)) if inst == self.instance && t == token => Ok(task),
            _ => Err(EngineError::Refused(RefusalReason::UnknownLease)),
        }
    }

    pub fn renew(&mut self, id: &str, token: u64, timeout: Duration) -> Result<u64, EngineError> {
        let now = now_ms();
        let task = self.task_of(id, token)?;
        self.with_row(task, timeout, |row, _| {
            let ttl = row.renew(token, now).map_err(EngineError::Refused)?;
            Ok((ttl, true))
        })
    }

    pub fn release(&mut self, id: &str, token: u64, timeout: Duration) -> Result<(), EngineError> {
        let now = now_ms();
        let task = self.task_of(id, token)?;
        self.with_row(task, timeout, |row, _| {
            row.release(token, now).map_err(EngineError::Refused)?;
            Ok(((), true))
        })
    }

    pub fn revoke(
        &mut self,
        task: &str,
        force: bool,
        timeout: Duration,
    ) -> Result<u64, EngineError> {
        super::validate_task(task).map_err(EngineError::BadRequest)?;
        let now = now_ms();
        self.with_row(task, timeout, |row, _| Ok((row.revoke(force, now)?, true)))
    }

    pub fn clear(&mut self, task: &str, timeout: Duration) -> Result<u64, EngineError> {
        super::validate_task(task).map_err(EngineError::BadRequest)?;
        let now = now_ms();
        self.with_row(task, timeout, |row, _| Ok((row.clear(now)?, true)))
    }

    pub fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, EngineError> {
        self.conn
            .busy_timeout(timeout.max(Duration::from_millis(1)))
            .map_err(store::StoreError::from)?;
        let now = now_ms();
        let rows = store::load_all(&self.conn, Expiry::Boot(&self.boot_id))?;
        let mut out: Vec<LeaseInfo> = rows
            .iter()
            .filter_map(|r| r.info(now, &self.instance))
            .collect();
        out.sort_by(|a, b| a.task.cmp(&b.task));
        Ok(out)
    }
}
