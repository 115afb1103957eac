//! What goes into the machine ([`Event`]: what the supervisor loop saw) and
//! what comes out ([`Action`]: what it must do), in the machine's own words:
//! a stop of the job's tree is a [`Stop`], a signal passed on to the job is
//! a relay, and what is said is typed ([`Notice`], [`Status`]) and worded
//! only by `agent/report.rs`.

use std::time::Duration;

use crate::agent::report::{Notice, Status};
use crate::agent::state_file::LeaseView;
use crate::exit::ChildStatus;
use crate::keeper::protocol::Containment;
use crate::lease::{Outcome, RefusalReason};
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;
use crate::time::deadline::{Deadline, TreeSize};

/// Something that happened, as the supervisor loop saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Nothing but the passing of time.
    Tick,
    /// The grant is in hand and the job is started next, unless the grant
    /// came too late for it (less than grace left on the lease).
    Granted,
    /// The keeper could not be handed the job (its ctl pipe, the reader
    /// thread): no job runs.
    KeeperNotStarted { error: String },
    /// A renewal sent at `sent_at` was accepted with this ttl.
    Renewed { sent_at: BootInstant, ttl: Duration },
    /// A renewal failed in a way that leaves the lease possibly valid.
    RenewFailed { error: String },
    /// The authority refused a renewal: the lease is gone for good.
    Refused {
        reason: RefusalReason,
        message: String,
    },
    /// A signal was delivered to the agent.
    Signal(Sig),
    /// The keeper started the job; its process group id is `pid`, and
    /// `containment` holds its tree.
    ChildStarted { pid: i32, containment: Containment },
    /// The job's leader stopped (Ctrl-Z at its terminal). Nothing changes
    /// for the lease: renewals go on, the keeper guards the deadline; the
    /// supervisor stops the front process the shell waits on.
    JobStopped,
    /// The keeper sampled the tree: the kill lead follows its size.
    TreeSized(TreeSize),
    /// The command could not be started.
    SpawnFailed { not_found: bool, message: String },
    /// The job's leader ended (at `at`, on the boot clock, as the keeper saw it).
    ChildExited {
        status: ChildStatus,
        at: BootInstant,
    },
    /// The keeper says every process of the job's tree has been reaped: a
    /// claim, never enough to release ([`Event::KeeperReaped`] is).
    TreeGone,
    /// The agent reaped the keeper itself; `tree_empty`: and found no
    /// process of the tree left (with a PID namespace, the init's reaping
    /// proves it; without, no child is left below the agent, the subreaper
    /// the keeper's orphans would go to). The one proof a release needs.
    KeeperReaped { tree_empty: bool },
}

/// How the job's whole tree is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM to every process of the tree (the job may clean up).
    Term,
    /// SIGKILL to every process of the tree, until none is left.
    Kill,
}

/// What the supervisor must do. Within one step it carries out every
/// [`Action::Stop`], [`Action::Relay`] and [`Action::ArmKeeper`] first,
/// then the rest in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stop the job's whole tree.
    Stop(Stop),
    /// Pass this signal on to the members of the job's process group.
    Relay(Sig),
    /// Hand the keeper the deadline it enforces alone if need be.
    ArmKeeper(Deadline),
    /// Say something (the reporter words it).
    Report(Notice),
    /// Publish the lease view (state file) and the status (systemd STATUS).
    Publish(LeaseView, Status),
    /// The job is running: tell systemd READY.
    Ready(Status),
    /// Stopping the job: tell systemd STOPPING.
    Stopping(Status),
    /// No more renewals.
    StopHeartbeat,
    /// The run's result, before any release: published in the state file and
    /// the last STATUS line.
    Finished { outcome: Outcome, status: u8 },
    /// Release the lease with this outcome (after the agent confirmed the
    /// tree gone, or when no job was ever handed to the keeper).
    Release {
        outcome: Outcome,
        exit_code: Option<i32>,
    },
    /// Exit with this status (after any release).
    Exit(u8),
}

/// What a signal sent to the agent becomes for the job: SIGTERM, and a
/// signal whose default would end the agent (`Sig::FATAL`), stop the whole
/// tree with SIGTERM; every other signal (SIGINT, SIGQUIT, SIGHUP, SIGUSR1,
/// SIGUSR2, job control) is relayed as itself to the job's group.
pub(super) fn passed_on(sig: Sig) -> Action {
    if sig == Sig::Term || (sig.ends_run() && !sig.is_stop()) {
        Action::Stop(Stop::Term)
    } else {
        Action::Relay(sig)
    }
}
