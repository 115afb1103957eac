//! The supervisor's decisions as a pure state machine: `(state, event, now)
//! -> actions`.
//!
//! Nothing here touches a process, a socket or a clock; the supervisor loop
//! feeds it events stamped with the boot clock and carries out the actions it
//! returns. That is what lets the property tests throw every order and timing
//! of events at it.
//!
//! The rules it enforces:
//! - **Deadline** = the latest `send time + granted ttl` over the grant and
//!   every successful renewal. The agent counts from when it *sent* the
//!   request, the authority from when it *received* it, so the local deadline
//!   is never later than the authority's expiry.
//! - SIGTERM to the job's group at `deadline - grace`, SIGKILL at `deadline`,
//!   whatever the network is doing. The loop wakes up for both
//!   ([`Machine::next_wake`]), and a late wake-up (the agent was paused) kills
//!   at once, before any other event is looked at.
//! - **Refusal**: SIGTERM at once, SIGKILL `grace` later (never after the
//!   deadline).
//! - **Cancel** (SIGTERM/SIGINT/SIGQUIT to the agent): the signal is relayed,
//!   SIGKILL follows `grace` later; the lease is released as `cancelled`.
//! - Once lost, always lost: a renewal answer that arrives after the lease
//!   was given up (refused, expired, or the job already told to stop for the
//!   deadline) changes nothing.
//! - The job is finished only when its whole process tree is gone (the
//!   keeper's `TreeGone`): leftovers in the group get SIGTERM when the leader
//!   exits, and SIGKILL after grace, before the lease is released.

use std::time::Duration;

use crate::agent::state_file::LeaseView;
use crate::exit::{self, ChildStatus};
use crate::lease::{Outcome, RefusalReason};
use crate::time::clock::BootInstant;

pub const SIGTERM: i32 = 15;
pub const SIGKILL: i32 = 9;
const SIGINT: i32 = 2;
const SIGQUIT: i32 = 3;

/// After SIGKILL, how long to wait for the keeper's "tree gone" before
/// finishing anyway (descendants that left the process group survive
/// SIGKILL to the group; they are reported, not waited for forever).
pub const TREE_GONE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long before the deadline SIGKILL is sent (capped at ttl/20): the
/// kernel needs a moment to take a killed process down, and "dead before
/// the deadline" must hold, not "signalled at it".
pub const KILL_LEAD: Duration = Duration::from_millis(20);

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
    Signal(i32),
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

/// What the supervisor must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this signal to the job's process group.
    SignalGroup(i32),
    Log(log::Level, String),
    /// Publish the lease view (state file, systemd STATUS).
    Publish(LeaseView, String),
    /// The job is running: tell systemd READY.
    Ready(String),
    /// Stopping the job: tell systemd STOPPING.
    Stopping(String),
    /// No more renewals.
    StopHeartbeat,
    /// Release the lease with this outcome, then exit.
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
    Cancelled(i32),
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
    Running {
        pid: i32,
    },
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
    grace: Duration,
    kill_lead: Duration,
    deadline: BootInstant,
    lease: Lease,
    job: Job,
    stop: Option<Stop>,
    cancel: Option<i32>,
    keeper_lost: bool,
    /// The lease was lost while the leader still ran: the exit status is 124.
    lost_while_running: bool,
    /// Relayable signals that arrived before the group was known.
    early_signals: Vec<i32>,
    task: String,
    token: u64,
}

impl Machine {
    /// A machine for a lease granted to a request sent at `acquire_sent`.
    pub fn new(
        task: &str,
        token: u64,
        acquire_sent: BootInstant,
        ttl: Duration,
        grace: Duration,
    ) -> Self {
        Machine {
            grace,
            kill_lead: KILL_LEAD.min(ttl / 20),
            deadline: acquire_sent + ttl,
            lease: Lease::Valid,
            job: Job::Starting,
            stop: None,
            cancel: None,
            keeper_lost: false,
            lost_while_running: false,
            early_signals: Vec::new(),
            task: task.to_string(),
            token,
        }
    }

    /// The local deadline: last successful send + ttl. The job must be
    /// dead by then.
    pub fn deadline(&self) -> BootInstant {
        self.deadline
    }

    /// When SIGKILL goes out: [`KILL_LEAD`] (at most a twentieth of the
    /// ttl) before the deadline, so the group is dead, not merely
    /// signalled, by the deadline.
    pub fn kill_time(&self) -> BootInstant {
        self.deadline - self.kill_lead
    }

