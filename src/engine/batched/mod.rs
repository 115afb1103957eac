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
//!   change. Such a change comes back as a [`Queued`] value that the caller
//!   may answer only once [`BatchedEngine::committed`] (a future, see
//!   [`super::ack`]) returned it. While one commit is fsyncing the next batch
//!   queues up: group commit.
//! - A grant that is in memory but not yet acknowledged is visible to other
//!   acquirers as `held`, which is safe; its id has not been given out, so
//!   nobody can renew it. If a commit fails, the engine stops granting
//!   ([`BatchedEngine::healthy`] turns false): memory may be ahead of the disk
//!   and only a restart (which reloads the disk) makes them agree again.
//!   Tokens skipped by a failed commit are simply never issued.
//! - A release is answered, like a grant, only once it is committed, with
//!   the end of its attempt in the run history ([`super::history`]) in the
//!   same transaction: a finished attempt whose release was answered is not
//!   lost in a crash. (The release waits for the group commit; it adds no
//!   fsync.) Writes nobody waits for (a hold, an expiry, a compaction) may
//!   be lost in a crash: the restart rule then makes them happen again.
//! - On start, every lease on record expires `ttl` after now (the protocol's
//!   Restart rule): a live holder renews in time and keeps it, a dead one is
//!   found within one ttl. A lease seen expired under policy hold is written
//!   as `held` (without waiting) when first seen — by a request, a listing,
//!   or the sweeper thread that walks the rows a slice at a time — so it
//!   stays `held_for_operator` across a restart.
//! - Tokens come from one global sequence (in memory, written with every
//!   batch of grants), so a released task's row is dropped from memory and
//!   deleted on disk (compaction) and its next token is still higher.
//! - Bounded: the listing is built a page at a time, copying only that page
//!   under the lock; live leases are counted per principal and in total, and

mod counters;
mod state;
mod sweep;
mod writer;

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::engine::ack::{Acked, Pending};
use crate::engine::api::{Granted, MAX_PAGE, Page, validate_acquire, validate_task};
use crate::engine::error::{EngineError, StoreError};
use crate::engine::history::{self, Cause};
use crate::engine::rules::{AcquireSpec, NewLease, Phase, TaskRow, lease_id, new_key, task_of};
use crate::engine::store::{HistoryRead, Store};
use crate::lease::{LeaseInfo, LeaseState, Outcome, RefusalReason};
use crate::time::{boot_ms, wall_ms};

pub use counters::{Counters, StateCounts};
pub use state::Limits;

use state::{MemRow, State, observe};
use sweep::{FORGET_AFTER_MS, Sweep};
use writer::Writer;

/// How long a request waits for its commit before answering 503 (and the
/// engine stops granting: [`BatchedEngine::commit_timed_out`]).
pub const COMMIT_WAIT: Duration = Duration::from_secs(30);
/// At most this many rows are looked at per listed lease (plus a little):
/// a page over many expired rows ends early rather than hold the lock.
const SCAN_PER_LEASE: usize = 4;
/// Most tasks whose last success is remembered for `/metrics`.
const MAX_SUCCESS_TASKS: usize = 10_000;

/// A change made in memory whose durable write is queued to the writer.
/// Its outcome may be answered only once [`BatchedEngine::committed`]
/// returned it.
#[must_use = "a queued change is answered only once it is committed"]
pub struct Queued<T> {
    value: T,
    /// `None`: nothing to wait for (the change needed no write).
    ack: Option<Pending>,
    /// A grant: counted once committed.
    grant: bool,
}

/// The serve engine (shared by all request threads).
pub struct BatchedEngine {
    state: Arc<Mutex<State>>,
    writer: Writer,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    sweeper: Mutex<Option<JoinHandle<()>>>,
    stop_sweeping: Arc<AtomicBool>,
    limits: Limits,
    pub counters: Arc<Counters>,
    /// The store's handle for history reads (they never wait for the
    /// writer).
    reader: Mutex<Box<dyn HistoryRead>>,
    /// When each task last ended with a release reporting `succeeded`
    /// (wall-clock ms), for `/metrics`.
    last_success: Mutex<HashMap<String, u64>>,
}

