//! One `serve` replica: whether it leads now, with which engine, and (on
//! a PostgreSQL store) the leadership thread that decides it.
//!
//! With `--db` (SQLite) the replica always leads: one engine for the whole
//! run ([`Replica::single`]). With `--store postgresql://…` several
//! replicas share the store and one leads ([`Replica::replicated`]): the
//! leadership thread runs `leader.rs`'s machine against the store's
//! leadership row; a takeover starts a fresh engine on the store (fenced
//! at the new epoch: every commit is refused once a newer epoch exists),
//! loading everything on record (the protocol's Restart rule), and a
//! step-down takes it out of service before anything else.
//!
//! What a request sees: [`Replica::leading`] gives the current term only
//! while its deadline (boot clock) is ahead, else [`NotLeader`] naming the
//! leader as last seen in the store. The deadline is checked on every
//! lease call and again before a committed change is answered, so a leader
//! stopped (SIGSTOP, a long GC-like pause, a hung store) answers nothing
//! as leader once it wakes past its deadline, whatever its thread was
//! doing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Handle;

use super::leader::{Event, Machine, Step, Timing};
use crate::engine::EngineError;
use crate::engine::batched::{BatchedEngine, Counters, Limits};
use crate::engine::error::chain;
use crate::engine::history::Record;
use crate::engine::postgres::conn::Conn;
use crate::engine::postgres::connect::PgConfig;
use crate::engine::postgres::leader::{Leadership, Seen, Takeover, judge};
use crate::engine::postgres::{PgReader, PgStore};
use crate::engine::store::HistoryRead;
use crate::time::{boot_ms, wall_ms};

/// This replica does not lead: the lease call goes elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLeader {
    /// The leader's URL as last seen in the store, if any.
    pub leader: Option<String>,
}

/// One term as leader: its engine, and until when it may answer.
pub struct Term {
    pub engine: Arc<BatchedEngine>,
    pub epoch: u64,
    deadline_ms: AtomicU64,
}

impl Term {
    /// Still within this term's deadline.
    pub fn valid(&self) -> bool {
        boot_ms() < self.deadline_ms.load(Ordering::Acquire)
    }
}

/// Who leads, since when, the replicas seen and the recent takeovers, as
/// the status page and `/metrics` show them.
#[derive(Clone, Debug, Default)]
pub struct Roster {
    pub leader: Option<String>,
    /// Wall-clock ms the current leader took over.
    pub since_ms: Option<u64>,
    pub epoch: u64,
    pub replicas: Vec<Seen>,
    pub takeovers: Vec<Takeover>,
}

/// How a replicated `serve` runs (from the flags).
pub struct Replicated {
    pub cfg: PgConfig,
    pub rt: Handle,
    pub limits: Limits,
    pub timing: Timing,
    pub allow_async: bool,
}

