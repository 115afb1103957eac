//! The PostgreSQL store: the storage seam ([`super::store`]) on a database
//! that several `serve` replicas share, one of which leads.
//!
//! - `connect.rs`: the URL, the password, TLS (`--store`, `--store-password-file`);
//! - `tls.rs`: TLS over tokio-rustls for the client;
//! - `conn.rs`: one connection, its calls run to completion on the store's
//!   runtime within a deadline, remade after a failure;
//! - `schema.rs`: the schema and its migrations;
//! - `rows.rs`: rows read back and checked, writes and their parameters;
//! - `leader.rs`: the leadership row (observe, take over, renew, release)
//!   and the replication check;
//! - here: [`PgStore`] (what a leader's engine runs on), [`PgTxn`] (one
//!   transaction: its writes pipelined, checked against the leader epoch)
//!   and [`PgReader`] (history reads on a connection of their own).
//!
//! **The fence.** A [`PgStore`] is opened for one leader epoch. Each of
//! its transactions first reads the leadership row `FOR SHARE` and goes on
//! only if the epoch is still its own: a takeover's `UPDATE` of that row
//! waits for every transaction that holds the share lock and is then seen
//! by every later one, so a deposed leader's writes are refused in the
//! very transaction that carries them ([`StoreError::Deposed`]), and a new
//! leader's load (after its takeover committed) sees everything the old
//! leader ever committed. Tokens come from `seq`, written with every group
//! of grants: a new leader issues above every token ever committed.
//!
//! **Pipelining.** The writer's group of changes is sent in one go (the
//! fence read, every row, history write and the sequence, then `COMMIT`):
//! two round trips per group whatever its size. A write that fails fails
//! the transaction (the seam allows a store to defer its writes so).

pub mod conn;
pub mod connect;
pub mod leader;
pub mod rows;
pub mod schema;
pub mod tls;

use futures_util::future::{try_join, try_join_all};
use tokio::runtime::Handle;
use tokio_postgres::types::ToSql;

use super::error::StoreError;
use super::history::{Bounds, Op, Record};
use super::rules::TaskRow;
use super::store::{HistoryRead, Snapshot, Store, Txn};
use conn::{CALL_TIMEOUT, Conn, block};
use connect::PgConfig;
use rows::Write;

/// The fence: the leadership row, share-locked for the transaction.
const FENCE: &str = "SELECT epoch FROM leaseagent.leader WHERE id = 1 FOR SHARE";

/// The store a leader of epoch `epoch` writes through.
pub struct PgStore {
    conn: Conn,
    epoch: u64,
    /// What [`Store::load`] was given (rows read later get a ttl from it).
    restart_at_ms: u64,
    bounds: Bounds,
}

impl PgStore {
    /// A store for the leader of `epoch` (connects on first use).
    pub fn open(cfg: PgConfig, rt: Handle, epoch: u64, bounds: Bounds) -> Self {
        PgStore {
            conn: Conn::new(cfg, rt),
            epoch,
            restart_at_ms: 0,
            bounds,
        }
    }

    /// Checks the database once at start: reachable, the primary, not
    /// replicating to standbys that could lose answered commits unless
    /// `allow_async` ([`leader::judge`]; checked again at every takeover),
    /// its schema brought up to date (or refused if newer).
    pub fn prepare(cfg: &PgConfig, rt: &Handle, allow_async: bool) -> Result<(), StoreError> {
        let mut l = leader::Leadership::new(Conn::new(cfg.clone(), rt.clone()));
        let replication = l.replication(CALL_TIMEOUT)?;
        leader::judge(&replication, allow_async)?;
        let mut conn = Conn::new(cfg.clone(), rt.clone());
        schema::migrate(&mut conn)
    }

    fn load_all(&mut self, now_ms: u64) -> Result<Snapshot, StoreError> {
        let rt = self.conn.handle().clone();
        let client = self.conn.client()?;
        block(&rt, "loading the leases", CALL_TIMEOUT, async {
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await?;
            let seq = tx.query_opt(rows::SEQ_GET, &[]).await?;
            let tasks = tx.query(rows::SELECT_ROWS, &[]).await?;
            let successes = tx.query(rows::LAST_SUCCESSES, &[]).await?;
            tx.commit().await?;
            Ok((seq, tasks, successes))
        })
        .and_then(|(seq, tasks, successes)| {
            let rows = tasks
                .iter()
                .map(|r| rows::task_row(r, now_ms))
                .collect::<Result<Vec<_>, _>>()?;
            let last_successes = successes
                .iter()
                .filter_map(|r| {
                    let task: Option<String> = r.try_get(0).ok();
                    let at: Option<i64> = r.try_get(1).ok().flatten();
                    Some((task?, u64::try_from(at?).ok()?))
                })
                .collect();
            Ok(Snapshot {
                last_issued: rows::sequence(seq)?,
                rows,
                last_successes,
            })
        })
    }