impl BatchedEngine {
    /// Opens the SQLite database at `path` with no limits.
    #[cfg(test)]
    pub fn open(path: &std::path::Path) -> Result<Self, EngineError> {
        let store = crate::engine::sqlite::SqliteStore::open(path)?;
        Self::start(store, Limits::default())
    }

    /// Loads everything on record in `store` (each lease expiring one ttl
    /// from now; a held one stays held) and starts the writer and the
    /// sweeper.
    pub fn start(store: impl Store, limits: Limits) -> Result<Self, EngineError> {
        Self::start_inner(store, limits, FORGET_AFTER_MS, Arc::default())
    }

    /// [`BatchedEngine::start`], counting into `counters` (a replica's
    /// counters go on across its terms as leader: `/metrics` counters
    /// never go back).
    pub fn start_counting(
        store: impl Store,
        limits: Limits,
        counters: Arc<Counters>,
    ) -> Result<Self, EngineError> {
        Self::start_inner(store, limits, FORGET_AFTER_MS, counters)
    }

    /// [`BatchedEngine::start`], forgetting expired free leases
    /// `forget_after_ms` after they became free.
    fn start_inner(
        mut store: impl Store,
        limits: Limits,
        forget_after_ms: u64,
        counters: Arc<Counters>,
    ) -> Result<Self, EngineError> {
        let reader = store.reader()?;
        let snapshot = store.load(boot_ms())?;
        let mut successes = snapshot.last_successes;
        successes.sort_by_key(|(_, ms)| std::cmp::Reverse(*ms));
        successes.truncate(MAX_SUCCESS_TASKS);
        let last_success = successes.into_iter().collect();
        let state = State::load(snapshot.rows, snapshot.last_issued)?;
        let (writer, writer_thread) = writer::start(store, counters.clone(), limits.history)?;
        let state = Arc::new(Mutex::new(state));
        let stop_sweeping = Arc::new(AtomicBool::new(false));
        let sweeper = Sweep {
            state: state.clone(),
            writer: writer.clone(),
            counters: counters.clone(),
            stop: stop_sweeping.clone(),
            forget_after_ms,
        }
        .start()?;
        Ok(BatchedEngine {
            state,
            writer,
            writer_thread: Mutex::new(Some(writer_thread)),
            sweeper: Mutex::new(Some(sweeper)),
            stop_sweeping,
            limits,
            counters,
            reader: Mutex::new(reader),
            last_success: Mutex::new(last_success),
        })
    }

    /// False once a commit has failed: the engine no longer grants.
    pub fn healthy(&self) -> bool {
        self.writer.healthy()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied change:
        // every change is one assignment of a row computed before it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_healthy(&self) -> Result<(), EngineError> {
        if self.healthy() {
            Ok(())
        } else {
            Err(EngineError::Unavailable(
                "the lease database failed a commit; restart the server",
            ))
        }
    }

    /// Counts a newly seen expiry and records a hold; call on every row
    /// touched.
    fn observe(&self, m: &mut MemRow, now: u64) {
        observe(m, now, &self.writer, &self.counters);
    }

    /// Queues a durable write of `row` and `hist`; the acknowledgement
    /// comes once it is committed.
    fn queue(&self, row: &TaskRow, hist: Vec<history::Op>, wait: bool) -> Option<Pending> {
        self.writer.queue(Some(row), hist, wait)
    }

    /// Waits for `q`'s change to be committed, without a thread: the
    /// caller bounds the wait (by [`COMMIT_WAIT`]; past it, answer
    /// [`BatchedEngine::commit_timed_out`]).
    pub async fn committed<T>(&self, q: Queued<T>) -> Result<T, EngineError> {
        let acked = match q.ack {
            None => None,
            Some(p) => Some(p.await),
        };
        self.settled(q.value, q.grant, acked)
    }

