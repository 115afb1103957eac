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

use crate::agent::machine::{Action, Event, Machine};
use crate::agent::state_file::{LeaseStateFile, LeaseView, StateWriter};
use crate::authority::{Authority, Grant, RenewError};
use crate::keeper::handle::{JobGroup, Keeper};
use crate::sys::notify::Notifier;
use crate::time::clock::{BootInstant, MAX_WAIT};

/// Everything the loop needs, prepared by `run`.
pub struct Supervisor {
    pub machine: Machine,
    pub grant: Grant,
    pub authority: Box<dyn Authority>,
    pub events: Receiver<Event>,
    pub notifier: Notifier,
    pub state: Option<StateWriter>,
    pub boot_id: String,
    /// Dropped to stop renewals.
    pub heartbeat: Option<crate::agent::heartbeat::Heartbeat>,
    pub keeper: Option<Keeper>,
    /// Kept so the channel never reads as disconnected while the loop runs.
    pub _events_tx: Sender<Event>,
    /// Upper bound for the release call.
    pub release_timeout: Duration,
}

impl Supervisor {
    /// Runs until the machine says exit; returns the exit status.
    pub fn run(mut self) -> u8 {
        let mut group: Option<JobGroup> = None;
        let mut last_status = String::new();
        let watchdog = self.notifier.watchdog_interval();
        let mut next_watchdog = watchdog.map(|w| Instant::now() + w);
        loop {
            // A READY=1 systemd could not take yet goes out again.
            self.notifier.flush();
            let now = BootInstant::now();
            let mut wait = MAX_WAIT;
            if let Some(w) = self.machine.next_wake() {
                wait = wait.min(now.until(w));
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
            let actions = self.machine.step(event, now);
            for action in actions {
                match action {
                    Action::SignalGroup(sig) => {
                        if let Some(g) = group {
                            if let Err(e) = g.signal(sig) {
                                log::warn!("cannot signal process group {}: {e}", g.pgid());
                            }
                        }
                    }
                    Action::Log(level, msg) => log::log!(level, "{msg}"),
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
                    Action::Release { outcome, exit_code } => self.release(outcome, exit_code),
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
            deadline_boot_ms: self.machine.deadline().since_boot().as_millis() as u64,
            boot_id: self.boot_id.clone(),
            agent_pid: std::process::id(),
        };
        if let Err(e) = writer.write(&state) {
            log::debug!("cannot write the lease state file: {e}");
        }
    }

    fn release(&mut self, outcome: crate::lease::Outcome, exit_code: Option<i32>) {
        let lease = self.grant.lease_ref();
        let timeout = self.release_timeout;
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
