//! The deadline rule, written once for both guardians of a lease: the
//! agent's machine (`agent/machine/`) and the keeper's own timer
//! (`keeper/guard.rs`).
//!
//! - The **local deadline** of a grant or renewal sent at `sent` that
//!   granted `ttl` is `sent + ttl·(1 − ρ) − ε` ([`local`]). The agent counts
//!   from when it *sent* the request, the authority from when it *received*
//!   it; ρ (default [`DEFAULT_CLOCK_DRIFT_PPM`]) budgets for the two clocks'
//!   rates differing (NTP slews `CLOCK_BOOTTIME` by up to 500 ppm), ε
//!   ([`ROUNDING_MARGIN`]) for an authority that rounds its receipt time
//!   down to whole milliseconds. So the local deadline is never later than
//!   the authority's expiry.
//! - **SIGTERM** to the tree at `deadline − grace`, never after the kill
//!   time ([`Deadline::term_at`]); **SIGKILL** at `deadline − kill lead`
//!   ([`Deadline::kill_at`]), the lead being [`KILL_LEAD`] capped at a
//!   twentieth of the ttl ([`kill_lead`]): the kernel needs a moment to take
//!   a killed process down, and "dead before the deadline" must hold, not
//!   "signalled at it".
//!
//! Both guardians work from the same [`Deadline`] (the agent hands the
//! keeper the one its machine computed, through `keeper::protocol::Arm`),
//! so they cannot disagree on when a stop is due: either alone keeps it.

use std::time::Duration;

use crate::time::clock::BootInstant;

/// How long before the deadline SIGKILL is sent (capped at ttl/20).
pub const KILL_LEAD: Duration = Duration::from_millis(20);

/// ε of the deadline: an authority may floor its receipt time to whole
/// milliseconds (the reference engine does), so its expiry can be up to 1 ms
/// before `receipt + ttl`.
pub const ROUNDING_MARGIN: Duration = Duration::from_millis(1);

/// ρ of the deadline by default: 1,000 ppm (0.1 %), twice the most NTP slews
/// a clock (500 ppm), so the agent's clock may run that much slower than the
/// authority's.
pub const DEFAULT_CLOCK_DRIFT_PPM: u32 = 1_000;

/// The local deadline of a grant or renewal sent at `sent` that granted
/// `ttl`, with ρ = `drift_ppm` parts per million: `sent + ttl·(1 − ρ) − ε`.
pub fn local(sent: BootInstant, ttl: Duration, drift_ppm: u32) -> BootInstant {
    let ppm = u128::from(drift_ppm.min(1_000_000));
    let budget_ns = ttl.as_nanos() * (1_000_000 - ppm) / 1_000_000;
    let budget = Duration::from_nanos(u64::try_from(budget_ns).unwrap_or(u64::MAX));
    sent + budget.saturating_sub(ROUNDING_MARGIN)
}

/// How long before the deadline of a lease of `ttl` SIGKILL goes out:
/// [`KILL_LEAD`], at most a twentieth of the ttl.
pub fn kill_lead(ttl: Duration) -> Duration {
    KILL_LEAD.min(ttl / 20)
}

/// A deadline and how the tree is stopped before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// The tree must be dead by then.
    pub at: BootInstant,
    /// SIGTERM this long before `at` (never after the kill time).
    pub grace: Duration,
    /// SIGKILL this long before `at`.
    pub kill_lead: Duration,
}

impl Deadline {
    /// When SIGKILL is due: `at − kill lead`.
    pub fn kill_at(&self) -> BootInstant {
        self.at - self.kill_lead
    }

    /// When SIGTERM is due: `at − grace`, or the kill time if grace is
    /// shorter than the kill lead.
    pub fn term_at(&self) -> BootInstant {
        (self.at - self.grace).min(self.kill_at())
    }

    /// The same deadline with the grace it actually gets (`at − term_at`):
    /// what the keeper is handed, so both sides read one SIGTERM time.
    pub fn with_effective_grace(self) -> Self {
        Deadline {
            grace: self.at.saturating_since(self.term_at()),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_millis(1_000_000 + ms))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_local_deadline_takes_rho_of_the_ttl_and_the_rounding_margin() {
        // 30 s * (1 - 0.001) - 1 ms = 29.969 s.
        assert_eq!(local(at(0), ms(30_000), 1_000), at(29_969));
        // 24 h: 86.4 s of budget.
        assert_eq!(
            local(at(0), Duration::from_secs(86_400), 1_000),
            at(86_400_000 - 86_400 - 1)
        );
        assert_eq!(local(at(0), Duration::ZERO, 1_000), at(0));
        assert_eq!(local(at(0), ms(3_000), 0), at(2_999));
    }

    #[test]
    fn term_before_kill_before_the_deadline() {
        let d = Deadline {
            at: at(10_000),
            grace: ms(3_000),
            kill_lead: ms(200),
        };
        assert_eq!(d.term_at(), at(7_000));
        assert_eq!(d.kill_at(), at(9_800));
        assert_eq!(d.with_effective_grace(), d);
        // A grace shorter than the lead: SIGTERM at the kill time, and the
        // keeper is handed that grace.
        let short = Deadline { grace: ms(5), ..d };
        assert_eq!(short.term_at(), at(9_800));
        assert_eq!(short.with_effective_grace().grace, ms(200));
        assert_eq!(kill_lead(ms(30_000)), KILL_LEAD);
        assert_eq!(kill_lead(ms(200)), ms(10));
    }
}
