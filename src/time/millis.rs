//! Milliseconds, the unit every lease figure is counted in (on the wire,
//! in the databases, in the state file), and "now" in it on each clock.
//!
//! One conversion from a [`Duration`], saturating: `Duration::as_millis`
//! is a `u128`, and `as u64` would silently wrap a huge value into a small
//! one (a ttl of "forever" becoming a few milliseconds). Nothing a lease
//! can hold comes near `u64::MAX` ms (585 million years), so saturating is
//! never a different answer for a real value, and never a wrong direction
//! for a bound.
//!
//! One "now" per clock, each for what it is good for:
//! - [`boot_ms`]: `CLOCK_BOOTTIME` ([`super::clock::BootInstant`]), the
//!   lease clock: monotonic, counts suspend, one clock for the whole host.
//! - [`wall_ms`]: the wall clock (Unix epoch), for people only (history
//!   times, "held for", alerts); it jumps with NTP or `date -s`, so no lease
//!   arithmetic ever uses it.
//!
//! (`std::time::Instant`, `CLOCK_MONOTONIC`, times waits and server-side
//! connection deadlines; it stops during suspend, so it is never a lease
//! clock either.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::clock::BootInstant;

/// `d` in whole milliseconds (rounded down), saturating at `u64::MAX`.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Now on the boot clock, in milliseconds since boot.
pub fn boot_ms() -> u64 {
    ms(BootInstant::now().since_boot())
}

/// Now on the wall clock, in milliseconds since the Unix epoch (0 for a
/// clock set before 1970). For people only, never for lease arithmetic.
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ms_rounds_down_and_saturates_instead_of_wrapping() {
        assert_eq!(ms(Duration::from_micros(1999)), 1);
        assert_eq!(ms(Duration::from_secs(90)), 90_000);
        assert_eq!(ms(Duration::MAX), u64::MAX);
        // What `as u64` would make of it: a small, wrong number.
        let wrapped = Duration::from_millis(u64::MAX) + Duration::from_millis(5);
        assert_eq!(ms(wrapped), u64::MAX);
        assert_eq!(wrapped.as_millis() as u64, 4);
    }

    #[test]
    fn each_clock_reads_as_it_should() {
        let (a, b) = (boot_ms(), boot_ms());
        assert!(b >= a && a > 0);
        assert!(a <= ms(BootInstant::now().since_boot()));
        // Any clock set after 2001 and before 2286.
        assert!((1_000_000_000_000..10_000_000_000_000).contains(&wall_ms()));
    }
}
