//! The SQLite fenced store across connections and processes.

use std::path::Path;
use std::sync::{Arc, Barrier};

use leaseagent::fence::FencedStore;
use leaseagent::fence::sqlite::{Error, SqliteStore};

fn rows_by_token(db: &Path) -> Vec<(i64, i64)> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut st = c
        .prepare("SELECT token, count(*) FROM t GROUP BY token ORDER BY token")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Writers with different tokens race, each on its own connection: the
/// rows appear in token order (a lower token never commits after a higher
/// one), each accepted batch is whole, a refused one left nothing.
#[test]
fn racing_writers_commit_in_token_order_without_partial_batches() {
    const WRITERS: u64 = 8;
    const BATCH: i64 = 50;
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("f.db");
    {
        let s = SqliteStore::open(&db).unwrap();
        s.connection()
            .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER)")
            .unwrap();
    }
    let barrier = Arc::new(Barrier::new(WRITERS as usize));
    let handles: Vec<_> = (1..=WRITERS)
        .rev()
        .map(|t| {
            let (db, barrier) = (db.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut s = SqliteStore::open(&db).unwrap();
                barrier.wait();
                let r: Result<(), Error> = s.write("p", t, |tx| {
                    for _ in 0..BATCH {
                        tx.execute("INSERT INTO t (token) VALUES (?1)", [t as i64])?;
                    }
                    Ok(())
                });
                (t, r.map_err(|e| e.to_string()))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let accepted: Vec<i64> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(t, _)| *t as i64)
        .collect();
    for (t, r) in &results {
        if let Err(e) = r {
            assert!(e.contains(&format!("token {t} superseded by")), "{e}");
        }
    }
    assert!(
        accepted.contains(&(WRITERS as i64)),
        "the highest token must win"
    );
    let counts = rows_by_token(&db);
    assert_eq!(
        counts,
        accepted
            .iter()
            .rev()
            .map(|&t| (t, BATCH))
            .collect::<Vec<_>>(),
        "accepted batches whole, refused ones absent"
    );
    let c = rusqlite::Connection::open(&db).unwrap();
    let order: Vec<i64> = c
        .prepare("SELECT token FROM t ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] <= w[1]),
        "commit order by token"
    );
    let fence: i64 = c
        .query_row(
            "SELECT token FROM leaseagent_fence WHERE partition = 'p'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(fence, WRITERS as i64);
}

/// Runs the example job (`examples/fenced_rows.rs`, built by `cargo test`
/// next to this binary) as a real process with `LEASE_TOKEN`: its exit
/// status is 0 written, 1 superseded, 2 any other error.
fn fenced_rows(db: &std::path::Path, partition: &str, token: u64, rows: u64) -> (i32, String) {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples/fenced_rows");
    assert!(
        bin.exists(),
        "{} missing: cargo test builds the examples",
        bin.display()
    );
    let out = std::process::Command::new(&bin)
        .arg(db)
        .arg(partition)
        .arg(rows.to_string())
        .env("LEASE_TOKEN", token.to_string())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn example_job_writes_and_is_refused_when_superseded() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("export.db");
    let count = |tok: i64| -> i64 {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM export_rows WHERE token = ?1",
                [tok],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(fenced_rows(&db, "2024-06-01", 5, 30).0, 0);
    assert_eq!(count(5), 30);
    assert_eq!(fenced_rows(&db, "2024-06-01", 6, 20).0, 0);
    let (code, zombie) = fenced_rows(&db, "2024-06-01", 5, 30);
    assert_eq!(code, 1, "{zombie}");
    assert!(zombie.contains("token 5 superseded by 6"), "{zombie}");
    assert_eq!(
        (count(5), count(6)),
        (0, 20),
        "only the live attempt's rows"
    );
    // Another partition is fenced on its own.
    assert_eq!(fenced_rows(&db, "2024-06-02", 1, 3).0, 0);
}
