//! The PostgreSQL store's schema, created and migrated by `serve` itself.
//!
//! Everything lives in the schema `leaseagent` of the database the URL
//! names (the role needs `CREATE` on that database the first time, and to
//! own the schema after). `leaseagent.meta` holds `schema_version`: the
//! number of [`MIGRATIONS`] applied. On every start, under a transaction-
//! scoped advisory lock (so replicas starting together migrate once), the
//! missing migrations are applied in order, in that one transaction; a
//! version above what this build knows is refused
//! ([`StoreError::SchemaNewer`]): an older replica must not write rows it
//! cannot read. Migrations are append-only: a released one never changes.
//!
//! The tables (version 1):
//! - `tasks`, `seq`, `history`: the same rows as SQLite's (`sqlite/schema.rs`),
//!   without the embedded engine's expiry columns (serve keeps expiries in
//!   memory; the Restart rule gives every lease on record a full ttl when a
//!   leader takes over). Flags are `boolean`, numbers `bigint`.
//! - `leader`: one row, the leadership lease: `epoch` (bumped by every
//!   takeover; every write of a leader checks it, `leader.rs`), `holder`
//!   (the replica's identity, its URL and a random suffix), `url`, `beat`
//!   (bumped by every renewal: standbys watch it move), `since_ms`,
//!   `renewed_ms` (wall-clock ms, for people).
//! - `takeovers`: one row per takeover (the epoch it began, who took over
//!   from whom, when): the history of leadership the status page shows.
//! - `replicas`: each replica's URL and when it last looked at the store.

use super::conn::{CALL_TIMEOUT, Conn, block};
use crate::engine::error::StoreError;

/// The schema's migrations, in order; the version is how many are applied.
pub const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE leaseagent.tasks(
  task text PRIMARY KEY,
  last_token bigint NOT NULL,
  token bigint,
  holder text,
  ttl_ms bigint,
  policy text,
  grace_ms bigint,
  revoked boolean NOT NULL DEFAULT false,
  held boolean NOT NULL DEFAULT false,
  ended_token bigint,
  ended_reason text,
  principal text,
  lease_key text
);
CREATE TABLE leaseagent.seq(id int PRIMARY KEY CHECK (id = 1), last_token bigint NOT NULL);
INSERT INTO leaseagent.seq VALUES (1, 0);
CREATE TABLE leaseagent.history(
  token bigint PRIMARY KEY,
  task text NOT NULL,
  holder text NOT NULL,
  principal text NOT NULL,
  acquired_at bigint NOT NULL,
  ended_at bigint,
  ended text,
  outcome text,
  exit_code int,
  held_ms bigint
);
CREATE INDEX history_task ON leaseagent.history(task, token);
CREATE TABLE leaseagent.leader(
  id int PRIMARY KEY CHECK (id = 1),
  epoch bigint NOT NULL,
  holder text,
  url text,
  beat bigint NOT NULL,
  since_ms bigint,
  renewed_ms bigint
);
INSERT INTO leaseagent.leader VALUES (1, 0, NULL, NULL, 0, NULL, NULL);
CREATE TABLE leaseagent.takeovers(
  epoch bigint PRIMARY KEY,
  holder text NOT NULL,
  url text NOT NULL,
  previous text,
  at_ms bigint NOT NULL
);
CREATE TABLE leaseagent.replicas(
  url text PRIMARY KEY,
  holder text NOT NULL,
  seen_ms bigint NOT NULL
);",
    // 2: each attempt's number among its principal's (`pseq`), so one
    // principal's churn prunes only its own history (engine/history.rs).
    "ALTER TABLE leaseagent.history ADD COLUMN pseq bigint;
CREATE INDEX history_principal ON leaseagent.history(principal, pseq);",
];

/// The version this build writes.
pub fn latest() -> i64 {
    MIGRATIONS.len() as i64
}

/// Brings the schema up to [`latest`], once, whoever else starts too.
pub fn migrate(conn: &mut Conn) -> Result<(), StoreError> {
    let r = migrate_once(conn);
    conn.failed(r)
}

fn migrate_once(conn: &mut Conn) -> Result<(), StoreError> {
    let rt = conn.handle().clone();
    let client = conn.client()?;
    block(&rt, "migrating the schema", CALL_TIMEOUT, async {
        let tx = client.transaction().await?;
        tx.batch_execute(
            "SELECT pg_advisory_xact_lock(7240853691);
             CREATE SCHEMA IF NOT EXISTS leaseagent;
             CREATE TABLE IF NOT EXISTS leaseagent.meta(key text PRIMARY KEY, value text NOT NULL);",
        )
        .await?;
        let row = tx
            .query_opt(
                "SELECT value FROM leaseagent.meta WHERE key = 'schema_version'",
                &[],
            )
            .await?;
        let found: Option<String> = row.map(|r| r.get(0));
        Ok((tx, found))
    })
    .and_then(|(tx, found)| {
        let version = match found {
            None => 0,
            Some(v) => v.parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| {
                StoreError::Corrupt {
                    task: "-".into(),
                    column: "meta.schema_version",
                    problem: format!("is {v:?}"),
                }
            })?,
        };
        if version > latest() {
            return Err(StoreError::SchemaNewer {
                found: version,
                known: latest(),
            });
        }
        block(&rt, "migrating the schema", CALL_TIMEOUT, async {
            for m in &MIGRATIONS[version as usize..] {
                tx.batch_execute(m).await?;
            }
            tx.execute(
                "INSERT INTO leaseagent.meta(key, value) VALUES ('schema_version', $1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&latest().to_string()],
            )
            .await?;
            tx.commit().await
        })
    })
}
