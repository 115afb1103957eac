//! The lease clock: `CLOCK_BOOTTIME`.
//!
//! Lease arithmetic must never use the wall clock (NTP steps, an operator's
//! `date -s`) and must keep counting while the machine is suspended: a laptop
//! that sleeps through its deadline has lost its lease, and the agent must see
//! that the moment it wakes. `CLOCK_MONOTONIC` (what `std::time::Instant`
//! uses) stops during suspend; `CLOCK_BOOTTIME` does not. It is also one clock
//! for the whole host, so instants can be compared across processes (the
//! `check` subcommand and the embedded authority rely on that).
//!
//! Waiting still uses `Instant`-based timeouts (crossbeam), so every wait is
//! capped ([`MAX_WAIT`]) and the boot clock re-read on wake-up.

use std::ops::{Add, Sub};
use std::time::Duration;

/// The longest the supervisor sleeps before re-reading the boot clock, so a
/// system suspend (which stops the monotonic clock that timed waits use) is
/// noticed within this much of the wake-up.
pub const MAX_WAIT: Duration = Duration::from_millis(250);

/// An instant on `CLOCK_BOOTTIME`: time since boot, counting suspend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// Reads the boot clock now.
    pub fn now() -> Self {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        // Both fields are non-negative for this clock.
        BootInstant(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// An instant from its offset since boot (tests, and values read back
    /// from the state file or the embedded database).
    pub const fn from_since_boot(d: Duration) -> Self {
        BootInstant(d)
    }

    pub fn since_boot(self) -> Duration {
        self.0
    }

    /// `self - earlier`, or zero when `earlier` is later.
    pub fn saturating_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// `later - self`, or zero when `later` has already passed.
    pub fn until(self, later: BootInstant) -> Duration {
        later.0.saturating_sub(self.0)
    }

    pub fn saturating_sub(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(d))
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(d))
    }
}

impl Sub<Duration> for BootInstant {
    type Output = BootInstant;
    fn sub(self, d: Duration) -> BootInstant {
        self.saturating_sub(d)
    }
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`): two boot instants are
/// comparable only under the same boot id.
pub fn boot_id() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_moves_forward() {
        let a = BootInstant::now();
        let b = BootInstant::now();
        assert!(b >= a);
        assert!(a.since_boot() > Duration::ZERO);
    }

    #[test]
    fn arithmetic_saturates() {
        let a = BootInstant::from_since_boot(Duration::from_secs(5));
        assert_eq!(
            a - Duration::from_secs(10),
            BootInstant::from_since_boot(Duration::ZERO)
        );
        assert_eq!(a.until(a - Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(a.until(a + Duration::from_secs(1)), Duration::from_secs(1));
    }

    #[test]
    fn boot_id_is_a_uuid() {
        assert_eq!(boot_id().unwrap().len(), 36);
    }
}
