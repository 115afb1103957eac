//! The tasks' rows, the token sequence and the token ceiling in a SQLite
//! lease database.
//!
//! One row per task that has (or recently had) a lease, and one global token
//! sequence (`seq`). Every grant takes the next number of the sequence and
//! writes it back in the same transaction as the grant's row, so one
//! committed write makes both durable together: a token is never answered
//! without the counter that rules out its reuse being on disk (serve), or,
//! in the embedded engine, without a durable token ceiling above it
//! ([`Ceiling`], rows of `meta`, which need no schema change). Because the
//! sequence never decreases, a released task's row can be deleted
//! (compaction) without its next token ever going down; the per-task
//! `last_token` is kept only to tell `superseded` from `unknown_lease`.
//!
//! Bad data is an error, never a default: a negative or missing number, an
//! unknown policy or refusal reason, a sequence behind a task's counter is a
//! [`StoreError::Corrupt`] naming the task and the column, and the call
//! fails instead of granting (tokens must never restart because of bad data).

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params};

use crate::engine::error::{Context, StoreError, to_i64};
use crate::engine::rules::{Lease, TaskRow};
use crate::lease::{ExpiryPolicy, RefusalReason};

/// The last token issued for any task. A negative or missing value is
/// corruption, never read as 0.
pub fn last_issued(conn: &Connection) -> Result<u64, StoreError> {
    let v: Option<Value> = conn
        .query_row("SELECT last_token FROM seq WHERE id = 1", [], |r| r.get(0))
        .optional()
        .ctx("reading the token sequence")?;
    let corrupt = StoreError::CorruptSequence;
    match v {
        None => Err(corrupt("is missing".into())),
        Some(Value::Integer(i)) => u64::try_from(i).map_err(|_| corrupt(format!("is {i}"))),
        Some(other) => Err(corrupt(format!("is not an integer ({other:?})"))),
    }
}

/// Records that tokens up to `token` have been issued (never lowers it).
pub fn set_last_issued(conn: &Connection, token: u64) -> Result<(), StoreError> {
    let token = to_i64(token)?;
    let n = conn
        .prepare_cached("UPDATE seq SET last_token = MAX(last_token, ?1) WHERE id = 1")
        .and_then(|mut st| st.execute(params![token]))
        .ctx("writing the token sequence")?;
    if n == 1 {
        Ok(())
    } else {
        Err(StoreError::CorruptSequence("is missing".into()))
    }
}

/// The embedded engine's token ceiling (see `file`, "Durability"): the
/// highest token that grants may answer without an fdatasync of their own,
/// whether the ceiling was already on disk when it was recorded (`durable`),
/// and the boot it was written under. Three rows of `meta`, so files
/// without them need no new schema: a file without a ceiling has none
/// (`None`, as good as 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ceiling {
    pub value: u64,
    pub durable: bool,
    pub boot_id: String,
}

const CEILING_KEYS: [&str; 3] = ["token_ceiling", "token_ceiling_state", "token_ceiling_boot"];

/// Reads the token ceiling. All three rows or none: anything else, or a
/// value that is not what [`save_ceiling`] writes, is corruption.
pub fn load_ceiling(conn: &Connection) -> Result<Option<Ceiling>, StoreError> {
    let mut vals: [Option<Value>; 3] = [None, None, None];
    {
        let mut st = conn
            .prepare_cached("SELECT key, value FROM meta WHERE key IN (?1, ?2, ?3)")
            .ctx("reading the token ceiling")?;
        let rows = st
            .query_map(
                params![CEILING_KEYS[0], CEILING_KEYS[1], CEILING_KEYS[2]],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, Value>(1)?)),
            )
            .ctx("reading the token ceiling")?;
        for r in rows {
            let (k, v) = r.ctx("reading the token ceiling")?;
            if let Some(i) = CEILING_KEYS.iter().position(|c| *c == k) {
                vals[i] = Some(v);
            }
        }
    }
    let corrupt = StoreError::CorruptCeiling;
    let text = |i: usize| match &vals[i] {
        Some(Value::Text(s)) => Ok(s.as_str()),
        Some(other) => Err(corrupt(format!(
            "{} is not text ({other:?})",
            CEILING_KEYS[i]
        ))),
        None => Err(corrupt(format!("{} is missing", CEILING_KEYS[i]))),
    };
    if vals.iter().all(Option::is_none) {
        return Ok(None);
    }
    let v = text(0)?;
    let value = v
        .parse::<i64>()
        .ok()
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| corrupt(format!("{} is {v:?}", CEILING_KEYS[0])))?;
    let durable = match text(1)? {
        "durable" => true,
        "pending" => false,
        s => return Err(corrupt(format!("{} is {s:?}", CEILING_KEYS[1]))),
    };
    Ok(Some(Ceiling {
        value,
        durable,
        boot_id: text(2)?.to_owned(),
    }))
}

