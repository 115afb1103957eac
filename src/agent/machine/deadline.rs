//! The machine and the clock: the deadline of the latest grant or renewal
//! (the rule of [`crate::time::deadline`], the keeper's too), when the loop
//! must wake up, and what is due when it does.

use std::time::Duration;

use super::events::{Action, Stop};
use super::outcome::TreeEnd;
use super::state::{Job, Lease, Machine, Phase, StopReason};
use crate::agent::report::{Loss, LostWhy, Notice, Status};
use crate::agent::state_file::LeaseView;
use crate::time::clock::BootInstant;
use crate::time::deadline::{self, Deadline};

/// After SIGKILL, how long to wait for the keeper's "tree gone" before
/// finishing anyway (descendants that left the process group survive
/// SIGKILL to the group; a stopped keeper reports nothing; a process in
/// uninterruptible sleep dies only when it wakes).
pub const TREE_GONE_TIMEOUT: Duration = Duration::from_secs(2);

impl Machine {
    /// The deadline in force and how the tree is stopped before it.
    fn stop_times(&self) -> Deadline {
        Deadline {
            at: self.deadline,
            grace: self.grace,
            kill_lead: deadline::kill_lead(self.ttl, self.tree),
            ttl: self.ttl,
        }
    }

    /// When SIGKILL goes out: the kill lead, sized from the tree as the
    /// keeper last sampled it ([`deadline::kill_lead`]), before the
    /// deadline, so the tree is dead, reaped, not merely signalled, by the
    /// deadline.
    pub fn kill_time(&self) -> BootInstant {
        self.stop_times().kill_at()
    }

    /// When SIGTERM goes out without a renewal: `grace` before the
    /// deadline (or at the kill time, if grace is shorter than the lead).
    pub(super) fn term_time(&self) -> BootInstant {
        self.stop_times().term_at()
    }

    /// The deadline as the keeper enforces it.
    pub fn arm_keeper(&self) -> Action {
        Action::ArmKeeper(self.stop_times().with_effective_grace())
    }

    /// Whether the keeper's own timer has sent SIGTERM for the deadline by
    /// `now` (it does at the term time whatever this loop does): a renewal
    /// answer that reaches the loop later cannot undo that stop.
    pub(super) fn keeper_acted(&self, now: BootInstant) -> bool {
        self.stop.is_none() && self.job_alive() && now >= self.term_time()
    }

    /// When the loop must wake up next, even if nothing happens.
    pub fn next_wake(&self) -> Option<BootInstant> {
        if let Job::Unstarted { since, .. } = self.job {
            return Some(since + TREE_GONE_TIMEOUT);
        }
        if !self.job_alive() {
            return None;
        }
        let kill = self.kill_time();
        Some(match self.stop.map(|s| s.phase) {
            None => kill.min(self.term_time()),
            Some(Phase::Terming { kill_at }) => kill.min(kill_at),
            Some(Phase::Killed { at }) | Some(Phase::Unwatched { killed_at: at }) => {
                at + TREE_GONE_TIMEOUT
            }
        })
    }

    /// Deadline rules; called after every event.
    pub(super) fn check_time(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        if let Job::Unstarted { status, since, .. } = self.job {
            if now >= since + TREE_GONE_TIMEOUT {
                // The keeper said it started nothing but was never seen
                // gone: nothing proves it, so no release.
                self.job = Job::Finished;
                out.push(Action::Report(Notice::NotReleasing));
                out.push(Action::Exit(status));
            }
            return;
        }
        if !self.job_alive() {
            return;
        }
        if now >= self.kill_time() && !self.killed() {
            // The keeper's own timer sent SIGTERM at the term time even if
            // this loop was late: the lease was given up then.
            if !self.lease_lost() && self.lose(Lease::Expired, now.min(self.term_time())) {
                out.push(Action::Report(Notice::LeaseLost(LostWhy::DeadlinePassed)));
                out.push(Action::Publish(
                    LeaseView::Lost,
                    Status::Lost(Loss::Expired),
                ));
            }
            if self.stop.is_none() {
                self.begin_stop(StopReason::DeadlineNear, self.kill_time(), now, out);
            }
            self.kill(now, out);
            return;
        }
        if self.stop.is_none() && now >= self.term_time() {
            self.lose(Lease::Expired, now.min(self.term_time()));
            out.push(Action::Report(Notice::LeaseLost(LostWhy::NoRenewal {
                kill_in: now.until(self.kill_time()),
            })));
            out.push(Action::Publish(
                LeaseView::Lost,
                Status::Lost(Loss::RenewalsFailed),
            ));
            self.begin_stop(StopReason::DeadlineNear, self.kill_time(), now, out);
            return;
        }
        let Some(stop) = self.stop else { return };
        match stop.phase {
            Phase::Terming { kill_at } => {
                if now >= kill_at {
                    self.kill(now, out);
                }
            }
            Phase::Killed { at } => {
                if now >= at + TREE_GONE_TIMEOUT {
                    out.push(Action::Report(match self.job {
                        Job::Exited { .. } => Notice::LeftoversOutsideGroup,
                        _ => Notice::GroupNotGone {
                            waited: now.saturating_since(at),
                        },
                    }));
                    self.finish(TreeEnd::GivenUp, out);
                }
            }
            Phase::Unwatched { killed_at } => {
                if now >= killed_at + TREE_GONE_TIMEOUT {
                    // Nobody could report the tree gone: that was said
                    // already. One last sweep first: the dead keeper's
                    // orphans are re-parented to the agent while it exits,
                    // possibly after the first walk went by them.
                    out.push(Action::Stop(Stop::Kill));
                    self.finish(TreeEnd::GivenUp, out);
                }
            }
        }
    }
}