    /// A commit that took longer than [`COMMIT_WAIT`]: the disk is not
    /// keeping up, so the engine stops granting (as after a failed commit).
    pub fn commit_timed_out(&self) -> EngineError {
        self.writer.fail();
        EngineError::Unavailable("the lease database did not commit in time")
    }

    fn settled<T>(&self, value: T, grant: bool, acked: Option<Acked>) -> Result<T, EngineError> {
        match acked {
            None | Some(Acked::Done(Ok(()))) => {}
            Some(Acked::Done(Err(e))) => return Err(EngineError::Commit(e)),
            Some(Acked::Lost) => {
                self.writer.fail();
                return Err(EngineError::Unavailable(
                    "the lease writer stopped before committing",
                ));
            }
        }
        if grant {
            self.counters.grants.fetch_add(1, Ordering::Relaxed);
        }
        Ok(value)
    }
    /// Grants the task if free; returns once the grant is on disk.
    #[cfg(test)]
    pub fn acquire(&self, spec: &AcquireSpec) -> Result<Granted, EngineError> {
        let q = self.acquire_queued(spec, None)?;
        crate::engine::ack::block_on(self.committed(q))
    }

    /// Grants the task if free, in memory, and queues the grant's write:
    /// the grant may be answered only once [`BatchedEngine::committed`] said
    /// it is on disk.
    /// Acquires as `waiter` (the caller's id while it waits) or as a
    /// newcomer (`None`): a freed task goes to the oldest waiter still
    /// asking, never to a later one or a newcomer first (`State`'s queue);
    /// a waiter refused for any reason keeps or takes its place.
    pub fn acquire_queued(
        &self,
        spec: &AcquireSpec,
        waiter: Option<&str>,
    ) -> Result<Queued<Granted>, EngineError> {
        validate_acquire(spec)?;
        let now = boot_ms();
        let key = new_key().map_err(StoreError::Random)?;
        let (token, rx) = {
            let mut st = self.lock();
            self.check_healthy()?;
            let st = &mut *st;
            if let Some(m) = st.rows.get_mut(&spec.task) {
                self.observe(m, now);
            }
            let grantable = st
                .rows
                .get(&spec.task)
                .and_then(|m| m.row.lease.as_ref())
                .is_none_or(|l| l.phase(now) == Phase::Free);
            let ahead = st.waiters_ahead(&spec.task, waiter, now);
            if let Some(w) = waiter {
                st.join_waiters(&spec.task, w, now);
            }
            if grantable && ahead > 0 {
                self.counters.acquire_held.fetch_add(1, Ordering::Relaxed);
                return Err(EngineError::Held {
                    holder: format!(
                        "{ahead} earlier waiter{}",
                        if ahead == 1 { "" } else { "s" }
                    ),
                    retry_after_ms: 100,
                });
            }
            if grantable {
                st.check_caps(&self.limits, spec, now, &self.writer)?;
            }
            if let Some(limit) = self.limits.max_new_tasks_per_hour
                && !st.rows.contains_key(&spec.task)
                && !st.allow_new_task(spec, now, limit)
            {
                return Err(EngineError::TooManyNewTasks { limit });
            }
            let token = st
                .last_issued
                .checked_add(1)
                .ok_or(EngineError::Unavailable("the token sequence is exhausted"))?;
            st.rows.entry(spec.task.clone()).or_insert_with(|| MemRow {
                row: TaskRow::new(&spec.task),
                expiry_counted: false,
            });
            let res = st.change(&spec.task, |m| {
                let before = m.row.lease.clone();
                m.row
                    .acquire(
                        spec,
                        now,
                        NewLease {
                            token,
                            key: key.clone(),
                        },
                    )
                    .map(|()| {
                        m.expiry_counted = false;
                        let hist = history::ops(before.as_ref(), &m.row, Cause::Acquire, now);
                        self.queue(&m.row, hist, true)
                    })
            });
            match res {
                Some(Ok(rx)) => {
                    st.last_issued = token;
                    if let Some(w) = waiter {
                        st.leave_waiters(&spec.task, w);
                    }
                    (token, rx)
                }
                Some(Err(e)) => {
                    match e {
                        EngineError::Held { .. } => Some(&self.counters.acquire_held),
                        EngineError::HeldForOperator { .. } => {
                            Some(&self.counters.acquire_held_for_operator)
                        }
                        _ => None,
                    }
                    .map(|c| c.fetch_add(1, Ordering::Relaxed));
                    return Err(e);
                }
                None => return Err(EngineError::Unavailable("task row vanished")),
            }
        };
        Ok(Queued {
            value: Granted {
                lease_id: lease_id(&key, &spec.task),
                token,
                ttl_ms: spec.ttl_ms,
            },
            ack: rx,
            grant: true,
        })
    }

