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

use crate::authority::{Grant, LeaseClient, Outcome};
use crate::keeper::handle::Keeper;
use crate::time::clock::{BootInstant, MAX_WAIT};

use crate::agent::machine::{Action, Event, Machine, Stop};
use crate::agent::report::{Notice, Reporter};
use crate::agent::state_file::{LeaseStateFile, LeaseView, Removing, StateQueue, StateSink};
use crate::sys::notify::Notifier;

/// The shortest wait of the loop when the machine names a wake-up time that
/// already passed and was acted on: a floor, so nothing can make it spin.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// Everything the loop needs, prepared by `run`.
pub struct Supervisor {
    machine: Machine,
    grant: Grant,
    /// Until the release, which takes it to a thread of its own
    /// (`release.rs`): the loop never waits on the authority's store.
    authority: Option<Box<dyn LeaseClient>>,
    events: Receiver<Event>,
    notifier: Notifier,
    /// Until the writer thread starts; then `queue` owns it.
    state: Option<Box<dyn StateSink>>,
    /// The state file's writer thread: the loop never waits on a filesystem.
    queue: Option<StateQueue>,
    /// The state file's removal, asked for with the release.
    removing: Option<Removing>,
    boot_id: String,
    /// This process's time namespace's boot-clock offset (ns).
    boot_offset_ns: i64,
    reporter: Reporter,
    /// Dropped to stop renewals.
    heartbeat: Option<crate::agent::heartbeat::Heartbeat>,
    keeper: Option<Keeper>,
    /// The front process the shell waits on, at a terminal
    /// (`agent/front.rs`): told the job's group and its stops.
    front: Option<crate::agent::front::FrontLink>,
    /// Kept so the channel never reads as disconnected while the loop runs.
    _events_tx: Sender<Event>,
    /// The run's outcome, once decided (published in the state file).
    outcome: Option<Outcome>,
    /// The last `STATUS=` sent to systemd.
    last_status: String,
    next_watchdog: Option<Instant>,
    /// When the machine was last stepped.
    last_step: BootInstant,
}

impl Supervisor {
    /// A supervisor for `grant`, before the keeper and the heartbeat exist.
    pub fn new(
        machine: Machine,
        grant: Grant,
        authority: Box<dyn LeaseClient>,
        events: (Sender<Event>, Receiver<Event>),
        notifier: Notifier,
    ) -> Self {
        Supervisor {
            reporter: Reporter::new(&grant.task, grant.token),
            machine,
            grant,
            authority: Some(authority),
            events: events.1,
            notifier,
            state: None,
            queue: None,
            removing: None,
            boot_id: crate::time::clock::boot_id().unwrap_or_default(),
            // Unreadable: 0, the host's clock, as every agent before this
            // field wrote.
            boot_offset_ns: crate::time::clock::boottime_offset()
                .ok()
                .and_then(|o| i64::try_from(o).ok())
                .unwrap_or(0),
            heartbeat: None,
            keeper: None,
            front: None,
            _events_tx: events.0,
            outcome: None,
            last_status: String::new(),
            next_watchdog: None,
            last_step: BootInstant::from_since_boot(Duration::ZERO),
        }
    }

    /// Hands the running keeper over, and the deadline to guard with it.
    pub fn set_keeper(&mut self, keeper: Keeper) {
        self.keeper = Some(keeper);
        let arm = self.machine.arm_keeper();
        self.act_on_job(&[arm]);
    }

    /// Hands the front process's link over (at a terminal).
    pub fn set_front(&mut self, front: Option<crate::agent::front::FrontLink>) {
        self.front = front;
    }

    /// Hands the heartbeat thread over (dropped to stop renewals).
    pub fn set_heartbeat(&mut self, heartbeat: crate::agent::heartbeat::Heartbeat) {
        self.heartbeat = Some(heartbeat);
    }
}