/// Records a new token ceiling, not yet known to be on disk.
pub fn save_ceiling(conn: &Connection, value: u64, boot_id: &str) -> Result<(), StoreError> {
    let value = to_i64(value)?.to_string();
    conn.prepare_cached(
        "INSERT INTO meta(key, value) VALUES (?1, ?2), (?3, 'pending'), (?4, ?5)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )
    .and_then(|mut st| {
        st.execute(params![
            CEILING_KEYS[0],
            value,
            CEILING_KEYS[1],
            CEILING_KEYS[2],
            boot_id
        ])
    })
    .map(|_| ())
    .ctx("writing the token ceiling")
}

/// Marks the ceiling `value` of boot `boot_id` as on disk, if it is still
/// the stored one and pending. True when it did.
pub fn mark_ceiling_durable(
    conn: &Connection,
    value: u64,
    boot_id: &str,
) -> Result<bool, StoreError> {
    let value = to_i64(value)?.to_string();
    conn.prepare_cached(
        "UPDATE meta SET value = 'durable' WHERE key = ?1 AND value = 'pending'
           AND EXISTS (SELECT 1 FROM meta WHERE key = ?2 AND value = ?3)
           AND EXISTS (SELECT 1 FROM meta WHERE key = ?4 AND value = ?5)",
    )
    .and_then(|mut st| {
        st.execute(params![
            CEILING_KEYS[1],
            CEILING_KEYS[0],
            value,
            CEILING_KEYS[2],
            boot_id
        ])
    })
    .map(|n| n == 1)
    .ctx("marking the token ceiling durable")
}

const SELECT: &str = "SELECT task, last_token, token, holder, ttl_ms, policy, grace_ms, expires_ms, boot_id, revoked, ended_token, ended_reason, principal, lease_key, held, written_ms FROM tasks";

/// How many columns [`SELECT`] reads.
const COLUMNS: usize = 16;

/// A row as stored, column by column, before any check.
struct RawRow([Value; COLUMNS]);

fn read_raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    let mut v: [Value; COLUMNS] = std::array::from_fn(|_| Value::Null);
    for (i, slot) in v.iter_mut().enumerate() {
        *slot = r.get(i)?;
    }
    Ok(RawRow(v))
}

/// A checked row: the expiry is only valid under the clock view `boot_id`
/// (`crate::time::clock::view`), written at `written_ms` on the wall clock.
struct Stored {
    row: TaskRow,
    boot_id: Option<String>,
    written_ms: Option<u64>,
}

/// Reads columns of one raw row, turning every surprise into `Corrupt`.
struct Cols<'a> {
    v: &'a [Value; COLUMNS],
    task: String,
}

impl Cols<'_> {
    fn bad(&self, column: &'static str, problem: String) -> StoreError {
        StoreError::Corrupt {
            task: self.task.clone(),
            column,
            problem,
        }
    }

    fn opt_u64(&self, i: usize, column: &'static str) -> Result<Option<u64>, StoreError> {
        match &self.v[i] {
            Value::Null => Ok(None),
            Value::Integer(n) => u64::try_from(*n)
                .map(Some)
                .map_err(|_| self.bad(column, format!("is negative ({n})"))),
            other => Err(self.bad(column, format!("is not an integer ({other:?})"))),
        }
    }

    fn u64(&self, i: usize, column: &'static str) -> Result<u64, StoreError> {
        self.opt_u64(i, column)?
            .ok_or_else(|| self.bad(column, "is missing".into()))
    }

    fn opt_text(&self, i: usize, column: &'static str) -> Result<Option<String>, StoreError> {
        match &self.v[i] {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s.clone())),
            other => Err(self.bad(column, format!("is not text ({other:?})"))),
        }
    }

    fn text(&self, i: usize, column: &'static str) -> Result<String, StoreError> {
        self.opt_text(i, column)?
            .ok_or_else(|| self.bad(column, "is missing".into()))
    }

    fn flag(&self, i: usize, column: &'static str) -> Result<bool, StoreError> {
        match self.u64(i, column)? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(self.bad(column, format!("is {n}, not 0 or 1"))),
        }
    }
}

