//! The supervisor's decisions as a pure state machine: `(state, event, now)
//! -> actions`.
//!
//! Nothing here touches a process, a socket or a clock; the supervisor loop
//! feeds it events stamped with the boot clock and carries out the actions it
//! returns (signals first, then everything that does I/O). That is what lets
//! the property tests throw every order and timing of events at it. It says
//! what happened as typed [`Notice`](crate::agent::report::Notice)s and
//! [`Status`](crate::agent::report::Status)es, and what to do to the
//! job in its own words ([`Stop`], [`Action::Relay`]); `report` words the
//! first, the supervisor carries out the second.
//!
//! The rules it enforces:
//! - **Deadline** = `sent + ttl·(1 − ρ) − ε` of the grant or of the latest
//!   successful renewal ([`Settings::deadline`], the rule of
//!   [`crate::time::deadline`], shared with the keeper), whether that renewal
//!   granted a longer or a shorter ttl than before (renewals are sequential:
//!   the latest answer is the authority's latest word).
//! - SIGTERM to the job's tree at `deadline - grace`, SIGKILL at
//!   `deadline - kill lead`, whatever the network is doing. The loop wakes up
//!   for both ([`Machine::next_wake`]), and a late wake-up (the agent was
//!   paused) kills at once, before any other event is looked at.
//! - **Too late to start**: a grant that arrives with less than grace left
//!   ([`Event::Granted`]) is released as `lost` and the command never
//!   starts (124); a keeper that cannot be handed the job
//!   ([`Event::KeeperNotStarted`]) ends the run with 125 and a `failed`
//!   release.
//! - **Refusal**: SIGTERM at once, SIGKILL `grace` later (never after the
//!   deadline).
//! - **Cancel** (SIGTERM/SIGINT/SIGQUIT to the agent): SIGTERM stops the
//!   tree ([`Stop::Term`]), SIGINT and SIGQUIT are relayed to the job's
//!   group ([`Action::Relay`]); SIGKILL follows `grace` later; the lease is
//!   released as `cancelled`.
//! - Once lost, always lost: a renewal answer that arrives after the lease
//!   was given up (refused, expired, or the job already told to stop for the
//!   deadline, by the agent or by the keeper's timer at the term time)
//!   changes nothing.
//! - **The exit status is decided by timestamps**, not by the order events
//!   reach the loop: the job counts as lost only if the keeper's stamp of its
//!   end is at or after the moment the lease was lost (the moment the agent
//!   acted on the loss, or for a deadline the SIGTERM time, which the
//!   keeper's own timer keeps even when the agent is late). A job that
//!   ended during a pause, before the deadline, keeps its own status even if
//!   the loop sees the clock before it sees the exit.
//! - The job is finished only when its whole process tree is gone (the
//!   keeper's `TreeGone`): leftovers in the group get SIGTERM when the leader
//!   exits, and SIGKILL after grace, before the lease is released.
//! - The keeper is the second guardian: after the grant (once the job
//!   started) and after every successful renewal the machine hands it the
//!   deadline, grace and kill lead ([`Action::ArmKeeper`]), and the keeper
//!   stops the tree by them on its own if the agent cannot.
//! - Everything after SIGKILL is bounded: if the tree is not reported gone
//!   [`TREE_GONE_TIMEOUT`](deadline::TREE_GONE_TIMEOUT) after SIGKILL (a process that survives SIGKILL
//!   or may not be signalled, a keeper lost), the run ends with exit status
//!   125 and the lease is **not** released: it is left to expire, since a
//!   process of the tree may still run. A lost keeper is never a reason to
//!   release either: the tree is killed and the lease expires (the stop's
//!   `Phase::Unwatched` in `state.rs`: nobody is left to report the tree gone).
//! - Signals: SIGTSTP, SIGTTIN, SIGTTOU and SIGCONT are relayed and change
//!   nothing else (the lease is still renewed); a second SIGINT or SIGTERM
//!   sends SIGKILL at once; a signal whose default would end the agent
//!   (`Sig::FATAL`) stops the job like SIGTERM (SIGTERM to the tree, not
//!   the signal itself) and releases.

//!
//! One role a file, each adding its methods to the one [`Machine`]:
//! - `events.rs`: what goes in ([`Event`]) and what comes out ([`Action`]);
//! - `state.rs`: the machine's state, and `step`, which hands each event to
//!   its role;
//! - `settings.rs`: the timing the user asked for ([`Settings`]);
//! - `deadline.rs`: the clock's rules (when to wake, what is due);
//! - `renewal.rs`: the authority's answers (renewed, failing, refused);
//! - `stop.rs`: stopping the tree, and the signals sent to the agent;
//! - `job.rs`: the job's life as the keeper reports it, and the keeper's;
//! - `outcome.rs`: the exit status and the release, decided at the end;
//! - `tests.rs`, `props.rs`: examples, and the properties over generated runs.

mod deadline;
mod events;
mod job;
mod outcome;
mod renewal;
mod settings;
mod state;
mod stop;

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

pub use events::{Action, Event, Stop};
pub use settings::Settings;
pub use state::Machine;