    /// `waiter`'s place in `task`'s queue (1 for the first), if it has one.
    pub fn waiter_position(&self, task: &str, waiter: &str) -> Option<usize> {
        self.lock().waiter_position(task, waiter)
    }

    fn refused(&self, e: EngineError) -> EngineError {
        if let EngineError::Refused(r) = e {
            self.counters.refusal(r);
        }
        e
    }

    /// Renews in memory only, for the lease's owner `principal`.
    pub fn renew(&self, id: &str, token: u64, principal: &str) -> Result<u64, EngineError> {
        let now = boot_ms();
        let (key, task) = task_of(id).map_err(|e| self.refused(e))?;
        let mut st = self.lock();
        let res = match st.rows.get_mut(task) {
            None => Err(EngineError::Refused(RefusalReason::UnknownLease)),
            Some(m) => {
                self.observe(m, now);
                m.row.renew(key, token, principal, now)
            }
        };
        drop(st);
        match res {
            Ok(ttl) => {
                self.counters.renewals.fetch_add(1, Ordering::Relaxed);
                Ok(ttl)
            }
            Err(e) => Err(self.refused(e)),
        }
    }

    /// Releases for the owner without a report, and waits for the commit.
    #[cfg(test)]
    pub fn release(&self, id: &str, token: u64, principal: &str) -> Result<(), EngineError> {
        let q = self.release_queued(id, token, principal, None, None)?;
        crate::engine::ack::block_on(self.committed(q))
    }

    /// Releases for the owner in memory and queues the write, with the
    /// attempt's end and what the agent reported (`outcome`, `exit_code`)
    /// in the same transaction: answered once [`BatchedEngine::committed`]
    /// returned it, so a finished attempt whose release was answered is on
    /// disk. The row is compacted when nothing is left in it.
    pub fn release_queued(
        &self,
        id: &str,
        token: u64,
        principal: &str,
        outcome: Option<Outcome>,
        exit_code: Option<i32>,
    ) -> Result<Queued<()>, EngineError> {
        let now = boot_ms();
        let (key, task) = task_of(id).map_err(|e| self.refused(e))?;
        let mut st = self.lock();
        if let Some(m) = st.rows.get_mut(task) {
            self.observe(m, now);
        }
        let res = st
            .change(task, |m| {
                let before = m.row.lease.clone();
                m.row.release(key, token, principal, now).map(|()| {
                    let cause = Cause::Release(outcome, exit_code);
                    let hist = history::ops(before.as_ref(), &m.row, cause, now);
                    self.queue(&m.row, hist, true)
                })
            })
            .unwrap_or(Err(EngineError::Refused(RefusalReason::UnknownLease)));
        drop(st);
        match res {
            Ok(ack) => {
                self.counters.releases.fetch_add(1, Ordering::Relaxed);
                if outcome == Some(Outcome::Succeeded) {
                    self.record_success(task);
                }
                Ok(Queued {
                    value: (),
                    ack,
                    grant: false,
                })
            }
            Err(e) => Err(self.refused(e)),
        }
    }

