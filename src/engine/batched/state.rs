//! Everything under the serve engine's one lock: every task's row in
//! memory, the token sequence, the live leases counted per principal and in
//! total, and the caps checked against those counts.
//!
//! Invariants:
//! - Every change to a row goes through [`State::change`], which keeps the
//!   counts right and drops a row that holds nothing (compaction); the
//!   caller queues its durable write while it still holds the lock, so the
//!   writer sees changes in the order memory did.
//! - A lease counts against the caps from its grant until it is released,
//!   revoked away or reclaimed: an expired lease still counts until a full
//!   cap makes [`State::check_caps`] reclaim it (at most once per
//!   [`RECLAIM_EVERY_MS`], a full pass), or the sweep forgets it.
//! - An expiry is counted once (`expiry_counted`), when first observed by a
//!   request, a listing, the metrics or the sweep, and recorded in the run
//!   history then, with the time it happened; a hold is written as `held`
//!   then too, so it survives a restart.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;

use crate::engine::error::{CapScope, EngineError};
use crate::engine::history::{self, Cause, Op};
use crate::engine::rules::{AcquireSpec, Phase, TaskRow};
use crate::time::wall_ms;

use super::counters::Counters;
use super::writer::Writer;

/// How often a full pass may drop expired leases when a cap is reached.
const RECLAIM_EVERY_MS: u64 = 1000;

/// Limits set when the engine starts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// Most live leases (active, grace, held) overall; `None`: no limit.
    pub max_live_leases: Option<u64>,
    /// How much run history is kept.
    pub history: history::Bounds,
    /// Most distinct tasks one principal may create (acquire while the
    /// task has no row) in an hour; `None`: no limit.
    pub max_new_tasks_per_hour: Option<u64>,
}

/// The window of [`Limits::max_new_tasks_per_hour`].
pub(super) const NEW_TASK_WINDOW_MS: u64 = 3_600_000;

/// The tasks one principal created in the last hour: in order of creation
/// (to let them age out) and as a set (a task created again within the
/// hour, after its row was compacted, counts once).
#[derive(Default)]
pub(super) struct NewTasks {
    order: VecDeque<(u64, String)>,
    seen: HashSet<String>,
}

pub(super) struct MemRow {
    pub(super) row: TaskRow,
    /// The current lease's expiry has been counted.
    pub(super) expiry_counted: bool,
}

pub(super) struct State {
    pub(super) rows: BTreeMap<String, MemRow>,
    /// The last token issued (the global sequence; on disk with its grant).
    pub(super) last_issued: u64,
    /// Rows holding a lease (in any phase, until reclaimed), by principal.
    pub(super) occupied: HashMap<String, u64>,
    /// The same, in total.
    total: u64,
    /// When expired leases were last reclaimed (boot-clock ms).
    last_reclaim_ms: Option<u64>,
    /// Tasks created in the last hour, by principal.
    new_tasks: HashMap<String, NewTasks>,
    /// Each task's waiters in arrival order, with when each last asked
    /// (boot-clock ms): lease protocol v1, "Waiting".
    waiters: HashMap<String, Vec<(String, u64)>>,
}

/// A waiter that has not asked for this long is forgotten.
pub const FORGET_WAITER_AFTER_MS: u64 = 5_000;

/// At most this many waiters are kept per task; later ones are answered
/// `held` without a place (a bound on what callers can make serve keep).
pub const MAX_WAITERS: usize = 1_000;

impl State {
    /// How many waiters still asking are ahead of `waiter` in `task`'s
    /// queue (all of them for a newcomer, `None`); forgets those that
    /// stopped asking.
    pub(super) fn waiters_ahead(&mut self, task: &str, waiter: Option<&str>, now_ms: u64) -> usize {
        let Some(q) = self.waiters.get_mut(task) else {
            return 0;
        };
        q.retain(|(_, seen)| now_ms.saturating_sub(*seen) <= FORGET_WAITER_AFTER_MS);
        let n = q.len();
        let ahead = waiter.map_or(n, |w| q.iter().position(|(id, _)| id == w).unwrap_or(n));
        if q.is_empty() {
            self.waiters.remove(task);
        }
        ahead
    }

    /// `waiter` asked for `task` now: joins at the back, or keeps its place.
    pub(super) fn join_waiters(&mut self, task: &str, waiter: &str, now_ms: u64) {
        let q = self.waiters.entry(task.to_string()).or_default();
        match q.iter().position(|(id, _)| id == waiter) {
            Some(i) => q[i].1 = now_ms,
            None if q.len() < MAX_WAITERS => q.push((waiter.to_string(), now_ms)),
            None => {}
        }
    }

