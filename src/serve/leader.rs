//! Leadership among `serve` replicas on one PostgreSQL store, as a pure
//! state machine: `(role, event, now) → role`, and `next(now)` says what
//! the leadership thread (`replica.rs`) does next. All times are
//! boot-clock milliseconds of this replica (`CLOCK_BOOTTIME`: it counts
//! through suspend and is never set); no clock of the database or of
//! another replica enters any decision.
//!
//! The rules, and what each guards against:
//! - **A leader fences itself.** Its deadline is `sent + ttl·(1 − ρ) − 1 ms`
//!   for the send time `sent` of its last *confirmed* renewal (or of the
//!   takeover): past it, it answers no lease call ([`Role::valid_until`]),
//!   whatever its renewals are doing (hung, refused, never sent because the
//!   process was stopped). The agent's deadline rule, applied to the
//!   authority (`time/deadline.rs`).
//! - **A standby waits a whole ttl of silence.** It may take over only
//!   after seeing the same leadership row (epoch and beat) for a full ttl,
//!   counted from when the read that first showed that row *returned*
//!   (after the commit that wrote it, so after its leader sent it): by then
//!   that leader's own deadline has passed. The takeover is a
//!   compare-and-set on exactly that row (`engine/postgres/leader.rs`), so
//!   a renewal that lands meanwhile wins and the standby goes on watching.
//! - **Nobody leads, or it was us.** A row without a holder (a fresh store,
//!   or a leader that let go on a clean stop) is taken at once; so is a row
//!   whose holder is this very process (it stepped down itself after a
//!   failed commit and answers nothing any more): that is a restart.
//! - **Deposed means stopped.** A renewal that matches no row (a newer
//!   epoch exists) or a writer refused by the fence steps down at once.
//!
//! A takeover is the protocol's Restart: the new leader loads every lease
//! on record with a full ttl from now (`engine::batched`), so no lease ends
//! early, and tokens continue above the store's sequence.

use crate::engine::postgres::leader::LeaderRow;

/// How leadership is timed (the `--leader-ttl` family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a leadership lasts past its last confirmed renewal.
    pub ttl_ms: u64,
    /// How often the leader renews (well inside the ttl).
    pub renew_every_ms: u64,
    /// How often a standby reads the row.
    pub poll_every_ms: u64,
    /// ρ: how much faster this clock may run than another's.
    pub drift_ppm: u32,
}

impl Timing {
    /// The defaults for a leader ttl: renew five times per ttl, watch ten
    /// times per ttl but at least every 500 ms (so a takeover comes within
    /// about 1.1 ttl, and a leadership let go is taken within half a second).
    pub fn for_ttl(ttl_ms: u64) -> Timing {
        Timing {
            ttl_ms,
            renew_every_ms: (ttl_ms / 5).max(1),
            poll_every_ms: (ttl_ms / 10).clamp(1, 500),
            drift_ppm: crate::time::deadline::DEFAULT_CLOCK_DRIFT_PPM,
        }
    }

    /// The deadline of a leadership confirmed by a call sent at `sent_ms`.
    pub fn deadline(&self, sent_ms: u64) -> u64 {
        let ppm = u128::from(self.drift_ppm.min(1_000_000));
        let budget = u128::from(self.ttl_ms) * (1_000_000 - ppm) / 1_000_000;
        let budget = u64::try_from(budget).unwrap_or(u64::MAX);
        sent_ms.saturating_add(budget).saturating_sub(1)
    }
}

/// What this replica is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Watching the row; `seen`: the row and when it was first seen so.
    Standby {
        seen: Option<(LeaderRow, u64)>,
        next_ms: u64,
    },
    /// Leading epoch `epoch` until `deadline_ms` unless renewed.
    Leading {
        epoch: u64,
        deadline_ms: u64,
        next_renew_ms: u64,
    },
}