fn check(raw: RawRow) -> Result<Stored, StoreError> {
    let task = match &raw.0[0] {
        Value::Text(s) => s.clone(),
        other => {
            return Err(StoreError::Corrupt {
                task: format!("{other:?}"),
                column: "task",
                problem: "is not text".into(),
            });
        }
    };
    let c = Cols { v: &raw.0, task };
    let last_token = c.u64(1, "last_token")?;
    let lease = match c.opt_u64(2, "token")? {
        None => None,
        Some(token) => {
            if token == 0 || token > last_token {
                return Err(c.bad(
                    "token",
                    format!("is {token}, outside 1..={last_token} (last_token)"),
                ));
            }
            let policy_name = c.text(5, "policy")?;
            let policy = ExpiryPolicy::parse(&policy_name)
                .ok_or_else(|| c.bad("policy", format!("is unknown ({policy_name:?})")))?;
            Some(Lease {
                token,
                key: c.opt_text(13, "lease_key")?.unwrap_or_default(),
                principal: c.opt_text(12, "principal")?.unwrap_or_default(),
                holder: c.text(3, "holder")?,
                ttl_ms: c.u64(4, "ttl_ms")?,
                policy,
                grace_ms: c.u64(6, "grace_ms")?,
                expires_ms: c.opt_u64(7, "expires_ms")?.unwrap_or(0),
                revoked: c.flag(9, "revoked")?,
                held: c.flag(14, "held")?,
            })
        }
    };
    let ended = match (
        c.opt_u64(10, "ended_token")?,
        c.opt_text(11, "ended_reason")?,
    ) {
        (None, None) => None,
        (Some(t), Some(r)) => Some((
            t,
            RefusalReason::parse(&r)
                .ok_or_else(|| c.bad("ended_reason", format!("is unknown ({r:?})")))?,
        )),
        _ => {
            return Err(c.bad(
                "ended_token",
                "and ended_reason must be both set or both empty".into(),
            ));
        }
    };
    let boot_id = c.opt_text(8, "boot_id")?;
    let written_ms = c.opt_u64(15, "written_ms")?;
    let ended_by = if lease.is_none() && ended.is_some() {
        c.opt_text(12, "principal")?.unwrap_or_default()
    } else {
        String::new()
    };
    Ok(Stored {
        row: TaskRow {
            task: c.task,
            last_token,
            ended_by,
            lease,
            ended,
        },
        boot_id,
        written_ms,
    })
}

/// Where stored expiries come from.
#[derive(Clone, Copy, Debug)]
pub enum Expiry<'a> {
    /// Embedded: expiries are boot-clock ms under this clock view
    /// (`crate::time::clock::view`); a row from another view is translated
    /// ([`foreign_expiry`]).
    Boot(&'a str),
    /// Serve after a restart: every lease expires at this instant (now + its ttl).
    RestartAt(u64),
}

/// Added to a lease's ttl, measured on the wall clock from the row's last
/// write, before a row from another boot is free: 1,000 ppm of the ttl (the
/// agents' default drift budget) and a second for the clocks' steps.
fn foreign_margin_ms(ttl_ms: u64) -> u64 {
    ttl_ms / 1000 + 1000
}

/// The expiry, on this view's boot clock, of a lease stored under another
/// clock view (module doc of `engine/file.rs`, "Clock views"):
/// - the same boot in another time namespace: exact, by the two views'
///   `CLOCK_BOOTTIME` offsets;
/// - another boot id (a VM or container with its own, a shared file): the
///   writer's boot clock means nothing here, so the lease is held until its
///   ttl has passed on the wall clock since the row's last write, plus a
///   margin; every renewal rewrites the row and pushes that on;
/// - a row written before views and write times were recorded (no
///   `written_ms`) under another boot id: expired, as every version before
///   read it (after a reboot, what it was).
fn foreign_expiry(
    expires_ms: u64,
    ttl_ms: u64,
    row_view: Option<&str>,
    written_ms: Option<u64>,
    mine: &str,
    (now_boot, now_wall): (u64, u64),
) -> u64 {
    use crate::time::clock::split_view;
    if let (Some((row_boot, row_off)), Some((my_boot, my_off))) =
        (row_view.and_then(split_view), split_view(mine))
        && row_boot == my_boot
    {
        let ns = i128::from(expires_ms) * 1_000_000 - row_off + my_off;
        return u64::try_from(ns.max(0) / 1_000_000).unwrap_or(u64::MAX);
    }
    match written_ms {
        Some(w) => wall_bound(w, ttl_ms, (now_boot, now_wall)),
        None => 0,
    }
}

