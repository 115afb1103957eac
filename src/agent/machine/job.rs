//! The machine and the job's life: whether it may start at all, then what
//! the keeper reports (started, could not start, leader ended, tree gone)
//! and the keeper's own end without that report.

use super::events::{Action, Stop, passed_on};
use super::outcome::TreeEnd;
use super::state::{Job, Machine, Phase, StopReason, Stopping};
use crate::agent::report::{Notice, Status};
use crate::agent::state_file::LeaseView;
use crate::exit::{self, ChildStatus};
use crate::lease::Outcome;
use crate::time::clock::BootInstant;

impl Machine {
    /// A command started at `now` would already be due for SIGTERM (the
    /// grant took so long to arrive that the lease has less than `grace`
    /// left): it is never started, and the lease is released as lost.
    pub(super) fn on_granted(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        if self.job == Job::Starting && now >= self.term_time() {
            self.end_unstarted(
                Notice::GrantTooLate,
                Outcome::Lost,
                exit::LEASE_LOST,
                None,
                out,
            );
        }
    }

    /// The keeper could not be handed the job: nothing runs, the lease is
    /// released as failed.
    pub(super) fn on_keeper_not_started(&mut self, error: String, out: &mut Vec<Action>) {
        if self.job == Job::Starting {
            let notice = Notice::KeeperNotStarted { error };
            self.end_unstarted(notice, Outcome::Failed, exit::AGENT_FAILED, None, out);
        }
    }

    pub(super) fn on_started(&mut self, pid: i32, out: &mut Vec<Action>) {
        if self.job != Job::Starting {
            return;
        }
        self.job = Job::Running;
        out.push(Action::Report(Notice::CommandStarted { pgid: pid }));
        match self.stop {
            // A stop decided before the group existed is carried out now.
            Some(stop) => {
                out.push(match stop.reason {
                    StopReason::Cancelled(sig) => passed_on(sig),
                    _ => Action::Stop(Stop::Term),
                });
                if !matches!(stop.phase, Phase::Terming { .. }) {
                    out.push(Action::Stop(Stop::Kill));
                }
            }
            None => {
                out.push(self.arm_keeper());
                out.push(Action::Ready(Status::CommandRunning));
                out.push(Action::Publish(LeaseView::Valid, Status::Holding));
            }
        }
        for sig in std::mem::take(&mut self.early_signals) {
            out.push(passed_on(sig));
        }
    }

    pub(super) fn on_spawn_failed(
        &mut self,
        not_found: bool,
        message: String,
        out: &mut Vec<Action>,
    ) {
        if !self.job_alive() {
            return;
        }
        let code = if not_found {
            exit::NOT_FOUND
        } else {
            exit::CANNOT_EXECUTE
        };
        let notice = Notice::SpawnFailed { message };
        self.end_unstarted(notice, Outcome::Failed, code, Some(i32::from(code)), out);
    }

    /// The end of a run whose command never ran: nothing to stop, so the
    /// lease is released at once.
    fn end_unstarted(
        &mut self,
        notice: Notice,
        outcome: Outcome,
        status: u8,
        exit_code: Option<i32>,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Report(notice));
        out.push(Action::StopHeartbeat);
        self.job = Job::Finished;
        out.push(Action::Finished { outcome, status });
        out.push(Action::Release { outcome, exit_code });
        out.push(Action::Exit(status));
    }

    pub(super) fn on_exited(
        &mut self,
        status: ChildStatus,
        at: BootInstant,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        if !matches!(self.job, Job::Running | Job::Starting) {
            return;
        }
        // The keeper stamps the exit; a paused agent learns of it late.
        let at = at.min(now);
        self.job = Job::Exited { status, at };
        out.push(Action::Report(Notice::CommandEnded { status }));
        if self.stop.is_none() {
            // Leftovers of the group must be gone before the lease is released.
            self.begin_stop(StopReason::Drain, now + self.grace, now, out);
        }
    }

    pub(super) fn on_tree_gone(&mut self, out: &mut Vec<Action>) {
        match self.job {
            Job::Exited { .. } => self.finish(TreeEnd::Gone, out),
            // The keeper saw no child left before reporting an exit: as
            // with a lost keeper, nothing is known of the job's end
            // (cannot happen with a sound keeper).
            Job::Running | Job::Starting => self.finish(TreeEnd::GivenUp, out),
            Job::Finished => {}
        }
    }

    pub(super) fn on_keeper_lost(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        if !self.job_alive() || self.unwatched() {
            return;
        }
        out.push(Action::Report(Notice::KeeperLost));
        // SIGKILL now (the agent walks the tree itself: the keeper's orphans
        // are its own children), again if it went out before; nobody will
        // report the tree gone, so the run ends TREE_GONE_TIMEOUT later
        // without a release.
        if self.stop.is_none() {
            out.push(Action::Stopping(Status::StoppingCommand));
        }
        let stop = match self.stop {
            Some(Stopping {
                reason,
                phase: Phase::Killed { at },
            }) => Stopping {
                reason,
                phase: Phase::Unwatched { killed_at: at },
            },
            _ => Stopping {
                reason: StopReason::KeeperLost,
                phase: Phase::Unwatched { killed_at: now },
            },
        };
        self.stop = Some(stop);
        out.push(Action::Stop(Stop::Kill));
    }
}
