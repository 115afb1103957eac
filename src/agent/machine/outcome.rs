//! The end of a run: the exit status and the release's outcome, decided by
//! timestamps (the keeper's stamp of the job's end against the moment the
//! lease was lost), not by the order events reached the loop; and no
//! release while a process of the tree may still run.

use std::time::Duration;

use super::events::Action;
use super::state::{Job, Lease, Machine, StopReason};
use crate::agent::report::{LostWhy, Notice};
use crate::exit::{self, ChildStatus};
use crate::lease::Outcome;
use crate::time::clock::BootInstant;

/// How the wait for the job's tree ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TreeEnd {
    /// The agent reaped the keeper and found no process of the tree left.
    Gone,
    /// The tree was not reported gone (a survivor, a process that may not
    /// be signalled, a lost keeper), so something may still run: exit 125,
    /// never `succeeded`, and no release.
    GivenUp,
}

/// `t` rounded down to whole milliseconds, the resolution of the keeper's
/// exit stamps.
pub(super) fn floor_ms(t: BootInstant) -> BootInstant {
    let d = t.since_boot();
    BootInstant::from_since_boot(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

impl Machine {
    /// Whether the job counts as lost: it was still running at the moment
    /// the lease was lost (by the keeper's exit stamp), or ended after the
    /// deadline, or was never seen to end while the lease was lost.
    fn lost_while_running(&self, ended_at: Option<BootInstant>) -> bool {
        if ended_at.is_some_and(|at| at >= self.deadline) {
            return true;
        }
        match (self.lost_at, ended_at) {
            // Exit stamps are whole milliseconds: an end in the same
            // millisecond as the loss counts as after it.
            (Some(lost), Some(at)) => at >= floor_ms(lost),
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The job's own status, as passed on (with `--remap-exit`, its own 124
    /// and 125 become 1, so they cannot be read as the agent's).
    fn passthrough(&self, status: ChildStatus) -> u8 {
        let code = status.passthrough();
        if self.settings.remap_exit
            && matches!(status, ChildStatus::Exited(_))
            && (code == exit::LEASE_LOST || code == exit::AGENT_FAILED)
        {
            1
        } else {
            code
        }
    }

    /// The tree is gone (or given up on): decide the exit status and release.
    pub(super) fn finish(&mut self, end: TreeEnd, out: &mut Vec<Action>) {
        let exited = match self.job {
            Job::Exited { status, at } => Some((status, at)),
            _ => None,
        };
        self.job = Job::Finished;
        out.push(Action::StopHeartbeat);
        let ended_at = exited.map(|(_, at)| at);
        let lost = self.lost_while_running(ended_at);
        let (outcome, code, exit_status) = if end == TreeEnd::GivenUp {
            let outcome = if lost { Outcome::Lost } else { Outcome::Failed };
            (outcome, None, exit::AGENT_FAILED)
        } else if lost {
            let code = exited.and_then(|(s, _)| s.exit_code());
            (Outcome::Lost, code, exit::LEASE_LOST)
        } else if self.unwatched() || self.keeper_failed {
            // The tree is gone, but the keeper died on its own: whatever
            // the job did, the run failed.
            (Outcome::Failed, None, exit::AGENT_FAILED)
        } else if let Some((status, _)) = exited {
            let outcome = if self.cancel.is_some() {
                Outcome::Cancelled
            } else if status.success() {
                Outcome::Succeeded
            } else {
                Outcome::Failed
            };
            (outcome, status.exit_code(), self.passthrough(status))
        } else {
            (Outcome::Failed, None, exit::AGENT_FAILED)
        };
        let stopped_for_lease = self
            .stop
            .is_some_and(|s| matches!(s.reason, StopReason::DeadlineNear | StopReason::Refused(_)));
        if ended_at.is_some_and(|at| at >= self.deadline) && !stopped_for_lease {
            out.push(Action::Report(Notice::LeaseLost(
                LostWhy::EndedAfterDeadline,
            )));
        }
        out.push(Action::Finished {
            outcome,
            status: exit_status,
        });
        // After a refusal the authority already dropped the lease; releasing
        // would only be refused.
        if end == TreeEnd::GivenUp {
            out.push(Action::Report(Notice::NotReleasing));
        } else if !matches!(self.lease, Lease::Refused(_)) {
            out.push(Action::Release {
                outcome,
                exit_code: code,
            });
        }
        out.push(Action::Exit(exit_status));
    }
}
