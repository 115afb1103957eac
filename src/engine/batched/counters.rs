//! What `/metrics` reads of the engine: event counters, bumped where the
//! events happen (the API, the writer, the sweep), and the leases by state.
//! Relaxed atomics: each is a count on its own, read without the lock.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lease::RefusalReason;

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
    pub(super) fn refusal(&self, r: RefusalReason) {
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