impl Supervisor {
    /// Runs until the machine says exit; returns the exit status.
    pub fn run(mut self) -> u8 {
        self.next_watchdog = self
            .notifier
            .watchdog_interval()
            .map(|w| Instant::now() + w);
        loop {
            let event = self.next_event();
            if let Some(code) = self.step(event) {
                return code;
            }
            // A READY=1 systemd could not take yet goes out again.
            self.notifier.flush();
            self.feed_watchdog();
        }
    }

    /// Hands `event` to the machine now and carries out what it says;
    /// `Some(status)` when the run is over. Also for the events before the
    /// loop runs (the grant, a keeper that could not be started), so every
    /// end of a run goes through the machine.
    pub fn step(&mut self, event: Event) -> Option<u8> {
        let now = BootInstant::now();
        self.last_step = now;
        self.tell_front(&event);
        let actions = self.machine.step(event, now);
        self.act_on_job(&actions);
        actions
            .into_iter()
            .find_map(|action| self.carry_out(action))
    }

    /// The terminal's side of the job's news, for the front process: the
    /// job's group (as the host names it) and its stops. No lease decision.
    fn tell_front(&mut self, event: &Event) {
        let Some(front) = self.front.as_mut() else {
            return;
        };
        match event {
            Event::ChildStarted { pid, .. } => {
                if let Some(host) = self.keeper.as_ref().and_then(|k| k.host_pid_of(*pid)) {
                    front.job_started(host);
                }
            }
            Event::JobStopped => front.job_stopped(),
            _ => {}
        }
    }