    fn operator(
        &self,
        task: &str,
        cause: Cause,
        f: impl FnOnce(&mut TaskRow, u64) -> Result<u64, EngineError>,
    ) -> Result<Queued<u64>, EngineError> {
        validate_task(task).map_err(EngineError::BadRequest)?;
        let now = boot_ms();
        let (token, rx) = {
            let mut st = self.lock();
            self.check_healthy()?;
            let Some(m) = st.rows.get_mut(task) else {
                return Err(EngineError::NotFound(format!("task `{task}` has no lease")));
            };
            self.observe(m, now);
            st.change(task, |m| {
                let before = m.row.lease.clone();
                f(&mut m.row, now).map(|token| {
                    let hist = history::ops(before.as_ref(), &m.row, cause, now);
                    (token, self.queue(&m.row, hist, true))
                })
            })
            .unwrap_or_else(|| Err(EngineError::NotFound(format!("task `{task}` has no lease"))))?
        };
        Ok(Queued {
            value: token,
            ack: rx,
            grant: false,
        })
    }

    /// Operator revoke, in memory, its write queued: durable (and answered)
    /// once [`BatchedEngine::committed`] returned it.
    pub fn revoke_queued(&self, task: &str, force: bool) -> Result<Queued<u64>, EngineError> {
        self.operator(task, Cause::Revoke, |row, now| row.revoke(force, now))
    }

    /// Operator clear of a held task, in memory, its write queued: durable
    /// (and answered) once [`BatchedEngine::committed`] returned it.
    pub fn clear_queued(&self, task: &str) -> Result<Queued<u64>, EngineError> {
        self.operator(task, Cause::Clear, |row, now| row.clear(now))
    }

    /// Up to `limit` (at most [`MAX_PAGE`]) leases that matter after task
    /// `after`, in task order. Only the page is copied under the lock, and
    /// the scan stops after a few rows per lease, so a listing never holds
    /// up renewals for long; `next_after` says where to go on.
    pub fn leases_page(&self, after: Option<&str>, limit: usize) -> Page {
        let limit = limit.clamp(1, MAX_PAGE);
        let budget = limit.saturating_mul(SCAN_PER_LEASE).saturating_add(64);
        let now = boot_ms();
        let mut page = Page::default();
        let mut st = self.lock();
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        for (scanned, (task, m)) in st
            .rows
            .range_mut::<str, _>((lower, Bound::Unbounded))
            .enumerate()
        {
            self.observe(m, now);
            if let Some(info) = m.row.info(now) {
                page.leases.push(info);
            }
            if page.leases.len() >= limit || scanned + 1 >= budget {
                page.next_after = Some(task.clone());
                break;
            }
        }
        page
    }

