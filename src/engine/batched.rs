//! The engine behind `leaseagent serve`: records in memory, grants batched
//! through one durable writer.
//!
//! - Every task's [`TaskRow`] lives in one map under one mutex. Renewals
//!   only update the in-memory expiry (boot-clock milliseconds): no disk I/O.
//! - Anything that must survive a crash (a grant and its token counter, a
//!   revoke, a clear) is applied to memory and, *under the same lock*, queued
//!   to the writer thread, so the queue order is the order of the changes.
//!   The writer commits everything queued in one transaction (WAL,
//!   `synchronous=FULL`: the commit fsyncs) and only then acknowledges each
//!   change; the request thread answers after the acknowledgement. While one
//!   commit is fsyncing the next batch queues up: group commit.
//! - A grant that is in memory but not yet acknowledged is visible to other
//!   acquirers as `held`, which is safe; its id has not been given out, so
//!   nobody can renew it. If a commit fails, the engine stops granting
//!   ([`ServeEngine::healthy`] turns false): memory may be ahead of the disk
//!   and only a restart (which reloads the disk) makes them agree again.
//!   Tokens skipped by a failed commit are simply never issued.
//! - Releases are queued without waiting: a release lost in a crash leaves a
//!   lease on record, which after the restart expires one ttl later — late,
//!   never early.
//! - On start, every lease on record expires `ttl` after now (the protocol's
//!   Restart rule): a live holder renews in time and keeps it, a dead one is
//!   found within one ttl.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use rusqlite::Connection;

use crate::lease::{LeaseInfo, RefusalReason};

use super::rules::{AcquireSpec, Phase, TaskRow, lease_id, parse_lease_id};
use super::store::{self, Expiry};
use super::{EngineError, now_ms, validate_acquire};

/// How long a request waits for its commit before answering 503.
const COMMIT_WAIT: Duration = Duration::from_secs(30);
/// Most changes committed in one transaction.
const MAX_BATCH: usize = 4096;

/// Event counters, read by `/metrics`.
#[derive(Default)]
pub struct Counters {
    pub grants: AtomicU64,
    pub renewals: AtomicU64,
    pub releases: AtomicU64,
    /// Acquires refused because the task is held (live or in grace).
    pub acquire_held: AtomicU64,
    pub acquire_held_for_operator: AtomicU64,
    /// Renewal/release refusals, by reason (expired, superseded, revoked, unknown_lease).
    pub refused: [AtomicU64; 4],
    /// Leases seen to expire (counted once each, when first observed).
    pub expiries: AtomicU64,
    /// Transactions committed by the writer, and changes in them.
    pub commits: AtomicU64,
    pub committed_changes: AtomicU64,
}

