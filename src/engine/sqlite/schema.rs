//! Opening a lease database: the file's modes and its schema.
//!
//! The file is in WAL mode with `synchronous=FULL`: each commit fsyncs the
//! WAL before returning, which is the durability the protocol demands of a
//! grant (the embedded engine runs at `NORMAL` and fdatasyncs the WAL
//! itself after the commits that must be durable; see `engine/file.rs`).
//!
//! The schema: `tasks` (one row per task that has, or recently had, a
//! lease; see `rows.rs`), `seq` (the global token sequence), `meta` (the
//! embedded engine's token ceiling) and `history` (one row per attempt;
//! see `history.rs`). `expires_ms`/`boot_id`/`written_ms` are only
//! meaningful to the embedded engine (`boot_id` holds the writer's clock
//! view, `crate::time::clock::view`) (serve keeps expiry in memory and writes NULL there);
//! `held` records that a lease expired under policy hold, so the state
//! survives a restart. The schema's version is a hash of its text, kept in
//! the file's header: a process that opens a current file reads one header
//! and takes no lock.

use std::path::Path;

use rusqlite::{Connection, Transaction};

use crate::engine::error::{Context, StoreError};

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
);
CREATE TABLE IF NOT EXISTS seq(id INTEGER PRIMARY KEY CHECK (id = 1), last_token INTEGER NOT NULL);";

/// The run history's table (`history.rs` reads and writes it).
pub const HISTORY: &str = "
CREATE TABLE IF NOT EXISTS history(
  token INTEGER PRIMARY KEY,
  task TEXT NOT NULL,
  holder TEXT NOT NULL,
  principal TEXT NOT NULL,
  acquired_at INTEGER NOT NULL,
  ended_at INTEGER,
  ended TEXT,
  outcome TEXT,
  exit_code INTEGER,
  held_ms INTEGER
);
CREATE INDEX IF NOT EXISTS history_task ON history(task, token);";

/// The history's per-principal attempt number (`pseq`, see `history.rs`)
/// and its index: added to every file, new ones included, on open.
pub const HISTORY_PSEQ: &str = "ALTER TABLE history ADD COLUMN pseq INTEGER;
CREATE INDEX IF NOT EXISTS history_principal ON history(principal, pseq);";

/// The embedded engine's queue of waiters (`waiters.rs`).
pub const WAITERS: &str = "
CREATE TABLE IF NOT EXISTS waiters(
  task TEXT NOT NULL,
  waiter TEXT NOT NULL,
  arrived INTEGER NOT NULL,
  seen_boot_ms INTEGER NOT NULL,
  seen_wall_ms INTEGER NOT NULL,
  view TEXT NOT NULL,
  PRIMARY KEY(task, waiter)
);
CREATE INDEX IF NOT EXISTS waiters_order ON waiters(task, arrived);";

/// Columns added after the first schema; added to older files on open
/// (each to the table its statement names).
const ADDED: [(&str, &str); 5] = [
    ("principal", "ALTER TABLE tasks ADD COLUMN principal TEXT"),
    ("lease_key", "ALTER TABLE tasks ADD COLUMN lease_key TEXT"),
    (
        "held",
        "ALTER TABLE tasks ADD COLUMN held INTEGER NOT NULL DEFAULT 0",
    ),
    ("pseq", HISTORY_PSEQ),
    // The wall-clock ms of the row's last write (embedded only): how a
    // reader under another boot id bounds the lease (`rows::foreign_expiry`).
    (
        "written_ms",
        "ALTER TABLE tasks ADD COLUMN written_ms INTEGER",
    ),
];

