//! How late the keeper gets a CPU after a timed wait of its own ends: the
//! measured part of the kill lead (`time::deadline::kill_lead`).
//!
//! Why measured: SIGKILL goes out when the keeper's deadline timer fires
//! *and the keeper runs*. On a quiet host that is within a fraction of a
//! millisecond; on a busy two-CPU host (every CPU taken by the job or by
//! others) a woken keeper waits its turn, a few milliseconds and at times
//! tens of them, and a small tree, whose whole lead is the 20 ms floor,
//! then lives past the deadline (#42 saw a leader run 1 ms past the
//! lease's expiry at load 2). The load average says how many wait, not
//! how long this process waits, and it lags by a minute; the keeper's own
//! wakes say exactly that, here and now. The keeper wakes on a timer at
//! least every few seconds (its samples of the tree, `event_loop.rs`), so
//! it measures all along, not only at the kill.
//!
//! The rule ([`Lateness`]): every timed wake's lateness (the time from
//! when the wait was due to end to when the keeper ran) is observed; the
//! value is the worst seen, decaying by half every [`HALF_LIFE`], so one
//! burst of load keeps the lead long for a while and a host that calmed
//! down gets the small lead back. The lead takes twice the value
//! (`deadline::LATE_FACTOR`), capped with the rest at a quarter of the
//! ttl.
//!
//! What it cannot do: a wake later than any seen in the last minute or so
//! (the first burst of load, right at the kill) is not foreseen; the
//! factor of two and the floor are its margin. A machine suspended while
//! the keeper waited wakes it "late" by the whole suspend: an observation
//! counts at most [`MAX_OBSERVED`], and the lead is capped at a quarter of
//! the ttl whatever it says.
//!
//! Pure: `(state, observation, now) -> value`, unit-tested below.

use std::time::Duration;

use crate::time::clock::BootInstant;

/// The worst lateness seen counts half after this long, a quarter after
/// twice it, and so on.
pub const HALF_LIFE: Duration = Duration::from_secs(30);

/// An observation counts at most this much (a machine suspended while the
/// keeper waited wakes "late" by the whole suspend).
pub const MAX_OBSERVED: Duration = Duration::from_secs(10);

/// The decayed worst lateness of the keeper's timed wakes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Lateness {
    /// The worst observation that still dominates, and when it was made.
    peak: Option<(Duration, BootInstant)>,
}

impl Lateness {
    /// The value at `now`: the peak, halved per [`HALF_LIFE`] since it was
    /// seen.
    pub fn value(&self, now: BootInstant) -> Duration {
        let Some((peak, at)) = self.peak else {
            return Duration::ZERO;
        };
        let halves = now.saturating_since(at).as_secs_f64() / HALF_LIFE.as_secs_f64();
        let factor = 0.5f64.powf(halves);
        if factor.is_finite() && factor > 0.0 {
            peak.mul_f64(factor.min(1.0))
        } else {
            Duration::ZERO
        }
    }

    /// A timed wake was `late` past its due time, seen at `now`. Returns
    /// the value after it.
    pub fn observe(&mut self, late: Duration, now: BootInstant) -> Duration {
        let late = late.min(MAX_OBSERVED);
        if late >= self.value(now) {
            self.peak = Some((late, now));
        }
        self.value(now)
    }

    /// The value at `now` in whole microseconds, as a tree size carries it.
    pub fn micros(&self, now: BootInstant) -> u32 {
        u32::try_from(self.value(now).as_micros()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_millis(ms))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Within a microsecond (the decay is computed in floating point).
    fn near(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) <= Duration::from_micros(1)
    }

    #[test]
    fn nothing_observed_is_nothing() {
        let l = Lateness::default();
        assert_eq!(l.value(t(0)), Duration::ZERO);
        assert_eq!(l.micros(t(u64::MAX / 2)), 0);
    }

    #[test]
    fn the_worst_counts_and_halves_every_half_life() {
        let mut l = Lateness::default();
        l.observe(ms(8), t(1_000));
        assert_eq!(l.value(t(1_000)), ms(8));
        // A smaller one does not lower it.
        assert_eq!(l.observe(ms(1), t(1_100)), l.value(t(1_100)));
        assert!(near(l.value(t(1_000) + HALF_LIFE), ms(4)));
        assert!(near(l.value(t(1_000) + HALF_LIFE * 2), ms(2)));
        // A new worst replaces it at once.
        l.observe(ms(20), t(5_000));
        assert_eq!(l.value(t(5_000)), ms(20));
        assert_eq!(l.micros(t(5_000)), 20_000);
        // Long after, a small observation is the value again.
        let later = t(5_000) + HALF_LIFE * 20;
        assert_eq!(l.observe(ms(1), later), ms(1));
    }

    #[test]
    fn a_suspend_counts_at_most_max_observed() {
        let mut l = Lateness::default();
        assert_eq!(l.observe(Duration::from_secs(3_600), t(0)), MAX_OBSERVED);
    }

    proptest! {
        /// Whatever the observations: the value is never below the latest
        /// observation (capped), never above the worst one, and never grows
        /// without an observation.
        #[test]
        fn the_value_stays_between_the_latest_and_the_worst(
            obs in prop::collection::vec((0u64..50_000, 0u64..40_000), 1..60),
        ) {
            let mut l = Lateness::default();
            let mut now = 0u64;
            let mut worst = Duration::ZERO;
            for (late_us, gap_ms) in obs {
                let before = l.value(t(now));
                now += gap_ms;
                prop_assert!(l.value(t(now)) <= before);
                let late = Duration::from_micros(late_us);
                worst = worst.max(late);
                let v = l.observe(late, t(now));
                prop_assert!(v >= late.min(MAX_OBSERVED));
                prop_assert!(v <= worst);
            }
        }
    }
}