    fn transaction_once(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let rt = self.conn.handle().clone();
        let stmts = Stmts::prepare(&mut self.conn)?;
        let client = self.conn.client()?;
        let tx = block(
            &rt,
            "beginning a transaction",
            CALL_TIMEOUT,
            client.transaction(),
        )?;
        let mut t = PgTxn {
            tx,
            rt,
            stmts,
            pending: Vec::new(),
            begins: None,
            fenced: false,
            epoch: self.epoch,
            restart_at_ms: self.restart_at_ms,
            bounds: self.bounds,
        };
        f(&mut t)?;
        t.flush()?;
        let PgTxn { tx, rt, .. } = t;
        block(&rt, "committing", CALL_TIMEOUT, tx.commit())
    }
}

impl Store for PgStore {
    fn load(&mut self, now_ms: u64) -> Result<Snapshot, StoreError> {
        self.restart_at_ms = now_ms;
        let r = self.load_all(now_ms);
        self.conn.failed(r)
    }

    fn transaction(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let r = self.transaction_once(f);
        self.conn.failed(r)
    }

    fn reader(&self) -> Result<Box<dyn HistoryRead>, StoreError> {
        Ok(Box::new(PgReader::new(
            self.conn_config(),
            self.conn.handle().clone(),
        )))
    }
}

impl PgStore {
    fn conn_config(&self) -> PgConfig {
        self.conn.config().clone()
    }
}

/// The statements a transaction may use, prepared on its connection.
#[derive(Clone)]
struct Stmts(Vec<(&'static str, tokio_postgres::Statement)>);

impl Stmts {
    const ALL: [&'static str; 11] = [
        FENCE,
        rows::SELECT_ROW,
        rows::UPSERT,
        rows::DELETE,
        rows::SEQ_GET,
        rows::SEQ_SET,
        rows::HIST_BEGIN,
        rows::HIST_END,
        rows::PRUNE_COUNT,
        rows::PRUNE_AGE,
        rows::PRUNE_PRINCIPAL,
    ];

    /// Prepares them (once per connection: `Conn` keeps them).
    fn prepare(conn: &mut Conn) -> Result<Self, StoreError> {
        let mut v = Vec::new();
        for sql in Self::ALL {
            v.push((sql, conn.stmt(sql)?));
        }
        Ok(Stmts(v))
    }

    fn get(&self, sql: &'static str) -> Result<&tokio_postgres::Statement, StoreError> {
        self.0
            .iter()
            .find(|(s, _)| *s == sql)
            .map(|(_, st)| st)
            .ok_or(StoreError::Failed)
    }
}

/// One transaction of a leader: writes kept until [`PgTxn::flush`], which
/// sends the fence and all of them at once.
pub struct PgTxn<'a> {
    tx: tokio_postgres::Transaction<'a>,
    rt: Handle,
    stmts: Stmts,
    pending: Vec<Write>,
    /// The newest grant of the transaction (token, wall ms) and how many
    /// there were: the history is pruned once, after them.
    begins: Option<(u64, u64, u64)>,
    fenced: bool,
    epoch: u64,
    restart_at_ms: u64,
    bounds: Bounds,
}

impl PgTxn<'_> {
    /// Sends the fence (first time) and every pending write, pipelined;
    /// checks the epoch and that the sequence was written.
    fn flush(&mut self) -> Result<(), StoreError> {
        if let Some((token, at, n)) = self.begins.take() {
            self.pending.extend(rows::prune(token, at, n, self.bounds)?);
        }
        let pending = std::mem::take(&mut self.pending);
        let need_fence = !self.fenced;
        if pending.is_empty() && !need_fence {
            return Ok(());
        }
        let mut calls = Vec::with_capacity(pending.len());
        for w in &pending {
            calls.push((self.stmts.get(w.sql)?, w));
        }
        let fence = self.stmts.get(FENCE)?.clone();
        let tx = &self.tx;
        let (epoch, counts) = block(&self.rt, "writing", CALL_TIMEOUT, async {
            let params: Vec<Vec<&(dyn ToSql + Sync)>> = calls
                .iter()
                .map(|(_, w)| {
                    w.params
                        .iter()
                        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                        .collect()
                })
                .collect();
            let fence_read = async {
                if need_fence {
                    tx.query_one(&fence, &[])
                        .await
                        .map(|r| Some(r.get::<_, i64>(0)))
                } else {
                    Ok(None)
                }
            };
            let writes = try_join_all(
                calls
                    .iter()
                    .zip(&params)
                    .map(|((st, _), p)| tx.execute(*st, p.as_slice())),
            );
            try_join(fence_read, writes).await
        })?;
        if let Some(current) = epoch {
            let current = u64::try_from(current).unwrap_or(0);
            if current != self.epoch {
                return Err(StoreError::Deposed {
                    mine: self.epoch,
                    current,
                });
            }
            self.fenced = true;
        }
        for (w, n) in pending.iter().zip(counts) {
            if w.one_row && n != 1 {
                return Err(StoreError::CorruptSequence("is missing".into()));
            }
        }
        Ok(())
    }
}

