//! The run history's table in a SQLite lease database: the writes
//! [`crate::engine::history::ops`] asks for, the bounded pruning, and the
//! reads (pages newest first, one attempt's times, each task's last
//! success). What the history records and why is in `engine/history.rs`.

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params};

use crate::engine::api::MAX_PAGE;
use crate::engine::error::{Context, StoreError, to_i64};
use crate::engine::history::{AGE_PRUNE_BATCH, Bounds, Op, Record, TOTAL_PRUNE_EVERY};
use crate::lease::{Ended, Outcome};
use crate::time::ms;

/// Writes one op (inside the caller's transaction); a grant also prunes.
pub fn apply(conn: &Connection, op: &Op, bounds: Bounds) -> Result<(), StoreError> {
    match op {
        Op::Begin {
            task,
            token,
            holder,
            principal,
            at_ms,
        } => {
            let (t, at) = (to_i64(*token)?, to_i64(*at_ms)?);
            let pseq: i64 = conn
                .prepare_cached(
                    "SELECT COALESCE(MAX(pseq), 0) + 1 FROM history WHERE principal = ?1",
                )
                .and_then(|mut st| st.query_row(params![principal], |r| r.get(0)))
                .ctx("numbering an attempt")?;
            conn.prepare_cached(
                "INSERT OR REPLACE INTO history(token, task, holder, principal, acquired_at, pseq)
                 VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut st| st.execute(params![t, task, holder, principal, at, pseq]))
            .ctx("recording an attempt")?;
            prune(conn, (*token, principal, pseq), *at_ms, bounds)
        }
        Op::End {
            token,
            ended,
            at_ms,
            outcome,
            exit_code,
            overwrite,
        } => {
            let (t, at) = (to_i64(*token)?, to_i64(*at_ms)?);
            conn.prepare_cached(
                "UPDATE history SET ended = ?2, ended_at = ?3, held_ms = MAX(0, ?3 - acquired_at),
                   outcome = ?4, exit_code = ?5
                 WHERE token = ?1 AND (?6 OR ended IS NULL)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    t,
                    ended.as_str(),
                    at,
                    outcome.map(Outcome::as_str),
                    exit_code,
                    overwrite
                ])
            })
            .map(|_| ())
            .ctx("recording the end of an attempt")
        }
    }
}

/// Deletes what is past the bounds, as seen from a grant of `token` at
/// wall time `now_ms` (bounded work, see `engine/history.rs`).
fn prune(
    conn: &Connection,
    (token, principal, pseq): (u64, &str, i64),
    now_ms: u64,
    bounds: Bounds,
) -> Result<(), StoreError> {
    let per = to_i64(bounds.max_rows_per_principal.min(bounds.max_rows))?;
    if pseq > per {
        conn.prepare_cached("DELETE FROM history WHERE principal = ?1 AND pseq <= ?2")
            .and_then(|mut st| st.execute(params![principal, pseq - per]))
            .ctx("pruning a principal's history")?;
    }
    if token % TOTAL_PRUNE_EVERY == 0 {
        let rows: i64 = conn
            .prepare_cached("SELECT COUNT(*) FROM history")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .ctx("counting history")?;
        let over = rows - to_i64(bounds.max_rows)?;
        if over > 0 {
            conn.prepare_cached(
                "DELETE FROM history WHERE token IN
                   (SELECT token FROM history ORDER BY token LIMIT ?1)",
            )
            .and_then(|mut st| st.execute(params![over]))
            .ctx("pruning history by count")?;
        }
    }
    let cutoff = to_i64(now_ms.saturating_sub(ms(bounds.max_age)))?;
    let batch = to_i64(AGE_PRUNE_BATCH)?;
    conn.prepare_cached(
        "DELETE FROM history WHERE token IN
           (SELECT token FROM history ORDER BY token LIMIT ?2)
         AND ended IS NOT NULL AND acquired_at < ?1",
    )
    .and_then(|mut st| st.execute(params![cutoff, batch]))
    .map(|_| ())
    .ctx("pruning history by age")
}

const COLUMNS: &str =
    "token, task, holder, principal, acquired_at, ended_at, ended, outcome, exit_code, held_ms";

fn corrupt(task: &str, column: &'static str, problem: String) -> StoreError {
    StoreError::Corrupt {
        task: task.to_string(),
        column,
        problem,
    }
}

