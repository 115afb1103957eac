//! The keeper's own hold on the deadline: the second guardian, as a pure
//! decision core (`(state, input, now) -> what is due`), tested without
//! processes.
//!
//! Why a second guardian: the agent decides, but it can be stopped
//! (SIGSTOP, Ctrl-Z before it handled it), blocked (a read or write on a
//! stalled filesystem), descheduled or dead. After every grant and renewal
//! the agent hands the keeper the deadline, the grace and the kill lead
//! ([`Arm`]); the keeper arms a `CLOCK_BOOTTIME` timer and, if no newer
//! deadline replaces it, stops the tree on its own: SIGTERM at
//! `deadline - grace`, SIGKILL at `deadline - kill lead`. Either guardian
//! alone keeps the deadline.
//!
//! Rules (mirroring the agent's machine; the times themselves are the one
//! rule both share, [`crate::time::deadline::Deadline`]):
//! - The latest [`Arm`] wins, earlier or later than the one before
//!   (renewals are sequential; the agent sends only what its machine
//!   decided).
//! - Once the keeper has acted on a deadline (SIGTERM sent), the stop is
//!   irreversible: a later [`Arm`] may only bring the deadline forward.
//! - At most one SIGTERM per deadline: the agent asks for SIGTERM at the
//!   same moment the timer fires; whichever comes second is not repeated
//!   (a job may read a second SIGTERM as "hurry").
//! - SIGKILL is due at `deadline - kill lead` whatever happened before.
//! - The kill lead is the larger of the agent's (in the `Arm`) and the one
//!   the keeper sizes from its own latest sample of the tree
//!   ([`Guard::sized`], by `time::deadline`'s rule under the armed ttl): a
//!   tree that grew while the agent was stopped is still dead, reaped, by
//!   the deadline. The keeper's measured wake lateness
//!   ([`Guard::late`], `keeper/lateness.rs`) goes into that sample at
//!   once, between samples too: a keeper that starts to wake late gets
//!   the longer lead before its next sample of the tree.

use crate::keeper::protocol::Arm;
use crate::time::clock::BootInstant;
use crate::time::deadline::{Deadline, TreeSize};

/// What the timer says is due now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    Term,
    Kill,
}

/// The keeper's view of the deadline (on `CLOCK_BOOTTIME`, as the agent's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Guard {
    armed: Option<Deadline>,
    /// SIGTERM went out for the current deadline (by the timer or asked).
    termed: bool,
    /// The timer's SIGKILL went out.
    killed: bool,
    /// The tree as the keeper last sampled it (none yet: the agent's lead).
    tree: Option<TreeSize>,
}

impl Guard {
    /// The armed deadline with the lead the tree needs now.
    fn effective(&self) -> Option<Deadline> {
        self.armed.map(|d| Deadline {
            kill_lead: self.tree.map_or(d.kill_lead, |t| d.lead_for(t)),
            ..d
        })
    }

    /// When SIGTERM is due, if armed.
    pub fn term_at(&self) -> Option<BootInstant> {
        self.effective().map(|d| d.term_at())
    }

    /// When SIGKILL is due, if armed.
    pub fn kill_at(&self) -> Option<BootInstant> {
        self.effective().map(|d| d.kill_at())
    }

    /// The keeper's latest sample of the tree: the lead it sizes.
    pub fn sized(&mut self, tree: TreeSize) {
        let late_us = self
            .tree
            .map_or(tree.late_us, |t| t.late_us.max(tree.late_us));
        self.tree = Some(TreeSize { late_us, ..tree });
    }

    /// The keeper's measured wake lateness now (microseconds): the sampled
    /// tree's lead takes it from here on (`deadline::kill_lead`).
    pub fn late(&mut self, late_us: u32) {
        self.tree.get_or_insert_default().late_us = late_us;
    }

    /// A new deadline from the agent. After the keeper acted on the old
    /// one it may only come earlier.
    pub fn arm(&mut self, new: Arm) {
        let new = new.deadline();
        match self.armed {
            Some(old) if self.termed || self.killed => {
                if new.at < old.at {
                    self.armed = Some(new);
                }
            }
            _ => self.armed = Some(new),
        }
    }

    /// The agent asked for SIGTERM to the tree: whether to send it (not if
    /// the timer already did for this deadline).
    pub fn term_requested(&mut self) -> bool {
        let first = !self.termed;
        self.termed = true;
        first || self.armed.is_none()
    }

    /// The next time the timer must fire, if anything is still due.
    pub fn next_wake(&self) -> Option<BootInstant> {
        if self.killed {
            return None;
        }
        if self.termed {
            self.kill_at()
        } else {
            self.term_at()
        }
    }

