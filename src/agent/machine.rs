//! The supervisor's decisions as a pure state machine: `(state, event, now)
//! -> actions`.
//!
//! Nothing here touches a process, a socket or a clock; the supervisor loop
//! feeds it events stamped with the boot clock and carries out the actions it
//! returns (signals first, then everything that does I/O). That is what lets
//! the property tests throw every order and timing of events at it. It says
//! what happened as typed [`Notice`]s; `report` words them.
//!
//! The rules it enforces:
//! - **Deadline** = `sent + ttl·(1 − ρ) − ε` of the grant or of the latest
//!   successful renewal ([`Settings::deadline`]), whether that renewal granted
//!   a longer or a shorter ttl than before (renewals are sequential: the
//!   latest answer is the authority's latest word). The agent counts from
//!   when it *sent* the request, the authority from when it *received* it;
//!   ρ (default [`DEFAULT_CLOCK_DRIFT_PPM`]) budgets for the two clocks'
//!   rates differing (NTP slews `CLOCK_BOOTTIME` by up to 500 ppm), ε
//!   ([`ROUNDING_MARGIN`]) for an authority that rounds its receipt time down
//!   to whole milliseconds. So the local deadline is never later than the
//!   authority's expiry.
//! - SIGTERM to the job's group at `deadline - grace`, SIGKILL at
//!   `deadline - kill lead`, whatever the network is doing. The loop wakes up
//!   for both ([`Machine::next_wake`]), and a late wake-up (the agent was
//!   paused) kills at once, before any other event is looked at.
//! - **Refusal**: SIGTERM at once, SIGKILL `grace` later (never after the
//!   deadline).
//! - **Cancel** (SIGTERM/SIGINT/SIGQUIT to the agent): the signal is relayed,
//!   SIGKILL follows `grace` later; the lease is released as `cancelled`.
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
//!   [`TREE_GONE_TIMEOUT`] after SIGKILL (a process that survives SIGKILL
//!   or may not be signalled, a keeper lost), the run ends with exit status
//!   125 and the lease is **not** released: it is left to expire, since a
//!   process of the tree may still run. A lost keeper is never a reason to
//!   release either: the tree is killed and the lease expires.
//! - Signals: SIGTSTP, SIGTTIN, SIGTTOU and SIGCONT are relayed and change
//!   nothing else (the lease is still renewed); a second SIGINT or SIGTERM
//!   sends SIGKILL at once; a signal whose default would end the agent
//!   (`Sig::FATAL`) stops the job like SIGTERM (SIGTERM to the tree, not
//!   the signal itself) and releases.

use std::time::Duration;

use crate::agent::report::{LostWhy, Notice};
use crate::agent::state_file::LeaseView;
use crate::exit::{self, ChildStatus};
use crate::lease::{Outcome, RefusalReason};
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;

/// After SIGKILL, how long to wait for the keeper's "tree gone" before
/// finishing anyway (descendants that left the process group survive
/// SIGKILL to the group; a stopped keeper reports nothing; a process in
/// uninterruptible sleep dies only when it wakes).
pub const TREE_GONE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long before the deadline SIGKILL is sent (capped at ttl/20): the
/// kernel needs a moment to take a killed process down, and "dead before
/// the deadline" must hold, not "signalled at it".
pub const KILL_LEAD: Duration = Duration::from_millis(20);

/// ε of the deadline: an authority may floor its receipt time to whole
/// milliseconds (the reference engine does), so its expiry can be up to 1 ms
/// before `receipt + ttl`.
pub const ROUNDING_MARGIN: Duration = Duration::from_millis(1);

/// ρ of the deadline by default: 1,000 ppm (0.1 %), twice the most NTP slews
/// a clock (500 ppm), so the agent's clock may run that much slower than the
/// authority's.
pub const DEFAULT_CLOCK_DRIFT_PPM: u32 = 1_000;

/// The timing the user asked for, and how a grant becomes a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `--ttl`: what heartbeat and grace were chosen for.
    pub asked_ttl: Duration,
    /// `--heartbeat` for the asked ttl.
    pub heartbeat: Duration,
    /// `--grace` for the asked ttl.
    pub grace: Duration,
    /// ρ in parts per million (`--clock-drift`).
    pub drift_ppm: u32,
    /// `--remap-exit`: the job's own 124 and 125 become 1.
    pub remap_exit: bool,
}

impl Settings {
    /// The local deadline of a grant or renewal sent at `sent` that granted
    /// `ttl`: `sent + ttl·(1 − ρ) − ε`.
    pub fn deadline(&self, sent: BootInstant, ttl: Duration) -> BootInstant {
        let ppm = u128::from(self.drift_ppm.min(1_000_000));
        let budget_ns = ttl.as_nanos() * (1_000_000 - ppm) / 1_000_000;
        let budget = Duration::from_nanos(u64::try_from(budget_ns).unwrap_or(u64::MAX));
        sent + budget.saturating_sub(ROUNDING_MARGIN)
    }

    /// Heartbeat and grace for a granted ttl (scaled down when the authority
    /// granted less than was asked; as configured otherwise).
    pub fn fitted(&self, granted: Duration) -> (Duration, Duration) {
        fit_to_granted(self.asked_ttl, self.heartbeat, self.grace, granted)
    }
}

/// Heartbeat and grace that fit a ttl the authority clamped below what was
/// asked. Each keeps its value when it still fits the default proportions of
/// the granted ttl (heartbeat at most a third, grace at most a sixth), and
/// otherwise shrinks no further than in proportion to the ttl.
pub fn fit_to_granted(
    cfg_ttl: Duration,
    heartbeat: Duration,
    grace: Duration,
    granted: Duration,
) -> (Duration, Duration) {
    if granted >= cfg_ttl {
        return (heartbeat, grace);
    }
    let scale = |d: Duration| -> Duration {
        let ns = d.as_nanos() * granted.as_nanos() / cfg_ttl.as_nanos().max(1);
        Duration::from_nanos(ns as u64)
    };
    let heartbeat = scale(heartbeat).max(heartbeat.min(granted / 3));
    let grace = scale(grace).max(grace.min(granted / 6));
    (heartbeat.max(Duration::from_millis(1)), grace)
}

/// Something that happened, as the supervisor loop saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Nothing but the passing of time.
    Tick,
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
    /// The keeper started the job; its process group id is `pid`.
    ChildStarted { pid: i32 },
    /// The command could not be started.
    SpawnFailed { not_found: bool, message: String },
    /// The job's leader ended (at `at`, on the boot clock, as the keeper saw it).
    ChildExited {
        status: ChildStatus,
        at: BootInstant,
    },
    /// Every process of the job's tree has been reaped.
    TreeGone,
    /// The keeper died without saying the tree was gone.
    KeeperLost,
}

