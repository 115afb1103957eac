//! The timing the user asked for, and how a grant becomes a deadline and
//! fits heartbeat and grace to the ttl granted.

use std::time::Duration;

use crate::time::clock::BootInstant;
use crate::time::deadline;

/// The timing the user asked for, and how a grant becomes a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `--ttl`: what heartbeat and grace were chosen for.
    pub asked_ttl: Duration,
    /// `--heartbeat` for the asked ttl.
    pub heartbeat: Duration,
    /// `--grace` for the asked ttl.
    pub grace: Duration,
    /// ρ in parts per million (`--clock-drift`).
    pub drift_ppm: u32,
    /// `--remap-exit`: the job's own 124 and 125 become 1.
    pub remap_exit: bool,
}

impl Settings {
    /// The local deadline of a grant or renewal sent at `sent` that granted
    /// `ttl`: `sent + ttl·(1 − ρ) − ε` ([`deadline::local`]).
    pub fn deadline(&self, sent: BootInstant, ttl: Duration) -> BootInstant {
        deadline::local(sent, ttl, self.drift_ppm)
    }

    /// Heartbeat and grace for a granted ttl (scaled down when the authority
    /// granted less than was asked; as configured otherwise).
    pub fn fitted(&self, granted: Duration) -> (Duration, Duration) {
        fit_to_granted(self.asked_ttl, self.heartbeat, self.grace, granted)
    }
}

/// Heartbeat and grace that fit a ttl the authority clamped below what was
/// asked. Each keeps its value when it still fits the default proportions of
/// the granted ttl (heartbeat at most a third, grace at most a sixth), and
/// otherwise shrinks no further than in proportion to the ttl.
pub fn fit_to_granted(
    cfg_ttl: Duration,
    heartbeat: Duration,
    grace: Duration,
    granted: Duration,
) -> (Duration, Duration) {
    if granted >= cfg_ttl {
        return (heartbeat, grace);
    }
    let scale = |d: Duration| -> Duration {
        let ns = d.as_nanos() * granted.as_nanos() / cfg_ttl.as_nanos().max(1);
        Duration::from_nanos(ns as u64)
    };
    let heartbeat = scale(heartbeat).max(heartbeat.min(granted / 3));
    let grace = scale(grace).max(grace.min(granted / 6));
    (heartbeat.max(Duration::from_millis(1)), grace)
}
