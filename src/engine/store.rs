//! The SQLite schema and row I/O of the lease engine.
//!
//! One row per task: the token counter (`last_token`) and the current lease.
//! The counter and the lease are in the same row, so one committed write
//! makes both durable together: a token can never be answered without the
//! counter that rules out its reuse being on disk.
//!
//! The file is in WAL mode with `synchronous=FULL`: each commit fsyncs the
//! WAL before returning, which is the durability the protocol demands of a
//! grant. `expires_ms`/`boot_id` are only meaningful to the embedded engine
//! (serve keeps expiry in memory and writes NULL there).

use std::fmt;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::lease::{ExpiryPolicy, RefusalReason};

use super::rules::{Lease, TaskRow};

/// A database failure.
#[derive(Debug)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError(format!("lease database: {e}"))
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks(
  task TEXT PRIMARY KEY,
  last_token INTEGER NOT NULL,
  token INTEGER,
  holder TEXT,
  ttl_ms INTEGER,
  policy TEXT,
  grace_ms INTEGER,
  expires_ms INTEGER,
  boot_id TEXT,
  revoked INTEGER NOT NULL DEFAULT 0,
  ended_token INTEGER,
  ended_reason TEXT
);";

/// Opens (creating if needed) the database at `path`; returns the connection
/// and the instance id that goes into every lease id.
pub fn open(path: &Path, busy: Duration) -> Result<(Connection, String), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError(format!("creating {}: {e}", dir.display())))?;
    }
    let conn = Connection::open(path)
        .map_err(|e| StoreError(format!("opening {}: {e}", path.display())))?;
    conn.busy_timeout(busy)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError(format!(
            "{}: cannot switch to WAL mode (got {mode})",
            path.display()
        )));
    }
    conn.execute_batch("PRAGMA synchronous=FULL;")?;
    conn.execute_batch(&format!("BEGIN IMMEDIATE;{SCHEMA}"))
        .and_then(|_| {
            let inst: Option<String> = conn
                .query_row("SELECT value FROM meta WHERE key='instance'", [], |r| {
                    r.get(0)
                })
                .optional()?;
            let inst = match inst {
                Some(i) => i,
                None => {
                    let i = format!("{:08x}", fastrand::u32(..));
                    conn.execute(
                        "INSERT INTO meta(key, value) VALUES('instance', ?1)",
                        params![i],
                    )?;
                    i
                }
            };
            conn.execute_batch("COMMIT")?;
            Ok(inst)
        })
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            StoreError::from(e)
        })
        .map(|inst| (conn, inst))
}

fn to_i64(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError(format!("value {v} too large for the database")))
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

const SELECT: &str = "SELECT task, last_token, token, holder, ttl_ms, policy, grace_ms, expires_ms, boot_id, revoked, ended_token, ended_reason FROM tasks";

/// A row as stored: the expiry is only valid under `boot_id`.
struct Raw {
    row: TaskRow,
    boot_id: Option<String>,
}

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    let token: Option<i64> = r.get(2)?;
    let lease = match token {
        None => None,
        Some(t) => Some(Lease {
            token: to_u64(t),
            holder: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
            ttl_ms: to_u64(r.get::<_, Option<i64>>(4)?.unwrap_or(0)),
            policy: r
                .get::<_, Option<String>>(5)?
                .as_deref()
                .and_then(ExpiryPolicy::parse)
                .unwrap_or(ExpiryPolicy::Redispatch),
            grace_ms: to_u64(r.get::<_, Option<i64>>(6)?.unwrap_or(0)),
            expires_ms: to_u64(r.get::<_, Option<i64>>(7)?.unwrap_or(0)),
            revoked: r.get::<_, i64>(9)? != 0,
        }),
    };
    let ended_token: Option<i64> = r.get(10)?;
    let ended_reason: Option<String> = r.get(11)?;
    let ended = match (
        ended_token,
        ended_reason.as_deref().and_then(RefusalReason::parse),
    ) {
        (Some(t), Some(reason)) => Some((to_u64(t), reason)),
        _ => None,
    };
    Ok(Raw {
        row: TaskRow {
            task: r.get(0)?,
            last_token: to_u64(r.get(1)?),
            lease,
            ended,
        },
        boot_id: r.get(8)?,
    })
}

/// Where stored expiries come from.
#[derive(Clone, Copy, Debug)]
pub enum Expiry<'a> {
    /// Embedded: expiries are boot-clock ms valid under this boot id; a row
    /// from another boot has expired (its expiry reads as 0).
    Boot(&'a str),
    /// Serve after a restart: every lease expires at this instant (now + its ttl).
    RestartAt(u64),
}

fn fix(mut raw: Raw, exp: Expiry<'_>) -> TaskRow {
    if let Some(l) = &mut raw.row.lease {
        match exp {
            Expiry::Boot(id) => {
                if raw.boot_id.as_deref() != Some(id) {
                    l.expires_ms = 0;
                }
            }
            Expiry::RestartAt(now) => l.expires_ms = now.saturating_add(l.ttl_ms),
        }
    }
    raw.row
}

/// Loads one task's row (a fresh row if the task was never seen).
pub fn load(conn: &Connection, task: &str, exp: Expiry<'_>) -> Result<TaskRow, StoreError> {
    let mut st = conn.prepare_cached(&format!("{SELECT} WHERE task = ?1"))?;
    let raw = st.query_row(params![task], read).optional()?;
    Ok(raw
        .map(|r| fix(r, exp))
        .unwrap_or_else(|| TaskRow::new(task)))
}

/// Loads every row.
pub fn load_all(conn: &Connection, exp: Expiry<'_>) -> Result<Vec<TaskRow>, StoreError> {
    let mut st = conn.prepare_cached(SELECT)?;
    let rows = st.query_map([], read)?;
    let mut out = Vec::new();
    for r in rows {
        out.push(fix(r?, exp));
    }
    Ok(out)
}

/// Writes a row (insert or replace). `boot_id` is stored with the expiry
/// (embedded); `None` stores no expiry (serve).
pub fn save(conn: &Connection, row: &TaskRow, boot_id: Option<&str>) -> Result<(), StoreError> {
    let mut st = conn.prepare_cached(
        "INSERT INTO tasks(task, last_token, token, holder, ttl_ms, policy, grace_ms, expires_ms, boot_id, revoked, ended_token, ended_reason)
         VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT(task) DO UPDATE SET last_token=excluded.last_token, token=excluded.token,
           holder=excluded.holder, ttl_ms=excluded.ttl_ms, policy=excluded.policy,
           grace_ms=excluded.grace_ms, expires_ms=excluded.expires_ms, boot_id=excluded.boot_id,
           revoked=excluded.revoked, ended_token=excluded.ended_token, ended_reason=excluded.ended_reason",
    )?;
    let l = row.lease.as_ref();
    let opt = |v: Option<u64>| v.map(to_i64).transpose();
    st.execute(params![
        row.task,
        to_i64(row.last_token)?,
        opt(l.map(|l| l.token))?,
        l.map(|l| l.holder.as_str()),
        opt(l.map(|l| l.ttl_ms))?,
        l.map(|l| l.policy.as_str()),
        opt(l.map(|l| l.grace_ms))?,
        opt(l.and(boot_id).and(l.map(|l| l.expires_ms)))?,
        l.and(boot_id),
        i64::from(l.is_some_and(|l| l.revoked)),
        opt(row.ended.map(|e| e.0))?,
        row.ended.map(|e| e.1.as_str()),
    ])?;
    Ok(())
}