/// What the supervisor must do. Within one step it sends every
/// [`Action::SignalGroup`] and [`Action::ArmKeeper`] first, then carries out
/// the rest in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this signal to the job's process group.
    SignalGroup(Sig),
    /// Hand the keeper the deadline it enforces alone if need be.
    ArmKeeper {
        deadline: BootInstant,
        grace: Duration,
        kill_lead: Duration,
    },
    /// Say something (the reporter words it).
    Report(Notice),
    /// Publish the lease view (state file, systemd STATUS).
    Publish(LeaseView, String),
    /// The job is running: tell systemd READY.
    Ready(String),
    /// Stopping the job: tell systemd STOPPING.
    Stopping(String),
    /// No more renewals.
    StopHeartbeat,
    /// The run's result, before any release: published in the state file and
    /// the last STATUS line.
    Finished { outcome: Outcome, status: u8 },
    /// Release the lease with this outcome (only ever after the tree was
    /// reported gone).
    Release {
        outcome: Outcome,
        exit_code: Option<i32>,
    },
    /// Exit with this status (after any release).
    Exit(u8),
}

/// Why the job is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `deadline - grace` reached without a renewal.
    DeadlineNear,
    Refused(RefusalReason),
    /// A signal asked the agent to stop.
    Cancelled(Sig),
    /// The leader exited; leftovers of its group are being stopped.
    Drain,
    /// The keeper vanished; the group is killed.
    KeeperLost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stop {
    reason: StopReason,
    kill_at: BootInstant,
    killed_at: Option<BootInstant>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Job {
    Starting,
    Running,
    /// The leader exited; the tree may still have members.
    Exited {
        status: ChildStatus,
        at: BootInstant,
    },
    Finished,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
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
    settings: Settings,
    /// The ttl of the latest grant or renewal.
    ttl: Duration,
    /// `--grace` fitted to `ttl`.
    grace: Duration,
    deadline: BootInstant,
    lease: Lease,
    job: Job,
    stop: Option<Stop>,
    cancel: Option<Sig>,
    keeper_lost: bool,
    /// When the lease was lost: the moment the agent acted on the loss, or
    /// the deadline, whichever is earlier.
    lost_at: Option<BootInstant>,
    /// Relayable signals that arrived after the keeper was started but
    /// before its start report (the job may already run).
    early_signals: Vec<Sig>,
    token: u64,
}

/// `t` rounded down to whole milliseconds, the resolution of the keeper's
/// exit stamps.
fn floor_ms(t: BootInstant) -> BootInstant {
    let d = t.since_boot();
    BootInstant::from_since_boot(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

impl Machine {
    /// A machine for a lease granted with `ttl` to a request sent at
    /// `acquire_sent`.
    pub fn new(token: u64, acquire_sent: BootInstant, ttl: Duration, settings: Settings) -> Self {
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
            keeper_lost: false,
            lost_at: None,
            early_signals: Vec::new(),
            token,
        }
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

    /// When SIGKILL goes out: [`KILL_LEAD`] (at most a twentieth of the
    /// ttl) before the deadline, so the group is dead, not merely
    /// signalled, by the deadline.
    pub fn kill_time(&self) -> BootInstant {
        self.deadline - self.kill_lead()
    }

    fn kill_lead(&self) -> Duration {
        KILL_LEAD.min(self.ttl / 20)
    }

    /// The deadline as the keeper enforces it.
    pub fn arm_keeper(&self) -> Action {
        Action::ArmKeeper {
            deadline: self.deadline,
            grace: self.deadline.saturating_since(self.term_time()),
            kill_lead: self.kill_lead(),
        }
    }

    /// When SIGTERM goes out without a renewal: `grace` before the
    /// deadline (or at the kill time, if grace is shorter than the lead).
    fn term_time(&self) -> BootInstant {
        (self.deadline - self.grace).min(self.kill_time())
    }

    /// Whether a command started at `now` would already be due for SIGTERM:
    /// the grant took so long to arrive that the lease has less than `grace`
    /// left. Such a command is never started.
    pub fn too_late_to_start(&self, now: BootInstant) -> bool {
        now >= self.term_time()
    }

    #[cfg(test)]
    pub fn is_finished(&self) -> bool {
        self.job == Job::Finished
    }

    /// Records that the lease is gone at `now`; returns whether it was held
    /// until now.
    fn lose(&mut self, how: Lease, now: BootInstant) -> bool {
        let was_lost = self.lease_lost();
        self.lease = how;
        if !was_lost {
            self.lost_at = Some(now.min(self.deadline));
        }
        !was_lost
    }

    fn lease_lost(&self) -> bool {
        matches!(self.lease, Lease::Refused(_) | Lease::Expired)
    }

    fn job_alive(&self) -> bool {
        matches!(self.job, Job::Starting | Job::Running | Job::Exited { .. })
    }

    fn group_known(&self) -> bool {
        matches!(self.job, Job::Running | Job::Exited { .. })
    }

    fn killed(&self) -> bool {
        self.stop.is_some_and(|s| s.killed_at.is_some())
    }

    /// Whether the keeper's own timer has sent SIGTERM for the deadline by
    /// `now` (it does at the term time whatever this loop does): a renewal
    /// answer that reaches the loop later cannot undo that stop.
    fn keeper_acted(&self, now: BootInstant) -> bool {
        self.stop.is_none() && self.job_alive() && now >= self.term_time()
    }

    /// When the loop must wake up next, even if nothing happens.
    pub fn next_wake(&self) -> Option<BootInstant> {
        if !self.job_alive() {
            return None;
        }
        let mut wake = self.kill_time();
        match self.stop {
            None => wake = wake.min(self.term_time()),
            Some(Stop {
                kill_at,
                killed_at: None,
                ..
            }) => wake = wake.min(kill_at),
            Some(Stop {
                killed_at: Some(k), ..
            }) => wake = k + TREE_GONE_TIMEOUT,
        }
        Some(wake)
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
            Event::Renewed { sent_at, ttl } => self.on_renewed(sent_at, ttl, now, &mut out),
            Event::RenewFailed { error } => self.on_renew_failed(error, now, &mut out),
            Event::Refused { reason, message } => self.on_refused(reason, message, now, &mut out),
            Event::Signal(sig) => self.on_signal(sig, now, &mut out),
            Event::ChildStarted { pid } => self.on_started(pid, &mut out),
            Event::SpawnFailed { not_found, message } => {
                self.on_spawn_failed(not_found, message, &mut out)
            }
            Event::ChildExited { status, at } => {
                // The clock first: the keeper's timer acted on the deadline
                // at its time, whatever order the loop sees things in.
                self.check_time(now, &mut out);
                self.on_exited(status, at, now, &mut out)
            }
            Event::TreeGone => self.on_tree_gone(&mut out),
            Event::KeeperLost => self.on_keeper_lost(now, &mut out),
        }
        self.check_time(now, &mut out);
        out
    }

    /// Deadline rules; called after every event.
    fn check_time(&mut self, now: BootInstant, out: &mut Vec<Action>) {
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
                    format!("lease lost (expired), token {}", self.token),
                ));
            }
            if self.stop.is_none() {
                self.begin_stop(
                    StopReason::DeadlineNear,
                    Sig::Term,
                    self.kill_time(),
                    now,
                    out,
                );
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
                format!("lease lost (renewals failed), token {}", self.token),
            ));
            self.begin_stop(
                StopReason::DeadlineNear,
                Sig::Term,
                self.kill_time(),
                now,
                out,
            );
            return;
        }
        let Some(stop) = self.stop else { return };
        if stop.killed_at.is_none() && now >= stop.kill_at {
            self.kill(now, out);
        }
        if let Some(k) = stop.killed_at {
            if now >= k + TREE_GONE_TIMEOUT {
                // After a keeper loss nobody could report the tree gone:
                // that was said already. One last sweep first: the dead
                // keeper's orphans are re-parented to the agent while it
                // exits, possibly after the first walk went by them.
                if self.keeper_lost {
                    out.push(Action::SignalGroup(Sig::Kill));
                }
                if !self.keeper_lost {
                    out.push(Action::Report(match self.job {
                        Job::Exited { .. } => Notice::LeftoversOutsideGroup,
                        _ => Notice::GroupNotGone {
                            waited: now.saturating_since(k),
                        },
                    }));
                }
                self.finish(true, out);
            }
        }
    }

    fn begin_stop(
        &mut self,
        reason: StopReason,
        sig: Sig,
        kill_at: BootInstant,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        let kill_at = kill_at.min(self.kill_time());
        self.stop = Some(Stop {
            reason,
            kill_at,
            killed_at: None,
        });
        if self.group_known() {
            out.push(Action::SignalGroup(sig));
        }
        if reason != StopReason::Drain {
            out.push(Action::Stopping(format!(
                "stopping the command (token {})",
                self.token
            )));
            out.push(Action::Report(Notice::Stopping {
                sig,
                kill_in: now.until(kill_at),
            }));
        }
    }

    /// SIGKILL, even before the keeper reported the job started: a keeper
    /// stopped before its first report still gets SIGCONT, and the agent
    /// walks the tree itself.
    fn kill(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        if let Some(stop) = self.stop.as_mut() {
            if stop.killed_at.is_none() {
                stop.killed_at = Some(now);
                out.push(Action::SignalGroup(Sig::Kill));
            }
        }
    }

    fn on_renewed(
        &mut self,
        sent_at: BootInstant,
        ttl: Duration,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        let deadline = self.settings.deadline(sent_at, ttl);
        if self.lease_lost()
            || self
                .stop
                .is_some_and(|s| s.reason == StopReason::DeadlineNear)
            || self.keeper_acted(now)
        {
            // Once lost, always lost; but an answer saying the lease ends
            // even sooner still brings SIGKILL forward.
            if deadline < self.deadline {
                self.deadline = deadline;
                if self.job_alive() {
                    out.push(self.arm_keeper());
                }
            }
            return;
        }
        // Renewals are sequential: this answer is the authority's latest
        // word, whether it granted more or less than before.
        self.deadline = deadline;
        if ttl != self.ttl {
            let was = self.ttl;
            self.ttl = ttl;
            self.grace = self.settings.fitted(ttl).1;
            out.push(Action::Report(Notice::TtlChanged {
                ttl,
                was,
                grace: self.grace,
            }));
        }
        if let Lease::Failing { since } = self.lease {
            out.push(Action::Report(Notice::RenewalsRecovered {
                after: now.saturating_since(since),
                left: now.until(self.deadline),
            }));
        }
        self.lease = Lease::Valid;
        if self.job_alive() {
            out.push(self.arm_keeper());
        }
        out.push(Action::Publish(
            LeaseView::Valid,
            format!("holding token {}", self.token),
        ));
    }

    fn on_renew_failed(&mut self, error: String, now: BootInstant, out: &mut Vec<Action>) {
        match self.lease {
            Lease::Valid => {
                self.lease = Lease::Failing { since: now };
                out.push(Action::Report(Notice::RenewalFailing {
                    error,
                    left: now.until(self.deadline),
                }));
                out.push(Action::Publish(
                    LeaseView::Renewing,
                    format!("holding token {}, renewals failing", self.token),
                ));
            }
            Lease::Failing { since } => {
                let since = now.saturating_since(since);
                out.push(Action::Report(Notice::RenewalStillFailing { error, since }));
                out.push(Action::Publish(
                    LeaseView::Renewing,
                    format!(
                        "holding token {}, renewals failing for {}",
                        self.token,
                        crate::time::duration::format(since)
                    ),
                ));
            }
            Lease::Refused(_) | Lease::Expired => {}
        }
    }

    fn on_refused(
        &mut self,
        reason: RefusalReason,
        message: String,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::StopHeartbeat);
        if matches!(self.lease, Lease::Refused(_)) {
            return;
        }
        if self.lose(Lease::Refused(reason), now) {
            out.push(Action::Report(Notice::LeaseLost(LostWhy::Refused {
                reason,
                message,
            })));
            out.push(Action::Publish(
                LeaseView::Lost,
                format!("lease lost ({reason}), token {}", self.token),
            ));
        }
        if self.job_alive() && !self.killed() {
            match self.stop {
                // Already stopping for another reason: only bring SIGKILL forward.
                Some(ref mut s) => s.kill_at = s.kill_at.min(now + self.grace),
                None => self.begin_stop(
                    StopReason::Refused(reason),
                    Sig::Term,
                    now + self.grace,
                    now,
                    out,
                ),
            }
        }
    }

    fn on_signal(&mut self, sig: Sig, now: BootInstant, out: &mut Vec<Action>) {
        if !self.job_alive() {
            return;
        }
        // A signal that would end the agent stops the job as SIGTERM does.
        let relay = if sig.ends_run() && !sig.is_stop() {
            Sig::Term
        } else {
            sig
        };
        if self.group_known() {
            out.push(Action::SignalGroup(relay));
        } else if !sig.ends_run() {
            // The job may already run while its start report is still on
            // the way: relay once the group is known, never drop it. (Stop
            // signals are carried out by the stop itself, on start.)
            self.early_signals.push(sig);
        }
        if !sig.ends_run() {
            return;
        }
        if self.cancel.is_some() {
            // A second SIGINT or SIGTERM: SIGKILL now.
            if matches!(sig, Sig::Int | Sig::Term) && self.stop.is_some() && !self.killed() {
                self.kill(now, out);
            }
            return;
        }
        self.cancel = Some(sig);
        out.push(Action::Report(Notice::Cancelling { sig }));
        match self.stop {
            Some(ref mut s) => s.kill_at = s.kill_at.min(now + self.grace),
            None => {
                // The relayed signal is the stop signal; SIGKILL follows.
                self.stop = Some(Stop {
                    reason: StopReason::Cancelled(sig),
                    kill_at: (now + self.grace).min(self.kill_time()),
                    killed_at: None,
                });
                out.push(Action::Stopping(format!(
                    "stopping the command (signal {sig})"
                )));
                out.push(Action::Publish(
                    LeaseView::Stopping,
                    format!("stopping (signal {sig}), token {}", self.token),
                ));
            }
        }
    }

    fn on_started(&mut self, pid: i32, out: &mut Vec<Action>) {
        if self.job != Job::Starting {
            return;
        }
        self.job = Job::Running;
        out.push(Action::Report(Notice::CommandStarted { pgid: pid }));
        match self.stop {
            // A stop decided before the group existed is carried out now.
            Some(stop) => {
                let sig = match stop.reason {
                    StopReason::Cancelled(sig) if sig.is_stop() => sig,
                    _ => Sig::Term,
                };
                out.push(Action::SignalGroup(sig));
                if stop.killed_at.is_some() {
                    out.push(Action::SignalGroup(Sig::Kill));
                }
            }
            None => {
                out.push(self.arm_keeper());
                out.push(Action::Ready(format!(
                    "holding token {}, command running",
                    self.token
                )));
                out.push(Action::Publish(
                    LeaseView::Valid,
                    format!("holding token {}", self.token),
                ));
            }
        }
        for sig in std::mem::take(&mut self.early_signals) {
            out.push(Action::SignalGroup(sig));
        }
    }

    fn on_spawn_failed(&mut self, not_found: bool, message: String, out: &mut Vec<Action>) {
        if !self.job_alive() {
            return;
        }
        out.push(Action::Report(Notice::SpawnFailed { message }));
        out.push(Action::StopHeartbeat);
        self.job = Job::Finished;
        let code = if not_found {
            exit::NOT_FOUND
        } else {
            exit::CANNOT_EXECUTE
        };
        out.push(Action::Finished {
            outcome: Outcome::Failed,
            status: code,
        });
        out.push(Action::Release {
            outcome: Outcome::Failed,
            exit_code: Some(i32::from(code)),
        });
        out.push(Action::Exit(code));
    }

    fn on_exited(
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
            self.begin_stop(StopReason::Drain, Sig::Term, now + self.grace, now, out);
        }
    }

    fn on_tree_gone(&mut self, out: &mut Vec<Action>) {
        match self.job {
            Job::Exited { .. } => self.finish(false, out),
            Job::Running | Job::Starting => {
                // The keeper saw no child left before reporting an exit: treat
                // as a lost keeper (cannot happen with a sound keeper).
                self.keeper_lost = true;
                self.finish(true, out);
            }
            Job::Finished => {}
        }
    }

    fn on_keeper_lost(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        if !self.job_alive() || self.keeper_lost {
            return;
        }
        self.keeper_lost = true;
        out.push(Action::Report(Notice::KeeperLost));
        // SIGKILL now (the agent walks the tree itself: the keeper's orphans
        // are its own children), again if it went out before; nobody will
        // report the tree gone, so the run ends TREE_GONE_TIMEOUT later
        // without a release.
        if self.stop.is_none() {
            out.push(Action::Stopping(format!(
                "stopping the command (token {})",
                self.token
            )));
        }
        if self.killed() {
            out.push(Action::SignalGroup(Sig::Kill));
        } else {
            self.stop = Some(Stop {
                reason: StopReason::KeeperLost,
                kill_at: now,
                killed_at: None,
            });
            self.kill(now, out);
        }
    }

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
    /// `given_up`: the tree was not reported gone (a survivor, a process
    /// that may not be signalled, a lost keeper), so something may still
    /// run: exit 125, never `succeeded`, and no release.
    fn finish(&mut self, given_up: bool, out: &mut Vec<Action>) {
        let exited = match self.job {
            Job::Exited { status, at } => Some((status, at)),
            _ => None,
        };
        self.job = Job::Finished;
        out.push(Action::StopHeartbeat);
        let ended_at = exited.map(|(_, at)| at);
        let lost = self.lost_while_running(ended_at);
        let (outcome, code, exit_status) = if given_up {
            let outcome = if lost { Outcome::Lost } else { Outcome::Failed };
            (outcome, None, exit::AGENT_FAILED)
        } else if lost {
            let code = exited.and_then(|(s, _)| s.exit_code());
            (Outcome::Lost, code, exit::LEASE_LOST)
        } else if self.keeper_lost {
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
        if given_up {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_with_less_than_grace_left_is_too_late_to_start() {
        let t0 = BootInstant::from_since_boot(Duration::from_secs(1));
        let ttl = Duration::from_secs(2);
        let settings = Settings {
            asked_ttl: ttl,
            heartbeat: Duration::from_millis(600),
            grace: Duration::from_millis(1500),
            drift_ppm: 0,
            remap_exit: false,
        };
        let m = Machine::new(1, t0, ttl, settings);
        assert!(!m.too_late_to_start(t0 + Duration::from_millis(400)));
        assert!(m.too_late_to_start(t0 + Duration::from_millis(900)));
    }
    use proptest::prelude::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_millis(1_000_000 + ms))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const SIGTERM: Sig = Sig::Term;
    const SIGKILL: Sig = Sig::Kill;
    const SIGINT: Sig = Sig::Int;

    /// No drift budget, no remapping: the deadline is `sent + ttl - 1ms`.
    fn settings(ttl: u64, grace: u64) -> Settings {
        Settings {
            asked_ttl: ms(ttl),
            heartbeat: ms(ttl / 3),
            grace: ms(grace),
            drift_ppm: 0,
            remap_exit: false,
        }
    }

    fn machine(ttl: u64, grace: u64) -> Machine {
        Machine::new(1, at(0), ms(ttl), settings(ttl, grace))
    }

    fn release(outcome: Outcome, exit_code: Option<i32>) -> Action {
        Action::Release { outcome, exit_code }
    }

    fn signals(actions: &[Action]) -> Vec<Sig> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::SignalGroup(s) => Some(*s),
                _ => None,
            })
            .collect()
    }

    fn exit_of(actions: &[Action]) -> Option<u8> {
        actions.iter().find_map(|a| match a {
            Action::Exit(c) => Some(*c),
            _ => None,
        })
    }

    /// The leader ends at `at` (seen at `seen`), then the tree is gone a
    /// millisecond later: the actions of that last step.
    fn end(m: &mut Machine, status: ChildStatus, at_ms: u64, seen_ms: u64) -> Vec<Action> {
        m.step(
            Event::ChildExited {
                status,
                at: at(at_ms),
            },
            at(seen_ms),
        );
        m.step(Event::TreeGone, at(seen_ms + 1))
    }

    fn started(ttl: u64, grace: u64) -> Machine {
        let mut m = machine(ttl, grace);
        m.step(Event::ChildStarted { pid: 100 }, at(1));
        m
    }

    #[test]
    fn silence_gives_term_at_deadline_minus_grace_and_kill_at_deadline() {
        // Deadline: 3000 - 1 ms of rounding margin (no drift budget here).
        let mut m = started(3000, 500);
        assert_eq!(m.deadline(), at(2999));
        assert_eq!(m.next_wake(), Some(at(2499)));
        assert!(signals(&m.step(Event::Tick, at(2498))).is_empty());
        assert_eq!(signals(&m.step(Event::Tick, at(2499))), vec![SIGTERM]);
        // SIGKILL leads the deadline by KILL_LEAD.
        assert_eq!(m.next_wake(), Some(at(2979)));
        assert!(signals(&m.step(Event::Tick, at(2978))).is_empty());
        assert_eq!(signals(&m.step(Event::Tick, at(2979))), vec![SIGKILL]);
        let a = m.step(
            Event::ChildExited {
                status: ChildStatus::Signaled(9),
                at: at(3001),
            },
            at(3001),
        );
        assert!(signals(&a).is_empty());
        let a = m.step(Event::TreeGone, at(3002));
        assert_eq!(exit_of(&a), Some(exit::LEASE_LOST));
        assert!(a.contains(&release(Outcome::Lost, None)));
    }

    #[test]
    fn every_renewal_sets_the_deadline_from_its_send_time_lower_or_higher() {
        let mut m = started(3000, 500);
        m.step(
            Event::Renewed {
                sent_at: at(1000),
                ttl: ms(3000),
            },
            at(1900),
        );
        assert_eq!(m.deadline(), at(3999));
        // A renewal that grants less moves the deadline down, and grace
        // shrinks to fit the new ttl (a sixth of it).
        let a = m.step(
            Event::Renewed {
                sent_at: at(2000),
                ttl: ms(600),
            },
            at(2010),
        );
        assert_eq!(m.deadline(), at(2599));
        assert_eq!(m.grace(), ms(100));
        assert!(
            a.iter()
                .any(|x| matches!(x, Action::Report(Notice::TtlChanged { .. })))
        );
        assert!(
            a.iter()
                .any(|x| matches!(x, Action::Publish(LeaseView::Valid, _)))
        );
        assert_eq!(m.next_wake(), Some(at(2499)));
        // And one that grants more moves it up again, grace back to --grace.
        m.step(
            Event::Renewed {
                sent_at: at(2100),
                ttl: ms(3000),
            },
            at(2110),
        );
        assert_eq!(m.deadline(), at(5099));
        assert_eq!(m.grace(), ms(500));
    }

    #[test]
    fn the_drift_budget_takes_rho_of_the_ttl_and_the_rounding_margin() {
        let s = Settings {
            drift_ppm: 1_000,
            ..settings(30_000, 5_000)
        };
        // 30 s * (1 - 0.001) - 1 ms = 29.969 s.
        assert_eq!(s.deadline(at(0), ms(30_000)), at(29_969));
        // 24 h: 86.4 s of budget.
        assert_eq!(
            s.deadline(at(0), Duration::from_secs(86_400)),
            at(86_400_000 - 86_400 - 1)
        );
        assert_eq!(s.deadline(at(0), Duration::ZERO), at(0));
    }

    #[test]
    fn after_a_loss_a_late_renewal_can_only_bring_the_deadline_forward() {
        let mut m = started(3000, 500);
        m.step(Event::Tick, at(2499));
        assert_eq!(m.deadline(), at(2999));
        m.step(
            Event::Renewed {
                sent_at: at(2400),
                ttl: ms(3000),
            },
            at(2500),
        );
        assert_eq!(m.deadline(), at(2999), "once lost, always lost");
        m.step(
            Event::Renewed {
                sent_at: at(2400),
                ttl: ms(500),
            },
            at(2510),
        );
        assert_eq!(
            m.deadline(),
            at(2899),
            "the authority's word on expiry still counts"
        );
        assert_eq!(signals(&m.step(Event::Tick, at(2879))), vec![SIGKILL]);
    }

    fn released(actions: &[Action]) -> bool {
        actions.iter().any(|a| matches!(a, Action::Release { .. }))
    }

    fn arms(actions: &[Action]) -> Vec<BootInstant> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::ArmKeeper { deadline, .. } => Some(*deadline),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_tree_not_reported_gone_after_sigkill_is_never_released_and_exits_125() {
        let mut m = started(3000, 500);
        m.step(Event::Tick, at(2499));
        assert_eq!(signals(&m.step(Event::Tick, at(2979))), vec![SIGKILL]);
        // No exit, no tree-gone report: the next wake is the timeout, in the future.
        assert_eq!(m.next_wake(), Some(at(2979) + TREE_GONE_TIMEOUT));
        let a = m.step(Event::Tick, at(2979) + TREE_GONE_TIMEOUT);
        assert!(m.is_finished());
        assert_eq!(m.next_wake(), None);
        assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
        assert!(!released(&a), "{a:?}");
        assert!(a.contains(&Action::Report(Notice::NotReleasing)));
        assert!(
            a.iter()
                .any(|x| matches!(x, Action::Report(Notice::GroupNotGone { .. })))
        );
        // The job ended by itself with 0, a descendant survives: not
        // `succeeded`, not released, 125.
        let mut m = started(30_000, 1000);
        m.step(
            Event::ChildExited {
                status: ChildStatus::Exited(0),
                at: at(100),
            },
            at(100),
        );
        assert_eq!(signals(&m.step(Event::Tick, at(1100))), vec![SIGKILL]);
        let a = m.step(Event::Tick, at(1100) + TREE_GONE_TIMEOUT);
        assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
        assert!(!released(&a));
        assert!(a.contains(&Action::Finished {
            outcome: Outcome::Failed,
            status: exit::AGENT_FAILED
        }));
    }

    #[test]
    fn keeper_loss_kills_and_never_releases() {
        let mut m = started(30_000, 1000);
        let a = m.step(Event::KeeperLost, at(100));
        assert_eq!(signals(&a), vec![SIGKILL]);
        assert!(!m.is_finished());
        let a = m.step(Event::Tick, at(100) + TREE_GONE_TIMEOUT);
        // A last sweep for the keeper's orphans re-parented since, then the end.
        assert_eq!(signals(&a), vec![SIGKILL]);
        assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
        assert!(!released(&a));
        // Keeper lost before its start report: the agent still kills what
        // it can reach, and nothing is released.
        let mut m = machine(30_000, 1000);
        let a = m.step(Event::KeeperLost, at(5));
        assert_eq!(signals(&a), vec![SIGKILL]);
        let a = m.step(Event::Tick, at(5) + TREE_GONE_TIMEOUT);
        assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
        assert!(!released(&a));
    }

    #[test]
    fn sigkill_goes_out_at_the_kill_time_even_without_a_start_report() {
        // The job stopped its keeper before the keeper reported it started.
        let mut m = machine(3000, 500);
        m.step(Event::Tick, at(2499));
        assert_eq!(signals(&m.step(Event::Tick, at(2979))), vec![SIGKILL]);
        let a = m.step(Event::Tick, at(2979) + TREE_GONE_TIMEOUT);
        assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
        assert!(!released(&a));
    }

    #[test]
    fn the_keeper_is_armed_on_start_and_after_every_renewal() {
        let mut m = machine(3000, 500);
        let a = m.step(Event::ChildStarted { pid: 4 }, at(1));
        assert_eq!(arms(&a), vec![at(2999)]);
        assert_eq!(
            m.arm_keeper(),
            Action::ArmKeeper {
                deadline: at(2999),
                grace: ms(500),
                kill_lead: KILL_LEAD
            }
        );
        let a = m.step(
            Event::Renewed {
                sent_at: at(1000),
                ttl: ms(3000),
            },
            at(1010),
        );
        assert_eq!(arms(&a), vec![at(3999)]);
        // Lower ttl: lower deadline, handed over too.
        let a = m.step(
            Event::Renewed {
                sent_at: at(1500),
                ttl: ms(1000),
            },
            at(1510),
        );
        assert_eq!(arms(&a), vec![at(2499)]);
        // Once lost, only an earlier deadline is handed over.
        m.step(Event::Tick, at(2400));
        let a = m.step(
            Event::Renewed {
                sent_at: at(2300),
                ttl: ms(3000),
            },
            at(2410),
        );
        assert!(arms(&a).is_empty());
    }

    #[test]
    fn job_control_signals_are_relayed_and_change_nothing_else() {
        let mut m = started(30_000, 1000);
        for sig in Sig::JOB_CONTROL {
            let a = m.step(Event::Signal(sig), at(100));
            assert_eq!(signals(&a), vec![sig]);
            assert!(exit_of(&a).is_none());
        }
        let a = m.step(
            Event::Renewed {
                sent_at: at(200),
                ttl: ms(30_000),
            },
            at(210),
        );
        assert_eq!(arms(&a).len(), 1, "renewals still count while paused");
        assert_eq!(m.next_wake(), Some(at(200 + 30_000 - 1 - 1000)));
    }

    #[test]
    fn a_second_sigint_or_sigterm_kills_at_once() {
        for second in [SIGINT, SIGTERM] {
            let mut m = started(30_000, 5000);
            let a = m.step(Event::Signal(SIGINT), at(100));
            assert_eq!(signals(&a), vec![SIGINT]);
            let a = m.step(Event::Signal(second), at(200));
            assert_eq!(signals(&a), vec![second, SIGKILL]);
        }
        // A second SIGHUP is only relayed.
        let mut m = started(30_000, 5000);
        m.step(Event::Signal(SIGTERM), at(100));
        assert_eq!(
            signals(&m.step(Event::Signal(Sig::Hup), at(200))),
            vec![Sig::Hup]
        );
    }

    #[test]
    fn a_signal_that_would_end_the_agent_stops_and_releases_like_sigterm() {
        for sig in Sig::FATAL {
            let mut m = started(30_000, 1000);
            let a = m.step(Event::Signal(sig), at(100));
            assert_eq!(signals(&a), vec![SIGTERM], "{sig:?}");
            assert!(a.contains(&Action::Report(Notice::Cancelling { sig })));
            assert_eq!(signals(&m.step(Event::Tick, at(1100))), vec![SIGKILL]);
            let a = end(&mut m, ChildStatus::Exited(3), 1101, 1101);
            assert!(a.contains(&release(Outcome::Cancelled, Some(3))), "{a:?}");
        }
    }

    #[test]
    fn remap_exit_turns_the_jobs_own_124_and_125_into_1() {
        for (code, plain, remapped) in [(124, 124, 1), (125, 125, 1), (3, 3, 3), (0, 0, 0)] {
            for remap in [false, true] {
                let s = Settings {
                    remap_exit: remap,
                    ..settings(30_000, 1000)
                };
                let mut m = Machine::new(1, at(0), ms(30_000), s);
                m.step(Event::ChildStarted { pid: 3 }, at(1));
                let a = end(&mut m, ChildStatus::Exited(code), 10, 10);
                assert_eq!(exit_of(&a), Some(if remap { remapped } else { plain }));
                // The authority still hears the job's real code.
                assert!(a.iter().any(
                    |x| matches!(x, Action::Release { exit_code: Some(c), .. } if *c == code)
                ));
            }
        }
    }

    #[test]
    fn refusal_terms_at_once_and_kills_after_grace() {
        let mut m = started(30_000, 2000);
        let a = m.step(
            Event::Refused {
                reason: RefusalReason::Revoked,
                message: String::new(),
            },
            at(100),
        );
        assert_eq!(signals(&a), vec![SIGTERM]);
        assert!(a.contains(&Action::StopHeartbeat));
        assert!(signals(&m.step(Event::Tick, at(2099))).is_empty());
        assert_eq!(signals(&m.step(Event::Tick, at(2100))), vec![SIGKILL]);
        let a = end(&mut m, ChildStatus::Signaled(9), 2101, 2101);
        assert_eq!(exit_of(&a), Some(exit::LEASE_LOST));
        assert!(
            !a.iter().any(|x| matches!(x, Action::Release { .. })),
            "no release after a refusal"
        );
    }

    #[test]
    fn cancel_relays_the_signal_and_releases_cancelled() {
        let mut m = started(30_000, 1000);
        let a = m.step(Event::Signal(SIGINT), at(10));
        assert_eq!(signals(&a), vec![SIGINT]);
        assert_eq!(signals(&m.step(Event::Tick, at(1010))), vec![SIGKILL]);
        let a = end(&mut m, ChildStatus::Exited(3), 1011, 1011);
        assert_eq!(exit_of(&a), Some(3));
        assert!(a.contains(&release(Outcome::Cancelled, Some(3))));
    }

    #[test]
    fn a_job_that_ended_before_the_deadline_keeps_its_status_even_if_seen_late() {
        let mut m = started(3000, 500);
        // The agent was paused; it wakes at 5000 and learns the job ended at 2000.
        let a = end(&mut m, ChildStatus::Exited(0), 2000, 5000);
        assert_eq!(exit_of(&a), Some(0));
        // One that ended after the deadline is a lost lease.
        let mut m = started(3000, 500);
        let a = end(&mut m, ChildStatus::Exited(0), 3200, 5000);
        assert_eq!(exit_of(&a), Some(exit::LEASE_LOST));
    }

    #[test]
    fn wake_after_pause_past_deadline_kills_in_the_same_step() {
        let mut m = started(3000, 500);
        let a = m.step(
            Event::Renewed {
                sent_at: at(100),
                ttl: ms(3000),
            },
            at(9000),
        );
        assert_eq!(signals(&a), vec![SIGTERM, SIGKILL]);
    }

    #[test]
    fn stop_decided_before_the_group_exists_is_carried_out_on_start() {
        let mut m = machine(3000, 500);
        let a = m.step(
            Event::Refused {
                reason: RefusalReason::Expired,
                message: String::new(),
            },
            at(10),
        );
        assert!(signals(&a).is_empty());
        let a = m.step(Event::ChildStarted { pid: 5 }, at(20));
        assert_eq!(signals(&a), vec![SIGTERM]);
    }

    #[test]
    fn signals_before_the_start_report_are_relayed_once_the_group_is_known() {
        let mut m = machine(30_000, 500);
        assert!(signals(&m.step(Event::Signal(Sig::Usr1), at(1))).is_empty());
        assert!(signals(&m.step(Event::Signal(Sig::Hup), at(2))).is_empty());
        let a = m.step(Event::ChildStarted { pid: 7 }, at(3));
        assert_eq!(signals(&a), vec![Sig::Usr1, Sig::Hup]);
        assert!(
            signals(&m.step(Event::Tick, at(4))).is_empty(),
            "relayed once"
        );
    }

    #[test]
    fn spawn_failure_maps_to_127_and_126() {
        for (not_found, code) in [(true, 127), (false, 126)] {
            let mut m = machine(3000, 500);
            let event = Event::SpawnFailed {
                not_found,
                message: "x".into(),
            };
            let a = m.step(event, at(1));
            assert_eq!(exit_of(&a), Some(code));
            assert!(a.contains(&release(Outcome::Failed, Some(code as i32))));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The agent is paused before it had any reason to act; meanwhile
        /// the job ends by itself (stamped `end`) and the agent resumes
        /// later. Whether the loop sees the clock or the keeper's report
        /// first, the status is 124 exactly when the job ended at or after
        /// the deadline, and the job's own status otherwise.
        #[test]
        fn exit_status_follows_the_exit_stamp_not_the_event_order(
            ttl in 1000u64..10_000,
            grace_frac in 0u64..100,
            pause_frac in 0u64..100,
            end_after_pause in 0u64..12_000,
            resume_after_end in 1u64..5000,
            drift_ppm in prop::sample::select(vec![0u32, 1_000, 50_000]),
            clock_first in any::<bool>(),
            code in 0i32..3,
        ) {
            let grace = ttl * grace_frac / 100;
            let st = Settings { drift_ppm, ..settings(ttl, grace) };
            let mut m = Machine::new(1, at(0), ms(ttl), st);
            m.step(Event::ChildStarted { pid: 4 }, at(1));
            let term = (m.term_time().since_boot().as_millis() as u64).saturating_sub(1_000_000);
            prop_assume!(term > 2);
            let pause = 2 + (term - 2) * pause_frac / 100;
            prop_assert!(m.next_wake().is_some_and(|w| w > at(pause)));
            let end = pause + end_after_pause;
            let resume = at(end + resume_after_end);
            let exited = Event::ChildExited { status: ChildStatus::Exited(code), at: at(end) };
            let mut actions = Vec::new();
            if clock_first {
                actions.extend(m.step(Event::Tick, resume));
                actions.extend(m.step(exited, resume));
            } else {
                actions.extend(m.step(exited, resume));
                actions.extend(m.step(Event::Tick, resume));
            }
            if !m.is_finished() {
                actions.extend(m.step(Event::TreeGone, resume + ms(1)));
            }
            // The keeper's timer stops the job at the term time even while
            // the agent is paused: an end from then on counts as lost.
            let expected = if at(end) >= floor_ms(m.term_time()) { exit::LEASE_LOST } else { code as u8 };
            prop_assert_eq!(exit_of(&actions), Some(expected));
        }
    }

    /// One input of a generated run.
    #[derive(Clone, Debug)]
    enum Op {
        /// Time passes with the loop awake (it ticks at every `next_wake`).
        Advance(u64),
        /// Time passes with the agent paused (no ticks).
        Pause(u64),
        /// A renewal sent `lag` ms ago (but not before the previous one:
        /// renewals are sequential) is answered.
        Renewed {
            lag: u64,
            ttl: u64,
        },
        RenewFailed,
        Refused,
        Signal(Sig),
        Exit(i32),
        TreeGone,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..4000).prop_map(Op::Advance),
            1 => (0u64..8000).prop_map(Op::Pause),
            4 => ((0u64..3000), (500u64..6000)).prop_map(|(lag, ttl)| Op::Renewed { lag, ttl }),
            2 => Just(Op::RenewFailed),
            1 => Just(Op::Refused),
            1 => prop::sample::select(Sig::caught().collect::<Vec<_>>()).prop_map(Op::Signal),
            1 => (0i32..3).prop_map(Op::Exit),
            1 => Just(Op::TreeGone),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the order and timing of events:
        /// - SIGKILL is never later than the deadline (the loop wakes at
        ///   `next_wake`; after a pause, the first step kills);
        /// - the job is never stopped while the lease is provably valid
        ///   with more than grace left (no refusal, no stop signal, leader
        ///   still running);
        /// - the local deadline never exceeds what the renewals prove, and
        ///   is the latest renewal's `sent + ttl·(1 − ρ) − ε` while the
        ///   lease is held (lower or higher than before).
        #[test]
        fn kill_never_late_and_never_early(
            ttl in 1000u64..10_000,
            grace_frac in 0u64..100,
            start_delay in 0u64..200,
            drift_ppm in prop::sample::select(vec![0u32, 1_000, 50_000]),
            ops in prop::collection::vec(op(), 1..60),
        ) {
            let grace = ttl * grace_frac / 100;
            let st = Settings { drift_ppm, ..settings(ttl, grace) };
            let mut m = Machine::new(1, at(0), ms(ttl), st);
            let mut now = at(start_delay);
            // What the authority's answers prove: the latest renewal's send
            // time + ttl (its expiry is no earlier), and the budgeted deadline.
            let mut proven = at(0) + ms(ttl);
            let mut budget = st.deadline(at(0), ms(ttl));
            let mut last_sent = at(0);
            let mut killed = false;
            let mut justified_stop = false;
            let mut leader_running = true;
            let mut pending_exit = None;
            let mut exit_seen = false;
            let mut stopping = false;
            let first = m.step(Event::ChildStarted { pid: 10 }, now);

            let check = |m: &Machine, actions: &[Action], now: BootInstant, relay: Option<Sig>,
                             killed: &mut bool, stopping: &mut bool, justified: bool, (proven, budget): (BootInstant, BootInstant), leader_running: bool| {
                for s in signals(actions) {
                    if Some(s) == relay { continue; }
                    let first_stop = !*stopping;
                    *stopping = true;
                    if s == SIGKILL { *killed = true; }
                    // Judge the decision to stop; its SIGKILL follows from it.
                    prop_assert!(
                        !first_stop || justified || !leader_running || now >= budget - ms(grace).max(KILL_LEAD),
                        "signal {s:?} at {now:?} with the lease provably valid until {budget:?} (grace {grace})"
                    );
                }
                prop_assert!(m.deadline() <= proven);
                prop_assert_eq!(m.deadline(), budget);
                if leader_running && !m.is_finished() {
                    if now >= m.kill_time() {
                        prop_assert!(*killed, "past the kill time at {now:?} ({:?}) without SIGKILL", m.kill_time());
                    } else if !*killed {
                        let w = m.next_wake();
                        prop_assert!(w.is_some_and(|w| w <= m.kill_time()), "next wake {w:?} after kill time {:?}", m.kill_time());
                    }
                    prop_assert!(m.kill_time() < m.deadline());
                }
                Ok(())
            };

            check(&m, &first, now, None, &mut killed, &mut stopping, justified_stop, (proven, budget), leader_running)?;
            for op in ops {
                if m.is_finished() { break; }
                let (event, relay) = match op {
                    Op::Advance(d) => {
                        let target = now + ms(d);
                        while let Some(w) = m.next_wake() {
                            if w > target || m.is_finished() { break; }
                            now = now.max(w);
                            let a = m.step(Event::Tick, now);
                            exit_seen |= exit_of(&a).is_some();
                            check(&m, &a, now, None, &mut killed, &mut stopping, justified_stop, (proven, budget), leader_running)?;
                            if killed && leader_running && pending_exit.is_none() {
                                // SIGKILL ends the leader.
                                pending_exit = Some(ChildStatus::Signaled(9));
                            }
                            if let Some(w2) = m.next_wake() { if w2 <= now { break; } }
                        }
                        now = target;
                        (Event::Tick, None)
                    }
                    Op::Pause(d) => { now = now + ms(d); (Event::Tick, None) }
                    Op::Renewed { lag, ttl: t } => {
                        let sent = now.saturating_sub(ms(lag)).max(last_sent);
                        last_sent = sent;
                        // The machine's own view of "lost" decides which rule
                        // applies; the model then checks the deadline it keeps.
                        let frozen = m.lease_lost()
                            || m.stop.is_some_and(|s| s.reason == StopReason::DeadlineNear)
                            || m.keeper_acted(now);
                        if !frozen {
                            proven = sent + ms(t);
                            budget = st.deadline(sent, ms(t));
                        } else {
                            proven = proven.min(sent + ms(t));
                            budget = budget.min(st.deadline(sent, ms(t)));
                        }
                        (Event::Renewed { sent_at: sent, ttl: ms(t) }, None)
                    }
                    Op::RenewFailed => (Event::RenewFailed { error: "x".into() }, None),
                    Op::Refused => {
                        justified_stop = true;
                        (Event::Refused { reason: RefusalReason::Superseded, message: String::new() }, None)
                    }
                    Op::Signal(s) => {
                        if s.ends_run() { justified_stop = true; }
                        (Event::Signal(s), Some(s))
                    }
                    Op::Exit(c) => {
                        if !leader_running { continue; }
                        leader_running = false;
                        (Event::ChildExited { status: ChildStatus::Exited(c), at: now }, None)
                    }
                    Op::TreeGone => {
                        if leader_running { continue; }
                        (Event::TreeGone, None)
                    }
                };
                let a = m.step(event, now);
                exit_seen |= exit_of(&a).is_some();
                check(&m, &a, now, relay, &mut killed, &mut stopping, justified_stop, (proven, budget), leader_running)?;
                if let Some(status) = pending_exit.take() {
                    if leader_running {
                        leader_running = false;
                        let a = m.step(Event::ChildExited { status, at: now }, now);
                        exit_seen |= exit_of(&a).is_some();
                        check(&m, &a, now, None, &mut killed, &mut stopping, justified_stop, (proven, budget), leader_running)?;
                    }
                }
                prop_assert_eq!(m.is_finished(), exit_seen, "finished exactly when an exit was decided");
            }
        }
    }
}
