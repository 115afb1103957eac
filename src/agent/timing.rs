//! Timing flags that cannot work, refused before anything is sent.
//!
//! `--ttl`, `--heartbeat`, `--grace` and `--clock-drift` each parse on their
//! own, but together they can describe a run that is lost before it starts:
//! a heartbeat due after the command's SIGTERM, a grace that swallows the
//! whole lease, a ttl no authority grants. Such a run used to be accepted and
//! then failed in a confusing way (exit 124 "lease lost" against a healthy
//! authority, or a command that never starts). This module is the one place
//! the combinations are checked; every refusal names the flag and says what
//! would fit.
//!
//! The rules, with W = the local deadline budget (`ttl * (1 - drift) - 1ms`,
//! the same rule as [`crate::agent::machine::Settings::deadline`]) less the
//! grace, i.e. the time from a renewal's send to the command's SIGTERM,
//! checked in this order, each once:
//! - `1s <= ttl <= 24h`: the lease protocol's bounds ([`crate::lease::MIN_TTL`],
//!   [`crate::lease::MAX_TTL`]), which both real authorities enforce; asking
//!   for less is refused by them anyway, only after the command's
//!   environment has been prepared.
//! - `heartbeat >= 100ms` ([`MIN_HEARTBEAT`]): every renewal is a request
//!   the authority must serve; a 1 ms heartbeat burns a fifth to a third
//!   of a CPU here and floods the authority, and below about 100 ms the
//!   scheduling and vCPU stalls seen on ordinary VMs are as long as the
//!   interval itself, so a shorter one buys no safety. (A zero heartbeat
//!   is told so in its own words.)
//! - `grace < ttl budget`: otherwise SIGTERM is due before the command has
//!   even started (it is then never started). (A grace not even below the
//!   ttl is told so in those words.)
//! - `heartbeat + retry <= W`, with `retry` the pause before a retry
//!   ([`crate::agent::heartbeat::retry_interval`]): the first renewal is due
//!   with room for at least one more try before SIGTERM. With default
//!   proportions (heartbeat ttl/3, grace ttl/6) W is 2.5 heartbeats, which
//!   leaves room for the first try and two more (see `heartbeat.rs` for the
//!   per-try timeout that makes two lost heartbeats survivable). (A
//!   heartbeat not even below the ttl is told so in those words.)

use std::time::Duration;

use crate::agent::heartbeat::retry_interval;
use crate::lease::{MAX_TTL, MIN_TTL};
use crate::time::duration::format;

/// A duration as a `DUR` the user can type back: whole seconds or
/// milliseconds, never rounded (`1997ms`, not `1.9s`).
fn exact(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1_000 == 0 {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

/// The shortest heartbeat accepted (module doc: why).
pub const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

/// A combination of timing flags that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TimingError {
    #[error(
        "--ttl ({}) must be between {} and {} (the lease protocol's bounds)",
        format(*ttl),
        format(MIN_TTL),
        format(MAX_TTL)
    )]
    TtlOutOfBounds { ttl: Duration },
    #[error("--heartbeat must be above 0")]
    ZeroHeartbeat,
    #[error(
        "--heartbeat ({}) is below the smallest accepted, {}: each renewal is a request the authority serves, and a shorter interval is no safer",
        format(*heartbeat),
        format(MIN_HEARTBEAT)
    )]
    HeartbeatTooShort { heartbeat: Duration },
    #[error(
        "--grace ({}) must be below --ttl ({}): the command gets SIGTERM --grace before the lease's deadline",
        format(*grace),
        format(*ttl)
    )]
    GraceNotBelowTtl { grace: Duration, ttl: Duration },
    #[error(
        "--grace ({}) must be below the lease's local deadline ({}: --ttl {} less the --clock-drift budget): the command would be due for SIGTERM before it starts",
        exact(*grace),
        exact(*budget),
        exact(*ttl)
    )]
    GraceNotBelowDeadline {
        grace: Duration,
        budget: Duration,
        ttl: Duration,
    },
    #[error("--heartbeat ({}) must be below --ttl ({})", format(*heartbeat), format(*ttl))]
    HeartbeatNotBelowTtl { heartbeat: Duration, ttl: Duration },
    #[error(
        "--heartbeat ({}) leaves no room to renew: the command gets SIGTERM {} after a renewal (--ttl {} less --grace {} and the --clock-drift budget), and the first renewal plus one retry need {}; {}",
        exact(*heartbeat),
        exact(*window),
        exact(*ttl),
        exact(*grace),
        exact(*needed),
        fix_hint(*window, *grace)
    )]
    NoRoomToRenew {
        heartbeat: Duration,
        window: Duration,
        needed: Duration,
        ttl: Duration,
        grace: Duration,
    },
}

