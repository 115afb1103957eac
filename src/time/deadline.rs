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
//!   ([`Deadline::kill_at`]). The kernel needs time to take a killed tree
//!   down, and "dead before the deadline" means reaped, not "signalled at
//!   it": the lead is sized from the tree as it runs ([`kill_lead`]): a
//!   floor ([`KILL_LEAD`], at most a twentieth of the ttl) plus a cost per
//!   process and per GiB of private resident memory ([`TreeSize`]), from
//!   the teardown times measured for #31 (2,000 processes: up to 170 ms
//!   after `cgroup.kill` on 2 CPUs; 4 GiB: up to 450 ms) with about twice
//!   their margin, stretched on a host busier than that
//!   ([`BUSY_CALIBRATED_MILLI`]: dying processes wait for a CPU too),
//!   at most a quarter of the ttl
//!   ([`max_kill_lead`]). To the floor goes twice the keeper's own
//!   measured lateness ([`TreeSize::late_us`], [`LATE_FACTOR`]): how long
//!   past their due time its recent timed wakes got a CPU
//!   (`keeper/lateness.rs`). The kill itself goes out that late on a busy
//!   host, so a small tree on a loaded machine gets the lead its scheduler
//!   needs, measured where it runs rather than guessed from the load. A quarter keeps the contract's "two lost
//!   heartbeats do not stop the command" with default flags (the third
//!   try, at 1.67 heartbeats, is answered before 2.25), and a tree too big
//!   for it on this host is killed as early as the lease allows.
//!
//! Both guardians work from the same [`Deadline`] (the agent hands the
//! keeper the one its machine computed, through `keeper::protocol::Arm`),
//! so they cannot disagree on when a stop is due: either alone keeps it.

use std::time::Duration;

use crate::time::clock::BootInstant;

/// The floor of the kill lead: how long before the deadline SIGKILL goes
/// out for the smallest tree (capped at ttl/20).
pub const KILL_LEAD: Duration = Duration::from_millis(20);

/// What a process of the tree adds to the kill lead: its share of the
/// kernel's teardown on a busy two-CPU host, sized for the slowest stop,
/// the fallback's walk (2,000 processes of `nobody`, each in a session of
/// its own, took up to 433 ms from the first SIGKILL to the last death in
/// #31's figures, and 300-450 ms in `agent_contain`'s test), with margin;
/// `cgroup.kill` and a PID namespace take about half of that.
pub const LEAD_PER_PROCESS: Duration = Duration::from_micros(400);

/// What a GiB of private resident memory (anonymous pages: freed one by
/// one at exit) adds to the kill lead (4 GiB took up to 450 ms), with
/// margin.
pub const LEAD_PER_GIB: Duration = Duration::from_millis(200);

/// How many times the keeper's measured wake lateness goes into the
/// lead's floor: once for the kill's own wake, once more as margin for a
/// wake later than any seen lately.
pub const LATE_FACTOR: u32 = 2;

/// The tree as last sampled: how many processes, how much private
/// resident memory (resident less shared, in bytes), how busy the host
/// was (`busy_milli`: the 1-minute load average per online CPU, times
/// 1,000; 0 when unknown), and how late the keeper's recent timed wakes
/// were (`late_us`, microseconds: the decayed worst, see
/// `keeper/lateness.rs`; 0 when none was measured).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeSize {
    pub procs: u32,
    pub private_bytes: u64,
    pub busy_milli: u32,
    pub late_us: u32,
}

/// The load per CPU the per-process and per-GiB costs were measured at
/// (#31's "busy two-CPU host", load about 4): above it, a dying process
/// waits that much longer for a CPU to tear itself down, and those costs
/// grow in proportion (a stop tree bench at load 30 on 2 CPUs reaped 100
/// processes 7 ms, 1,000 processes 195 ms and 0.5 GiB 65 ms after the
/// authority's expiry with unscaled costs).
pub const BUSY_CALIBRATED_MILLI: u32 = 2_000;

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

/// The longest kill lead of a lease of `ttl`: a quarter of it.
pub fn max_kill_lead(ttl: Duration) -> Duration {
    ttl / 4
}