    /// `waiter`'s place in `task`'s queue (1 for the first), if it has one.
    pub(super) fn waiter_position(&self, task: &str, waiter: &str) -> Option<usize> {
        let q = self.waiters.get(task)?;
        q.iter().position(|(id, _)| id == waiter).map(|i| i + 1)
    }

    /// `waiter` was granted `task`.
    pub(super) fn leave_waiters(&mut self, task: &str, waiter: &str) {
        if let Some(q) = self.waiters.get_mut(task) {
            q.retain(|(id, _)| id != waiter);
            if q.is_empty() {
                self.waiters.remove(task);
            }
        }
    }

    /// The state of a store's rows and sequence; a row whose counter is
    /// above the sequence is refused (granting could reuse a token).
    pub(super) fn load(rows: Vec<TaskRow>, last_issued: u64) -> Result<Self, EngineError> {
        let mut state = State {
            rows: BTreeMap::new(),
            last_issued,
            occupied: HashMap::new(),
            total: 0,
            last_reclaim_ms: None,
            new_tasks: HashMap::new(),
            waiters: HashMap::new(),
        };
        for row in rows {
            if row.last_token > last_issued {
                return Err(EngineError::SequenceBehind {
                    task: row.task,
                    next: last_issued,
                    last: row.last_token,
                });
            }
            state.count(occupant(&row), true);
            state.rows.insert(
                row.task.clone(),
                MemRow {
                    row,
                    expiry_counted: false,
                },
            );
        }
        Ok(state)
    }