    /// Every lease that matters, sorted by task, a page at a time (the lock
    /// is let go between pages). `serve` itself lists one page per request.
    #[cfg(test)]
    pub fn leases(&self) -> Vec<LeaseInfo> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.leases_page(after.as_deref(), MAX_PAGE);
            out.extend(page.leases);
            match page.next_after {
                Some(a) => after = Some(a),
                None => return out,
            }
        }
    }

    /// Live leases (active, grace, held, and expired ones not yet
    /// reclaimed) of `principal`, as counted for its cap.
    #[cfg(test)]
    pub fn live_leases_of(&self, principal: &str) -> u64 {
        self.lock().occupied.get(principal).copied().unwrap_or(0)
    }

    /// Leases by state (also brings the expiry counter and holds up to date).
    pub fn state_counts(&self) -> StateCounts {
        let now = boot_ms();
        let mut c = StateCounts::default();
        let mut st = self.lock();
        for m in st.rows.values_mut() {
            self.observe(m, now);
            match m.row.lease.as_ref().map(|l| l.phase(now)) {
                Some(Phase::Active { .. }) => c.active += 1,
                Some(Phase::Grace { .. }) => c.grace += 1,
                Some(Phase::Held) => c.held_for_operator += 1,
                _ => {}
            }
        }
        c
    }

    /// Up to `limit` attempts (of `task`, or of every task), newest first,
    /// with tokens below `before`, read from the database (what has been
    /// committed: a release is answered only once it is).
    pub fn history_page(
        &self,
        task: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<history::Record>, EngineError> {
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        Ok(reader.page(task, before, limit)?)
    }

    /// Tasks held for an operator, with the wall time their lease expired
    /// (from the run history; `None` if it has been pruned), in task order.
    pub fn held_for_operator(&self) -> Vec<(LeaseInfo, Option<u64>)> {
        let now = boot_ms();
        let held: Vec<LeaseInfo> = {
            let mut st = self.lock();
            st.rows
                .values_mut()
                .filter_map(|m| {
                    self.observe(m, now);
                    m.row
                        .info(now)
                        .filter(|i| i.state == LeaseState::HeldForOperator)
                })
                .collect()
        };
        held.into_iter()
            .map(|i| {
                let since = self.attempt_times(i.token).and_then(|t| t.1);
                (i, since)
            })
            .collect()
    }

    /// When attempt `token` was acquired and ended (wall-clock ms), if kept.
    pub fn attempt_times(&self, token: u64) -> Option<(u64, Option<u64>)> {
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        reader.times(token).ok().flatten()
    }

    /// Notes that `task` just succeeded. Bounded: past
    /// [`MAX_SUCCESS_TASKS`] tasks, the one that succeeded longest ago is
    /// forgotten (its metric series disappears, as its history would).
    fn record_success(&self, task: &str) {
        let mut map = self.last_success.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(task.to_string(), wall_ms());
        if map.len() > MAX_SUCCESS_TASKS {
            let oldest = map
                .iter()
                .min_by_key(|(_, ms)| **ms)
                .map(|(t, _)| t.clone());
            if let Some(t) = oldest {
                map.remove(&t);
            }
        }
    }

    /// When each task last ended with a release reporting `succeeded`
    /// (wall-clock ms), in task order.
    pub fn last_successes(&self) -> Vec<(String, u64)> {
        let map = self.last_success.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<(String, u64)> = map.iter().map(|(t, ms)| (t.clone(), *ms)).collect();
        v.sort();
        v
    }

    /// Commits whatever is queued and stops the writer and the sweeper.
    pub fn shutdown(&self) {
        self.stop_sweeping.store(true, Ordering::Relaxed);
        join(&self.sweeper);
        self.writer.stop();
        join(&self.writer_thread);
    }
}

/// Waits for the thread in `slot` to end (once; a second call finds none).
fn join(slot: &Mutex<Option<JoinHandle<()>>>) {
    let handle = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(h) = handle {
        let _ = h.join();
    }
}

