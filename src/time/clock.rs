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

/// This process's clock view: the boot id, and the time namespace's
/// `CLOCK_BOOTTIME` offset when it has one (`BOOT_ID@NANOSECONDS`; just
/// the boot id in the host's own time namespace). Two boot-clock instants
/// are comparable only under one boot id, and translate between two time
/// namespaces of one boot by their offsets ([`split_view`]).
pub fn view() -> std::io::Result<String> {
    let id = boot_id()?;
    Ok(match boottime_offset()? {
        0 => id,
        off => format!("{id}@{off}"),
    })
}

/// This process's time namespace's `CLOCK_BOOTTIME` offset against the
/// host's, in nanoseconds (0 in the host's own namespace, or on a kernel
/// without time namespaces). A boot-clock instant read here is the host's
/// plus this offset.
pub fn boottime_offset() -> std::io::Result<i128> {
    let offsets = match std::fs::read_to_string("/proc/self/timens_offsets") {
        Ok(text) => text,
        // No time namespaces in this kernel: the host's clock.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    boottime_offset_ns(&offsets)
}

/// The `boottime` line of `/proc/self/timens_offsets` ("boottime  SECS
/// NSECS"), in nanoseconds; 0 without one.
fn boottime_offset_ns(text: &str) -> std::io::Result<i128> {
    let bad = || std::io::Error::other(format!("unreadable timens_offsets: {text:?}"));
    for line in text.lines() {
        let mut f = line.split_whitespace();
        if f.next() != Some("boottime") {
            continue;
        }
        let secs: i128 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        let nsecs: i128 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        return Ok(secs * 1_000_000_000 + nsecs);
    }
    Ok(0)
}

/// A clock view ([`view`]) as its boot id and its boot-clock offset (ns).
/// `None` for text no version wrote.
pub fn split_view(view: &str) -> Option<(&str, i128)> {
    match view.split_once('@') {
        None => Some((view, 0)),
        Some((id, off)) => Some((id, off.parse().ok()?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_carry_the_time_namespace_offset() {
        let host = "monotonic           0         0\nboottime            0         0\n";
        assert_eq!(boottime_offset_ns(host).unwrap(), 0);
        let day = "monotonic           0         0\nboottime        86400         5\n";
        assert_eq!(boottime_offset_ns(day).unwrap(), 86_400_000_000_005);
        let back = "boottime        -1000         0\n";
        assert_eq!(boottime_offset_ns(back).unwrap(), -1_000_000_000_000);
        assert!(boottime_offset_ns("boottime x 0").is_err());
        assert_eq!(split_view("b"), Some(("b", 0)));
        assert_eq!(split_view("b@-7"), Some(("b", -7)));
        assert_eq!(split_view("b@x"), None);
        // This process's own view starts with the boot id.
        assert!(view().unwrap().starts_with(&boot_id().unwrap()));
    }

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