    /// What is due at `now` (and is then recorded as done).
    pub fn due(&mut self, now: BootInstant) -> Vec<Due> {
        let mut out = Vec::new();
        if self.killed {
            return out;
        }
        if !self.termed && self.term_at().is_some_and(|t| now >= t) {
            self.termed = true;
            out.push(Due::Term);
        }
        if self.kill_at().is_some_and(|k| now >= k) {
            self.killed = true;
            out.push(Due::Kill);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arm(deadline: u64, grace: u64, lead: u64) -> Arm {
        Arm {
            deadline_us: deadline,
            grace_us: grace,
            kill_lead_us: lead,
            // Long enough that a sampled lead is never capped below `lead`.
            ttl_us: 40_000_000,
        }
    }

    /// `us` microseconds after boot.
    fn t(us: u64) -> BootInstant {
        BootInstant::from_since_boot(std::time::Duration::from_micros(us))
    }

    #[test]
    fn unarmed_nothing_is_due() {
        let mut g = Guard::default();
        assert_eq!(g.next_wake(), None);
        assert!(g.due(t(u64::MAX)).is_empty());
    }

    #[test]
    fn term_at_deadline_minus_grace_then_kill_at_deadline_minus_lead() {
        let mut g = Guard::default();
        g.arm(arm(10_000, 3_000, 200));
        assert_eq!(g.next_wake(), Some(t(7_000)));
        assert!(g.due(t(6_999)).is_empty());
        assert_eq!(g.due(t(7_000)), vec![Due::Term]);
        assert_eq!(g.next_wake(), Some(t(9_800)));
        assert!(g.due(t(9_799)).is_empty());
        assert_eq!(g.due(t(9_800)), vec![Due::Kill]);
        assert_eq!(g.next_wake(), None);
        // A wake-up long after (the keeper was stopped): both at once.
        let mut g = Guard::default();
        g.arm(arm(10_000, 3_000, 200));
        assert_eq!(g.due(t(50_000)), vec![Due::Term, Due::Kill]);
    }

    #[test]
    fn a_renewal_moves_the_deadline_either_way_until_the_keeper_acted() {
        let mut g = Guard::default();
        g.arm(arm(10_000, 3_000, 200));
        g.arm(arm(20_000, 3_000, 200));
        assert_eq!(g.next_wake(), Some(t(17_000)));
        g.arm(arm(5_000, 1_000, 200));
        assert_eq!(g.next_wake(), Some(t(4_000)));
        assert_eq!(g.due(t(4_000)), vec![Due::Term]);
        // Once acted on: a later deadline changes nothing, an earlier one counts.
        g.arm(arm(60_000, 1_000, 200));
        assert_eq!(g.kill_at(), Some(t(4_800)));
        g.arm(arm(4_500, 1_000, 200));
        assert_eq!(g.kill_at(), Some(t(4_300)));
    }

    #[test]
    fn sigterm_goes_out_once_per_deadline() {
        let mut g = Guard::default();
        g.arm(arm(10_000, 3_000, 200));
        assert_eq!(g.due(t(7_000)), vec![Due::Term]);
        assert!(!g.term_requested(), "the agent's SIGTERM is the same one");
        let mut g = Guard::default();
        g.arm(arm(10_000, 3_000, 200));
        assert!(g.term_requested());
        assert!(
            g.due(t(7_000)).is_empty(),
            "the timer's SIGTERM is the same one"
        );
        assert_eq!(g.due(t(9_800)), vec![Due::Kill]);
        // Unarmed (before the first Arm), every request is carried out.
        let mut g = Guard::default();
        assert!(g.term_requested());
        assert!(g.term_requested());
    }

    #[test]
    fn a_bigger_tree_brings_the_kill_earlier_never_later() {
        let mut g = Guard::default();
        g.arm(arm(10_000_000, 3_000_000, 20_000));
        assert_eq!(g.kill_at(), Some(t(9_980_000)));
        // 1,000 processes: the lead grows by their share.
        g.sized(TreeSize {
            procs: 1_000,
            ..TreeSize::default()
        });
        let lead = crate::time::deadline::kill_lead(
            std::time::Duration::from_secs(40),
            TreeSize {
                procs: 1_000,
                ..TreeSize::default()
            },
        );
        assert_eq!(g.kill_at(), Some(t(10_000_000 - lead.as_micros() as u64)));
        // A smaller sample never brings it below the agent's own lead.
        g.arm(arm(10_000_000, 3_000_000, 50_000));
        g.sized(TreeSize::default());
        assert_eq!(g.kill_at(), Some(t(9_950_000)));
    }

    #[test]
    fn a_keeper_that_wakes_late_kills_earlier_before_its_next_sample() {
        let mut g = Guard::default();
        g.arm(arm(10_000_000, 3_000_000, 20_000));
        assert_eq!(g.kill_at(), Some(t(9_980_000)));
        // 15 ms late: twice that on the 20 ms floor.
        g.late(15_000);
        assert_eq!(g.kill_at(), Some(t(9_950_000)));
        // A sample taken before that observation does not undo it.
        g.sized(TreeSize::default());
        assert_eq!(g.kill_at(), Some(t(9_950_000)));
        // A calmer keeper gets the agent's lead back, never less.
        g.late(0);
        assert_eq!(g.kill_at(), Some(t(9_980_000)));
    }

    proptest! {
        /// Whatever the sequence of deadlines and wake-ups: SIGKILL is due
        /// no later than the earliest kill time of any deadline the keeper
        /// acted on or the latest one, and never before the current
        /// deadline's SIGTERM time unless it had acted already.
        #[test]
        fn kill_is_never_later_than_the_armed_kill_time(
            steps in prop::collection::vec((0u64..20_000, 0u64..5_000, 1u64..500, 0u64..3_000), 1..40),
        ) {
            let mut g = Guard::default();
            let mut now = 0u64;
            let mut killed_at = None;
            for (deadline, grace, lead, advance) in steps {
                g.arm(arm(now + deadline, grace, lead));
                let k = g.kill_at().unwrap();
                // The loop wakes at next_wake or when time advances.
                let target = now + advance;
                while let Some(w) = g.next_wake() {
                    if w > t(target) { break; }
                    now = now.max(w.since_boot().as_micros() as u64);
                    if g.due(t(now)).contains(&Due::Kill) { killed_at = Some(now); }
                }
                now = target;
                if g.due(t(now)).contains(&Due::Kill) { killed_at = Some(now); }
                if t(now) >= k {
                    prop_assert!(killed_at.is_some_and(|at| t(at) <= t(now).max(k)));
                }
            }
        }
    }
}