fn check(v: [Value; 10]) -> Result<Record, StoreError> {
    let text = |i: usize, col: &'static str, task: &str| match &v[i] {
        Value::Text(s) => Ok(Some(s.clone())),
        Value::Null => Ok(None),
        other => Err(corrupt(task, col, format!("is not text ({other:?})"))),
    };
    let num = |i: usize, col: &'static str, task: &str| match &v[i] {
        Value::Integer(n) => u64::try_from(*n)
            .map(Some)
            .map_err(|_| corrupt(task, col, format!("is negative ({n})"))),
        Value::Null => Ok(None),
        other => Err(corrupt(task, col, format!("is not an integer ({other:?})"))),
    };
    let task = text(1, "history.task", "?")?.unwrap_or_default();
    let need = |x: Option<u64>, col| x.ok_or_else(|| corrupt(&task, col, "is missing".into()));
    let ended = match text(6, "history.ended", &task)? {
        None => None,
        Some(s) => Some(
            Ended::parse(&s)
                .ok_or_else(|| corrupt(&task, "history.ended", format!("is unknown ({s:?})")))?,
        ),
    };
    let outcome = match text(7, "history.outcome", &task)? {
        None => None,
        Some(s) => Some(
            Outcome::parse(&s)
                .ok_or_else(|| corrupt(&task, "history.outcome", format!("is unknown ({s:?})")))?,
        ),
    };
    let exit_code = match &v[8] {
        Value::Null => None,
        Value::Integer(n) => Some(
            i32::try_from(*n)
                .map_err(|_| corrupt(&task, "history.exit_code", format!("is {n}")))?,
        ),
        other => {
            return Err(corrupt(
                &task,
                "history.exit_code",
                format!("is not an integer ({other:?})"),
            ));
        }
    };
    Ok(Record {
        token: need(num(0, "history.token", &task)?, "history.token")?,
        holder: text(2, "history.holder", &task)?.unwrap_or_default(),
        principal: text(3, "history.principal", &task)?.unwrap_or_default(),
        acquired_ms: need(num(4, "history.acquired_at", &task)?, "history.acquired_at")?,
        ended_ms: num(5, "history.ended_at", &task)?,
        ended,
        outcome,
        exit_code,
        held_ms: num(9, "history.held_ms", &task)?,
        task,
    })
}