/// What to change when the heartbeat does not fit.
fn fix_hint(window: Duration, grace: Duration) -> String {
    match largest_heartbeat(window) {
        Some(h) => format!("use --heartbeat {} or less", exact(h)),
        None => format!(
            "no --heartbeat fits: lower --grace ({}) or raise --ttl",
            exact(grace)
        ),
    }
}

/// The largest heartbeat `h >= MIN_HEARTBEAT` with `h + retry(h) <= window`.
fn largest_heartbeat(window: Duration) -> Option<Duration> {
    // retry(h) = max(h/4, 50ms) (capped at h); so h = 4/5 window when h/4
    // is over 50 ms, else window - 50 ms. Round down to whole milliseconds.
    let floor = retry_interval(MIN_HEARTBEAT);
    let h = if window >= Duration::from_millis(250) {
        window * 4 / 5
    } else {
        window.saturating_sub(floor)
    };
    let h = Duration::from_millis(crate::time::ms(h));
    (h >= MIN_HEARTBEAT && h + retry_interval(h) <= window).then_some(h)
}

/// The whole set of rules (module doc), given the deadline rule of `settings`.
pub fn check(s: &crate::agent::machine::Settings) -> Result<(), TimingError> {
    let (ttl, heartbeat, grace) = (s.asked_ttl, s.heartbeat, s.grace);
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(TimingError::TtlOutOfBounds { ttl });
    }
    if heartbeat < MIN_HEARTBEAT {
        return Err(if heartbeat.is_zero() {
            TimingError::ZeroHeartbeat
        } else {
            TimingError::HeartbeatTooShort { heartbeat }
        });
    }
    let zero = crate::time::clock::BootInstant::from_since_boot(Duration::ZERO);
    let budget = s.deadline(zero, ttl).saturating_since(zero);
    if grace >= budget {
        return Err(if grace >= ttl {
            TimingError::GraceNotBelowTtl { grace, ttl }
        } else {
            TimingError::GraceNotBelowDeadline { grace, budget, ttl }
        });
    }
    let window = budget - grace;
    let needed = heartbeat + retry_interval(heartbeat);
    if needed > window {
        return Err(if heartbeat >= ttl {
            TimingError::HeartbeatNotBelowTtl { heartbeat, ttl }
        } else {
            TimingError::NoRoomToRenew {
                heartbeat,
                window,
                needed,
                ttl,
                grace,
            }
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::machine::Settings;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn settings(ttl: u64, heartbeat: Option<u64>, grace: Option<u64>) -> Settings {
        Settings {
            asked_ttl: ms(ttl),
            heartbeat: heartbeat.map_or(ms(ttl) / 3, ms),
            grace: grace.map_or(ms(ttl) / 6, ms),
            drift_ppm: crate::time::deadline::DEFAULT_CLOCK_DRIFT_PPM,
            remap_exit: false,
        }
    }

    #[test]
    fn default_proportions_pass_across_the_ttl_range() {
        for ttl in [1_000, 3_000, 30_000, 3_600_000, 86_400_000] {
            assert_eq!(check(&settings(ttl, None, None)), Ok(()), "{ttl}");
        }
    }

    #[test]
    fn the_issues_examples_are_refused_naming_the_flag() {
        let e = check(&settings(3_000, Some(2_600), None)).unwrap_err();
        assert!(matches!(e, TimingError::NoRoomToRenew { .. }), "{e}");
        assert!(e.to_string().starts_with("--heartbeat (2600ms)"), "{e}");
        assert!(
            e.to_string().contains("use --heartbeat 1996ms or less"),
            "{e}"
        );
        let e = check(&settings(1_000, None, Some(999))).unwrap_err();
        assert!(e.to_string().starts_with("--grace (999ms)"), "{e}");
        let e = check(&settings(100, None, None)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--ttl (100ms) must be between 1s and 24h (the lease protocol's bounds)"
        );
        let e = check(&settings(30_000, Some(1), None)).unwrap_err();
        assert!(
            e.to_string().starts_with("--heartbeat (1ms) is below"),
            "{e}"
        );
        assert!(check(&settings(86_400_001, None, None)).is_err());
    }

    #[test]
    fn the_suggested_heartbeat_fits_and_one_more_millisecond_does_not() {
        for (ttl, grace) in [(3_000, 500), (1_000, 600), (2_000, 1_500), (10_000, 9_000)] {
            let e = check(&settings(ttl, Some(ttl - 1), Some(grace))).unwrap_err();
            let TimingError::NoRoomToRenew { window, .. } = e else {
                panic!("{e}")
            };
            match largest_heartbeat(window) {
                Some(h) => {
                    assert_eq!(
                        check(&settings(ttl, Some(h.as_millis() as u64), Some(grace))),
                        Ok(())
                    );
                    let over = h.as_millis() as u64 + 1;
                    assert!(check(&settings(ttl, Some(over), Some(grace))).is_err());
                }
                None => assert!(e.to_string().contains("no --heartbeat fits"), "{e}"),
            }
        }
    }
}
