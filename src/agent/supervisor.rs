//! The supervisor loop: the only place that acts on the job.
//!
//! Three threads feed it events over one crossbeam channel: the heartbeat
//! thread (renewal answers), the signal thread, and the keeper-report reader
//! (started, exited, tree gone). The loop stamps each event with the boot
//! clock, hands it to the pure [`Machine`], and carries out the actions it
//! returns. No other thread signals the job, writes the state file or talks
//! to systemd, so there is no shared mutable state to race on.
//!
//! Every wait of the loop is bounded by the machine's next deadline, by
//! [`MAX_WAIT`] (to notice a suspend) and by the systemd watchdog interval.
//! After a pause (SIGSTOP, VM stall) the first thing the loop does on wake-up
//! is `Machine::step`, which checks the clock *before* looking at any event:
//! a job past its deadline is killed without waiting for any network answer.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::authority::{Authority, Grant, Outcome, RenewError};
use crate::keeper::handle::{JobGroup, Keeper};
use crate::time::clock::{BootInstant, MAX_WAIT};

use crate::agent::machine::{Action, Event, Machine};
use crate::agent::report::Reporter;
use crate::agent::state_file::{LeaseStateFile, LeaseView, StateWriter};
use crate::sys::notify::Notifier;

/// The shortest wait of the loop when the machine names a wake-up time that
/// already passed and was acted on: a floor, so nothing can make it spin.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// Everything the loop needs, prepared by `run`.
pub struct Supervisor {
    machine: Machine,
    grant: Grant,
    authority: Box<dyn Authority>,
    events: Receiver<Event>,
    notifier: Notifier,
    state: Option<StateWriter>,
    boot_id: String,
    reporter: Reporter,
    /// Dropped to stop renewals.
    heartbeat: Option<crate::agent::heartbeat::Heartbeat>,
    keeper: Option<Keeper>,
    /// Kept so the channel never reads as disconnected while the loop runs.
    _events_tx: Sender<Event>,
    /// The run's outcome, once decided (published in the state file).
    outcome: Option<Outcome>,
}

/// Upper bound for the release call.
pub fn release_timeout(ttl: Duration) -> Duration {
    ttl.min(Duration::from_secs(5))
}

impl Supervisor {
    /// A supervisor for `grant`, before the keeper and the heartbeat exist.
    pub fn new(
        machine: Machine,
        grant: Grant,
        authority: Box<dyn Authority>,
        events: (Sender<Event>, Receiver<Event>),
        notifier: Notifier,
        state: Option<StateWriter>,
    ) -> Self {
        Supervisor {
            reporter: Reporter::new(&grant.task, grant.token),
            machine,
            grant,
            authority,
            events: events.1,
            notifier,
            state,
            boot_id: crate::time::clock::boot_id().unwrap_or_default(),
            heartbeat: None,
            keeper: None,
            _events_tx: events.0,
            outcome: None,
        }
    }

    /// Hands the running keeper over.
    pub fn set_keeper(&mut self, keeper: Keeper) {
        self.keeper = Some(keeper);
    }

    /// Hands the heartbeat thread over (dropped to stop renewals).
    pub fn set_heartbeat(&mut self, heartbeat: crate::agent::heartbeat::Heartbeat) {
        self.heartbeat = Some(heartbeat);
    }
}