/// This replica.
pub struct Replica {
    /// The URL this replica is reached at (`--advertise`).
    pub url: String,
    /// On a shared store (false: SQLite, always leading).
    pub replicated: bool,
    term: RwLock<Option<Arc<Term>>>,
    roster: Mutex<Roster>,
    /// The engine's counters, kept across terms.
    pub counters: Arc<Counters>,
    /// Takeovers this replica made from another leader.
    pub failovers: AtomicU64,
    /// History reads while standing by (a leader reads through its engine).
    standby_reader: Mutex<Option<Box<dyn HistoryRead>>>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Replica {
    fn new(url: String, replicated: bool, counters: Arc<Counters>) -> Self {
        Replica {
            url,
            replicated,
            term: RwLock::new(None),
            roster: Mutex::new(Roster::default()),
            counters,
            failovers: AtomicU64::new(0),
            standby_reader: Mutex::new(None),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// A replica that always leads, on its own store (SQLite).
    pub fn single(engine: BatchedEngine, url: String) -> Arc<Self> {
        let r = Replica::new(url.clone(), false, engine.counters.clone());
        let term = Term {
            engine: Arc::new(engine),
            epoch: 0,
            deadline_ms: AtomicU64::new(u64::MAX),
        };
        *r.term.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(term));
        r.roster.lock().unwrap_or_else(|p| p.into_inner()).leader = Some(url);
        Arc::new(r)
    }

    /// A replica on a shared PostgreSQL store, standing by until its
    /// leadership thread takes over.
    pub fn replicated(config: Replicated, url: String) -> std::io::Result<Arc<Self>> {
        let r = Arc::new(Replica::new(url.clone(), true, Arc::default()));
        *r.standby_reader.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(
            PgReader::new(config.cfg.clone(), config.rt.clone()),
        ));
        let identity = format!(
            "{url}#{}",
            crate::engine::rules::new_key()?.get(..12).unwrap_or("0")
        );
        let me = r.clone();
        let thread = std::thread::Builder::new()
            .name("leadership".into())
            .spawn(move || Leading::new(me, config, identity).run())?;
        *r.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
        Ok(r)
    }

    fn current(&self) -> Option<Arc<Term>> {
        self.term.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The current term, while it may answer lease calls.
    pub fn leading(&self) -> Result<Arc<Term>, NotLeader> {
        match self.current() {
            Some(t) if t.valid() => Ok(t),
            _ => Err(NotLeader {
                leader: self.leader_elsewhere(),
            }),
        }
    }

    /// The leader's URL as last seen, unless it is this replica's own.
    fn leader_elsewhere(&self) -> Option<String> {
        let roster = self.roster.lock().unwrap_or_else(|p| p.into_inner());
        roster.leader.clone().filter(|l| *l != self.url)
    }

    /// Who leads and who was seen, for the status page and `/metrics`.
    pub fn roster(&self) -> Roster {
        self.roster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// History while standing by (read from the store).
    pub fn standby_history(
        &self,
        task: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Record>, EngineError> {
        let mut reader = self
            .standby_reader
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match reader.as_mut() {
            Some(r) => Ok(r.page(task, before, limit)?),
            None => Err(EngineError::Unavailable(
                "this replica has no store to read",
            )),
        }
    }

    fn install(&self, term: Option<Arc<Term>>) -> Option<Arc<Term>> {
        let mut slot = self.term.write().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *slot, term)
    }

    /// Stops leading (what is queued is committed, if the store still
    /// takes it) and lets go of the leadership so a standby takes over at
    /// once; stops the leadership thread.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        match thread {
            Some(t) => {
                let _ = t.join();
            }
            None => {
                if let Some(term) = self.install(None) {
                    term.engine.shutdown();
                }
            }
        }
    }
}

/// The leadership thread's own state.
struct Leading {
    replica: Arc<Replica>,
    config: Replicated,
    store: Leadership,
    machine: Machine,
    /// When the roster was last read (boot ms).
    roster_at: u64,
    /// The last refusal logged (so a refused store is said once a while).
    last_refusal: Option<(String, u64)>,
}

/// How often the status page's roster is read from the store.
const ROSTER_EVERY_MS: u64 = 2000;
/// The longest any one leadership call may take.
const CALL_MS: u64 = 5000;

impl Leading {
    fn new(replica: Arc<Replica>, config: Replicated, identity: String) -> Self {
        let store = Leadership::new(Conn::new(config.cfg.clone(), config.rt.clone()));
        let machine = Machine::new(identity, config.timing);
        Leading {
            replica,
            config,
            store,
            machine,
            roster_at: 0,
            last_refusal: None,
        }
    }

    fn call_within(ms: u64) -> Duration {
        Duration::from_millis(ms.clamp(1, CALL_MS))
    }

    fn run(mut self) {
        while !self.replica.stop.load(Ordering::Relaxed) {
            let now = boot_ms();
            if let Some(t) = self.replica.current() {
                if !t.engine.healthy() {
                    log::error!(
                        "the store refused or failed a commit of leader epoch {}; stepping down",
                        t.epoch
                    );
                    self.machine.apply(Event::EngineFailed, now);
                }
            }
            self.refresh_roster(now);
            match self.machine.next(now) {
                Step::Observe => self.observe(),
                Step::TakeOver(row) => self.take_over(row),
                Step::Renew { epoch, within_ms } => self.renew(epoch, within_ms),
                Step::Resign { epoch } => self.step_down(epoch, now),
                Step::Wait { until_ms } => {
                    let ms = until_ms.saturating_sub(now).clamp(1, 50);
                    std::thread::sleep(Duration::from_millis(ms));
                }
            }
        }
        self.stop();
    }

    fn observe(&mut self) {
        let r = self.store.observe(
            &self.replica.url,
            &self.machine.identity,
            wall_ms(),
            Self::call_within(CALL_MS),
        );
        match r {
            Ok(row) => {
                {
                    let mut roster = self
                        .replica
                        .roster
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    roster.leader = row.url.clone();
                    roster.since_ms = row.since_ms;
                    roster.epoch = row.epoch;
                }
                self.machine.apply(
                    Event::Observed {
                        row,
                        at_ms: boot_ms(),
                    },
                    boot_ms(),
                );
            }
            Err(e) => {
                log::warn!("reading the leadership: {}", chain(&e));
                self.machine.apply(Event::Failed, boot_ms());
            }
        }
    }

    /// Logs why this replica does not lead: `why` and the store's error,
    /// once a minute while it stays the same (it is tried again and again).
    fn refused(&mut self, why: &str, detail: String) {
        let text = format!("{why}: {detail}");
        let now = boot_ms();
        let said = self
            .last_refusal
            .as_ref()
            .is_some_and(|(t, at)| *t == text && now.saturating_sub(*at) < 60_000);
        if !said {
            log::error!("{text}");
            self.last_refusal = Some((text, now));
        }
    }

