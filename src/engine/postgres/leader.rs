//! The leadership row of the PostgreSQL store, and whether the store's
//! replication keeps answered commits across a failover of PostgreSQL.
//!
//! Leadership is a lease held in the store (`leaseagent.leader`, one row):
//! the leader bumps `beat` well inside its ttl ([`Leadership::renew`],
//! conditional on its `epoch`); a standby reads the row
//! ([`Leadership::observe`]) and may take over only with a compare-and-set
//! on exactly the `(epoch, beat)` it saw ([`Leadership::take_over`]),
//! which bumps `epoch`. When a standby may do that (the row unchanged for a
//! whole ttl on the standby's own monotonic clock) and when a leader stops
//! answering (a ttl, less drift, after the send time of its last confirmed
//! renewal) is decided in `serve/leader.rs`; no clock of the database is
//! trusted, so a jump of its wall clock neither ends nor extends a
//! leadership. The epoch is what fences writes (`mod.rs`).
//!
//! Replication ([`judge`]): a PostgreSQL failover to an asynchronous
//! standby can lose commits that were answered (a grant, and the token
//! sequence with it: tokens would be issued twice). So `serve` refuses a
//! primary that streams to standbys none of which is synchronous, or whose
//! commits do not wait for the standby (`synchronous_commit` below `on`),
//! unless told `--store-allow-async` (then that risk is the operator's).
//! Patroni in `synchronous_mode` (`synchronous_standby_names` set, a sync
//! standby streaming) passes, and never promotes a standby that could miss
//! an acknowledged commit.

use std::time::Duration;

use super::conn::{Conn, block};
use crate::engine::error::{StoreError, to_i64};

/// The leadership row as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderRow {
    pub epoch: u64,
    /// The leading replica's identity (its URL and a random suffix), or
    /// `None`: nobody leads (a fresh store, or the leader let go).
    pub holder: Option<String>,
    pub url: Option<String>,
    /// Bumped by every renewal: standbys watch it move.
    pub beat: u64,
    /// When the current leader took over (wall-clock ms, for people).
    pub since_ms: Option<u64>,
}

/// One takeover, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Takeover {
    pub epoch: u64,
    pub url: String,
    pub previous: Option<String>,
    pub at_ms: u64,
}

/// A replica and when it last looked at the store (wall-clock ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub url: String,
    pub seen_ms: u64,
}

const READ: &str = "SELECT epoch, holder, url, beat, since_ms FROM leaseagent.leader WHERE id = 1";
const SEEN: &str = "INSERT INTO leaseagent.replicas(url, holder, seen_ms) VALUES ($1, $2, $3)
     ON CONFLICT (url) DO UPDATE SET holder = excluded.holder, seen_ms = excluded.seen_ms";
const TAKE: &str =
    "UPDATE leaseagent.leader SET epoch = epoch + 1, holder = $3, url = $4, beat = 0,
       since_ms = $5, renewed_ms = $5
     WHERE id = 1 AND epoch = $1 AND beat = $2 RETURNING epoch";
const LOG: &str = "INSERT INTO leaseagent.takeovers(epoch, holder, url, previous, at_ms)
     VALUES ($1, $2, $3, $4, $5)";
const RENEW: &str = "UPDATE leaseagent.leader SET beat = beat + 1, renewed_ms = $2
     WHERE id = 1 AND epoch = $1";
const RELEASE: &str = "UPDATE leaseagent.leader SET holder = NULL, url = NULL, beat = beat + 1
     WHERE id = 1 AND epoch = $1";
const REPLICAS: &str = "SELECT url, seen_ms FROM leaseagent.replicas ORDER BY url LIMIT 64";
const TAKEOVERS: &str =
    "SELECT epoch, url, previous, at_ms FROM leaseagent.takeovers ORDER BY epoch DESC LIMIT $1";
const REPLICATION: &str = "SELECT pg_is_in_recovery(),
       current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       (SELECT count(*) FROM pg_stat_replication),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)";