/// Up to `limit` attempts (of `task`, or of every task), newest first,
/// with tokens below `before`.
pub fn page(
    conn: &Connection,
    task: Option<&str>,
    before: Option<u64>,
    limit: usize,
) -> Result<Vec<Record>, StoreError> {
    let limit = i64::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(1);
    let before = before.map(to_i64).transpose()?;
    let sql = format!(
        "SELECT {COLUMNS} FROM history WHERE (?1 IS NULL OR task = ?1) AND (?2 IS NULL OR token < ?2)
         ORDER BY token DESC LIMIT ?3"
    );
    let raws = conn
        .prepare_cached(&sql)
        .and_then(|mut st| {
            st.query_map(params![task, before, limit], |r| {
                let mut v: [Value; 10] = std::array::from_fn(|_| Value::Null);
                for (i, slot) in v.iter_mut().enumerate() {
                    *slot = r.get(i)?;
                }
                Ok(v)
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .ctx("reading history")?;
    raws.into_iter().map(check).collect()
}

/// When each task last ended with a release reporting `succeeded`
/// (wall-clock ms), from the rows still kept.
pub fn last_successes(conn: &Connection) -> Result<Vec<(String, u64)>, StoreError> {
    conn.prepare(
        "SELECT task, MAX(ended_at) FROM history
         WHERE outcome = 'succeeded' AND ended_at IS NOT NULL GROUP BY task",
    )
    .and_then(|mut st| {
        st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()
    })
    .ctx("reading the last successes")
    .map(|v| {
        v.into_iter()
            .map(|(t, ms)| (t, u64::try_from(ms).unwrap_or(0)))
            .collect()
    })
}

/// When attempt `token` was acquired and when it ended (for a held task:
/// when its lease expired), wall-clock ms; `None` if it is not kept.
pub fn times(conn: &Connection, token: u64) -> Result<Option<(u64, Option<u64>)>, StoreError> {
    let t = to_i64(token)?;
    let v: Option<(i64, Option<i64>)> = conn
        .prepare_cached("SELECT acquired_at, ended_at FROM history WHERE token = ?1")
        .and_then(|mut st| {
            st.query_row(params![t], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .ctx("reading an attempt")?;
    let ms = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(v.map(|(a, e)| (ms(a), e.map(ms))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::history::{DEFAULT_BOUNDS, rfc3339};
    use crate::engine::sqlite::schema::{HISTORY, HISTORY_PSEQ};
    use std::time::Duration;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(HISTORY).unwrap();
        c.execute_batch(HISTORY_PSEQ).unwrap();
        c
    }

    #[test]
    fn rows_begin_end_page_and_stay_bounded() {
        let c = db();
        let bounds = Bounds {
            max_age: Duration::from_secs(3600),
            max_rows: 5,
            max_rows_per_principal: 100,
        };
        for t in 1..=12u64 {
            let task = if t % 2 == 0 { "even" } else { "odd" };
            apply(
                &c,
                &Op::Begin {
                    task: task.into(),
                    token: t,
                    holder: "<h>".into(),
                    principal: "p".into(),
                    at_ms: 1_000_000 + t,
                },
                bounds,
            )
            .unwrap();
            apply(
                &c,
                &Op::End {
                    token: t,
                    ended: Ended::Released,
                    at_ms: 1_000_100 + t,
                    outcome: Some(Outcome::Succeeded),
                    exit_code: Some(0),
                    overwrite: true,
                },
                bounds,
            )
            .unwrap();
        }
        let all = page(&c, None, None, 100).unwrap();
        let tokens: Vec<u64> = all.iter().map(|r| r.token).collect();
        assert_eq!(
            tokens,
            vec![12, 11, 10, 9, 8],
            "newest first, at most max_rows"
        );
        assert_eq!(all[0].held_ms, Some(100));
        let even = page(&c, Some("even"), Some(12), 2).unwrap();
        assert_eq!(
            even.iter().map(|r| r.token).collect::<Vec<_>>(),
            vec![10, 8]
        );
        // An expiry noticed late does not overwrite a release.
        apply(
            &c,
            &Op::End {
                token: 12,
                ended: Ended::Expired,
                at_ms: 5,
                outcome: None,
                exit_code: None,
                overwrite: false,
            },
            bounds,
        )
        .unwrap();
        assert_eq!(
            page(&c, None, None, 1).unwrap()[0].ended,
            Some(Ended::Released)
        );
        // Old finished rows go by age, a bounded batch per grant.
        let later = 1_000_000 + 7_200_000;
        apply(
            &c,
            &Op::Begin {
                task: "odd".into(),
                token: 13,
                holder: "h".into(),
                principal: "".into(),
                at_ms: later,
            },
            bounds,
        )
        .unwrap();
        assert_eq!(page(&c, None, None, 100).unwrap().len(), 1);
        assert_eq!(
            page(&c, None, None, 100).unwrap()[0].attempt().acquired_at,
            rfc3339(later)
        );
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn a_bad_stored_value_is_corrupt() {
        let c = db();
        apply(
            &c,
            &Op::Begin {
                task: "t".into(),
                token: 1,
                holder: "h".into(),
                principal: "".into(),
                at_ms: 1,
            },
            DEFAULT_BOUNDS,
        )
        .unwrap();
        c.execute("UPDATE history SET ended = 'vanished'", [])
            .unwrap();
        assert!(matches!(
            page(&c, None, None, 10),
            Err(StoreError::Corrupt { .. })
        ));
    }

    fn begin(c: &Connection, token: u64, principal: &str, bounds: Bounds) {
        let op = Op::Begin {
            task: format!("{principal}-task"),
            token,
            holder: "h".into(),
            principal: principal.into(),
            at_ms: 1_000_000 + token,
        };
        apply(c, &op, bounds).unwrap();
    }

    fn rows_of(c: &Connection, principal: &str) -> Vec<u64> {
        page(c, None, None, 1000)
            .unwrap()
            .into_iter()
            .filter(|r| r.principal == principal)
            .map(|r| r.token)
            .collect()
    }

    #[test]
    fn one_principal_s_churn_keeps_to_its_own_rows() {
        let c = db();
        let bounds = Bounds {
            max_age: Duration::from_secs(3600),
            max_rows: 50,
            max_rows_per_principal: 10,
        };
        for t in 1..=5 {
            begin(&c, t, "quiet", bounds);
        }
        // 3,100 attempts of another principal, as in the report.
        for t in 6..=3105 {
            begin(&c, t, "churn", bounds);
        }
        assert_eq!(rows_of(&c, "quiet"), vec![5, 4, 3, 2, 1]);
        assert_eq!(
            rows_of(&c, "churn"),
            (3096..=3105).rev().collect::<Vec<_>>()
        );
        // The total bound: many principals, each within its own bound, are
        // cut to max_rows (at the next multiple of TOTAL_PRUNE_EVERY),
        // oldest first.
        let mut t = 3106;
        for p in 0..10 {
            for _ in 0..10 {
                begin(&c, t, &format!("p{p}"), bounds);
                t += 1;
            }
        }
        while t % TOTAL_PRUNE_EVERY != 1 {
            begin(&c, t, "p0", bounds);
            t += 1;
        }
        let all = page(&c, None, None, 1000).unwrap();
        assert_eq!(all.len(), 50);
        assert_eq!(all[0].token, t - 1);
        // The oldest went first: the quiet principal's and the churn's.
        assert!(rows_of(&c, "quiet").is_empty());
        assert!(rows_of(&c, "churn").is_empty());
        assert_eq!(rows_of(&c, "p9").len(), 10);
    }
}