    fn count(&mut self, principal: Option<String>, up: bool) {
        let Some(p) = principal else { return };
        if up {
            self.total += 1;
            *self.occupied.entry(p).or_insert(0) += 1;
        } else {
            self.total = self.total.saturating_sub(1);
            if let Some(n) = self.occupied.get_mut(&p) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.occupied.remove(&p);
                }
            }
        }
    }

    /// Applies `f` to the task's row keeping the counts right, and drops the
    /// row from memory when it holds nothing (compaction; the caller queues
    /// the write that deletes it on disk).
    pub(super) fn change<T>(&mut self, task: &str, f: impl FnOnce(&mut MemRow) -> T) -> Option<T> {
        let m = self.rows.get_mut(task)?;
        let before = occupant(&m.row);
        let out = f(m);
        let after = occupant(&m.row);
        let empty = m.row.lease.is_none() && m.row.ended.is_none();
        if before != after {
            self.count(before, false);
            self.count(after, true);
        }
        if empty {
            self.rows.remove(task);
        }
        Some(out)
    }

    /// Drops leases that expired and are free (they still count against
    /// the caps until then), writing the compaction without waiting. A full
    /// pass, so at most once per [`RECLAIM_EVERY_MS`].
    fn reclaim(&mut self, now: u64, writer: &Writer) {
        if self
            .last_reclaim_ms
            .is_some_and(|t| now.saturating_sub(t) < RECLAIM_EVERY_MS)
        {
            return;
        }
        self.last_reclaim_ms = Some(now);
        let free: Vec<String> = self
            .rows
            .iter()
            .filter(|(_, m)| {
                m.row
                    .lease
                    .as_ref()
                    .is_some_and(|l| l.phase(now) == Phase::Free)
            })
            .map(|(t, _)| t.clone())
            .collect();
        for task in free {
            let row = self.change(&task, |m| drop_lease(&mut m.row, now));
            if let Some((row, hist)) = row {
                writer.queue(Some(&row), hist, false);
            }
        }
    }

    /// The cap this acquire would exceed, if any (`replacing`: the row's
    /// current lease, free now, that the grant replaces).
    fn over_cap(
        &self,
        limits: &Limits,
        spec: &AcquireSpec,
        replacing: Option<&str>,
    ) -> Option<EngineError> {
        if let Some(limit) = limits.max_live_leases {
            let total = self.total - u64::from(replacing.is_some());
            if total >= limit {
                return Some(EngineError::TooManyLeases {
                    scope: CapScope::Global,
                    limit,
                });
            }
        }
        if let Some(limit) = spec.max_leases {
            let mine = self.occupied.get(&spec.principal).copied().unwrap_or(0)
                - u64::from(replacing == Some(spec.principal.as_str()));
            if mine >= limit {
                return Some(EngineError::TooManyLeases {
                    scope: CapScope::Principal,
                    limit,
                });
            }
        }
        None
    }

    /// Whether `spec.principal` may create `spec.task` (which has no row)
    /// now, under `limit` distinct new tasks an hour; counts it if so.
    pub(super) fn allow_new_task(&mut self, spec: &AcquireSpec, now: u64, limit: u64) -> bool {
        let e = self.new_tasks.entry(spec.principal.clone()).or_default();
        while let Some((t, _)) = e.order.front() {
            if now.saturating_sub(*t) < NEW_TASK_WINDOW_MS {
                break;
            }
            if let Some((_, task)) = e.order.pop_front() {
                e.seen.remove(&task);
            }
        }
        if e.seen.contains(&spec.task) {
            return true;
        }
        if e.order.len() as u64 >= limit {
            return false;
        }
        e.order.push_back((now, spec.task.clone()));
        e.seen.insert(spec.task.clone());
        true
    }

    /// Checks the caps for a grant of `spec.task` (reclaiming expired
    /// leases once if a cap is reached).
    pub(super) fn check_caps(
        &mut self,
        limits: &Limits,
        spec: &AcquireSpec,
        now: u64,
        writer: &Writer,
    ) -> Result<(), EngineError> {
        if limits.max_live_leases.is_none() && spec.max_leases.is_none() {
            return Ok(());
        }
        let replacing = |st: &State| {
            st.rows
                .get(&spec.task)
                .and_then(|m| m.row.lease.as_ref())
                .filter(|l| l.phase(now) == Phase::Free)
                .map(|l| l.principal.clone())
        };
        let r = replacing(self);
        if self.over_cap(limits, spec, r.as_deref()).is_none() {
            return Ok(());
        }
        self.reclaim(now, writer);
        let r = replacing(self);
        match self.over_cap(limits, spec, r.as_deref()) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

fn occupant(row: &TaskRow) -> Option<String> {
    row.lease.as_ref().map(|l| l.principal.clone())
}

/// Counts a newly seen expiry of the row's lease, records it in the run
/// history and records a hold (queued without waiting). Call on every row
/// touched.
pub(super) fn observe(m: &mut MemRow, now: u64, writer: &Writer, counters: &Counters) {
    let mut hist = Vec::new();
    if let Some(l) = &m.row.lease {
        if !m.expiry_counted && !matches!(l.phase(now), Phase::Active { .. }) {
            m.expiry_counted = true;
            counters.expiries.fetch_add(1, Ordering::Relaxed);
            hist.push(history::expired(l, now, wall_ms()));
        }
    }
    if m.row.settle(now) {
        writer.queue(Some(&m.row), hist, false);
    } else if !hist.is_empty() {
        writer.queue(None, hist, false);
    }
}

/// Drops a row's expired lease (compaction); returns the row to write and
/// the history of the attempt it ends.
pub(super) fn drop_lease(row: &mut TaskRow, now: u64) -> (TaskRow, Vec<Op>) {
    let before = row.lease.take();
    let hist = history::ops(before.as_ref(), row, Cause::Sweep, now);
    (row.clone(), hist)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_keep_their_places_and_the_silent_are_forgotten() {
        let mut st = State::load(Vec::new(), 0).unwrap();
        assert_eq!(st.waiters_ahead("t", Some("a"), 0), 0);
        for (w, t) in [("a", 0), ("b", 10), ("c", 20)] {
            st.join_waiters("t", w, t);
        }
        assert_eq!(st.waiters_ahead("t", Some("a"), 100), 0);
        assert_eq!(st.waiters_ahead("t", Some("c"), 100), 2);
        assert_eq!(
            st.waiters_ahead("t", None, 100),
            3,
            "a newcomer is behind all"
        );
        // a asks again (keeps its place); b and c go silent.
        st.join_waiters("t", "a", 4_000);
        assert_eq!(st.waiters_ahead("t", None, 5_015), 2, "b is forgotten");
        assert_eq!(st.waiters_ahead("t", None, 5_025), 1, "c too");
        st.leave_waiters("t", "a");
        assert_eq!(st.waiters_ahead("t", None, 5_025), 0);
        assert!(st.waiters.is_empty(), "no empty queue kept");
        for i in 0..MAX_WAITERS + 5 {
            st.join_waiters("u", &format!("w{i}"), 0);
        }
        assert_eq!(st.waiters_ahead("u", None, 0), MAX_WAITERS);
    }
}