/// A connection for the leadership calls (apart from the writer's, so a
/// group commit never delays a renewal).
pub struct Leadership {
    conn: Conn,
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Leadership {
    pub fn new(conn: Conn) -> Self {
        Leadership { conn }
    }

    fn call<T>(
        &mut self,
        r: impl FnOnce(&mut Conn) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let r = r(&mut self.conn);
        self.conn.failed(r)
    }

    /// Reads the row, and records that replica `url` (`holder`) looked.
    pub fn observe(
        &mut self,
        url: &str,
        holder: &str,
        now_wall: u64,
        after: Duration,
    ) -> Result<LeaderRow, StoreError> {
        let now = to_i64(now_wall)?;
        self.call(|c| {
            let (read, seen) = (c.stmt(READ)?, c.stmt(SEEN)?);
            let rt = c.handle().clone();
            let client = c.client()?;
            let (row, _) = block(&rt, "reading the leader", after, async {
                futures_util::future::try_join(
                    client.query_one(&read, &[]),
                    client.execute(&seen, &[&url, &holder, &now]),
                )
                .await
            })?;
            let corrupt = |problem: String| StoreError::Corrupt {
                task: "-".into(),
                column: "leader.epoch",
                problem,
            };
            let epoch: i64 = row.try_get(0).map_err(|e| corrupt(e.to_string()))?;
            let beat: i64 = row.try_get(3).map_err(|e| corrupt(e.to_string()))?;
            if epoch < 0 || beat < 0 {
                return Err(corrupt(format!("epoch {epoch}, beat {beat}")));
            }
            Ok(LeaderRow {
                epoch: u(epoch),
                holder: row.try_get(1).ok().flatten(),
                url: row.try_get(2).ok().flatten(),
                beat: u(beat),
                since_ms: row.try_get::<_, Option<i64>>(4).ok().flatten().map(u),
            })
        })
    }

    /// Takes over from `seen` if the row is still exactly that (epoch and
    /// beat), recording the takeover; the new epoch, or `None` if the row
    /// moved (its leader renewed, or another replica took over first).
    pub fn take_over(
        &mut self,
        seen: &LeaderRow,
        holder: &str,
        url: &str,
        now_wall: u64,
        after: Duration,
    ) -> Result<Option<u64>, StoreError> {
        let (epoch, beat, now) = (to_i64(seen.epoch)?, to_i64(seen.beat)?, to_i64(now_wall)?);
        let previous = seen.url.clone();
        self.call(|c| {
            let (take, log) = (c.stmt(TAKE)?, c.stmt(LOG)?);
            let rt = c.handle().clone();
            let client = c.client()?;
            block(&rt, "taking over", after, async {
                let tx = client.transaction().await?;
                let row = tx
                    .query_opt(&take, &[&epoch, &beat, &holder, &url, &now])
                    .await?;
                let Some(row) = row else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                let new: i64 = row.get(0);
                tx.execute(&log, &[&new, &holder, &url, &previous, &now])
                    .await?;
                tx.commit().await?;
                Ok(Some(u(new)))
            })
        })
    }

    /// Renews leadership `epoch`; false if another replica took over.
    pub fn renew(
        &mut self,
        epoch: u64,
        now_wall: u64,
        after: Duration,
    ) -> Result<bool, StoreError> {
        let (epoch, now) = (to_i64(epoch)?, to_i64(now_wall)?);
        self.call(|c| {
            let st = c.stmt(RENEW)?;
            let rt = c.handle().clone();
            let client = c.client()?;
            block(&rt, "renewing the leadership", after, async {
                client.execute(&st, &[&epoch, &now]).await
            })
            .map(|n| n == 1)
        })
    }

    /// Lets go of leadership `epoch` (a clean stop: standbys take over at
    /// once instead of after a ttl). Call only once nothing of this leader
    /// answers any more.
    pub fn release(&mut self, epoch: u64, after: Duration) -> Result<bool, StoreError> {
        let epoch = to_i64(epoch)?;
        self.call(|c| {
            let st = c.stmt(RELEASE)?;
            let rt = c.handle().clone();
            let client = c.client()?;
            block(&rt, "letting go of the leadership", after, async {
                client.execute(&st, &[&epoch]).await
            })
            .map(|n| n == 1)
        })
    }

    /// The replicas that looked at the store, and the last takeovers
    /// (newest first), for the status page.
    pub fn roster(
        &mut self,
        takeovers: i64,
        after: Duration,
    ) -> Result<(Vec<Seen>, Vec<Takeover>), StoreError> {
        self.call(|c| {
            let (rs, ts) = (c.stmt(REPLICAS)?, c.stmt(TAKEOVERS)?);
            let rt = c.handle().clone();
            let client = c.client()?;
            let (replicas, taken) = block(&rt, "reading the replicas", after, async {
                futures_util::future::try_join(
                    client.query(&rs, &[]),
                    client.query(&ts, &[&takeovers]),
                )
                .await
            })?;
            let seen = replicas
                .iter()
                .filter_map(|r| {
                    Some(Seen {
                        url: r.try_get(0).ok()?,
                        seen_ms: u(r.try_get(1).ok()?),
                    })
                })
                .collect();
            let taken = taken
                .iter()
                .filter_map(|r| {
                    Some(Takeover {
                        epoch: u(r.try_get(0).ok()?),
                        url: r.try_get(1).ok()?,
                        previous: r.try_get(2).ok()?,
                        at_ms: u(r.try_get(3).ok()?),
                    })
                })
                .collect();
            Ok((seen, taken))
        })
    }

    /// What the primary says of its replication ([`judge`] decides).
    pub fn replication(&mut self, after: Duration) -> Result<Replication, StoreError> {
        self.call(|c| {
            let st = c.stmt(REPLICATION)?;
            let rt = c.handle().clone();
            let client = c.client()?;
            let r = block(&rt, "reading the replication state", after, async {
                client.query_one(&st, &[]).await
            })?;
            let bad = |e: tokio_postgres::Error| StoreError::Replication(e.to_string());
            Ok(Replication {
                in_recovery: r.try_get(0).map_err(bad)?,
                sync_names: r.try_get(1).map_err(bad)?,
                synchronous_commit: r.try_get(2).map_err(bad)?,
                standbys: u(r.try_get(3).map_err(bad)?),
                sync_standbys: u(r.try_get(4).map_err(bad)?),
                unknown: u(r.try_get(5).map_err(bad)?),
            })
        })
    }
}

/// The primary's replication, as it reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replication {
    /// Connected to a standby (read-only): not the primary.
    pub in_recovery: bool,
    pub sync_names: String,
    pub synchronous_commit: String,
    /// Standbys streaming from it, how many of them synchronously, and how
    /// many whose state this role may not see (it needs `pg_monitor`).
    pub standbys: u64,
    pub sync_standbys: u64,
    pub unknown: u64,
}

