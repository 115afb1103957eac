//! The machine and the job's life: whether it may start at all, then what
//! the keeper reports (started, could not start, leader ended), and the
//! agent's own reaping of the keeper, the one proof that the tree is gone.

use super::events::{Action, Stop, passed_on};
use super::outcome::TreeEnd;
use super::state::{Job, Machine, Phase, StopReason, Stopping};
use crate::agent::report::{Notice, Status};
use crate::agent::state_file::LeaseView;
use crate::exit::{self, ChildStatus};
use crate::keeper::protocol::Containment;
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

    pub(super) fn on_started(&mut self, pid: i32, containment: Containment, out: &mut Vec<Action>) {
        if self.job != Job::Starting {
            return;
        }
        self.job = Job::Running;
        self.containment = Some(containment);
        out.push(Action::Report(Notice::CommandStarted {
            pgid: pid,
            containment,
        }));
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

    /// The keeper says the command could not be started: decided at once,
    /// released only once the agent has reaped the keeper and found nothing
    /// left (a report alone never releases), or never, TREE_GONE_TIMEOUT
    /// later.
    pub(super) fn on_spawn_failed(
        &mut self,
        not_found: bool,
        message: String,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        if !matches!(self.job, Job::Starting) {
            return;
        }
        let code = if not_found {
            exit::NOT_FOUND
        } else {
            exit::CANNOT_EXECUTE
        };
        out.push(Action::Report(Notice::SpawnFailed { message }));
        out.push(Action::StopHeartbeat);
        out.push(Action::Finished {
            outcome: Outcome::Failed,
            status: code,
        });
        self.job = Job::Unstarted {
            status: code,
            exit_code: Some(i32::from(code)),
            since: now,
        };
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

    /// The agent reaped the keeper: the one proof that the tree is gone
    /// (`tree_empty`), or that it is not (processes of it were left: the
    /// keeper's orphans, without a namespace). A `TreeGone` report before
    /// it changes nothing but the words: only this releases.
    pub(super) fn on_keeper_reaped(
        &mut self,
        tree_empty: bool,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        if let Job::Unstarted {
            status, exit_code, ..
        } = self.job
        {
            self.job = Job::Finished;
            if tree_empty {
                out.push(Action::Release {
                    outcome: Outcome::Failed,
                    exit_code,
                });
                out.push(Action::Exit(status));
            } else {
                // The keeper said it started nothing, yet something is
                // left below the agent: never released.
                out.push(Action::Stop(Stop::Kill));
                out.push(Action::Report(Notice::NotReleasing));
                out.push(Action::Exit(exit::AGENT_FAILED));
            }
            return;
        }
        if !self.job_alive() || self.unwatched() {
            return;
        }
        if !tree_empty {
            self.lose_keeper(now, out);
            return;
        }
        if !self.reported_gone && !self.killed() {
            // Nobody killed it and it said nothing: the keeper died (killed
            // from outside, its own failure), taking the tree with it.
            out.push(Action::Report(Notice::KeeperLost { tree_gone: true }));
            self.keeper_failed = true;
        }
        if let (
            Job::Running | Job::Starting,
            Some(Stopping {
                phase: Phase::Killed { at },
                ..
            }),
        ) = (&self.job, self.stop)
        {
            // The agent's own SIGKILL (to the namespace's init) ended the
            // leader before the keeper could say so.
            self.job = Job::Exited {
                status: ChildStatus::Signaled(9),
                at,
            };
        }
        self.finish(TreeEnd::Gone, out);
    }

    /// The keeper is gone and processes of the tree are left: SIGKILL now
    /// (the agent walks the tree itself: they are its own children), again
    /// if it went out before; nothing can prove the tree gone, so the run
    /// ends TREE_GONE_TIMEOUT later without a release.
    fn lose_keeper(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        out.push(Action::Report(Notice::KeeperLost { tree_gone: false }));
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