impl Supervisor {
    /// Runs until the machine says exit; returns the exit status.
    pub fn run(mut self) -> u8 {
        let mut group: Option<JobGroup> = None;
        let mut last_status = String::new();
        let watchdog = self.notifier.watchdog_interval();
        let mut next_watchdog = watchdog.map(|w| Instant::now() + w);
        let mut last_step = BootInstant::from_since_boot(Duration::ZERO);
        loop {
            let now = BootInstant::now();
            let mut wait = MAX_WAIT;
            if let Some(w) = self.machine.next_wake() {
                // A wake-up time the last step already reached was acted on;
                // if the machine still names it, never spin on it.
                wait = wait.min(if w <= last_step {
                    MIN_WAIT
                } else {
                    now.until(w)
                });
            }
            if let Some(t) = next_watchdog {
                wait = wait.min(t.saturating_duration_since(Instant::now()));
            }
            let event = match self.events.recv_timeout(wait) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => Event::Tick,
            };
            if let Event::ChildStarted { pid } = event {
                group = JobGroup::for_kill(pid);
            }
            let now = BootInstant::now();
            last_step = now;
            let actions = self.machine.step(event, now);
            // The kill path first: every signal of this step goes out before
            // anything that does I/O (log, state file, systemd, release).
            for action in &actions {
                if let (Action::SignalGroup(sig), Some(g)) = (action, group) {
                    if let Err(e) = g.signal(*sig) {
                        log::warn!("cannot signal process group {}: {e}", g.pgid());
                    }
                }
            }
            for action in actions {
                match action {
                    Action::SignalGroup(_) => {}
                    Action::Report(notice) => self.reporter.report(&notice),
                    Action::Finished { outcome, status } => {
                        self.outcome = Some(outcome);
                        self.publish(if outcome == Outcome::Lost {
                            LeaseView::Lost
                        } else {
                            LeaseView::Stopping
                        });
                        let line = format!(
                            "finished: task {} token {}, outcome {}, exit status {status}",
                            self.grant.task,
                            self.grant.token,
                            outcome.as_str()
                        );
                        log::info!("{line}");
                        self.notifier.status(&line);
                        last_status = line;
                    }
                    Action::Publish(view, status) => {
                        self.publish(view);
                        if status != last_status {
                            self.notifier.status(&status);
                            last_status = status;
                        }
                    }
                    Action::Ready(status) => {
                        self.notifier.ready(&status);
                        last_status = status;
                    }
                    Action::Stopping(status) => {
                        self.notifier.stopping(&status);
                        self.publish(LeaseView::Stopping);
                        last_status = status;
                    }
                    Action::StopHeartbeat => {
                        self.heartbeat = None;
                    }
                    Action::Release {
                        outcome,
                        exit_code,
                        if_group_empty,
                    } => {
                        if if_group_empty && !group.is_some_and(|g| g.is_empty()) {
                            log::warn!(
                                "not releasing task {} token {}: the command's process group may still have members; the lease will expire by itself",
                                self.grant.task,
                                self.grant.token
                            );
                        } else {
                            self.release(outcome, exit_code);
                        }
                    }
                    Action::Exit(code) => {
                        if let Some(k) = self.keeper.take() {
                            k.finish(Duration::from_secs(1));
                        }
                        if let Some(s) = &self.state {
                            s.remove();
                        }
                        return code;
                    }
                }
            }
            // A READY=1 systemd could not take yet goes out again.
            self.notifier.flush();
            if let (Some(t), Some(w)) = (next_watchdog, watchdog) {
                if Instant::now() >= t {
                    self.notifier.watchdog();
                    next_watchdog = Some(Instant::now() + w);
                }
            }
        }
    }

    /// Writes the state file once before the job starts.
    pub fn publish_initial(&self) {
        self.publish(LeaseView::Valid);
    }

    fn publish(&self, view: LeaseView) {
        let Some(writer) = &self.state else { return };
        let state = LeaseStateFile {
            task: self.grant.task.clone(),
            lease_id: self.grant.lease_id.clone(),
            token: self.grant.token,
            state: view,
            outcome: self.outcome.map(|o| o.as_str().to_string()),
            deadline_boot_ms: self.machine.deadline().since_boot().as_millis() as u64,
            boot_id: self.boot_id.clone(),
            agent_pid: std::process::id(),
        };
        if let Err(e) = writer.write(&state) {
            log::debug!("cannot write the lease state file: {e}");
        }
    }

    fn release(&mut self, outcome: Outcome, exit_code: Option<i32>) {
        let lease = self.grant.lease_ref();
        let timeout = release_timeout(self.grant.ttl);
        match self.authority.release(&lease, outcome, exit_code, timeout) {
            Ok(()) => log::info!(
                "released task {} token {} ({})",
                lease.task,
                lease.token,
                outcome.as_str()
            ),
            Err(RenewError::Refused { reason, .. }) => log::info!(
                "release of task {} token {}: the authority had already dropped the lease ({reason})",
                lease.task,
                lease.token
            ),
            Err(RenewError::Transient(e)) => log::warn!(
                "release of task {} token {} failed ({e}); the lease will expire by itself",
                lease.task,
                lease.token
            ),
        }
    }
}