impl Drop for BatchedEngine {
    fn drop(&mut self) {
        self.stop_sweeping.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::error::CapScope;
    use crate::engine::sqlite::SqliteStore;
    use crate::lease::ExpiryPolicy;
    use rusqlite::Connection;
    use state::NEW_TASK_WINDOW_MS;

    fn spec(task: &str, principal: &str, ttl_ms: u64, policy: ExpiryPolicy) -> AcquireSpec {
        AcquireSpec {
            task: task.into(),
            principal: principal.into(),
            holder: "h".into(),
            ttl_ms,
            policy,
            grace_ms: 0,
            max_leases: None,
        }
    }

    fn open(d: &tempfile::TempDir, limits: Limits) -> BatchedEngine {
        let store = SqliteStore::open(&d.path().join("s.db")).unwrap();
        BatchedEngine::start(store, limits).unwrap()
    }

    #[test]
    fn the_sweep_forgets_a_dead_holders_lease_some_time_after_expiry() {
        let d = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&d.path().join("s.db")).unwrap();
        let e = BatchedEngine::start_inner(store, Limits::default(), 500, Arc::default()).unwrap();
        let g = e
            .acquire(&spec("dead", "", 1000, ExpiryPolicy::Redispatch))
            .unwrap();
        let start = std::time::Instant::now();
        while e.state.lock().unwrap().rows.contains_key("dead") {
            assert!(start.elapsed() < Duration::from_secs(20), "never forgotten");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            start.elapsed() >= Duration::from_millis(1400),
            "not before expiry + 500 ms"
        );
        assert!(matches!(
            e.renew(&g.lease_id, g.token, ""),
            Err(EngineError::Refused(RefusalReason::UnknownLease))
        ));
        e.shutdown();
        let c = Connection::open(d.path().join("s.db")).unwrap();
        let rows: i64 = c
            .query_row("SELECT COUNT(*) FROM tasks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0, "compacted on disk too");
        let e = open(&d, Limits::default());
        let g2 = e
            .acquire(&spec("dead", "", 1000, ExpiryPolicy::Redispatch))
            .unwrap();
        assert!(g2.token > g.token);
        e.shutdown();
    }

    #[test]
    fn only_the_owner_renews_or_releases() {
        let d = tempfile::tempdir().unwrap();
        let e = open(&d, Limits::default());
        let g = e
            .acquire(&spec("t", "alice", 30_000, ExpiryPolicy::Redispatch))
            .unwrap();
        assert!(matches!(
            e.renew(&g.lease_id, g.token, "bob"),
            Err(EngineError::NotOwner { .. })
        ));
        assert!(matches!(
            e.release(&g.lease_id, g.token, ""),
            Err(EngineError::NotOwner { .. })
        ));
        assert_eq!(e.leases()[0].principal, "alice");
        e.renew(&g.lease_id, g.token, "alice").unwrap();
        e.release(&g.lease_id, g.token, "alice").unwrap();
        assert!(e.leases().is_empty());
        e.shutdown();
    }

    #[test]
    fn a_principal_creates_a_bounded_number_of_distinct_tasks_an_hour() {
        let d = tempfile::tempdir().unwrap();
        let e = open(
            &d,
            Limits {
                max_new_tasks_per_hour: Some(3),
                ..Limits::default()
            },
        );
        let s = |task: &str, p: &str| spec(task, p, 30_000, ExpiryPolicy::Redispatch);
        let mut grants = Vec::new();
        for t in ["a", "b", "c"] {
            grants.push(e.acquire(&s(t, "p")).unwrap());
        }
        assert!(matches!(
            e.acquire(&s("d", "p")),
            Err(EngineError::TooManyNewTasks { limit: 3 })
        ));
        assert!(!e.state.lock().unwrap().rows.contains_key("d"));
        // Released (its row compacted) and taken again: the same task,
        // counted once.
        let a = grants.remove(0);
        e.release(&a.lease_id, a.token, "p").unwrap();
        assert!(!e.state.lock().unwrap().rows.contains_key("a"));
        e.acquire(&s("a", "p")).unwrap();
        // Another principal has its own count.
        e.acquire(&s("d", "q")).unwrap();
        // An hour later the first ones have aged out.
        let mut st = e.state.lock().unwrap();
        let later = boot_ms() + NEW_TASK_WINDOW_MS;
        assert!(!st.allow_new_task(&s("e", "p"), boot_ms(), 3));
        assert!(st.allow_new_task(&s("e", "p"), later, 3));
        drop(st);
        e.shutdown();
    }

    #[test]
    fn caps_per_principal_and_overall_and_expired_leases_are_reclaimed() {
        let d = tempfile::tempdir().unwrap();
        let e = open(
            &d,
            Limits {
                max_live_leases: Some(3),
                ..Limits::default()
            },
        );
        let capped = |task: &str, p: &str| {
            let mut s = spec(task, p, 30_000, ExpiryPolicy::Redispatch);
            s.max_leases = Some(2);
            s
        };
        let a1 = e.acquire(&capped("a1", "a")).unwrap();
        e.acquire(&capped("a2", "a")).unwrap();
        assert!(matches!(
            e.acquire(&capped("a3", "a")),
            Err(EngineError::TooManyLeases {
                scope: CapScope::Principal,
                limit: 2
            })
        ));
        e.acquire(&capped("b1", "b")).unwrap();
        assert!(matches!(
            e.acquire(&capped("b2", "b")),
            Err(EngineError::TooManyLeases {
                scope: CapScope::Global,
                limit: 3
            })
        ));
        assert_eq!(e.live_leases_of("a"), 2);
        // A release frees a place at once.
        e.release(&a1.lease_id, a1.token, "a").unwrap();
        assert_eq!(e.live_leases_of("a"), 1);
        e.acquire(&capped("b2", "b")).unwrap();
        // An expired lease still counts until reclaimed, which a full cap does.
        let d2 = tempfile::tempdir().unwrap();
        let e2 = open(
            &d2,
            Limits {
                max_live_leases: Some(1),
                ..Limits::default()
            },
        );
        e2.acquire(&spec("x", "", 1000, ExpiryPolicy::Redispatch))
            .unwrap();
        let start = std::time::Instant::now();
        loop {
            match e2.acquire(&spec("y", "", 1000, ExpiryPolicy::Redispatch)) {
                Ok(_) => break,
                Err(EngineError::TooManyLeases { .. }) => {
                    assert!(start.elapsed() < Duration::from_secs(10));
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(other) => panic!("{other:?}"),
            }
        }
        assert!(start.elapsed() >= Duration::from_millis(900));
        assert_eq!(e2.live_leases_of(""), 1);
        e.shutdown();
        e2.shutdown();
    }

    #[test]
    fn pages_are_ordered_bounded_and_cover_everything_once() {
        let d = tempfile::tempdir().unwrap();
        let e = open(&d, Limits::default());
        for i in 0..250 {
            e.acquire(&spec(
                &format!("t{i:03}"),
                "",
                30_000,
                ExpiryPolicy::Redispatch,
            ))
            .unwrap();
        }
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let p = e.leases_page(after.as_deref(), 100);
            assert!(p.leases.len() <= 100);
            pages += 1;
            seen.extend(p.leases.into_iter().map(|l| l.task));
            match p.next_after {
                Some(a) => after = Some(a),
                None => break,
            }
        }
        assert!((3..=4).contains(&pages), "{pages}");
        let want: Vec<String> = (0..250).map(|i| format!("t{i:03}")).collect();
        assert_eq!(seen, want);
        assert_eq!(e.leases_page(Some("t100"), 1).leases[0].task, "t101");
        e.shutdown();
    }

    #[test]
    fn the_sweep_records_a_hold_that_no_request_looked_at() {
        let d = tempfile::tempdir().unwrap();
        let e = open(&d, Limits::default());
        e.acquire(&spec("h", "", 1000, ExpiryPolicy::Hold)).unwrap();
        let c = Connection::open(d.path().join("s.db")).unwrap();
        let start = std::time::Instant::now();
        loop {
            let held: i64 = c
                .query_row("SELECT held FROM tasks WHERE task = 'h'", [], |r| r.get(0))
                .unwrap();
            if held == 1 {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "never recorded");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            start.elapsed() >= Duration::from_millis(900),
            "not before expiry"
        );
        assert_eq!(e.counters.expiries.load(Ordering::Relaxed), 1);
        e.shutdown();
    }

    #[test]
    fn holds_tokens_and_compaction_survive_a_reopen() {
        let d = tempfile::tempdir().unwrap();
        let e = open(&d, Limits::default());
        let held = e.acquire(&spec("h", "", 1000, ExpiryPolicy::Hold)).unwrap();
        let mut last = held.token;
        for _ in 0..5 {
            let g = e
                .acquire(&spec("r", "", 30_000, ExpiryPolicy::Redispatch))
                .unwrap();
            assert!(g.token > last);
            last = g.token;
            e.release(&g.lease_id, g.token, "").unwrap();
        }
        let start = std::time::Instant::now();
        while e.state_counts().held_for_operator == 0 {
            assert!(start.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(50));
        }
        e.shutdown();
        let e = open(&d, Limits::default());
        let c = e.state_counts();
        assert_eq!((c.active, c.held_for_operator), (0, 1));
        assert_eq!(e.leases().len(), 1, "the released task was compacted");
        let g = e
            .acquire(&spec("r", "", 30_000, ExpiryPolicy::Redispatch))
            .unwrap();
        assert!(g.token > last, "{} after {last}", g.token);
        e.shutdown();
    }
}
