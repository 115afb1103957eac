//! The embedded engine's queue of waiters: who asked for a held task, in
//! arrival order, so that a freed task goes to the oldest waiter still
//! asking, never to a newcomer first (lease protocol v1, "Waiting").
//!
//! Why in the database: the waiters are separate processes (`--wait`
//! agents), and the database is the one place they share. A row per
//! (task, waiter): its place (`arrived`, from a counter that only rises)
//! and when it last asked (rewritten at most once a second), on the boot clock with its clock view and on the
//! wall clock (as task rows keep expiries: `rows.rs`). A waiter asks again
//! every 100 ms while it waits; one that has not asked
//! for [`FORGET_AFTER_MS`] (killed, its `--wait` over without a goodbye)
//! is forgotten, so a dead waiter blocks a task for at most that long.
//! Between views the wall clock decides: a step of the wall clock then
//! only forgets a live waiter early (it asks again and joins at the back)
//! or keeps a dead one longer; it never grants two holders.

use rusqlite::{Connection, params};

use crate::engine::error::{Context, StoreError, to_i64};

/// A waiter that has not asked for this long is forgotten (the bound the
/// protocol says an authority states).
pub const FORGET_AFTER_MS: u64 = 5_000;

/// A waiter's last ask is rewritten at most this often: it asks far more
/// often, and each rewrite is a commit that grows the WAL.
const REFRESH_MS: u64 = 1_000;

/// When the caller is asking: its clock view and both clocks now.
#[derive(Clone, Copy, Debug)]
pub struct Asking<'a> {
    pub view: &'a str,
    pub boot_ms: u64,
    pub wall_ms: u64,
}

/// Forgets the task's waiters that stopped asking, then lists the others,
/// oldest first.
pub fn queue(conn: &Connection, task: &str, now: Asking<'_>) -> Result<Vec<String>, StoreError> {
    let bound = to_i64(FORGET_AFTER_MS)?;
    conn.prepare_cached(
        "DELETE FROM waiters WHERE task = ?1 AND CASE WHEN view = ?2
           THEN ?3 - seen_boot_ms > ?5 ELSE ?4 - seen_wall_ms > ?5 END",
    )
    .and_then(|mut st| {
        st.execute(params![
            task,
            now.view,
            to_i64(now.boot_ms).unwrap_or(i64::MAX),
            to_i64(now.wall_ms).unwrap_or(i64::MAX),
            bound
        ])
    })
    .ctx("forgetting waiters")?;
    let mut st = conn
        .prepare_cached("SELECT waiter FROM waiters WHERE task = ?1 ORDER BY arrived")
        .ctx("reading the waiters")?;
    let rows = st
        .query_map(params![task], |r| r.get::<_, String>(0))
        .ctx("reading the waiters")?;
    rows.map(|r| r.ctx("reading the waiters")).collect()
}

/// Records that `waiter` asked for `task` now: a new waiter joins at the
/// back, a known one keeps its place.
pub fn join(
    conn: &Connection,
    task: &str,
    waiter: &str,
    now: Asking<'_>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO waiters(task, waiter, arrived, seen_boot_ms, seen_wall_ms, view)
         VALUES (?1, ?2, (SELECT COALESCE(MAX(arrived), 0) + 1 FROM waiters), ?3, ?4, ?5)
         ON CONFLICT(task, waiter) DO UPDATE SET seen_boot_ms = excluded.seen_boot_ms,
           seen_wall_ms = excluded.seen_wall_ms, view = excluded.view
         WHERE view != excluded.view OR excluded.seen_boot_ms - seen_boot_ms >= ?6",
    )
    .and_then(|mut st| {
        st.execute(params![
            task,
            waiter,
            to_i64(now.boot_ms).unwrap_or(i64::MAX),
            to_i64(now.wall_ms).unwrap_or(i64::MAX),
            now.view,
            to_i64(REFRESH_MS).unwrap_or(i64::MAX)
        ])
    })
    .map(|_| ())
    .ctx("queueing a waiter")
}

/// Takes `waiter` out of `task`'s queue (granted, or gone).
pub fn leave(conn: &Connection, task: &str, waiter: &str) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM waiters WHERE task = ?1 AND waiter = ?2")
        .and_then(|mut st| st.execute(params![task, waiter]))
        .map(|_| ())
        .ctx("dequeueing a waiter")
}

/// Takes `waiter` out of every queue (it stopped waiting).
pub fn leave_all(conn: &Connection, waiter: &str) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM waiters WHERE waiter = ?1")
        .and_then(|mut st| st.execute(params![waiter]))
        .map(|_| ())
        .ctx("dequeueing a waiter")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(super::super::schema::WAITERS).unwrap();
        c
    }

    #[test]
    fn waiters_keep_their_places_and_the_silent_are_forgotten() {
        let c = db();
        let at = |boot_ms, wall_ms| Asking {
            view: "b",
            boot_ms,
            wall_ms,
        };
        for (w, t) in [("w0", 0), ("w1", 10), ("w2", 20)] {
            join(&c, "t", w, at(t, t)).unwrap();
        }
        join(&c, "other", "w9", at(0, 0)).unwrap();
        // Asking again keeps the place.
        join(&c, "t", "w0", at(4_000, 4_000)).unwrap();
        // Within a second of that, not rewritten (no commit to make).
        join(&c, "t", "w0", at(4_500, 4_500)).unwrap();
        let seen: i64 = c
            .query_row(
                "SELECT seen_boot_ms FROM waiters WHERE waiter = 'w0'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(seen, 4_000);
        assert_eq!(
            queue(&c, "t", at(4_000, 4_000)).unwrap(),
            ["w0", "w1", "w2"]
        );
        // w1 and w2 have not asked for more than 5 s.
        assert_eq!(queue(&c, "t", at(5_025, 5_025)).unwrap(), ["w0"]);
        leave(&c, "t", "w0").unwrap();
        assert!(queue(&c, "t", at(5_025, 5_025)).unwrap().is_empty());
        leave_all(&c, "w9").unwrap();
        assert!(queue(&c, "other", at(1, 1)).unwrap().is_empty());
        // Another view is judged on the wall clock.
        join(&c, "u", "x", at(1_000_000, 50)).unwrap();
        let other = Asking {
            view: "c",
            boot_ms: 0,
            wall_ms: 4_000,
        };
        assert_eq!(queue(&c, "u", other).unwrap(), ["x"]);
        let later = Asking {
            view: "c",
            boot_ms: 0,
            wall_ms: 5_100,
        };
        assert!(queue(&c, "u", later).unwrap().is_empty());
    }
}
