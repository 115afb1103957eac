//! The sweeper thread: walks the rows a slice at a time so that a lease
//! expiring under policy hold is recorded as held soon after its expiry
//! even if no request touches it (else a restart would bring it back live
//! for one ttl), the expiry counter is current, and a dead holder's expired
//! lease is forgotten some time after it became free (bounding what holders
//! that died without releasing leave behind). Each slice holds the lock for
//! at most [`SWEEP_SLICE`] rows, so renewals never wait long behind it.

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::engine::error::EngineError;
use crate::engine::rules::Phase;
use crate::time::boot_ms;

use super::counters::Counters;
use super::state::{State, drop_lease, observe};
use super::writer::Writer;

/// How long after it became free an expired lease is kept (so that a late
/// renewal hears `expired`); then its row is compacted like a released one
/// (a renewal after that hears `unknown_lease`: refused all the same). This
/// bounds the state left by holders that died without releasing.
pub(super) const FORGET_AFTER_MS: u64 = 600_000;

/// Rows looked at per slice of the sweep, and the pause between slices.
const SWEEP_SLICE: usize = 1024;
const SWEEP_PAUSE: Duration = Duration::from_millis(100);

pub(super) struct Sweep {
    pub(super) state: Arc<Mutex<State>>,
    pub(super) writer: Writer,
    pub(super) counters: Arc<Counters>,
    /// Set to end the thread (checked between slices).
    pub(super) stop: Arc<AtomicBool>,
    pub(super) forget_after_ms: u64,
}

impl Sweep {
    /// Starts the sweeper thread.
    pub(super) fn start(self) -> Result<JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name("lease-sweeper".into())
            .spawn(move || self.run())
            .map_err(|_| EngineError::Unavailable("cannot start the lease sweeper thread"))
    }

    fn run(self) {
        let mut cursor: Option<String> = None;
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(SWEEP_PAUSE);
            cursor = self.slice(cursor.as_deref());
        }
    }

    /// Sweeps up to [`SWEEP_SLICE`] rows after `after`; returns where to go on.
    fn slice(&self, after: Option<&str>) -> Option<String> {
        let now = boot_ms();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut last = None;
        let mut forget = Vec::new();
        for (i, (task, m)) in st
            .rows
            .range_mut::<str, _>((lower, Bound::Unbounded))
            .enumerate()
        {
            observe(m, now, &self.writer, &self.counters);
            if m.row.lease.as_ref().is_some_and(|l| {
                l.phase(now) == Phase::Free
                    && now
                        >= l.expires_ms
                            .saturating_add(l.grace_ms)
                            .saturating_add(self.forget_after_ms)
            }) {
                forget.push(task.clone());
            }
            if i + 1 >= SWEEP_SLICE {
                last = Some(task.clone());
                break;
            }
        }
        for task in forget {
            let row = st.change(&task, |m| drop_lease(&mut m.row, now));
            if let Some((row, hist)) = row {
                self.writer.queue(Some(&row), hist, false);
            }
        }
        last
    }
}