/// Now on the boot clock plus what is left of `ttl_ms` (and the margin)
/// since `written_ms` on the wall clock.
fn wall_bound(written_ms: u64, ttl_ms: u64, (now_boot, now_wall): (u64, u64)) -> u64 {
    let until = written_ms
        .saturating_add(ttl_ms)
        .saturating_add(foreign_margin_ms(ttl_ms));
    if until <= now_wall {
        // Over: long expired, not "expires now". `now_boot` is read after
        // the engine took its own now, so "now" here would read as 1 ms
        // still to go to a caller whose clock reading came first.
        return 0;
    }
    now_boot.saturating_add(until - now_wall)
}

fn fix(mut s: Stored, exp: Expiry<'_>) -> TaskRow {
    if let Some(l) = &mut s.row.lease {
        match exp {
            Expiry::Boot(view) => {
                if s.boot_id.as_deref() != Some(view) {
                    let now = (crate::time::boot_ms(), crate::time::wall_ms());
                    l.expires_ms = foreign_expiry(
                        l.expires_ms,
                        l.ttl_ms,
                        s.boot_id.as_deref(),
                        s.written_ms,
                        view,
                        now,
                    );
                }
            }
            Expiry::RestartAt(now) => l.expires_ms = now.saturating_add(l.ttl_ms),
        }
    }
    s.row
}

/// Loads one task's row (a fresh row if the task has none).
pub fn load(conn: &Connection, task: &str, exp: Expiry<'_>) -> Result<TaskRow, StoreError> {
    let raw = conn
        .prepare_cached(&format!("{SELECT} WHERE task = ?1"))
        .and_then(|mut st| st.query_row(params![task], read_raw).optional())
        .ctx("reading a task")?;
    match raw {
        None => Ok(TaskRow::new(task)),
        Some(r) => Ok(fix(check(r)?, exp)),
    }
}