impl Counters {
    fn refusal(&self, r: RefusalReason) {
        let i = match r {
            RefusalReason::Expired => 0,
            RefusalReason::Superseded => 1,
            RefusalReason::Revoked => 2,
            RefusalReason::UnknownLease => 3,
        };
        self.refused[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Leases by state, for `/metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub struct StateCounts {
    pub active: u64,
    pub grace: u64,
    pub held_for_operator: u64,
}

struct MemRow {
    row: TaskRow,
    /// The current lease's expiry has been counted.
    expiry_counted: bool,
}

enum Job {
    Write(TaskRow, Option<Sender<Result<(), String>>>),
    Stop,
}

/// The serve engine (shared by all request threads).
pub struct ServeEngine {
    tasks: Mutex<HashMap<String, MemRow>>,
    jobs: Sender<Job>,
    writer: Mutex<Option<JoinHandle<()>>>,
    failed: Arc<AtomicBool>,
    instance: String,
    pub counters: Arc<Counters>,
}

impl ServeEngine {
    /// Opens the database, loads every record (each lease expiring one ttl
    /// from now) and starts the writer.
    pub fn open(path: &Path) -> Result<Self, EngineError> {
        let (conn, instance) = store::open(path, Duration::from_secs(5))?;
        let now = now_ms();
        let rows = store::load_all(&conn, Expiry::RestartAt(now))?;
        let tasks = rows
            .into_iter()
            .map(|row| {
                (
                    row.task.clone(),
                    MemRow {
                        row,
                        expiry_counted: false,
                    },
                )
            })
            .collect();
        let (tx, rx) = crossbeam_channel::unbounded();
        let failed = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let (f2, c2) = (failed.clone(), counters.clone());
        let writer = std::thread::Builder::new()
            .name("lease-writer".into())
            .spawn(move || writer_loop(conn, rx, f2, c2))
            .map_err(|e| EngineError::Storage(format!("starting the writer: {e}")))?;
        Ok(ServeEngine {
            tasks: Mutex::new(tasks),
            jobs: tx,
            writer: Mutex::new(Some(writer)),
            failed,
            instance,
            counters,
        })
    }

    /// False once a commit has failed: the engine no longer grants.
    pub fn healthy(&self) -> bool {
        !self.failed.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, MemRow>> {
        // A panic while holding the lock cannot leave a half-applied change:
        // every change is one assignment of a row computed before it.
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_healthy(&self) -> Result<(), EngineError> {
        if self.healthy() {
            Ok(())
        } else {
            Err(EngineError::Storage(
                "the lease database failed a commit; restart the server".into(),
            ))
        }
    }

    fn count_expiry(&self, m: &mut MemRow, now: u64) {
        if let Some(l) = &m.row.lease {
            if !m.expiry_counted && !matches!(l.phase(now), Phase::Active { .. }) {
                m.expiry_counted = true;
                self.counters.expiries.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Queues a durable write of `row`; the receiver yields once it is committed.
    fn queue(&self, row: &TaskRow, wait: bool) -> Option<Receiver<Result<(), String>>> {
        let (ack, rx) = if wait {
            let (t, r) = crossbeam_channel::bounded(1);
            (Some(t), Some(r))
        } else {
            (None, None)
        };
        if self.jobs.send(Job::Write(row.clone(), ack)).is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        rx
    }

    fn wait(&self, rx: Option<Receiver<Result<(), String>>>) -> Result<(), EngineError> {
        let Some(rx) = rx else { return Ok(()) };
        match rx.recv_timeout(COMMIT_WAIT) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(EngineError::Storage(e)),
            Err(_) => {
                self.failed.store(true, Ordering::Relaxed);
                Err(EngineError::Storage(
                    "the lease database did not commit in time".into(),
                ))
            }
        }
    }

    /// Grants the task if free; answers only once the grant is on disk.
    pub fn acquire(&self, spec: &AcquireSpec) -> Result<(String, u64, u64), EngineError> {
        validate_acquire(spec)?;
        let now = now_ms();
        let (token, rx) = {
            let mut map = self.lock();
            self.check_healthy()?;
            let m = map.entry(spec.task.clone()).or_insert_with(|| MemRow {
                row: TaskRow::new(&spec.task),
                expiry_counted: false,
            });
            self.count_expiry(m, now);
            let token = match m.row.acquire(spec, now, &self.instance) {
                Ok(t) => t,
                Err(e) => {
                    match e {
                        EngineError::Held { .. } => &self.counters.acquire_held,
                        _ => &self.counters.acquire_held_for_operator,
                    }
                    .fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            };
            m.expiry_counted = false;
            (token, self.queue(&m.row, true))
        };
        self.wait(rx)?;
        self.counters.grants.fetch_add(1, Ordering::Relaxed);
        Ok((
            lease_id(&self.instance, token, &spec.task),
            token,
            spec.ttl_ms,
        ))
    }

    fn task_of<'a>(&self, id: &'a str, token: u64) -> Result<&'a str, EngineError> {
        match parse_lease_id(id) {
            Some((inst, t, task)) if inst == self.instance && t == token => Ok(task),
            _ => {
                self.counters.refusal(RefusalReason::UnknownLease);
                Err(EngineError::Refused(RefusalReason::UnknownLease))
            }
        }
    }

    /// Renews in memory only.
    pub fn renew(&self, id: &str, token: u64) -> Result<u64, EngineError> {
        let now = now_ms();
        let task = self.task_of(id, token)?;
        let mut map = self.lock();
        let res = match map.get_mut(task) {
            None => Err(RefusalReason::UnknownLease),
            Some(m) => {
                self.count_expiry(m, now);
                m.row.renew(token, now)
            }
        };
        drop(map);
        match res {
            Ok(ttl) => {
                self.counters.renewals.fetch_add(1, Ordering::Relaxed);
                Ok(ttl)
            }
            Err(r) => {
                self.counters.refusal(r);
                Err(EngineError::Refused(r))
            }
        }
    }

    /// Releases; written to disk without waiting (see the module docs).
    pub fn release(&self, id: &str, token: u64) -> Result<(), EngineError> {
        let now = now_ms();
        let task = self.task_of(id, token)?;
        let mut map = self.lock();
        let res = match map.get_mut(task) {
            None => Err(RefusalReason::UnknownLease),
            Some(m) => {
                self.count_expiry(m, now);
                let r = m.row.release(token, now);
                if r.is_ok() {
                    self.queue(&m.row, false);
                }
                r
            }
        };
        drop(map);
        match res {
            Ok(()) => {
                self.counters.releases.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(r) => {
                self.counters.refusal(r);
                Err(EngineError::Refused(r))
            }
        }
    }

    fn operator(
        &self,
        task: &str,
        f: impl FnOnce(&mut TaskRow, u64) -> Result<u64, EngineError>,
    ) -> Result<u64, EngineError> {
        super::validate_task(task).map_err(EngineError::BadRequest)?;
        let now = now_ms();
        let (token, rx) = {
            let mut map = self.lock();
            self.check_healthy()?;
            let Some(m) = map.get_mut(task) else {
                return Err(EngineError::NotFound(format!("task `{task}` has no lease")));
            };
            self.count_expiry(m, now);
            let token = f(&mut m.row, now)?;
            (token, self.queue(&m.row, true))
        };
        self.wait(rx)?;
        Ok(token)
    }

    /// Operator revoke; durable before it is answered.
    pub fn revoke(&self, task: &str, force: bool) -> Result<u64, EngineError> {
        self.operator(task, |row, now| row.revoke(force, now))
    }

    /// Operator clear of a held task; durable before it is answered.
    pub fn clear(&self, task: &str) -> Result<u64, EngineError> {
        self.operator(task, |row, now| row.clear(now))
    }

    /// Every lease that matters (active, grace, held), sorted by task.
    pub fn leases(&self) -> Vec<LeaseInfo> {
        let now = now_ms();
        let mut map = self.lock();
        let mut out: Vec<LeaseInfo> = map
            .values_mut()
            .filter_map(|m| {
                self.count_expiry(m, now);
                m.row.info(now, &self.instance)
            })
            .collect();
        drop(map);
        out.sort_by(|a, b| a.task.cmp(&b.task));
        out
    }

    /// Leases by state (also brings the expiry counter up to date).
    pub fn state_counts(&self) -> StateCounts {
        let now = now_ms();
        let mut c = StateCounts::default();
        let mut map = self.lock();
        for m in map.values_mut() {
            self.count_expiry(m, now);
            match m.row.lease.as_ref().map(|l| l.phase(now)) {
                Some(Phase::Active { .. }) => c.active += 1,
                Some(Phase::Grace { .. }) => c.grace += 1,
                Some(Phase::Held) => c.held_for_operator += 1,
                _ => {}
            }
        }
        c
    }

    /// Commits whatever is queued and stops the writer.
    pub fn shutdown(&self) {
        let _ = self.jobs.send(Job::Stop);
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn commit(conn: &Connection, rows: &[&TaskRow]) -> Result<(), store::StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let res = rows
        .iter()
        .try_for_each(|r| store::save(conn, r, None))
        .and_then(|_| {
            conn.execute_batch("COMMIT")
                .map_err(store::StoreError::from)
        });
    if res.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    res
}

fn writer_loop(
    conn: Connection,
    rx: Receiver<Job>,
    failed: Arc<AtomicBool>,
    counters: Arc<Counters>,
) {
    let mut batch = Vec::new();
    loop {
        let Ok(first) = rx.recv() else { return };
        batch.clear();
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let rows: Vec<&TaskRow> = batch
            .iter()
            .filter_map(|j| match j {
                Job::Write(r, _) => Some(r),
                Job::Stop => None,
            })
            .collect();
        let res = if rows.is_empty() || failed.load(Ordering::Relaxed) {
            if failed.load(Ordering::Relaxed) {
                Err("the lease database failed an earlier commit".to_string())
            } else {
                Ok(())
            }
        } else {
            commit(&conn, &rows).map_err(|e| e.to_string())
        };
        match &res {
            Ok(()) => {
                counters.commits.fetch_add(1, Ordering::Relaxed);
                counters
                    .committed_changes
                    .fetch_add(rows.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                log::error!("lease database commit failed: {e}");
                failed.store(true, Ordering::Relaxed);
            }
        }
        let mut stop = false;
        for j in batch.drain(..) {
            match j {
                Job::Write(_, Some(ack)) => {
                    let _ = ack.send(res.clone());
                }
                Job::Write(_, None) => {}
                Job::Stop => stop = true,
            }
        }
        if stop {
            return;
        }
    }
}