    fn take_over(&mut self, row: crate::engine::postgres::leader::LeaderRow) {
        let checked = self
            .store
            .replication(Self::call_within(CALL_MS))
            .and_then(|r| judge(&r, self.config.allow_async));
        if let Err(e) = checked {
            self.refused("not taking over", chain(&e));
            self.machine.apply(Event::Failed, boot_ms());
            return;
        }
        let sent = boot_ms();
        let r = self.store.take_over(
            &row,
            &self.machine.identity,
            &self.replica.url,
            wall_ms(),
            Self::call_within(CALL_MS),
        );
        let epoch = match r {
            Ok(Some(epoch)) => epoch,
            Ok(None) => return self.machine.apply(Event::Moved, boot_ms()),
            Err(e) => {
                log::warn!("taking over: {}", chain(&e));
                return self.machine.apply(Event::Failed, boot_ms());
            }
        };
        self.machine.apply(
            Event::TookOver {
                epoch,
                sent_ms: sent,
            },
            boot_ms(),
        );
        let from = row.url.clone().unwrap_or_else(|| "nobody".into());
        let store = PgStore::open(
            self.config.cfg.clone(),
            self.config.rt.clone(),
            epoch,
            self.config.limits.history,
        );
        let started =
            BatchedEngine::start_counting(store, self.config.limits, self.replica.counters.clone());
        let engine = match started {
            Ok(e) => e,
            Err(e) => {
                // Tried again with a doubling wait (leader.rs): said once
                // a minute, not at every try.
                // (An engine error's text already carries its causes.)
                self.refused(
                    "took over but cannot lead: loading the leases",
                    e.to_string(),
                );
                return self.machine.apply(Event::EngineFailed, boot_ms());
            }
        };
        let deadline = self.machine.role.valid_until().unwrap_or(0);
        let term = Term {
            engine: Arc::new(engine),
            epoch,
            deadline_ms: AtomicU64::new(deadline),
        };
        self.replica.install(Some(Arc::new(term)));
        let other = row.holder.is_some() && row.holder.as_deref() != Some(&self.machine.identity);
        if other {
            self.replica.failovers.fetch_add(1, Ordering::Relaxed);
        }
        {
            let mut roster = self
                .replica
                .roster
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            roster.leader = Some(self.replica.url.clone());
            roster.since_ms = Some(wall_ms());
            roster.epoch = epoch;
        }
        self.roster_at = 0;
        eprintln!(
            "leaseagent serve: leading (epoch {epoch}, took over from {from}; every lease on record \
             expires no sooner than its ttl from now)"
        );
    }

    fn renew(&mut self, epoch: u64, within_ms: u64) {
        let sent = boot_ms();
        match self
            .store
            .renew(epoch, wall_ms(), Self::call_within(within_ms))
        {
            Ok(true) => {
                self.machine
                    .apply(Event::Renewed { sent_ms: sent }, boot_ms());
                if let (Some(t), Some(d)) =
                    (self.replica.current(), self.machine.role.valid_until())
                {
                    if t.epoch == epoch {
                        t.deadline_ms.store(d, Ordering::Release);
                    }
                }
            }
            Ok(false) => {
                log::error!("another replica took over from epoch {epoch}");
                self.machine.apply(Event::Deposed, boot_ms());
            }
            Err(e) => {
                log::warn!("renewing the leadership: {}", chain(&e));
                self.machine.apply(Event::Failed, boot_ms());
            }
        }
    }

    fn step_down(&mut self, epoch: u64, now: u64) {
        if let Some(term) = self.replica.install(None) {
            term.deadline_ms.store(0, Ordering::Release);
            // Its writer may be waiting for the store: let it end apart.
            let _ = std::thread::Builder::new()
                .name("stepped-down".into())
                .spawn(move || term.engine.shutdown());
        }
        eprintln!("leaseagent serve: standing by (no longer leading epoch {epoch})");
        self.machine.stepped_down(now);
    }

    fn refresh_roster(&mut self, now: u64) {
        if self.roster_at != 0 && now.saturating_sub(self.roster_at) < ROSTER_EVERY_MS {
            return;
        }
        self.roster_at = now.max(1);
        if let Ok((replicas, takeovers)) = self.store.roster(20, Self::call_within(1000)) {
            let mut roster = self
                .replica
                .roster
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            roster.replicas = replicas;
            roster.takeovers = takeovers;
        }
    }

    /// A clean stop: what the engine queued is committed, then the
    /// leadership is let go (standbys take over at once).
    fn stop(mut self) {
        let Some(term) = self.replica.install(None) else {
            return;
        };
        term.engine.shutdown();
        if term.valid() {
            match self.store.release(term.epoch, Self::call_within(CALL_MS)) {
                Ok(_) => eprintln!(
                    "leaseagent serve: let go of the leadership (epoch {})",
                    term.epoch
                ),
                Err(e) => log::warn!("letting go of the leadership: {}", chain(&e)),
            }
        }
    }
}