/// How long before the deadline of a lease of `ttl` SIGKILL goes out for a
/// tree of `tree`'s size: [`KILL_LEAD`] (at most ttl/20) and
/// [`LATE_FACTOR`] times the keeper's measured lateness, plus
/// [`LEAD_PER_PROCESS`] a process and [`LEAD_PER_GIB`] a GiB of private
/// resident memory, those two scaled up by how much busier the host is
/// than [`BUSY_CALIBRATED_MILLI`], at most [`max_kill_lead`].
pub fn kill_lead(ttl: Duration, tree: TreeSize) -> Duration {
    const GIB: u128 = 1 << 30;
    let late = Duration::from_micros(u64::from(tree.late_us)) * LATE_FACTOR;
    let floor = KILL_LEAD.min(ttl / 20).saturating_add(late);
    let per_proc_ns = LEAD_PER_PROCESS.as_nanos() * u128::from(tree.procs);
    let per_mem_ns = LEAD_PER_GIB.as_nanos() * u128::from(tree.private_bytes) / GIB;
    let busy = u128::from(tree.busy_milli.max(BUSY_CALIBRATED_MILLI));
    let variable_ns = (per_proc_ns + per_mem_ns) * busy / u128::from(BUSY_CALIBRATED_MILLI);
    let sized = floor.saturating_add(Duration::from_nanos(
        u64::try_from(variable_ns).unwrap_or(u64::MAX),
    ));
    sized.min(max_kill_lead(ttl))
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
    /// The granted ttl, which bounds the lead ([`kill_lead`]): the keeper
    /// sizes a lead of its own from its samples of the tree with it.
    pub ttl: Duration,
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

    /// The lead for a tree of `tree`'s size under this deadline's ttl, or
    /// the one it carries if that is longer (a lead only ever grows: the
    /// earlier kill is the safe one).
    pub fn lead_for(&self, tree: TreeSize) -> Duration {
        self.kill_lead.max(kill_lead(self.ttl, tree))
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
            ttl: ms(10_000),
        };
        assert_eq!(d.term_at(), at(7_000));
        assert_eq!(d.kill_at(), at(9_800));
        assert_eq!(d.with_effective_grace(), d);
        // A grace shorter than the lead: SIGTERM at the kill time, and the
        // keeper is handed that grace.
        let short = Deadline { grace: ms(5), ..d };
        assert_eq!(short.term_at(), at(9_800));
        assert_eq!(short.with_effective_grace().grace, ms(200));
        let none = TreeSize::default();
        assert_eq!(kill_lead(ms(30_000), none), KILL_LEAD);
        assert_eq!(kill_lead(ms(200), none), ms(10));
    }

    #[test]
    fn the_lead_grows_with_the_tree_up_to_a_quarter_of_the_ttl() {
        let ttl = ms(30_000);
        let procs = |n| TreeSize {
            procs: n,
            private_bytes: 0,
            busy_milli: 0,
            late_us: 0,
        };
        assert_eq!(kill_lead(ttl, procs(1)), KILL_LEAD + LEAD_PER_PROCESS);
        assert_eq!(
            kill_lead(ttl, procs(1_000)),
            KILL_LEAD + LEAD_PER_PROCESS * 1_000
        );
        let gib = TreeSize {
            procs: 0,
            private_bytes: 2 << 30,
            busy_milli: 0,
            late_us: 0,
        };
        assert_eq!(kill_lead(ttl, gib), KILL_LEAD + LEAD_PER_GIB * 2);
        // Capped at ttl/4, never below the floor.
        let huge = TreeSize {
            procs: u32::MAX,
            private_bytes: u64::MAX,
            busy_milli: 0,
            late_us: 0,
        };
        assert_eq!(kill_lead(ms(4_000), huge), ms(1_000));
        assert_eq!(kill_lead(ms(40), none()), ms(2));
        // A deadline's lead only grows with a sample.
        let d = Deadline {
            at: at(10_000),
            grace: ms(3_000),
            kill_lead: ms(300),
            ttl: ms(4_000),
        };
        assert_eq!(d.lead_for(procs(1)), ms(300));
        assert_eq!(d.lead_for(huge), ms(1_000));
    }

    /// On a host busier than the costs were measured at, the per-process
    /// and per-GiB parts grow in proportion; the floor does not, nor does a
    /// quieter host shrink anything; the cap holds.
    #[test]
    fn a_busy_host_stretches_the_tree_s_part_of_the_lead() {
        let ttl = ms(30_000);
        let tree = |busy_milli| TreeSize {
            procs: 100,
            private_bytes: 1 << 30,
            busy_milli,
            late_us: 0,
        };
        let calm = KILL_LEAD + LEAD_PER_PROCESS * 100 + LEAD_PER_GIB;
        assert_eq!(kill_lead(ttl, tree(0)), calm);
        assert_eq!(kill_lead(ttl, tree(500)), calm);
        assert_eq!(kill_lead(ttl, tree(BUSY_CALIBRATED_MILLI)), calm);
        // Load 30 on 2 CPUs: 15 per CPU, 7.5 times the calibration.
        assert_eq!(
            kill_lead(ttl, tree(15_000)),
            KILL_LEAD + (LEAD_PER_PROCESS * 100 + LEAD_PER_GIB) * 15 / 2
        );
        assert_eq!(kill_lead(ms(4_000), tree(u32::MAX)), ms(1_000));
        let empty = TreeSize {
            busy_milli: 50_000,
            ..TreeSize::default()
        };
        assert_eq!(kill_lead(ttl, empty), KILL_LEAD);
    }

    /// A keeper that woke late lately gets twice that on the floor, the
    /// tree's part on top, and the cap still holds; a quiet one (0)
    /// changes nothing.
    #[test]
    fn the_measured_lateness_raises_the_floor_twice_over() {
        let ttl = ms(2_000);
        let late = |us| TreeSize {
            late_us: us,
            ..TreeSize::default()
        };
        assert_eq!(kill_lead(ttl, late(0)), KILL_LEAD);
        assert_eq!(kill_lead(ttl, late(12_000)), KILL_LEAD + ms(24));
        let tree = TreeSize {
            procs: 10,
            ..late(5_000)
        };
        assert_eq!(
            kill_lead(ttl, tree),
            KILL_LEAD + ms(10) + LEAD_PER_PROCESS * 10
        );
        assert_eq!(kill_lead(ttl, late(u32::MAX)), ms(500));
        // A short ttl's floor is capped at ttl/20 before the lateness.
        assert_eq!(kill_lead(ms(200), late(1_000)), ms(12));
        let d = Deadline {
            at: at(10_000),
            grace: ms(600),
            kill_lead: KILL_LEAD,
            ttl,
        };
        assert_eq!(d.lead_for(late(30_000)), KILL_LEAD + ms(60));
    }

    fn none() -> TreeSize {
        TreeSize::default()
    }
}
