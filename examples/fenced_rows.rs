//! A Rust job that writes its output rows through the fenced SQLite store.
//!
//! ```text
//! leaseagent --task nightly-export -- \
//!     cargo run --example fenced_rows -- export.db 2024-06-01 1000
//! ```
//!
//! It writes ROWS rows for PARTITION into `export_rows`, in one transaction
//! with the fence check: if a later attempt (higher `LEASE_TOKEN`) already
//! wrote this partition, nothing is written and it exits 1. The job first
//! deletes the partition's old rows, so the partition always holds exactly
//! one attempt's output.
//!
//! Exit status: 0 written; 1 superseded; 2 any other error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use leaseagent::fence::sqlite::{Error, SqliteStore};
use leaseagent::fence::{FenceError, FencedStore};

/// Writes `rows` rows for `partition` with `token`; the whole job's work.
fn write_partition(db: &Path, partition: &str, token: u64, rows: u64) -> Result<u64, Error> {
    let mut store = SqliteStore::open(db)?;
    store.connection().execute_batch(
        "CREATE TABLE IF NOT EXISTS export_rows (
             partition TEXT NOT NULL, token INTEGER NOT NULL, n INTEGER NOT NULL, value TEXT
         )",
    )?;
    // The expensive part (computing rows) happens outside the transaction;
    // the fence is checked again, for real, inside `write`.
    let values: Vec<String> = (0..rows).map(|n| format!("row {n} of {token}")).collect();
    store.write(partition, token, |tx| {
        tx.execute("DELETE FROM export_rows WHERE partition = ?1", [partition])?;
        let mut ins = tx.prepare(
            "INSERT INTO export_rows (partition, token, n, value) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (n, v) in values.iter().enumerate() {
            ins.execute(rusqlite::params![partition, token as i64, n as i64, v])?;
        }
        Ok(rows)
    })
}

fn run() -> Result<u64, Error> {
    let mut args = std::env::args_os().skip(1);
    let (Some(db), Some(partition)) = (args.next(), args.next()) else {
        eprintln!("usage: fenced_rows DB PARTITION [ROWS]   (token from LEASE_TOKEN)");
        std::process::exit(2);
    };
    let rows: u64 = args
        .next()
        .and_then(|r| r.to_str().and_then(|r| r.parse().ok()))
        .unwrap_or(100);
    let partition = partition.to_string_lossy().into_owned();
    let token = match leaseagent::fence::token_from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fenced_rows: {e}");
            std::process::exit(2);
        }
    };

    write_partition(&PathBuf::from(db), &partition, token, rows)
}

fn main() -> ExitCode {
    match run() {
        Ok(n) => {
            eprintln!("fenced_rows: wrote {n} rows");
            ExitCode::SUCCESS
        }
        Err(e) if e.superseded().is_some() => {
            eprintln!("fenced_rows: refused: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("fenced_rows: {e}");
            ExitCode::from(2)
        }
    }
}