    /// Waits for the next event, or for the machine's next wake-up time,
    /// the watchdog, or [`MAX_WAIT`] (a `Tick`).
    fn next_event(&self) -> Event {
        let now = BootInstant::now();
        let mut wait = MAX_WAIT;
        if let Some(w) = self.machine.next_wake() {
            // A wake-up time the last step already reached was acted on;
            // if the machine still names it, never spin on it.
            wait = wait.min(if w <= self.last_step {
                MIN_WAIT
            } else {
                now.until(w)
            });
        }
        if let Some(t) = self.next_watchdog {
            wait = wait.min(t.saturating_duration_since(Instant::now()));
        }
        match self.events.recv_timeout(wait) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => Event::Tick,
        }
    }

    /// The kill path first: every stop and relay of a step, and the
    /// keeper's deadline, go out before anything that does I/O (log, state
    /// file, systemd, release).
    fn act_on_job(&mut self, actions: &[Action]) {
        // Through the keeper, which stops the whole tree (see keeper/handle.rs).
        let Some(k) = self.keeper.as_mut() else {
            return;
        };
        for action in actions {
            match action {
                Action::Stop(Stop::Term) => k.term(),
                Action::Stop(Stop::Kill) => k.kill(),
                Action::Relay(sig) => k.relay(*sig),
                Action::ArmKeeper(deadline) => k.arm(*deadline),
                _ => {}
            }
        }
    }

    /// Carries out one action other than those on the job; `Some(status)`
    /// to exit.
    fn carry_out(&mut self, action: Action) -> Option<u8> {
        match action {
            Action::Stop(_) | Action::Relay(_) | Action::ArmKeeper(_) => {}
            Action::Report(notice) => self.reporter.report(&notice),
            Action::Finished { outcome, status } => {
                self.outcome = Some(outcome);
                self.publish(if outcome == Outcome::Lost {
                    LeaseView::Lost
                } else {
                    LeaseView::Stopping
                });
                let notice = Notice::Finished { outcome, status };
                self.reporter.report(&notice);
                let line = self.reporter.line(&notice).1;
                self.notifier.status(&line);
                self.last_status = line;
            }
            Action::Publish(view, status) => {
                self.publish(view);
                let status = self.reporter.status(&status);
                if status != self.last_status {
                    self.notifier.status(&status);
                    self.last_status = status;
                }
            }
            Action::Ready(status) => {
                let status = self.reporter.status(&status);
                self.notifier.ready(&status);
                self.last_status = status;
            }
            Action::Stopping(status) => {
                let status = self.reporter.status(&status);
                self.notifier.stopping(&status);
                self.publish(LeaseView::Stopping);
                self.last_status = status;
            }
            Action::StopHeartbeat => self.heartbeat = None,
            Action::Release { outcome, exit_code } => {
                // The tree is gone (a release only follows `TreeGone`): the
                // keeper finishes, and the state file goes, while the
                // release is under way.
                if let Some(k) = self.keeper.as_mut() {
                    k.done();
                }
                self.removing = self.queue.take().map(StateQueue::begin_remove);
                self.release(outcome, exit_code)
            }
            Action::Exit(code) => {
                // The removal too runs on the writer's thread, started here
                // if the run ended before it was (the loop never touches the
                // filesystem); a writer that gets no thread leaves the file.
                let removing = self
                    .removing
                    .take()
                    .or_else(|| self.queue.take().map(StateQueue::begin_remove))
                    .or_else(|| {
                        let q = StateQueue::spawn(self.state.take()?);
                        q.ok().map(StateQueue::begin_remove)
                    });
                if let Some(k) = self.keeper.take() {
                    k.finish(Duration::from_secs(1));
                }
                if let Some(r) = removing {
                    r.wait(Duration::from_millis(500));
                }
                return Some(code);
            }
        }
        None
    }

    /// `WATCHDOG=1` every half watchdog interval, from the loop itself.
    fn feed_watchdog(&mut self) {
        let (Some(t), Some(w)) = (self.next_watchdog, self.notifier.watchdog_interval()) else {
            return;
        };
        if Instant::now() >= t {
            self.notifier.watchdog();
            self.next_watchdog = Some(Instant::now() + w);
        }
    }

    /// Takes the state file's writer and writes the file once, directly,
    /// before the job starts; later views go through the writer thread
    /// ([`Self::start_state_queue`]).
    pub fn publish_initial(&mut self, state: Option<Box<dyn StateSink>>) {
        let view = self.view(LeaseView::Valid);
        self.state = state;
        if let Some(writer) = &mut self.state {
            if let Err(e) = writer.write(&view) {
                log::debug!("cannot write the lease state file: {e}");
            }
        }
    }

    /// Hands the state file to its writer thread. Started once the job is
    /// on its way, not before: nothing is published between the first
    /// write and the loop, and the thread's start-up is then off the path
    /// from the grant to the job.
    pub fn start_state_queue(&mut self) {
        let Some(writer) = self.state.take() else {
            return;
        };
        match StateQueue::spawn(writer) {
            Ok(q) => self.queue = Some(q),
            Err(e) => log::warn!("no writer thread for the lease state file: {e}"),
        }
    }

    fn publish(&self, view: LeaseView) {
        if let Some(q) = &self.queue {
            q.publish(self.view(view));
        }
    }

    fn view(&self, view: LeaseView) -> LeaseStateFile {
        LeaseStateFile {
            task: self.grant.task.clone(),
            lease_id: self.grant.lease_id.clone(),
            token: self.grant.token,
            state: view,
            outcome: self.outcome.map(|o| o.as_str().to_string()),
            containment: self.machine.containment().map(|c| c.as_str().to_string()),
            deadline_boot_ms: crate::time::ms(self.machine.deadline().since_boot()),
            boot_id: self.boot_id.clone(),
            boot_offset_ns: self.boot_offset_ns,
            agent_pid: std::process::id(),
        }
    }

    /// Releases on a thread of its own, waited for within the release's
    /// window: never past the lease's deadline (`release.rs`).
    fn release(&mut self, outcome: Outcome, exit_code: Option<i32>) {
        let Some(window) = crate::agent::release::window(
            BootInstant::now(),
            self.machine.deadline(),
            self.grant.ttl,
        ) else {
            return;
        };
        let Some(authority) = self.authority.take() else {
            return;
        };
        let notice = crate::agent::release::release_within(
            authority,
            self.grant.lease_ref(),
            outcome,
            exit_code,
            window,
        );
        self.reporter.report(&notice);
    }
}
