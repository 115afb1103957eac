//! The machine's state, and `step`: each event to the role that takes it,
//! then the clock's rules.

use std::time::Duration;

use crate::exit::ChildStatus;
use crate::keeper::protocol::Containment;
use crate::lease::RefusalReason;
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;
use crate::time::deadline::TreeSize;

use super::events::{Action, Event};
use super::settings::Settings;

/// Why the job is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StopReason {
    /// `deadline - grace` reached without a renewal.
    DeadlineNear,
    Refused(RefusalReason),
    /// A signal asked the agent to stop.
    Cancelled(Sig),
    /// The leader exited; leftovers of its group are being stopped.
    Drain,
    /// The keeper was reaped with processes of the tree left (its orphans,
    /// without a namespace); they are killed.
    KeeperLost,
}

/// How far a stop has gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// SIGTERM (or the relayed stop signal) went out, or goes out once the
    /// group is known; SIGKILL is due at `kill_at`.
    Terming { kill_at: BootInstant },
    /// SIGKILL went out at `at`; the keeper reports the tree gone, or the
    /// run gives up `TREE_GONE_TIMEOUT` later.
    Killed { at: BootInstant },
    /// The keeper is gone and processes of the tree were left, so nothing
    /// can prove the tree gone. SIGKILL went out at `killed_at` (the agent
    /// walks the tree itself); one last sweep `TREE_GONE_TIMEOUT` later,
    /// then the run ends unreleased.
    Unwatched { killed_at: BootInstant },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stopping {
    pub(super) reason: StopReason,
    pub(super) phase: Phase,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Job {
    Starting,
    Running,
    /// The leader exited; the tree may still have members.
    Exited {
        status: ChildStatus,
        at: BootInstant,
    },
    /// The keeper says the command could not be started (since `since`):
    /// decided, released once the agent has reaped the keeper and found
    /// nothing left.
    Unstarted {
        status: u8,
        exit_code: Option<i32>,
        since: BootInstant,
    },
    Finished,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lease {
    Valid,
    Failing {
        since: BootInstant,
    },
    Refused(RefusalReason),
    /// The deadline passed, or the job was told to stop for it.
    Expired,
}

/// The supervisor's whole state.
#[derive(Clone, Debug)]
pub struct Machine {
    pub(super) settings: Settings,
    /// The ttl of the latest grant or renewal.
    pub(super) ttl: Duration,
    /// `--grace` fitted to `ttl`.
    pub(super) grace: Duration,
    pub(super) deadline: BootInstant,
    pub(super) lease: Lease,
    pub(super) job: Job,
    pub(super) stop: Option<Stopping>,
    pub(super) cancel: Option<Sig>,
    /// When the lease was lost: the moment the agent acted on the loss, or
    /// the deadline, whichever is earlier.
    pub(super) lost_at: Option<BootInstant>,
    /// Relayable signals that arrived after the keeper was started but
    /// before its start report (the job may already run).
    pub(super) early_signals: Vec<Sig>,
    /// What holds the job's tree, once started.
    pub(super) containment: Option<Containment>,
    /// The tree as the keeper last sampled it: the kill lead's size.
    pub(super) tree: TreeSize,
    /// The keeper said the tree is gone (a claim: the agent's reaping of
    /// the keeper is the proof).
    pub(super) reported_gone: bool,
    /// The keeper ended without saying the tree was gone and without the
    /// agent killing it: whatever the job did, the run failed (125).
    pub(super) keeper_failed: bool,
}

impl Machine {
    /// A machine for a lease granted with `ttl` to a request sent at
    /// `acquire_sent`.
    pub fn new(acquire_sent: BootInstant, ttl: Duration, settings: Settings) -> Self {
        let (_, grace) = settings.fitted(ttl);
        Machine {
            settings,
            ttl,
            grace,
            deadline: settings.deadline(acquire_sent, ttl),
            lease: Lease::Valid,
            job: Job::Starting,
            stop: None,
            cancel: None,
            lost_at: None,
            early_signals: Vec::new(),
            containment: None,
            tree: TreeSize::default(),
            reported_gone: false,
            keeper_failed: false,
        }
    }

    /// What holds the job's tree, once the keeper said.
    pub fn containment(&self) -> Option<Containment> {
        self.containment
    }

    /// The local deadline. The job must be dead by then.
    pub fn deadline(&self) -> BootInstant {
        self.deadline
    }

    /// The grace in force (`--grace` fitted to the latest granted ttl).
    #[cfg(test)]
    pub fn grace(&self) -> Duration {
        self.grace
    }

    #[cfg(test)]
    pub fn is_finished(&self) -> bool {
        self.job == Job::Finished
    }

    /// Applies one event at `now`; returns what to do.
    pub fn step(&mut self, event: Event, now: BootInstant) -> Vec<Action> {
        let mut out = Vec::new();
        // The event first (it can only be something already received: a
        // renewal proves a later deadline, it never waits on the network),
        // then the clock: a wake-up past the deadline (the agent was paused)
        // kills in this same step.
        match event {
            Event::Tick => {}
            Event::Granted => self.on_granted(now, &mut out),
            Event::KeeperNotStarted { error } => self.on_keeper_not_started(error, &mut out),
            Event::Renewed { sent_at, ttl } => self.on_renewed(sent_at, ttl, now, &mut out),
            Event::RenewFailed { error } => self.on_renew_failed(error, now, &mut out),
            Event::Refused { reason, message } => self.on_refused(reason, message, now, &mut out),
            Event::Signal(sig) => self.on_signal(sig, now, &mut out),
            Event::ChildStarted { pid, containment } => self.on_started(pid, containment, &mut out),
            Event::TreeSized(size) => self.tree = size,
            Event::JobStopped => {}
            Event::SpawnFailed { not_found, message } => {
                self.on_spawn_failed(not_found, message, now, &mut out)
            }
            Event::ChildExited { status, at } => {
                // The clock first: the keeper's timer acted on the deadline
                // at its time, whatever order the loop sees things in.
                self.check_time(now, &mut out);
                self.on_exited(status, at, now, &mut out)
            }
            Event::TreeGone => self.reported_gone = true,
            Event::KeeperReaped { tree_empty } => self.on_keeper_reaped(tree_empty, now, &mut out),
        }
        self.check_time(now, &mut out);
        out
    }

    /// Records that the lease is gone at `now`; returns whether it was held
    /// until now.
    pub(super) fn lose(&mut self, how: Lease, now: BootInstant) -> bool {
        let was_lost = self.lease_lost();
        self.lease = how;
        if !was_lost {
            self.lost_at = Some(now.min(self.deadline));
        }
        !was_lost
    }

    pub(super) fn lease_lost(&self) -> bool {
        matches!(self.lease, Lease::Refused(_) | Lease::Expired)
    }

    pub(super) fn job_alive(&self) -> bool {
        matches!(self.job, Job::Starting | Job::Running | Job::Exited { .. })
    }

    pub(super) fn group_known(&self) -> bool {
        matches!(self.job, Job::Running | Job::Exited { .. })
    }

    /// Whether SIGKILL went out (by the agent's machine).
    pub(super) fn killed(&self) -> bool {
        self.stop
            .is_some_and(|s| !matches!(s.phase, Phase::Terming { .. }))
    }

    /// Whether the keeper is gone, so nothing reports the tree any more.
    pub(super) fn unwatched(&self) -> bool {
        self.stop
            .is_some_and(|s| matches!(s.phase, Phase::Unwatched { .. }))
    }
}