/// What happened (each with the instant it happened at, where it matters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A read of the row returned it at `at_ms`.
    Observed { row: LeaderRow, at_ms: u64 },
    /// The takeover sent at `sent_ms` committed: we lead `epoch`.
    TookOver { epoch: u64, sent_ms: u64 },
    /// The takeover matched no row (the row moved): keep watching.
    Moved,
    /// The renewal sent at `sent_ms` was confirmed.
    Renewed { sent_ms: u64 },
    /// A newer epoch exists (the renewal matched no row, or the fence
    /// refused a commit).
    Deposed,
    /// This leader's writer failed (the store was unreachable or a commit
    /// failed): it steps down and takes its own row again as a restart.
    EngineFailed,
    /// A call to the store failed (no answer): try again soon.
    Failed,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Read the row.
    Observe,
    /// Try to take over from exactly this row.
    TakeOver(LeaderRow),
    /// Renew `epoch`; the call must end within `within_ms`.
    Renew { epoch: u64, within_ms: u64 },
    /// Stop leading `epoch` now (its deadline passed, or it was deposed).
    Resign { epoch: u64 },
    /// Nothing until then.
    Wait { until_ms: u64 },
}

/// How soon a failed call is tried again.
const RETRY_MS: u64 = 100;

/// The machine: a role, this replica's identity, and the timing.
#[derive(Clone, Debug)]
pub struct Machine {
    pub role: Role,
    pub identity: String,
    pub timing: Timing,
    /// A step-down is due (deposed, or the writer failed) for this epoch.
    stepping_down: Option<u64>,
    /// Writer failures in a row with no confirmed renewal between them:
    /// each doubles the wait before this replica takes its own row again
    /// (up to one leadership ttl), so a store whose rows cannot be loaded
    /// is not taken over and given up several times a second, each time
    /// with a new epoch.
    failures: u32,
}

impl Role {
    /// Until when lease calls may be answered (`None`: not leading).
    pub fn valid_until(&self) -> Option<u64> {
        match self {
            Role::Leading { deadline_ms, .. } => Some(*deadline_ms),
            Role::Standby { .. } => None,
        }
    }
}

impl Machine {
    pub fn new(identity: String, timing: Timing) -> Self {
        Machine {
            role: Role::Standby {
                seen: None,
                next_ms: 0,
            },
            identity,
            timing,
            stepping_down: None,
            failures: 0,
        }
    }

    /// What to do at `now`.
    pub fn next(&self, now: u64) -> Step {
        if let Some(epoch) = self.stepping_down {
            return Step::Resign { epoch };
        }
        match &self.role {
            Role::Leading {
                epoch,
                deadline_ms,
                next_renew_ms,
            } => {
                if now >= *deadline_ms {
                    Step::Resign { epoch: *epoch }
                } else if now >= *next_renew_ms {
                    Step::Renew {
                        epoch: *epoch,
                        within_ms: deadline_ms - now,
                    }
                } else {
                    Step::Wait {
                        until_ms: (*next_renew_ms).min(*deadline_ms),
                    }
                }
            }
            Role::Standby { seen, next_ms } => {
                if let Some((row, since)) = seen {
                    let free = row.holder.is_none()
                        || row.holder.as_deref() == Some(self.identity.as_str());
                    if free || now >= since.saturating_add(self.timing.ttl_ms) {
                        return Step::TakeOver(row.clone());
                    }
                }
                if now >= *next_ms {
                    Step::Observe
                } else {
                    Step::Wait { until_ms: *next_ms }
                }
            }
        }
    }

    /// Applies what happened at `now`.
    pub fn apply(&mut self, ev: Event, now: u64) {
        let t = self.timing;
        match (&mut self.role, ev) {
            (Role::Standby { seen, next_ms }, Event::Observed { row, at_ms }) => {
                let same = seen.as_ref().is_some_and(|(r, _)| *r == row);
                if !same {
                    *seen = Some((row, at_ms));
                }
                *next_ms = now.saturating_add(t.poll_every_ms);
            }
            (Role::Standby { .. }, Event::TookOver { epoch, sent_ms }) => {
                self.role = Role::Leading {
                    epoch,
                    deadline_ms: t.deadline(sent_ms),
                    next_renew_ms: sent_ms.saturating_add(t.renew_every_ms),
                };
            }
            (Role::Standby { seen, next_ms }, Event::Moved) => {
                *seen = None;
                *next_ms = now;
            }
            (
                Role::Leading {
                    deadline_ms,
                    next_renew_ms,
                    ..
                },
                Event::Renewed { sent_ms },
            ) => {
                *deadline_ms = (*deadline_ms).max(t.deadline(sent_ms));
                *next_renew_ms = sent_ms.saturating_add(t.renew_every_ms);
                self.failures = 0;
            }
            (Role::Leading { epoch, .. }, Event::Deposed) => {
                self.stepping_down = Some(*epoch);
            }
            (Role::Leading { epoch, .. }, Event::EngineFailed) => {
                self.stepping_down = Some(*epoch);
                self.failures = self.failures.saturating_add(1);
            }
            (Role::Leading { next_renew_ms, .. }, Event::Failed) => {
                *next_renew_ms = now.saturating_add(RETRY_MS);
            }
            (Role::Standby { next_ms, .. }, Event::Failed) => {
                *next_ms = now.saturating_add(RETRY_MS.max(t.poll_every_ms / 2));
            }
            // Anything else is stale news for the role we are in.
            _ => {}
        }
    }