impl Txn for PgTxn<'_> {
    fn load(&mut self, task: &str) -> Result<TaskRow, StoreError> {
        self.flush()?;
        let st = self.stmts.get(rows::SELECT_ROW)?.clone();
        let tx = &self.tx;
        let row = block(&self.rt, "reading a task", CALL_TIMEOUT, async {
            tx.query_opt(&st, &[&task]).await
        })?;
        match row {
            None => Ok(TaskRow::new(task)),
            Some(r) => rows::task_row(&r, self.restart_at_ms),
        }
    }

    fn save(&mut self, row: &TaskRow) -> Result<(), StoreError> {
        self.pending.push(rows::save(row)?);
        Ok(())
    }

    fn last_issued(&mut self) -> Result<u64, StoreError> {
        self.flush()?;
        let st = self.stmts.get(rows::SEQ_GET)?.clone();
        let tx = &self.tx;
        let row = block(
            &self.rt,
            "reading the token sequence",
            CALL_TIMEOUT,
            async { tx.query_opt(&st, &[]).await },
        )?;
        rows::sequence(row)
    }

    fn set_last_issued(&mut self, token: u64) -> Result<(), StoreError> {
        self.pending.push(rows::set_last_issued(token)?);
        Ok(())
    }

    fn record(&mut self, op: &Op, bounds: Bounds) -> Result<(), StoreError> {
        self.pending.push(rows::record(op)?);
        if let Op::Begin {
            token,
            at_ms,
            principal,
            ..
        } = op
        {
            let (t, a, n) = self.begins.unwrap_or((0, 0, 0));
            self.begins = Some((t.max(*token), a.max(*at_ms), n + 1));
            self.pending.push(rows::prune_principal(principal, bounds)?);
        }
        Ok(())
    }
}

/// History reads, on a connection of their own (they never wait for the
/// writer's commits).
pub struct PgReader {
    conn: Conn,
}

impl PgReader {
    pub fn new(cfg: PgConfig, rt: Handle) -> Self {
        PgReader {
            conn: Conn::new(cfg, rt),
        }
    }

    fn page_once(
        &mut self,
        task: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let st = self.conn.stmt(rows::HIST_PAGE)?;
        let rt = self.conn.handle().clone();
        let client = self.conn.client()?;
        let limit = i64::try_from(limit.clamp(1, super::api::MAX_PAGE)).unwrap_or(1);
        let before = before.map(super::error::to_i64).transpose()?;
        let rows = block(&rt, "reading history", CALL_TIMEOUT, async {
            client.query(&st, &[&task, &before, &limit]).await
        })?;
        rows.iter().map(rows::record_of).collect()
    }

    fn times_once(&mut self, token: u64) -> Result<Option<(u64, Option<u64>)>, StoreError> {
        let st = self.conn.stmt(rows::HIST_TIMES)?;
        let rt = self.conn.handle().clone();
        let client = self.conn.client()?;
        let t = super::error::to_i64(token)?;
        let row = block(&rt, "reading an attempt", CALL_TIMEOUT, async {
            client.query_opt(&st, &[&t]).await
        })?;
        let ms = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(row.and_then(|r| {
            let a: i64 = r.try_get(0).ok()?;
            let e: Option<i64> = r.try_get(1).ok()?;
            Some((ms(a), e.map(ms)))
        }))
    }
}

impl HistoryRead for PgReader {
    fn page(
        &mut self,
        task: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let r = self.page_once(task, before, limit);
        self.conn.failed(r)
    }

    fn times(&mut self, token: u64) -> Result<Option<(u64, Option<u64>)>, StoreError> {
        let r = self.times_once(token);
        self.conn.failed(r)
    }
}