/// Loads up to `limit` rows in task order, after `after` if given.
pub fn load_page(
    conn: &Connection,
    after: Option<&str>,
    limit: usize,
    exp: Expiry<'_>,
) -> Result<Vec<TaskRow>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let raws = conn
        .prepare_cached(&format!(
            "{SELECT} WHERE ?1 IS NULL OR task > ?1 ORDER BY task LIMIT ?2"
        ))
        .and_then(|mut st| {
            st.query_map(params![after, limit], read_raw)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .ctx("listing tasks")?;
    raws.into_iter()
        .map(|r| check(r).map(|s| fix(s, exp)))
        .collect()
}

/// Loads every row.
pub fn load_all(conn: &Connection, exp: Expiry<'_>) -> Result<Vec<TaskRow>, StoreError> {
    load_page(conn, None, usize::MAX, exp)
}

/// Writes a row (insert or replace), or deletes it when it holds nothing
/// worth keeping (no lease, no early end to report): compaction. `boot_id`
/// is stored with the expiry (embedded); `None` stores no expiry (serve).
pub fn save(conn: &Connection, row: &TaskRow, boot_id: Option<&str>) -> Result<(), StoreError> {
    if row.lease.is_none() && row.ended.is_none() {
        return conn
            .prepare_cached("DELETE FROM tasks WHERE task = ?1")
            .and_then(|mut st| st.execute(params![row.task]))
            .map(|_| ())
            .ctx("compacting a task");
    }
    let l = row.lease.as_ref();
    let opt = |v: Option<u64>| v.map(to_i64).transpose();
    let values = params![
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
        // Without a lease, the column names whose early end `ended` is.
        l.map_or(row.ended.map(|_| row.ended_by.as_str()), |l| Some(
            l.principal.as_str()
        )),
        l.map(|l| l.key.as_str()),
        i64::from(l.is_some_and(|l| l.held)),
        opt(l.and(boot_id).map(|_| crate::time::wall_ms()))?,
    ];
    conn.prepare_cached(
        "INSERT INTO tasks(task, last_token, token, holder, ttl_ms, policy, grace_ms, expires_ms, boot_id, revoked, ended_token, ended_reason, principal, lease_key, held, written_ms)
         VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
         ON CONFLICT(task) DO UPDATE SET last_token=excluded.last_token, token=excluded.token,
           holder=excluded.holder, ttl_ms=excluded.ttl_ms, policy=excluded.policy,
           grace_ms=excluded.grace_ms, expires_ms=excluded.expires_ms, boot_id=excluded.boot_id,
           revoked=excluded.revoked, ended_token=excluded.ended_token, ended_reason=excluded.ended_reason,
           principal=excluded.principal, lease_key=excluded.lease_key, held=excluded.held,
           written_ms=excluded.written_ms",
    )
    .and_then(|mut st| st.execute(values))
    .map(|_| ())
    .ctx("writing a task")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sqlite::schema::{connect, ensure_schema, schema_current, set_modes};
    use rusqlite::TransactionBehavior;

    fn db() -> (tempfile::TempDir, Connection) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("t.db");
        let mut c = connect(&path).unwrap();
        set_modes(&c, &path).unwrap();
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        ensure_schema(&tx).unwrap();
        tx.commit().unwrap();
        (d, c)
    }

    #[test]
    fn a_row_of_another_clock_view_is_held_until_proven_free() {
        let now = (50_000, 1_700_000_000_000);
        // Same boot, the writer a day ahead (a time namespace): exact.
        let day_ns: i128 = 86_400 * 1_000_000_000;
        let ahead = format!("b@{day_ns}");
        assert_eq!(
            foreign_expiry(86_460_000, 30_000, Some(&ahead), Some(1), "b", now),
            60_000
        );
        // ...and from the host to a reader 1,000 s behind.
        let behind = format!("b@{}", -1_000_000_000_000i128);
        assert_eq!(
            foreign_expiry(1_060_000, 30_000, Some("b"), Some(1), &behind, now),
            60_000
        );
        // Another boot id: its ttl on the wall clock since its last write,
        // plus the margin, whatever its boot-clock expiry says.
        let written = now.1 - 10_000;
        assert_eq!(
            foreign_expiry(0, 30_000, Some("other"), Some(written), "b", now),
            50_000 + 20_000 + 30 + 1000
        );
        assert_eq!(
            foreign_expiry(u64::MAX, 30_000, Some("other"), Some(1), "b", now),
            0,
            "long past on the wall clock: free (expired long ago, not \"now\", which a \
             caller whose clock reading came first would take for 1 ms to go)"
        );
        // Unreadable views are another boot too.
        assert_eq!(
            foreign_expiry(0, 30_000, Some("x@y"), Some(written), "b", now),
            71_030
        );
        // Written before views were recorded: as every version read it.
        assert_eq!(foreign_expiry(99, 30_000, Some("other"), None, "b", now), 0);
    }

    #[test]
    fn the_writers_view_and_write_time_are_stored_with_the_row() {
        let (_d, c) = db();
        let mut r = held_row();
        if let Some(l) = &mut r.lease {
            l.held = false;
            l.policy = ExpiryPolicy::Redispatch;
            l.expires_ms = crate::time::boot_ms() + 1000;
        }
        let before = crate::time::wall_ms();
        save(&c, &r, Some("b@5")).unwrap();
        let (view, written): (String, i64) = c
            .query_row("SELECT boot_id, written_ms FROM tasks", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(view, "b@5");
        assert!(u64::try_from(written).unwrap() >= before);
        // Read under that view: as written; under another boot: bounded by
        // the wall clock, never expired at once.
        let same = load(&c, "t", Expiry::Boot("b@5")).unwrap();
        assert_eq!(same.lease, r.lease);
        let other = load(&c, "t", Expiry::Boot("c")).unwrap();
        let left = other.lease.unwrap().expires_ms - crate::time::boot_ms();
        assert!((1000..=2001).contains(&left), "{left}");
    }

    fn held_row() -> TaskRow {
        let mut r = TaskRow::new("t");
        r.last_token = 7;
        r.lease = Some(Lease {
            token: 7,
            key: "k".into(),
            principal: "p".into(),
            holder: "h".into(),
            ttl_ms: 1000,
            policy: ExpiryPolicy::Hold,
            grace_ms: 0,
            expires_ms: 5,
            revoked: false,
            held: true,
        });
        r.ended = Some((6, RefusalReason::Revoked));
        r
    }

    #[test]
    fn rows_round_trip_and_empty_rows_are_compacted() {
        let (_d, c) = db();
        let r = held_row();
        save(&c, &r, Some("b")).unwrap();
        assert_eq!(load(&c, "t", Expiry::Boot("b")).unwrap(), r);
        let mut free = r.clone();
        free.lease = None;
        free.ended = None;
        save(&c, &free, None).unwrap();
        assert_eq!(load_all(&c, Expiry::RestartAt(0)).unwrap(), vec![]);
    }

    #[test]
    fn each_kind_of_bad_value_is_corrupt_never_a_default() {
        let cases = [
            "UPDATE tasks SET last_token = -1",
            "UPDATE tasks SET token = -3",
            "UPDATE tasks SET token = 8",
            "UPDATE tasks SET policy = 'sometimes'",
            "UPDATE tasks SET policy = NULL",
            "UPDATE tasks SET ended_reason = 'bored'",
            "UPDATE tasks SET ended_token = NULL",
            "UPDATE tasks SET ttl_ms = 'soon'",
            "UPDATE tasks SET held = 2",
            "UPDATE tasks SET holder = NULL",
        ];
        for sql in cases {
            let (_d, c) = db();
            save(&c, &held_row(), None).unwrap();
            c.execute(sql, []).unwrap();
            let e = load(&c, "t", Expiry::RestartAt(0)).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{sql}: {e:?}");
            assert!(load_all(&c, Expiry::RestartAt(0)).is_err(), "{sql}");
        }
    }

    #[test]
    fn the_sequence_never_goes_down_and_a_bad_one_is_corrupt() {
        let (_d, c) = db();
        assert_eq!(last_issued(&c).unwrap(), 0);
        set_last_issued(&c, 9).unwrap();
        set_last_issued(&c, 4).unwrap();
        assert_eq!(last_issued(&c).unwrap(), 9);
        c.execute("UPDATE seq SET last_token = -9", []).unwrap();
        assert!(matches!(
            last_issued(&c),
            Err(StoreError::CorruptSequence(_))
        ));
        c.execute("DELETE FROM seq", []).unwrap();
        assert!(matches!(
            last_issued(&c),
            Err(StoreError::CorruptSequence(_))
        ));
        assert!(set_last_issued(&c, 10).is_err());
    }

    #[test]
    fn the_token_ceiling_round_trips_and_is_marked_durable_only_as_saved() {
        let (_d, c) = db();
        assert_eq!(load_ceiling(&c).unwrap(), None, "a file without one");
        save_ceiling(&c, 2048, "b1").unwrap();
        let pending = Ceiling {
            value: 2048,
            durable: false,
            boot_id: "b1".into(),
        };
        assert_eq!(load_ceiling(&c).unwrap(), Some(pending.clone()));
        assert!(!mark_ceiling_durable(&c, 1024, "b1").unwrap());
        assert!(!mark_ceiling_durable(&c, 2048, "b2").unwrap());
        assert!(mark_ceiling_durable(&c, 2048, "b1").unwrap());
        assert!(!mark_ceiling_durable(&c, 2048, "b1").unwrap(), "once");
        let durable = Ceiling {
            durable: true,
            ..pending
        };
        assert_eq!(load_ceiling(&c).unwrap(), Some(durable));
        c.execute("UPDATE meta SET value = 7 WHERE key = 'token_ceiling'", [])
            .unwrap();
        assert_eq!(load_ceiling(&c).unwrap().unwrap().value, 7, "TEXT affinity");
        c.execute(
            "UPDATE meta SET value = x'00' WHERE key = 'token_ceiling'",
            [],
        )
        .unwrap();
        assert!(matches!(
            load_ceiling(&c),
            Err(StoreError::CorruptCeiling(_))
        ));
    }

    #[test]
    fn an_old_file_gains_the_new_columns_and_a_sequence_from_its_counters() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("old.db");
        let mut c = connect(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE tasks(task TEXT PRIMARY KEY, last_token INTEGER NOT NULL, token INTEGER,
               holder TEXT, ttl_ms INTEGER, policy TEXT, grace_ms INTEGER, expires_ms INTEGER,
               boot_id TEXT, revoked INTEGER NOT NULL DEFAULT 0, ended_token INTEGER, ended_reason TEXT);
             INSERT INTO tasks(task, last_token) VALUES('a', 41), ('b', 12);",
        )
        .unwrap();
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        assert!(!schema_current(&tx).unwrap());
        ensure_schema(&tx).unwrap();
        assert!(schema_current(&tx).unwrap());
        tx.commit().unwrap();
        assert_eq!(last_issued(&c).unwrap(), 41);
        assert_eq!(load(&c, "a", Expiry::RestartAt(0)).unwrap().last_token, 41);
    }
}