    /// When SIGTERM goes out without a renewal: `grace` before the
    /// deadline (or at the kill time, if grace is shorter than the lead).
    fn term_time(&self) -> BootInstant {
        (self.deadline - self.grace).min(self.kill_time())
    }

    #[cfg(test)]
    pub fn is_finished(&self) -> bool {
        self.job == Job::Finished
    }

    /// Records that the lease is gone; returns whether it was held until now.
    fn lose(&mut self, how: Lease) -> bool {
        let was_lost = self.lease_lost();
        self.lease = how;
        if matches!(self.job, Job::Starting | Job::Running { .. }) {
            self.lost_while_running = true;
        }
        !was_lost
    }

    fn lease_lost(&self) -> bool {
        matches!(self.lease, Lease::Refused(_) | Lease::Expired)
    }

    fn job_alive(&self) -> bool {
        matches!(
            self.job,
            Job::Starting | Job::Running { .. } | Job::Exited { .. }
        )
    }

    fn group_known(&self) -> bool {
        matches!(self.job, Job::Running { .. } | Job::Exited { .. })
    }

    fn killed(&self) -> bool {
        self.stop.is_some_and(|s| s.killed_at.is_some())
    }

    fn left(&self, now: BootInstant) -> String {
        crate::time::duration::format(now.until(self.deadline))
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
            Event::ChildStarted { pid } => self.on_started(pid, now, &mut out),
            Event::SpawnFailed { not_found, message } => {
                out.push(Action::Log(
                    log::Level::Error,
                    format!("cannot run the command: {message}"),
                ));
                out.push(Action::StopHeartbeat);
                self.job = Job::Finished;
                let code = if not_found {
                    exit::NOT_FOUND
                } else {
                    exit::CANNOT_EXECUTE
                };
                out.push(Action::Release {
                    outcome: Outcome::Failed,
                    exit_code: Some(code as i32),
                });
                out.push(Action::Exit(code));
            }
            Event::ChildExited { status, at } => self.on_exited(status, at, now, &mut out),
            Event::TreeGone => self.on_tree_gone(now, &mut out),
            Event::KeeperLost => {
                if self.job_alive() {
                    self.keeper_lost = true;
                    out.push(Action::Log(
                        log::Level::Error,
                        "the keeper process died; killing the job's process group".into(),
                    ));
                    self.begin_stop(StopReason::KeeperLost, SIGKILL, now, now, &mut out);
                    self.kill(now, &mut out);
                }
                if let Job::Exited { .. } | Job::Running { .. } | Job::Starting = self.job {
                    self.finish(now, &mut out);
                }
            }
        }
        self.check_time(now, &mut out);
        out
    }

    /// Deadline rules; called before and after every event.
    fn check_time(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        if !self.job_alive() {
            return;
        }
        if now >= self.kill_time() && !self.killed() {
            if !self.lease_lost() && self.lose(Lease::Expired) {
                out.push(Action::Log(
                    log::Level::Error,
                    format!(
                        "lease lost: task {} token {}: deadline passed without a renewal",
                        self.task, self.token
                    ),
                ));
                out.push(Action::Publish(
                    LeaseView::Lost,
                    format!("lease lost (expired), token {}", self.token),
                ));
            }
            if self.stop.is_none() {
                self.begin_stop(
                    StopReason::DeadlineNear,
                    SIGTERM,
                    self.kill_time(),
                    now,
                    out,
                );
            }
            self.kill(now, out);
            return;
        }
        if self.stop.is_none() && now >= self.term_time() {
            self.lose(Lease::Expired);
            out.push(Action::Log(
                log::Level::Error,
                format!(
                    "lease lost: task {} token {}: no renewal for too long; stopping the command, SIGKILL in {}",
                    self.task,
                    self.token,
                    self.left(now)
                ),
            ));
            out.push(Action::Publish(
                LeaseView::Lost,
                format!("lease lost (renewals failed), token {}", self.token),
            ));
            self.begin_stop(
                StopReason::DeadlineNear,
                SIGTERM,
                self.kill_time(),
                now,
                out,
            );
            return;
        }
        if let Some(stop) = self.stop {
            if stop.killed_at.is_none() && now >= stop.kill_at {
                self.kill(now, out);
            }
            if let (Some(k), Job::Exited { .. }) = (stop.killed_at, &self.job) {
                if now >= k + TREE_GONE_TIMEOUT {
                    out.push(Action::Log(
                        log::Level::Warn,
                        "processes the command started are still running outside its process group; not waiting for them".into(),
                    ));
                    self.finish(now, out);
                }
            }
        }
    }

    fn begin_stop(
        &mut self,
        reason: StopReason,
        sig: i32,
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
        if reason != StopReason::Drain {
            out.push(Action::Stopping(format!(
                "stopping the command (token {})",
                self.token
            )));
        }
        if self.group_known() {
            out.push(Action::SignalGroup(sig));
        }
        if reason != StopReason::Drain && reason != StopReason::KeeperLost {
            out.push(Action::Log(
                log::Level::Warn,
                format!(
                    "stopping: task {} token {}: signal {sig} sent, SIGKILL in {}",
                    self.task,
                    self.token,
                    crate::time::duration::format(now.until(kill_at))
                ),
            ));
        }
    }

    fn kill(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        if let Some(stop) = self.stop.as_mut() {
            if stop.killed_at.is_none() {
                stop.killed_at = Some(now);
                if self.group_known() {
                    out.push(Action::SignalGroup(SIGKILL));
                }
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
        if self.lease_lost()
            || self
                .stop
                .is_some_and(|s| s.reason == StopReason::DeadlineNear)
        {
            return;
        }
        let new_deadline = sent_at + ttl;
        if new_deadline > self.deadline {
            self.deadline = new_deadline;
        }
        if let Lease::Failing { since } = self.lease {
            out.push(Action::Log(
                log::Level::Info,
                format!(
                    "renewals recovered after {}: task {} token {}, {} left",
                    crate::time::duration::format(now.saturating_since(since)),
                    self.task,
                    self.token,
                    self.left(now)
                ),
            ));
        }
        self.lease = Lease::Valid;
        out.push(Action::Publish(
            LeaseView::Valid,
            format!("holding token {}", self.token),
        ));
    }

    fn on_renew_failed(&mut self, error: String, now: BootInstant, out: &mut Vec<Action>) {
        if self.lease_lost() {
            return;
        }
        match self.lease {
            Lease::Valid => {
                self.lease = Lease::Failing { since: now };
                out.push(Action::Log(
                    log::Level::Warn,
                    format!(
                        "renewal failing: task {} token {}: {error}; lease valid for {} more at most",
                        self.task,
                        self.token,
                        self.left(now)
                    ),
                ));
                out.push(Action::Publish(
                    LeaseView::Renewing,
                    format!("holding token {}, renewals failing", self.token),
                ));
            }
            Lease::Failing { since } => {
                out.push(Action::Log(
                    log::Level::Debug,
                    format!(
                        "renewal still failing after {}: {error}",
                        crate::time::duration::format(now.saturating_since(since))
                    ),
                ));
                out.push(Action::Publish(
                    LeaseView::Renewing,
                    format!(
                        "holding token {}, renewals failing for {}",
                        self.token,
                        crate::time::duration::format(now.saturating_since(since))
                    ),
                ));
            }
            _ => {}
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
        if self.lose(Lease::Refused(reason)) {
            out.push(Action::Log(
                log::Level::Error,
                format!(
                    "lease lost: task {} token {}: renewal refused ({reason}) {message}",
                    self.task, self.token
                ),
            ));
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
                    SIGTERM,
                    now + self.grace,
                    now,
                    out,
                ),
            }
        }
    }

    fn on_signal(&mut self, sig: i32, now: BootInstant, out: &mut Vec<Action>) {
        if !self.job_alive() {
            return;
        }
        if self.group_known() {
            out.push(Action::SignalGroup(sig));
        } else if !matches!(sig, SIGTERM | SIGINT | SIGQUIT) {
            // The job may already run while its start report is still on
            // the way: relay once the group is known, never drop it. (Stop
            // signals are carried out by the stop itself, on start.)
            self.early_signals.push(sig);
        }
        if matches!(sig, SIGTERM | SIGINT | SIGQUIT) && self.cancel.is_none() {
            self.cancel = Some(sig);
            out.push(Action::Log(
                log::Level::Warn,
                format!(
                    "signal {sig} received: stopping the command and releasing task {} token {}",
                    self.task, self.token
                ),
            ));
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
    }

    fn on_started(&mut self, pid: i32, now: BootInstant, out: &mut Vec<Action>) {
        if self.job != Job::Starting {
            return;
        }
        self.job = Job::Running { pid };
        out.push(Action::Log(
            log::Level::Debug,
            format!("command started, process group {pid}"),
        ));
        match self.stop {
            // A stop decided before the group existed is carried out now.
            Some(stop) => {
                let sig = match stop.reason {
                    StopReason::Cancelled(sig) => sig,
                    _ => SIGTERM,
                };
                out.push(Action::SignalGroup(sig));
                if stop.killed_at.is_some() {
                    out.push(Action::SignalGroup(SIGKILL));
                }
            }
            None => {
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
        let _ = now;
    }

    fn on_exited(
        &mut self,
        status: ChildStatus,
        at: BootInstant,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        if !matches!(self.job, Job::Running { .. } | Job::Starting) {
            return;
        }
        // The keeper stamps the exit; a paused agent learns of it late.
        let at = at.min(now);
        self.job = Job::Exited { status, at };
        out.push(Action::Log(
            log::Level::Info,
            format!("command ended with {status}"),
        ));
        if self.stop.is_none() {
            // Leftovers of the group must be gone before the lease is released.
            self.begin_stop(StopReason::Drain, SIGTERM, now + self.grace, now, out);
        }
    }

    fn on_tree_gone(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        match self.job {
            Job::Exited { .. } => self.finish(now, out),
            Job::Running { .. } | Job::Starting => {
                // The keeper saw no child left before reporting an exit: treat
                // as a lost keeper (cannot happen with a sound keeper).
                self.keeper_lost = true;
                self.finish(now, out);
            }
            Job::Finished => {}
        }
    }

    /// The tree is gone (or given up on): decide the exit status and release.
    fn finish(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        let exited = match self.job {
            Job::Exited { status, at } => Some((status, at)),
            _ => None,
        };
        self.job = Job::Finished;
        out.push(Action::StopHeartbeat);
        let ended_after_deadline = exited.is_some_and(|(_, at)| at >= self.deadline);
        let (outcome, code, exit_status) = if self.lost_while_running || ended_after_deadline {
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
            (outcome, status.exit_code(), status.passthrough())
        } else {
            (Outcome::Failed, None, exit::AGENT_FAILED)
        };
        if ended_after_deadline && !self.lost_while_running {
            out.push(Action::Log(
                log::Level::Error,
                format!("lease lost: task {} token {}: the command ended after the lease's deadline (was the agent paused?)", self.task, self.token),
            ));
        }
        if let Lease::Refused(_) = self.lease {
            // The authority already dropped the lease; releasing would only be refused.
            out.push(Action::Exit(exit_status));
        } else {
            out.push(Action::Release {
                outcome,
                exit_code: code,
            });
            out.push(Action::Exit(exit_status));
        }
        let _ = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_millis(1_000_000 + ms))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn signals(actions: &[Action]) -> Vec<i32> {
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
        let mut m = Machine::new("t", 1, at(0), ms(ttl), ms(grace));
        m.step(Event::ChildStarted { pid: 100 }, at(1));
        m
    }

    #[test]
    fn silence_gives_term_at_deadline_minus_grace_and_kill_at_deadline() {
        let mut m = started(3000, 500);
        assert_eq!(m.next_wake(), Some(at(2500)));
        assert!(signals(&m.step(Event::Tick, at(2499))).is_empty());
        assert_eq!(signals(&m.step(Event::Tick, at(2500))), vec![SIGTERM]);
        // SIGKILL leads the deadline by KILL_LEAD.
        assert_eq!(m.next_wake(), Some(at(2980)));
        assert!(signals(&m.step(Event::Tick, at(2979))).is_empty());
        assert_eq!(signals(&m.step(Event::Tick, at(2980))), vec![SIGKILL]);
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
        assert!(a.contains(&Action::Release {
            outcome: Outcome::Lost,
            exit_code: None
        }));
    }

    #[test]
    fn renewal_counts_from_its_send_time() {
        let mut m = started(3000, 500);
        m.step(
            Event::Renewed {
                sent_at: at(1000),
                ttl: ms(3000),
            },
            at(1900),
        );
        assert_eq!(m.deadline(), at(4000));
        // A late answer to an older request never moves the deadline back.
        m.step(
            Event::Renewed {
                sent_at: at(500),
                ttl: ms(3000),
            },
            at(1950),
        );
        assert_eq!(m.deadline(), at(4000));
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
        assert!(a.contains(&Action::Release {
            outcome: Outcome::Cancelled,
            exit_code: Some(3)
        }));
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
        let mut m = Machine::new("t", 1, at(0), ms(3000), ms(500));
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
        let mut m = Machine::new("t", 1, at(0), ms(30_000), ms(500));
        assert!(signals(&m.step(Event::Signal(10), at(1))).is_empty());
        assert!(signals(&m.step(Event::Signal(1), at(2))).is_empty());
        let a = m.step(Event::ChildStarted { pid: 7 }, at(3));
        assert_eq!(signals(&a), vec![10, 1]);
        assert!(
            signals(&m.step(Event::Tick, at(4))).is_empty(),
            "relayed once"
        );
    }

    #[test]
    fn spawn_failure_maps_to_127_and_126() {
        for (not_found, code) in [(true, 127), (false, 126)] {
            let mut m = Machine::new("t", 1, at(0), ms(3000), ms(500));
            let event = Event::SpawnFailed {
                not_found,
                message: "x".into(),
            };
            let a = m.step(event, at(1));
            assert_eq!(exit_of(&a), Some(code));
            assert!(a.contains(&Action::Release {
                outcome: Outcome::Failed,
                exit_code: Some(code as i32)
            }));
        }
    }

    /// One input of a generated run.
    #[derive(Clone, Debug)]
    enum Op {
        /// Time passes with the loop awake (it ticks at every `next_wake`).
        Advance(u64),
        /// Time passes with the agent paused (no ticks).
        Pause(u64),
        /// A renewal sent `lag` ms ago is answered.
        Renewed {
            lag: u64,
            ttl: u64,
        },
        RenewFailed,
        Refused,
        Signal(i32),
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
            1 => prop::sample::select(vec![1, 2, 3, 10, 12, 15]).prop_map(Op::Signal),
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
        /// - the local deadline never exceeds what the renewals prove.
        #[test]
        fn kill_never_late_and_never_early(
            ttl in 1000u64..10_000,
            grace_frac in 0u64..100,
            start_delay in 0u64..200,
            ops in prop::collection::vec(op(), 1..60),
        ) {
            let grace = ttl * grace_frac / 100;
            let mut m = Machine::new("t", 1, at(0), ms(ttl), ms(grace));
            let mut now = at(start_delay);
            let mut proven = at(0) + ms(ttl);
            let mut killed = false;
            let mut justified_stop = false;
            let mut leader_running = true;
            let mut pending_exit = None;
            let mut exit_seen = false;
            let mut stopping = false;
            let first = m.step(Event::ChildStarted { pid: 10 }, now);

            let check = |m: &Machine, actions: &[Action], now: BootInstant, relay: Option<i32>,
                             killed: &mut bool, stopping: &mut bool, justified: bool, proven: BootInstant, leader_running: bool| {
                for s in signals(actions) {
                    if Some(s) == relay { continue; }
                    let first_stop = !*stopping;
                    *stopping = true;
                    if s == SIGKILL { *killed = true; }
                    // Judge the decision to stop; its SIGKILL follows from it.
                    prop_assert!(
                        !first_stop || justified || !leader_running || now >= proven - ms(grace).max(KILL_LEAD),
                        "signal {s} at {now:?} with the lease provably valid until {proven:?} (grace {grace})"
                    );
                }
                prop_assert!(m.deadline() <= proven);
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

            check(&m, &first, now, None, &mut killed, &mut stopping, justified_stop, proven, leader_running)?;
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
                            check(&m, &a, now, None, &mut killed, &mut stopping, justified_stop, proven, leader_running)?;
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
                        let sent = now.saturating_sub(ms(lag)).max(at(0));
                        proven = proven.max(sent + ms(t));
                        (Event::Renewed { sent_at: sent, ttl: ms(t) }, None)
                    }
                    Op::RenewFailed => (Event::RenewFailed { error: "x".into() }, None),
                    Op::Refused => {
                        justified_stop = true;
                        (Event::Refused { reason: RefusalReason::Superseded, message: String::new() }, None)
                    }
                    Op::Signal(s) => {
                        if matches!(s, SIGTERM | SIGINT | SIGQUIT) { justified_stop = true; }
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
                check(&m, &a, now, relay, &mut killed, &mut stopping, justified_stop, proven, leader_running)?;
                if let Some(status) = pending_exit.take() {
                    if leader_running {
                        leader_running = false;
                        let a = m.step(Event::ChildExited { status, at: now }, now);
                        exit_seen |= exit_of(&a).is_some();
                        check(&m, &a, now, None, &mut killed, &mut stopping, justified_stop, proven, leader_running)?;
                    }
                }
                prop_assert_eq!(m.is_finished(), exit_seen, "finished exactly when an exit was decided");
            }
        }
    }
}