    /// The step-down of [`Step::Resign`] is done: watch again.
    pub fn stepped_down(&mut self, now: u64) {
        self.stepping_down = None;
        self.role = Role::Standby {
            seen: None,
            next_ms: now.saturating_add(self.backoff_ms()),
        };
    }

    /// How long to wait before watching again after a step-down: nothing
    /// after a deposition or a first writer failure (a restart), then
    /// [`RETRY_MS`] doubling per failure in a row, at most one ttl.
    fn backoff_ms(&self) -> u64 {
        match self.failures {
            0 | 1 => 0,
            n => RETRY_MS
                .saturating_mul(1u64 << (n - 2).min(20))
                .min(self.timing.ttl_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(epoch: u64, beat: u64, holder: Option<&str>) -> LeaderRow {
        LeaderRow {
            epoch,
            holder: holder.map(String::from),
            url: holder.map(|h| format!("http://{h}")),
            beat,
            since_ms: None,
        }
    }

    fn m() -> Machine {
        Machine::new("me#1".into(), Timing::for_ttl(5000))
    }

    #[test]
    fn a_standby_takes_a_free_row_at_once_and_a_held_one_after_a_silent_ttl() {
        let mut m = m();
        assert_eq!(m.next(0), Step::Observe);
        m.apply(
            Event::Observed {
                row: row(0, 0, None),
                at_ms: 10,
            },
            10,
        );
        assert_eq!(m.next(10), Step::TakeOver(row(0, 0, None)));
        let mut m = super::tests::m();
        let held = row(3, 7, Some("other#2"));
        m.apply(
            Event::Observed {
                row: held.clone(),
                at_ms: 100,
            },
            100,
        );
        assert_eq!(m.next(4000), Step::Observe);
        m.apply(
            Event::Observed {
                row: held.clone(),
                at_ms: 4000,
            },
            4000,
        );
        assert!(matches!(m.next(5099), Step::Wait { .. } | Step::Observe));
        assert_eq!(m.next(5100), Step::TakeOver(held.clone()));
        // The leader renewed meanwhile: the clock starts again.
        m.apply(
            Event::Observed {
                row: row(3, 8, Some("other#2")),
                at_ms: 5100,
            },
            5100,
        );
        assert_ne!(m.next(10_099), Step::TakeOver(row(3, 8, Some("other#2"))));
    }

    #[test]
    fn a_leader_fences_itself_on_its_last_confirmed_send() {
        let mut m = m();
        m.apply(
            Event::TookOver {
                epoch: 4,
                sent_ms: 1000,
            },
            1020,
        );
        let d = Timing::for_ttl(5000).deadline(1000);
        assert_eq!(m.role.valid_until(), Some(d));
        assert!(d < 6000);
        assert_eq!(
            m.next(2000),
            Step::Renew {
                epoch: 4,
                within_ms: d - 2000
            }
        );
        m.apply(Event::Failed, 2000);
        m.apply(Event::Renewed { sent_ms: 2100 }, 2150);
        assert_eq!(
            m.role.valid_until(),
            Some(Timing::for_ttl(5000).deadline(2100))
        );
        assert_eq!(m.next(7200), Step::Resign { epoch: 4 });
        m.stepped_down(7200);
        assert_eq!(m.role.valid_until(), None);
    }

    #[test]
    fn deposed_or_a_failed_writer_steps_down_at_once() {
        for ev in [Event::Deposed, Event::EngineFailed] {
            let mut m = m();
            m.apply(
                Event::TookOver {
                    epoch: 2,
                    sent_ms: 0,
                },
                0,
            );
            m.apply(ev, 10);
            assert_eq!(m.next(10), Step::Resign { epoch: 2 });
        }
        // Its own row is taken again at once (a restart), anyone else's not.
        let mut m = m();
        m.apply(
            Event::Observed {
                row: row(2, 5, Some("me#1")),
                at_ms: 20,
            },
            20,
        );
        assert_eq!(m.next(20), Step::TakeOver(row(2, 5, Some("me#1"))));
    }

    /// A writer that fails at every takeover (rows it cannot load) is
    /// restarted at once the first time, then ever more slowly, at most
    /// one ttl apart; a confirmed renewal forgives the failures.
    #[test]
    fn a_writer_failing_again_and_again_backs_off_up_to_one_ttl() {
        let mut m = m();
        let ttl = m.timing.ttl_ms;
        let mut now = 0;
        let mut gaps = Vec::new();
        for epoch in 1..=12 {
            m.apply(
                Event::TookOver {
                    epoch,
                    sent_ms: now,
                },
                now,
            );
            m.apply(Event::EngineFailed, now);
            assert_eq!(m.next(now), Step::Resign { epoch });
            m.stepped_down(now);
            let Role::Standby { next_ms, .. } = m.role else {
                panic!("standby after a step-down")
            };
            gaps.push(next_ms - now);
            now = next_ms;
        }
        assert_eq!(&gaps[..4], &[0, 100, 200, 400], "{gaps:?}");
        assert!(gaps.windows(2).all(|w| w[0] <= w[1]), "{gaps:?}");
        assert_eq!(*gaps.last().unwrap(), ttl, "{gaps:?}");
        // Leading well again: the next failure restarts at once.
        m.apply(
            Event::TookOver {
                epoch: 20,
                sent_ms: now,
            },
            now,
        );
        m.apply(Event::Renewed { sent_ms: now + 10 }, now + 10);
        m.apply(Event::EngineFailed, now + 20);
        m.stepped_down(now + 20);
        assert!(matches!(m.role, Role::Standby { next_ms, .. } if next_ms == now + 20));
    }

    proptest! {
        /// Whatever happens, a leader's deadline is never past ttl·(1−ρ)
        /// after the send time of a confirmed renewal or takeover, and a
        /// held row is never taken before a ttl of seeing it unchanged.
        #[test]
        fn never_leads_past_a_confirmed_send_nor_takes_over_early(
            evs in proptest::collection::vec((0u8..6, 0u64..3000, 0u64..3), 1..60)
        ) {
            let timing = Timing::for_ttl(5000);
            let mut m = Machine::new("me#1".into(), timing);
            let mut now = 0u64;
            let mut confirmed: Option<u64> = None;
            let mut first_seen: Option<(LeaderRow, u64)> = None;
            for (kind, dt, beat) in evs {
                now += dt;
                match m.next(now) {
                    Step::TakeOver(r) => {
                        let free = r.holder.is_none() || r.holder.as_deref() == Some("me#1");
                        if !free {
                            let (seen, at) = first_seen.clone().unwrap();
                            prop_assert_eq!(&seen, &r);
                            prop_assert!(now >= at + timing.ttl_ms);
                        }
                    }
                    Step::Resign { .. } => {
                        m.stepped_down(now);
                        confirmed = None;
                    }
                    _ => {}
                }
                let ev = match kind {
                    0 => {
                        let r = row(1, beat, Some("other#2"));
                        if first_seen.as_ref().is_none_or(|(s, _)| *s != r) {
                            first_seen = Some((r.clone(), now));
                        }
                        Event::Observed { row: r, at_ms: now }
                    }
                    1 if matches!(m.role, Role::Standby { .. }) => {
                        confirmed = Some(now.saturating_sub(dt / 2));
                        Event::TookOver { epoch: 2, sent_ms: now.saturating_sub(dt / 2) }
                    }
                    2 if matches!(m.role, Role::Leading { .. }) => {
                        let s = now.saturating_sub(dt / 3);
                        confirmed = Some(confirmed.map_or(s, |c| c.max(s)));
                        Event::Renewed { sent_ms: s }
                    }
                    3 => Event::Failed,
                    4 => Event::Moved,
                    _ => Event::Deposed,
                };
                if matches!(ev, Event::Observed { .. }) && !matches!(m.role, Role::Standby { .. }) {
                    continue;
                }
                if matches!(ev, Event::Moved) {
                    first_seen = None;
                }
                m.apply(ev, now);
                if let (Some(d), Some(c)) = (m.role.valid_until(), confirmed) {
                    prop_assert!(d <= c + timing.ttl_ms * 999 / 1000);
                }
                if matches!(m.role, Role::Standby { .. }) {
                    confirmed = None;
                }
            }
        }
    }
}