/// Opens (creating if needed) the database at `path`. The busy handler is
/// the caller's to set; the modes are set by [`set_modes`], the schema
/// created or brought up to date by [`ensure_schema`].
pub fn connect(path: &Path) -> Result<Connection, StoreError> {
    // A database whose directory was checked on a descriptor is opened
    // through that descriptor (`sys::sqlite_at`), never by name again.
    if let Some(via) = crate::sys::sqlite_at::path_for(path) {
        return Connection::open_with_flags_and_vfs(
            via,
            rusqlite::OpenFlags::default(),
            crate::sys::sqlite_at::VFS,
        )
        .ctx("opening the file");
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    Connection::open(path).ctx("opening the file")
}

/// Switches to WAL (needs the write lock the first time: call it in turn,
/// see `engine/gate.rs`) and sets `synchronous=FULL`.
pub fn set_modes(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .ctx("switching to WAL mode")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NotWal {
            path: path.to_path_buf(),
            mode,
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .ctx("setting synchronous=FULL")
}

/// The schema's version, stored in the file's `user_version` by
/// [`ensure_schema`]: a hash of the text of [`SCHEMA`], [`HISTORY`],
/// [`WAITERS`] and [`ADDED`], so any change to them is a new version without anyone having
/// to bump a number (everything `ensure_schema` creates must be in those).
const SCHEMA_VERSION: i64 = {
    // FNV-1a, 31 bits (user_version is a signed 32-bit integer; 0 is a
    // file that never had a schema).
    let mut h: u32 = 0x811c_9dc5;
    let mut parts: [&[u8]; 3 + 2 * ADDED.len()] = [SCHEMA.as_bytes(); 3 + 2 * ADDED.len()];
    parts[1] = HISTORY.as_bytes();
    parts[2] = WAITERS.as_bytes();
    let mut i = 0;
    while i < ADDED.len() {
        parts[3 + 2 * i] = ADDED[i].0.as_bytes();
        parts[4 + 2 * i] = ADDED[i].1.as_bytes();
        i += 1;
    }
    let mut p = 0;
    while p < parts.len() {
        let mut b = 0;
        while b < parts[p].len() {
            h = (h ^ parts[p][b] as u32).wrapping_mul(0x0100_0193);
            b += 1;
        }
        p += 1;
    }
    ((h & 0x7fff_ffff) | 1) as i64
};

/// True when the file already has this version's schema: one read of the
/// file header (no write lock needed, so a process that opens a current
/// file does not queue for it, and no table is inspected).
pub fn schema_current(conn: &Connection) -> Result<bool, StoreError> {
    let v: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .ctx("reading the schema version")?;
    Ok(v == SCHEMA_VERSION)
}

/// The column names of `table`.
fn columns(tx: &Transaction<'_>, table: &str) -> Result<Vec<String>, StoreError> {
    let mut st = tx
        .prepare("SELECT name FROM pragma_table_info(?1)")
        .ctx("reading the schema")?;
    let names = st
        .query_map([table], |r| r.get::<_, String>(0))
        .ctx("reading the schema")?;
    let mut have = Vec::new();
    for n in names {
        have.push(n.ctx("reading the schema")?);
    }
    Ok(have)
}

/// Creates the tables, adds columns missing from an older file, and starts
/// the token sequence from the highest per-task counter.
pub fn ensure_schema(tx: &Transaction<'_>) -> Result<(), StoreError> {
    tx.execute_batch(SCHEMA).ctx("creating the schema")?;
    tx.execute_batch(HISTORY)
        .ctx("creating the history table")?;
    tx.execute_batch(WAITERS)
        .ctx("creating the waiters' table")?;
    for (col, sql) in ADDED {
        // "ALTER TABLE <table> ADD COLUMN ...": the table is the third word.
        let table = sql.split_whitespace().nth(2).unwrap_or("tasks");
        if !columns(tx, table)?.iter().any(|h| h == col) {
            tx.execute_batch(sql).ctx("adding a column")?;
        }
    }
    tx.execute(
        "INSERT INTO seq(id, last_token)
         SELECT 1, (SELECT COALESCE(MAX(last_token), 0) FROM tasks)
         WHERE NOT EXISTS (SELECT 1 FROM seq)",
        [],
    )
    .ctx("starting the token sequence")?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .ctx("recording the schema version")?;
    Ok(())
}