/// Whether `serve` may run on a store replicating as `r`: `Err` says why
/// not and how to fix it or opt in.
pub fn judge(r: &Replication, allow_async: bool) -> Result<(), StoreError> {
    let refuse = |why: String| Err(StoreError::Replication(why));
    if r.in_recovery {
        return refuse(
            "the server is a standby (in recovery): connect to the primary (several hosts in the \
             URL are tried in turn for the one that accepts writes)"
                .into(),
        );
    }
    if r.standbys == 0 {
        return Ok(());
    }
    if r.unknown > 0 && r.sync_standbys == 0 {
        return refuse(format!(
            "{} standby(s) stream from this primary but this role may not see whether they are \
             synchronous: GRANT pg_monitor TO the role serve uses (or --store-allow-async)",
            r.standbys
        ));
    }
    let waits = matches!(r.synchronous_commit.as_str(), "on" | "remote_apply");
    if r.sync_standbys > 0 && !r.sync_names.trim().is_empty() && waits {
        return Ok(());
    }
    if allow_async {
        log::warn!(
            "PostgreSQL store: {} standby(s), none synchronous: a failover of PostgreSQL may lose \
             answered grants and issue their tokens again (allowed by --store-allow-async)",
            r.standbys
        );
        return Ok(());
    }
    refuse(format!(
        "{} standby(s) stream from this primary and none is synchronous (synchronous_standby_names \
         = {:?}, synchronous_commit = {}): a failover to one of them could lose answered grants and \
         issue their tokens again. Replicate synchronously (Patroni: synchronous_mode: true), or \
         accept that risk with --store-allow-async",
        r.standbys, r.sync_names, r.synchronous_commit
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_synchronous_replication_passes_unless_allowed() {
        let alone = Replication {
            synchronous_commit: "on".into(),
            ..Default::default()
        };
        assert!(
            judge(&alone, false).is_ok(),
            "no standby: nothing to fail over to"
        );
        let sync = Replication {
            sync_names: "\"node2\"".into(),
            standbys: 2,
            sync_standbys: 1,
            ..alone.clone()
        };
        assert!(judge(&sync, false).is_ok());
        let async_ = Replication {
            sync_names: String::new(),
            sync_standbys: 0,
            ..sync.clone()
        };
        let e = judge(&async_, false).unwrap_err().to_string();
        assert!(
            e.contains("--store-allow-async") && e.contains("synchronous_mode"),
            "{e}"
        );
        assert!(judge(&async_, true).is_ok());
        let local_commit = Replication {
            synchronous_commit: "local".into(),
            ..sync.clone()
        };
        assert!(judge(&local_commit, false).is_err());
        let blind = Replication {
            unknown: 2,
            sync_standbys: 0,
            ..sync.clone()
        };
        assert!(
            judge(&blind, false)
                .unwrap_err()
                .to_string()
                .contains("pg_monitor")
        );
        let standby = Replication {
            in_recovery: true,
            ..alone
        };
        assert!(judge(&standby, true).is_err(), "never on a standby");
    }
}
