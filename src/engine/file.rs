//! The engine over a SQLite file shared by every agent process on a host
//! (the embedded default authority).
//!
//! Every call is one immediate transaction (`BEGIN IMMEDIATE`, through
//! rusqlite's `Transaction`): read the task's row, apply the rule from
//! [`super::rules`], write it back, commit. SQLite's write lock serialises
//! agents, so two processes racing for a free task cannot both see it free:
//! exactly one grant. Processes take turns at the write lock through
//! [`super::gate`], so a peer that commits in a tight loop cannot starve
//! the others (a turn is waited for at most half the time left, so a
//! stopped peer holding the gate cannot stall the rest); every wait (gate,
//! write lock, a busy answer retried) ends at the call's deadline, and then
//! the call fails as transient.
//!
//! The row, the token sequence and the history are read and written
//! through the storage seam's [`Txn`] (SQLite's `SqliteTxn`), as serve's
//! writer does; the transaction around them (turns at the gate, the WAL's
//! own `fdatasync`, the token ceiling) is this file's: the durability of
//! one SQLite file on one host.
//!
//! Expiry is a column: boot-clock milliseconds plus the clock view they
//! were measured under (`CLOCK_BOOTTIME` keeps counting through suspend),
//! and the wall-clock time of the row's last write.
//!
//! Clock views: `CLOCK_BOOTTIME` is one clock for the whole host only
//! within one time namespace and one boot id. A view is the boot id plus
//! the time namespace's boot-clock offset (`time::clock::view`); a row is
//! read under the reader's view (`sqlite::rows::foreign_expiry`): from the
//! same boot in another time namespace (a CRIU restore, `unshare --time`)
//! its expiry is translated exactly by the two offsets; from another boot
//! id (a VM or a container with its own boot id sharing the directory, a
//! file on a disk two hosts mount, or a reboot) it is held until its ttl
//! has passed on the wall clock since its last write, plus a margin, and
//! never read as expired at once: the holder may be alive on another
//! clock, renewing. Before, such a row read as expired and a second agent
//! was granted the task while the first job ran. The token ceiling stays
//! keyed by the bare boot id: it is about power losses, not clocks.
//!
//! "Now" is read before waiting for the lock, so lock waits only make a
//! renewal's new expiry earlier and a lease look more alive to an acquirer:
//! both are the safe direction.
//!
//! Durability (the reasoning is in docs/design.md, "The embedded
//! authority's file"): the connection runs with `synchronous=NORMAL`, so a
//! commit writes its WAL frames to the page cache and returns; the engine
//! `fdatasync`s the WAL file itself ([`Wal::sync`]) where a crash could
//! otherwise cost something. (Not `synchronous=FULL`: that also fsyncs the
//! directory on each connection's first sync, a second device flush per
//! run; SQLite still syncs the WAL header, with the directory, whenever it
//! starts a new or emptied WAL, which is when the directory entry can be
//! new.)
//!
//! Grants sync once per [`BLOCK`] tokens, through a token ceiling `C`
//! stored with its state (`pending` or `durable`) and the boot id it was
//! written under (`sqlite::rows::Ceiling`, rows of `meta`). A grant takes
//! `t = last_issued + 1`; if the ceiling's boot is not this boot, commits
//! after the last synced ceiling may have been lost in a power loss, so
//! `t = max(t, C + 1)`. When `t > C`, the state is `pending` or the boot
//! differs, the grant's own transaction also writes
//! `C' = max(C, t + BLOCK - 1)`, `pending`, this boot (only if it grants: a
//! refusal writes no ceiling); after the commit the WAL is synced before
//! the answer, then a second, unsynced transaction marks `C'` `durable` if
//! it is still the stored, pending ceiling. Any other grant is answered
//! after its commit, unsynced, except under policy `hold`: such a grant
//! lost in a power loss would let the task run again without an operator
//! (no reuse of a token, but a duplicated run), so it is always synced. A
//! clean reboot skips at most [`BLOCK`] tokens. Why no token is ever
//! answered twice:
//!
//! - Every answered token `t` is at most a ceiling whose WAL frames were
//!   fdatasync'd before `t` was answered: either this grant synced it, or
//!   the stored state was `durable`, which is written only after a
//!   successful sync of that same `C` (ceilings only rise, and any new one
//!   is written `pending`).
//! - `pending` left behind (a process killed between its commit and its
//!   sync, or a failed sync) makes the next grant sync again.
//! - A process crash loses nothing the page cache holds: within one boot
//!   the sequence in the page cache is the truth, and it only rises,
//!   unless an I/O error drops the cache (ext4 `errors=remount-ro`, a
//!   writeback error): then the file goes back to its last synced state in
//!   the same boot. Every grant raises a copy in memory of the highest
//!   token answered (`witness.rs`) before its commit; a grant that finds
//!   the sequence below it (or finds no copy to compare with) starts above
//!   the ceiling and the copy, and syncs its reservation, as after a power
//!   loss.
//! - A power loss changes the boot id. WAL frames survive as a prefix
//!   (cumulative checksums), an fdatasync covers every frame written before
//!   it, a checkpoint syncs the database before it truncates the WAL, and
//!   the ceiling only rises, so the disk holds a ceiling at least as high
//!   as every synced one; the first grant of the new boot starts above it
//!   and reserves, with a sync.
//!
//! Revokes and clears sync after their commit as before: they issue no
//! token, so uniqueness does not need it, but the operator is told the
//! change is done, and they are rare. Renewals and releases are not
//! synced: after a power loss every lease of the previous boot has expired
//! anyway (the boot id changed); a release lost to an I/O error in the
//! same boot brings its lease back until the lease's own expiry, as if
//! its agent had died. The release of a `hold` lease is the exception: it
//! is synced, as its grant was, or the lease would come back and end as
//! held for an operator.
//!
//! Size: nothing checkpoints on close or inside a call. After a release (and
//! after a renewal has been reported, see [`FileEngine::tidy`]) the WAL is
//! checkpointed and truncated once it passes a small bound, without waiting
//! for anyone: a busy database just leaves it to the next process. A first
//! opener rebuilds the WAL index by reading the whole WAL, so a bounded WAL
//! is what keeps start-up from growing with the host's history.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, Transaction, TransactionBehavior};
use rustix::fs::{Mode, OFlags};

use crate::lease::LeaseInfo;

use super::api::{Granted, MAX_PAGE, Page, validate_acquire, validate_task};
use super::error::{Context, EngineError, StoreError};
use super::gate::{self, Gate, GateError, Turn};
use super::history::{self, Cause};
use super::rules::{AcquireSpec, NewLease, Phase, TaskRow, lease_id, new_key, task_of};
use super::sqlite::rows::{self, Ceiling, Expiry};
use super::sqlite::waiters::Asking;
use super::sqlite::{SqliteTxn, schema};
use super::store::{HistoryRead, Txn};
use super::witness::{Trust, Witness};
use crate::time::{boot_ms, wall_ms};

/// One process's handle on the shared database.
pub struct FileEngine {
    conn: Connection,
    gate: Gate,
    /// This boot's id: what the token ceiling is written under.
    boot_id: String,
    /// This process's clock view (`time::clock::view`): what rows'
    /// expiries are written under.
    view: String,
    wal: Wal,
    /// The database file (the memory copy is named after it).
    db: PathBuf,
    /// The memory copy of the highest token answered (`witness.rs`),
    /// opened at the first grant (a heartbeat's engine never needs it).
    witness: Option<Witness>,
}

/// How durable a commit is when the call answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// The WAL is fdatasync'd after the commit, before the call answers:
    /// operator calls and grants under policy `hold`.
    Synced,
    /// Written to the page cache only, unless the commit reserved a token
    /// ceiling ([`Write::RowAndCeiling`]): grants, renewals and releases.
    Cached,
}

/// What a call's rule asks [`FileEngine::with_row`] to commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    /// Nothing (unless the row had to record a hold).
    Nothing,
    /// The task's row.
    Row,
    /// Only the waiters' queue (a waiter refused): committed without the
    /// row, which must keep its writer's clock view and write time.
    QueueOnly,
    /// The task's row, the WAL synced after the commit: a grant the memory
    /// copy could not record, a release of a lease under policy `hold`.
    RowSynced,
    /// The task's row and a new token ceiling (pending): after the commit
    /// the WAL is synced, then the ceiling is marked durable.
    RowAndCeiling(u64),
}

/// Tokens reserved by one fdatasync: a grant syncs when its token is above
/// the durable ceiling, and then moves the ceiling this far ahead. After a
/// power loss the first grant starts above the ceiling, so at most this
/// many tokens are skipped per boot; 1,024 of 2^63 is nothing, and one
/// flush per 1,024 grants is about 2.5 µs a grant instead of 2.6 ms.
pub const BLOCK: u64 = 1024;

/// The next token after `last_issued`, and the ceiling to reserve with it
/// if this grant must sync (see the module doc, "Durability").
fn next_token(
    last_issued: u64,
    ceiling: Option<&Ceiling>,
    boot_id: &str,
    trust: Trust,
) -> Result<(u64, Option<u64>), EngineError> {
    const EXHAUSTED: EngineError = EngineError::Unavailable("the token sequence is exhausted");
    let mut token = last_issued.checked_add(1).ok_or(EXHAUSTED)?;
    if let Trust::Lost(answered) = trust {
        // The disk lost writes the cache held (`witness.rs`): tokens up to
        // `answered` were answered.
        token = token.max(answered.checked_add(1).ok_or(EXHAUSTED)?);
    }
    let Some(c) = ceiling else {
        return Ok((token, Some(token.saturating_add(BLOCK - 1))));
    };
    if c.boot_id != boot_id || trust != Trust::Cache {
        // A power loss, or an I/O error that dropped the page cache, may
        // have lost commits made after the last synced ceiling: every token
        // up to it may have been answered. (Without a memory copy, nothing
        // tells a lost cache from a good one.)
        let token = token.max(c.value.checked_add(1).ok_or(EXHAUSTED)?);
        return Ok((token, Some(token.saturating_add(BLOCK - 1))));
    }
    if token <= c.value && c.durable {
        return Ok((token, None));
    }
    Ok((token, Some(c.value.max(token.saturating_add(BLOCK - 1)))))
}

/// The database's WAL file, as the engine syncs and measures it.
struct Wal {
    path: PathBuf,
    /// Opened at the first sync (SQLite creates the file on the first
    /// read). SQLite never deletes the WAL while a connection is open (the
    /// last one to close would, after a checkpoint, which this engine
    /// never does on close), so the descriptor names the file SQLite
    /// writes; one whose file was unlinked anyway is replaced.
    fd: Option<OwnedFd>,
    /// How many syncs were made (for the tests).
    syncs: u64,
}

impl Wal {
    /// Makes every frame written so far durable.
    fn sync(&mut self) -> Result<(), StoreError> {
        let err = |source: rustix::io::Errno| StoreError::SyncWal {
            path: self.path.clone(),
            source: source.into(),
        };
        let stale = match &self.fd {
            Some(fd) => rustix::fs::fstat(fd).map_err(err)?.st_nlink == 0,
            None => true,
        };
        if stale {
            let fd = rustix::fs::open(
                &self.path,
                OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .map_err(err)?;
            self.fd = Some(fd);
        }
        if let Some(fd) = &self.fd {
            rustix::fs::fdatasync(fd).map_err(err)?;
        }
        self.syncs += 1;
        Ok(())
    }
}

/// What [`FileEngine::tidy`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tidied {
    /// The WAL was within the bound: nothing to do.
    Small,
    /// Checkpointed and truncated to zero bytes.
    Truncated,
    /// Another process was reading, writing or checkpointing: left for later.
    Busy,
}

/// Checkpoint after a release once the WAL is larger than this. Each run
/// (a grant and a release, each touching the task's row, the counters and
/// the history with its index) adds about eight 4 KiB pages, so this is a
/// checkpoint about every eighth run, and a first opener reads at most
/// this much to rebuild the WAL index.
pub const TIDY_AFTER_RELEASE: u64 = 256 * 1024;

/// Checkpoint after a renewal once the WAL is larger than this: a lone
/// long job adds one page per renewal, so with a 10 s heartbeat its
/// heartbeat thread checkpoints about every 40 minutes (other runs'
/// releases usually do it first).
pub const TIDY_AFTER_RENEWAL: u64 = 1024 * 1024;

/// Calls `f` again while it fails because the database was busy, until
/// `deadline`.
fn retrying<T>(
    deadline: Instant,
    mut f: impl FnMut() -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    loop {
        match f() {
            Err(e) if e.is_busy() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            other => return other,
        }
    }
}

fn deadline_in(timeout: Duration) -> Instant {
    Instant::now() + timeout.max(Duration::from_millis(1))
}

/// Takes a turn at the gate, waiting at most half the time left: a gate
/// holder that is stopped (SIGSTOP, a debugger) must not stall everyone, so
/// after that the write lock is polled without a turn.
fn turn(gate: &Gate, deadline: Instant) -> Result<Option<Turn<'_>>, StoreError> {
    let now = Instant::now();
    let patience = now + deadline.saturating_duration_since(now) / 2;
    match gate.enter(patience) {
        Ok(t) => Ok(Some(t)),
        Err(GateError::Timeout { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Begins an immediate transaction, taking turns with other processes.
fn begin<'c>(
    conn: &'c mut Connection,
    gate: &Gate,
    deadline: Instant,
) -> Result<Transaction<'c>, StoreError> {
    let _turn = turn(gate, deadline)?;
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx("taking the write lock")
}

/// Marks the ceiling `value` durable once the WAL holding it was synced:
/// a second, small transaction, not synced (it only saves later grants a
/// sync). A failure leaves the ceiling pending, which costs the next grant
/// a sync and nothing else, so it is logged, not returned: the grant is
/// already durable and must be answered.
fn mark_durable(conn: &mut Connection, gate: &Gate, deadline: Instant, value: u64, boot_id: &str) {
    let done = begin(conn, gate, deadline).and_then(|tx| {
        rows::mark_ceiling_durable(&tx, value, boot_id)?;
        tx.commit().ctx("committing the token ceiling")
    });
    if let Err(e) = done {
        log::debug!("token ceiling {value} left pending: {e}");
    }
}

impl FileEngine {
    /// Opens (creating if needed) the database, waiting at most `timeout`
    /// for other processes that hold it.
    pub fn open(path: &Path, timeout: Duration) -> Result<Self, EngineError> {
        let deadline = deadline_in(timeout);
        let boot_id = crate::time::clock::boot_id().map_err(StoreError::BootId)?;
        let view = crate::time::clock::view().map_err(StoreError::BootId)?;
        let mut conn = schema::connect(path)?;
        conn.busy_handler(Some(gate::busy_handler))
            .ctx("setting the busy handler")?;
        // No checkpoint when a connection closes: every agent closes two
        // (its own and its heartbeat thread's) at the end of every run, and
        // each last close copied the WAL into the file with two more fsyncs
        // while the other connection waited for the lock. The WAL is kept
        // small by `tidy` instead; SQLite's automatic checkpoint (1,000
        // pages) stays as a backstop that `tidy` keeps from ever running.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .ctx("keeping checkpoints off close")?;
        let gate = Gate::open(path).map_err(StoreError::from)?;
        gate::with_deadline(deadline, || {
            retrying(deadline, || {
                let _turn = turn(&gate, deadline)?;
                schema::set_modes(&conn, path)?;
                if schema::schema_current(&conn)? {
                    return Ok(());
                }
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .ctx("taking the write lock")?;
                schema::ensure_schema(&tx)?;
                tx.commit().ctx("committing the schema")?;
                Ok(())
            })
        })?;
        // `schema::set_modes` set FULL (serve's setting); here the engine
        // syncs the WAL itself where it must (`Durability`).
        conn.pragma_update(None, "synchronous", "NORMAL")
            .ctx("setting synchronous=NORMAL")?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        Ok(FileEngine {
            conn,
            gate,
            boot_id,
            view,
            wal: Wal {
                path: PathBuf::from(wal),
                fd: None,
                syncs: 0,
            },
            db: path.to_path_buf(),
            witness: None,
        })
    }

    /// Checkpoints the WAL into the database and truncates it, if it is
    /// larger than `bound` bytes. Never waits: the busy handler is off, so
    /// a peer that is writing, reading an old snapshot or checkpointing
    /// makes this a no-op (`Busy`), and whoever comes next tries again.
    ///
    /// Two steps: a PASSIVE checkpoint copies the pages and does the fsyncs
    /// without the write lock (peers keep committing meanwhile); then
    /// TRUNCATE, which takes the write lock only to copy what was committed
    /// since (usually nothing) and cut the file to zero bytes.
    pub fn tidy(&mut self, bound: u64) -> Tidied {
        let big = std::fs::metadata(&self.wal.path).is_ok_and(|m| m.len() > bound);
        if !big {
            return Tidied::Small;
        }
        let conn = &self.conn;
        let checkpoint = |mode: &str| -> rusqlite::Result<bool> {
            conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                Ok(r.get::<_, i64>(0)? == 0 && r.get::<_, i64>(1)? == r.get::<_, i64>(2)?)
            })
        };
        let done = gate::with_deadline(Instant::now(), || {
            Ok::<_, rusqlite::Error>(checkpoint("PASSIVE")? && checkpoint("TRUNCATE")?)
        });
        match done {
            Ok(true) => Tidied::Truncated,
            Ok(false) => Tidied::Busy,
            Err(e) => {
                log::debug!("checkpointing {}: {e}", self.wal.path.display());
                Tidied::Busy
            }
        }
    }

    /// Runs `f` on the task's row inside one immediate transaction; the row
    /// is written back when `f` returns `Ok((_, true))`, or when it had to
    /// record a hold (whatever `f` answers), and with it, in the same
    /// transaction, the history of the attempts the change began or ended
    /// (`cause` says how they ended).
    fn with_row<T>(
        &mut self,
        task: &str,
        now: u64,
        cause: Cause,
        timeout: Duration,
        durability: Durability,
        mut f: impl FnMut(&mut TaskRow, &mut SqliteTxn<'_>) -> Result<(T, Write), EngineError>,
    ) -> Result<T, EngineError> {
        let deadline = deadline_in(timeout);
        let FileEngine {
            conn,
            gate,
            boot_id,
            view,
            wal,
            ..
        } = self;
        gate::with_deadline(deadline, || {
            retrying(deadline, || {
                let mut tx = SqliteTxn::boot(begin(conn, gate, deadline)?, view);
                let mut row = tx.load(task)?;
                let before = row.lease.clone();
                let settled = row.settle(now);
                let (out, write) = match f(&mut row, &mut tx) {
                    Ok((out, write)) => (Ok(out), write),
                    Err(e @ (EngineError::Storage(_) | EngineError::Commit(_))) => return Err(e),
                    // The rules leave the row as it was when they refuse.
                    Err(e) => (Err(e), Write::Nothing),
                };
                if write == Write::QueueOnly && !settled {
                    tx.commit()?;
                } else if write != Write::Nothing || settled {
                    tx.save(&row)?;
                    for op in history::ops(before.as_ref(), &row, cause, now) {
                        tx.record(&op, history::DEFAULT_BOUNDS)?;
                    }
                    tx.commit()?;
                    match write {
                        Write::RowAndCeiling(ceiling) => {
                            wal.sync()?;
                            mark_durable(conn, gate, deadline, ceiling, boot_id);
                        }
                        Write::RowSynced => wal.sync()?,
                        _ if durability == Durability::Synced => wal.sync()?,
                        _ => {}
                    }
                }
                out
            })
        })
    }

    /// Acquires as a newcomer: refused while anyone waits in the task's
    /// queue ([`FileEngine::acquire_queued`]).
    #[cfg(test)]
    pub fn acquire(
        &mut self,
        spec: &AcquireSpec,
        timeout: Duration,
    ) -> Result<Granted, EngineError> {
        self.acquire_queued(spec, None, timeout)
    }

    /// Acquires as `waiter` (an id the caller keeps while it waits), or as a
    /// newcomer (`None`). The task goes to the oldest waiter still asking
    /// (`sqlite::waiters`): a waiter that is not first, or a newcomer while
    /// anyone waits, is refused as held, and a waiter refused for any
    /// reason keeps (or takes) its place.
    pub fn acquire_queued(
        &mut self,
        spec: &AcquireSpec,
        waiter: Option<&str>,
        timeout: Duration,
    ) -> Result<Granted, EngineError> {
        validate_acquire(spec)?;
        let now = boot_ms();
        let view = self.view.clone();
        let key = new_key().map_err(StoreError::Random)?;
        let boot_id = self.boot_id.clone();
        let db = &self.db;
        let witness = self
            .witness
            .get_or_insert_with(|| Witness::open(db))
            .clone();
        // A `hold` grant lost in a power loss would let the task run again
        // without an operator, though its job may have been cut off midway:
        // it is synced whatever the ceiling.
        let durability = match spec.policy {
            crate::lease::ExpiryPolicy::Hold => Durability::Synced,
            _ => Durability::Cached,
        };
        self.with_row(
            &spec.task,
            now,
            Cause::Acquire,
            timeout,
            durability,
            |row, tx| {
                let asking = Asking {
                    view: &view,
                    boot_ms: now,
                    wall_ms: wall_ms(),
                };
                let queue = tx.waiters(&spec.task, asking)?;
                let ahead = waiter.map_or(queue.len(), |w| {
                    queue.iter().position(|q| q == w).unwrap_or(queue.len())
                });
                // Not this caller's turn: the rules' own refusal if the
                // task is taken, else the queue's.
                let free = row
                    .lease
                    .as_ref()
                    .is_none_or(|l| matches!(l.phase(now), Phase::Free));
                if !free || ahead > 0 {
                    let refusal = if free {
                        EngineError::Held {
                            holder: format!(
                                "{ahead} earlier waiter{}",
                                if ahead == 1 { "" } else { "s" }
                            ),
                            retry_after_ms: 100,
                        }
                    } else {
                        let mut probe = row.clone();
                        let t = NewLease {
                            token: row.last_token.saturating_add(1),
                            key: key.clone(),
                        };
                        match probe.acquire(spec, now, t) {
                            Err(e) => e,
                            Ok(()) => EngineError::Unavailable("the task is both free and not"),
                        }
                    };
                    return Ok(match waiter {
                        Some(w) => {
                            tx.join_waiters(&spec.task, w, asking)?;
                            (Err(refusal), Write::QueueOnly)
                        }
                        None => (Err(refusal), Write::Nothing),
                    });
                }
                if let Some(w) = waiter {
                    tx.leave_waiters(&spec.task, w)?;
                }
                let ceiling = tx.ceiling()?;
                let last = tx.last_issued()?;
                let trust = witness.trust(last);
                if let Trust::Lost(answered) = trust {
                    log::warn!(
                        "the lease database lost writes (tokens up to {answered} were answered, it \
                         says {last}; an I/O error dropped the page cache?): granting above them"
                    );
                }
                let (token, reserve) = next_token(last, ceiling.as_ref(), &boot_id, trust)?;
                row.acquire(
                    spec,
                    now,
                    NewLease {
                        token,
                        key: key.clone(),
                    },
                )?;
                tx.set_last_issued(token)?;
                // Raised before the commit, under the write lock: grants
                // raise it in order, and a failed commit only leaves it high.
                let recorded = witness.raise(token);
                // Only a grant reserves: a refusal returned above.
                let write = match reserve {
                    Some(c) => {
                        tx.save_ceiling(c, &boot_id)?;
                        Write::RowAndCeiling(c)
                    }
                    None if !recorded => Write::RowSynced,
                    None => Write::Row,
                };
                Ok((
                    Ok(Granted {
                        lease_id: lease_id(&key, &spec.task),
                        token,
                        ttl_ms: spec.ttl_ms,
                    }),
                    write,
                ))
            },
        )?
    }

    /// Gives up `waiter`'s places in every queue.
    pub fn leave_queue(&mut self, waiter: &str, timeout: Duration) -> Result<(), EngineError> {
        let deadline = deadline_in(timeout);
        let FileEngine { conn, gate, .. } = self;
        gate::with_deadline(deadline, || {
            retrying(deadline, || {
                let tx = begin(conn, gate, deadline)?;
                super::sqlite::waiters::leave_all(&tx, waiter)?;
                tx.commit().ctx("committing")?;
                Ok(())
            })
        })
    }

    /// Renews for `principal` (the embedded authority has none: `""`).
    pub fn renew(
        &mut self,
        id: &str,
        token: u64,
        principal: &str,
        timeout: Duration,
    ) -> Result<u64, EngineError> {
        let now = boot_ms();
        let (key, task) = task_of(id)?;
        self.with_row(
            task,
            now,
            Cause::Renew,
            timeout,
            Durability::Cached,
            |row, _| Ok((row.renew(key, token, principal, now)?, Write::Row)),
        )
    }

    /// Releases without a report of how the run went (see
    /// [`FileEngine::release_reporting`]).
    #[cfg(test)]
    pub fn release(
        &mut self,
        id: &str,
        token: u64,
        principal: &str,
        timeout: Duration,
    ) -> Result<(), EngineError> {
        self.release_reporting(id, token, principal, None, None, timeout)
    }

    /// Releases, recording in the run history how the run went.
    pub fn release_reporting(
        &mut self,
        id: &str,
        token: u64,
        principal: &str,
        outcome: Option<crate::lease::Outcome>,
        exit_code: Option<i32>,
        timeout: Duration,
    ) -> Result<(), EngineError> {
        let now = boot_ms();
        let (key, task) = task_of(id)?;
        let cause = Cause::Release(outcome, exit_code);
        self.with_row(task, now, cause, timeout, Durability::Cached, |row, _| {
            // A `hold` lease's grant was synced; its release is too, or a
            // release lost to an I/O error or a power loss would bring the
            // lease back, to end as held for an operator.
            let hold = row
                .lease
                .as_ref()
                .is_some_and(|l| l.policy == crate::lease::ExpiryPolicy::Hold);
            row.release(key, token, principal, now)?;
            Ok(((), if hold { Write::RowSynced } else { Write::Row }))
        })
    }

    pub fn revoke(
        &mut self,
        task: &str,
        force: bool,
        timeout: Duration,
    ) -> Result<u64, EngineError> {
        validate_task(task).map_err(EngineError::BadRequest)?;
        let now = boot_ms();
        self.with_row(
            task,
            now,
            Cause::Revoke,
            timeout,
            Durability::Synced,
            |row, _| Ok((row.revoke(force, now)?, Write::Row)),
        )
    }

    pub fn clear(&mut self, task: &str, timeout: Duration) -> Result<u64, EngineError> {
        validate_task(task).map_err(EngineError::BadRequest)?;
        let now = boot_ms();
        self.with_row(
            task,
            now,
            Cause::Clear,
            timeout,
            Durability::Synced,
            |row, _| Ok((row.clear(now)?, Write::Row)),
        )
    }

    /// Up to `limit` rows' worth of leases after task `after`, in task
    /// order. Reads need no write lock (WAL), so listing never holds up a
    /// grant.
    pub fn leases_page(
        &mut self,
        after: Option<&str>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Page, EngineError> {
        let deadline = deadline_in(timeout);
        let limit = limit.max(1);
        let now = boot_ms();
        let rows = gate::with_deadline(deadline, || {
            retrying(deadline, || {
                Ok(rows::load_page(
                    &self.conn,
                    after,
                    limit,
                    Expiry::Boot(&self.view),
                )?)
            })
        })?;
        let next_after = (rows.len() == limit)
            .then(|| rows.last().map(|r| r.task.clone()))
            .flatten();
        Ok(Page {
            leases: rows.iter().filter_map(|r| r.info(now)).collect(),
            next_after,
        })
    }

    /// Up to `limit` attempts (of `task`, or of all), newest first, with
    /// tokens below `before`. Reads need no write lock. An attempt whose
    /// expiry no call has written yet (the embedded authority has no
    /// sweeper) is shown as it stands: expired, at its expiry.
    pub fn history_page(
        &mut self,
        task: Option<&str>,
        before: Option<u64>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<history::Record>, EngineError> {
        let deadline = deadline_in(timeout);
        let now = boot_ms();
        gate::with_deadline(deadline, || {
            retrying(deadline, || {
                let mut page = HistoryRead::page(&mut self.conn, task, before, limit)?;
                for r in page.iter_mut().filter(|r| r.ended.is_none()) {
                    let row = rows::load(&self.conn, &r.task, Expiry::Boot(&self.view))?;
                    let end = match row.lease.as_ref().filter(|l| l.token == r.token) {
                        Some(l) if matches!(l.phase(now), Phase::Active { .. }) => {
                            continue;
                        }
                        Some(l) => history::expired(l, now, wall_ms()),
                        // Gone without a recorded end: expired, time unknown.
                        None => {
                            r.ended = Some(crate::lease::Ended::Expired);
                            continue;
                        }
                    };
                    if let history::Op::End { ended, at_ms, .. } = end {
                        r.ended = Some(ended);
                        r.ended_ms = Some(at_ms);
                        r.held_ms = Some(at_ms.saturating_sub(r.acquired_ms));
                    }
                }
                Ok(page)
            })
        })
    }

    /// Every lease that matters, in task order.
    pub fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, EngineError> {
        let deadline = deadline_in(timeout);
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let page = self.leases_page(after.as_deref(), MAX_PAGE, left)?;
            out.extend(page.leases);
            match page.next_after {
                Some(a) => after = Some(a),
                None => return Ok(out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{ExpiryPolicy, RefusalReason};

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn sqlite_is_built_without_what_leaseagent_never_uses() {
        // `.cargo/config.toml` sets LIBSQLITE3_FLAGS; an environment that
        // overrides it would bring back ~400 KiB of code (and of every
        // agent's resident memory).
        let c = Connection::open_in_memory().unwrap();
        let mut st = c.prepare("PRAGMA compile_options").unwrap();
        let opts: Vec<String> = st
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for want in ["OMIT_LOAD_EXTENSION", "OMIT_JSON", "DQS=0"] {
            assert!(opts.iter().any(|o| o == want), "{want} missing: {opts:?}");
        }
        for unwanted in ["ENABLE_FTS3", "ENABLE_FTS5", "ENABLE_RTREE", "ENABLE_STAT4"] {
            assert!(
                !opts.iter().any(|o| o == unwanted),
                "{unwanted} in {opts:?}"
            );
        }
    }

    fn spec(task: &str, policy: ExpiryPolicy) -> AcquireSpec {
        AcquireSpec {
            task: task.into(),
            principal: String::new(),
            holder: "h".into(),
            ttl_ms: 1000,
            policy,
            grace_ms: 0,
            max_leases: None,
        }
    }

    #[test]
    fn a_sequence_below_the_memory_copy_grants_above_the_ceiling() {
        let c = Ceiling {
            value: 1024,
            durable: true,
            boot_id: "b".into(),
        };
        let next = |last, trust| next_token(last, Some(&c), "b", trust).unwrap();
        assert_eq!(next(1, Trust::Cache), (2, None));
        // Tokens up to 4 answered, the file says 1: above the ceiling.
        assert_eq!(next(1, Trust::Lost(4)), (1025, Some(2048)));
        // Nothing to compare with: the same, every grant.
        assert_eq!(next(1, Trust::Unknown), (1025, Some(2048)));
        assert_eq!(next(1030, Trust::Unknown), (1031, Some(2054)));
        // No ceiling at all (a file that lost even its first one).
        assert_eq!(
            next_token(1, None, "b", Trust::Lost(4)).unwrap(),
            (5, Some(1028))
        );
    }

    #[test]
    fn released_rows_are_compacted_and_tokens_keep_rising() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("l.db");
        let mut e = FileEngine::open(&db, T).unwrap();
        let mut last = 0;
        for i in 0..5 {
            for task in ["a", "b"] {
                let g = e.acquire(&spec(task, ExpiryPolicy::Redispatch), T).unwrap();
                assert!(g.token > last, "round {i}: {} after {last}", g.token);
                last = g.token;
                e.release(&g.lease_id, g.token, "", T).unwrap();
            }
        }
        // A task whose lease was revoked with force is compacted after its
        // next lease is released (until then the old holder hears `revoked`).
        let g = e.acquire(&spec("c", ExpiryPolicy::Redispatch), T).unwrap();
        e.revoke("c", true, T).unwrap();
        let g2 = e.acquire(&spec("c", ExpiryPolicy::Redispatch), T).unwrap();
        assert!(matches!(
            e.renew(&g.lease_id, g.token, "", T),
            Err(EngineError::Refused(RefusalReason::Revoked))
        ));
        e.release(&g2.lease_id, g2.token, "", T).unwrap();
        last = g2.token;
        let c = Connection::open(&db).unwrap();
        let rows: i64 = c
            .query_row("SELECT COUNT(*) FROM tasks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0, "released rows are deleted");
        assert_eq!(rows::last_issued(&c).unwrap(), last);
    }

    #[test]
    fn a_corrupt_row_fails_the_call_and_never_restarts_tokens() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("l.db");
        let mut e = FileEngine::open(&db, T).unwrap();
        let g = e.acquire(&spec("x", ExpiryPolicy::Redispatch), T).unwrap();
        let c = Connection::open(&db).unwrap();
        c.execute("UPDATE tasks SET last_token = -5, token = NULL", [])
            .unwrap();
        let err = e
            .acquire(&spec("x", ExpiryPolicy::Redispatch), T)
            .unwrap_err();
        assert!(
            matches!(err, EngineError::Storage(StoreError::Corrupt { .. })),
            "{err:?}"
        );
        assert!(err.to_string().contains("last_token"), "{err}");
        c.execute(
            "UPDATE tasks SET last_token = 1, token = 1, policy = 'maybe'",
            [],
        )
        .unwrap();
        assert!(matches!(
            e.renew(&g.lease_id, g.token, "", T),
            Err(EngineError::Storage(StoreError::Corrupt { .. }))
        ));
        assert!(e.leases(T).is_err());
        // A sequence behind a task's counter is refused, not reused.
        c.execute(
            "UPDATE tasks SET last_token = 50, token = NULL, policy = NULL",
            [],
        )
        .unwrap();
        assert!(matches!(
            e.acquire(&spec("x", ExpiryPolicy::Redispatch), T),
            Err(EngineError::SequenceBehind { .. })
        ));
    }

    #[test]
    fn another_principal_cannot_renew_or_release() {
        let d = tempfile::tempdir().unwrap();
        let mut e = FileEngine::open(&d.path().join("l.db"), T).unwrap();
        let mut s = spec("o", ExpiryPolicy::Redispatch);
        s.principal = "alice".into();
        let g = e.acquire(&s, T).unwrap();
        assert!(matches!(
            e.renew(&g.lease_id, g.token, "bob", T),
            Err(EngineError::NotOwner { .. })
        ));
        assert!(matches!(
            e.release(&g.lease_id, g.token, "", T),
            Err(EngineError::NotOwner { .. })
        ));
        assert_eq!(e.leases(T).unwrap()[0].principal, "alice");
        e.renew(&g.lease_id, g.token, "alice", T).unwrap();
        e.release(&g.lease_id, g.token, "alice", T).unwrap();
        assert!(matches!(
            e.renew(&g.lease_id, g.token, "alice", T),
            Err(EngineError::Refused(RefusalReason::UnknownLease))
        ));
    }

    #[test]
    fn operator_calls_are_synced_grants_once_per_block_renewals_and_releases_never() {
        let d = tempfile::tempdir().unwrap();
        let mut e = FileEngine::open(&d.path().join("l.db"), T).unwrap();
        let synchronous: i64 = e
            .conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        assert_eq!(synchronous, 1, "NORMAL: the engine syncs where it must");
        let mut long = spec("f", ExpiryPolicy::Redispatch);
        long.ttl_ms = 60_000;
        let g = e.acquire(&long, T).unwrap();
        assert_eq!(e.wal.syncs, 1, "the first grant reserves a ceiling");
        assert_eq!(ceiling(&e), (BLOCK, "durable".into()));
        e.renew(&g.lease_id, g.token, "", T).unwrap();
        assert_eq!(e.wal.syncs, 1, "a renewal");
        e.revoke("f", false, T).unwrap();
        assert_eq!(e.wal.syncs, 2, "a revoke");
        let g2 = e.acquire(&spec("g", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!(g2.token, 2);
        assert_eq!(e.wal.syncs, 2, "a grant under the durable ceiling");
        e.release(&g2.lease_id, g2.token, "", T).unwrap();
        assert_eq!(e.wal.syncs, 2, "a release");
        // A refused acquire writes nothing and syncs nothing.
        assert!(e.acquire(&long, T).is_err());
        assert_eq!(e.wal.syncs, 2, "a refusal");
        // Tokens 3..=BLOCK go unsynced; BLOCK + 1 reserves the next block.
        let mut last = g2.token;
        while last < BLOCK {
            let g = e.acquire(&spec("h", ExpiryPolicy::Redispatch), T).unwrap();
            assert_eq!(g.token, last + 1);
            last = g.token;
            e.release(&g.lease_id, g.token, "", T).unwrap();
        }
        assert_eq!(e.wal.syncs, 2, "{BLOCK} grants, one sync");
        let g = e.acquire(&spec("h", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!(g.token, BLOCK + 1);
        assert_eq!(e.wal.syncs, 3, "the grant above the ceiling");
        assert_eq!(ceiling(&e), (2 * BLOCK, "durable".into()));
        // Grants under `hold` are synced every time.
        for (i, task) in ["h1", "h2"].into_iter().enumerate() {
            e.acquire(&spec(task, ExpiryPolicy::Hold), T).unwrap();
            assert_eq!(e.wal.syncs, 4 + i as u64, "a hold grant");
        }
    }

    /// The stored ceiling and its state.
    fn ceiling(e: &FileEngine) -> (u64, String) {
        let c = rows::load_ceiling(&e.conn).unwrap().unwrap();
        assert_eq!(c.boot_id, e.boot_id);
        let state = if c.durable { "durable" } else { "pending" };
        (c.value, state.into())
    }

    fn set_meta(c: &Connection, key: &str, value: &str) {
        c.execute(
            "UPDATE meta SET value = ?2 WHERE key = ?1",
            rusqlite::params![key, value],
        )
        .unwrap();
    }

    #[test]
    fn after_a_power_loss_the_first_grant_starts_above_the_ceiling() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("l.db");
        let mut e = FileEngine::open(&db, T).unwrap();
        for want in 1..=3 {
            let g = e.acquire(&spec("p", ExpiryPolicy::Redispatch), T).unwrap();
            assert_eq!(g.token, want);
            e.release(&g.lease_id, g.token, "", T).unwrap();
        }
        let g = e.acquire(&spec("q", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!((g.token, e.wal.syncs), (4, 1));
        // What a power loss may leave: the synced reservation (token 1,
        // the ceiling, still pending) and none of the unsynced commits
        // after it; and the machine comes back with a new boot id.
        let c = Connection::open(&db).unwrap();
        c.execute_batch(
            "UPDATE seq SET last_token = 1; DELETE FROM tasks;
             UPDATE meta SET value = 'pending' WHERE key = 'token_ceiling_state';",
        )
        .unwrap();
        e.boot_id = "00000000-0000-4000-8000-000000000001".into();
        let g = e.acquire(&spec("p", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!(g.token, BLOCK + 1, "above every token answered before");
        assert_eq!(e.wal.syncs, 2, "the first grant of a boot syncs");
        assert_eq!(ceiling(&e), (2 * BLOCK, "durable".into()));
        let g2 = e.acquire(&spec("q", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!(g2.token, BLOCK + 2);
        assert_eq!(e.wal.syncs, 2, "then the block is durable");

        // A durable ceiling of another boot is no better: the unsynced
        // grants of that boot may be gone, the ceiling is not.
        set_meta(&c, "token_ceiling_boot", "an-earlier-boot");
        c.execute("UPDATE seq SET last_token = ?1", [BLOCK as i64 + 5])
            .unwrap();
        let g3 = e.acquire(&spec("r", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!(g3.token, 2 * BLOCK + 1);
        assert_eq!(e.wal.syncs, 3);
        // A file from before ceilings existed (no ceiling rows, every
        // grant synced) goes on from its sequence.
        c.execute_batch("DELETE FROM meta; UPDATE seq SET last_token = 7000")
            .unwrap();
        let g4 = e.acquire(&spec("s", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!((g4.token, e.wal.syncs), (7001, 4));
        assert_eq!(ceiling(&e), (7000 + BLOCK, "durable".into()));
    }

    #[test]
    fn a_pending_ceiling_makes_the_next_grant_sync() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("l.db");
        let mut e = FileEngine::open(&db, T).unwrap();
        let mut long = spec("k", ExpiryPolicy::Redispatch);
        long.ttl_ms = 60_000;
        e.acquire(&long, T).unwrap();
        assert_eq!(e.wal.syncs, 1);
        // A process killed between its reservation's commit and its sync
        // (or whose sync failed) leaves the ceiling pending.
        let c = Connection::open(&db).unwrap();
        set_meta(&c, "token_ceiling_state", "pending");
        // A refused acquire neither writes the ceiling nor syncs.
        assert!(e.acquire(&long, T).is_err());
        assert_eq!(e.wal.syncs, 1);
        assert_eq!(ceiling(&e), (BLOCK, "pending".into()));
        let g = e.acquire(&spec("l", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!(g.token, 2, "the same boot: the sequence goes on");
        assert_eq!(e.wal.syncs, 2, "it syncs the pending ceiling");
        assert_eq!(ceiling(&e), (BLOCK + 1, "durable".into()));
        e.acquire(&spec("m", ExpiryPolicy::Redispatch), T).unwrap();
        assert_eq!(e.wal.syncs, 2);
        // Marking durable never marks a ceiling that was not the one synced.
        set_meta(&c, "token_ceiling_state", "pending");
        assert!(!rows::mark_ceiling_durable(&c, BLOCK, &e.boot_id).unwrap());
        assert!(!rows::mark_ceiling_durable(&c, BLOCK + 1, "another-boot").unwrap());
        assert!(rows::mark_ceiling_durable(&c, BLOCK + 1, &e.boot_id).unwrap());
        assert_eq!(ceiling(&e), (BLOCK + 1, "durable".into()));
    }

    #[test]
    fn a_corrupt_ceiling_fails_the_grant() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("l.db");
        let mut e = FileEngine::open(&db, T).unwrap();
        e.acquire(&spec("c0", ExpiryPolicy::Redispatch), T).unwrap();
        let c = Connection::open(&db).unwrap();
        for (key, value, good) in [
            ("token_ceiling", "-4", "1024"),
            ("token_ceiling", "lots", "1024"),
            ("token_ceiling_state", "probably", "durable"),
        ] {
            set_meta(&c, key, value);
            let err = e
                .acquire(&spec("c1", ExpiryPolicy::Redispatch), T)
                .unwrap_err();
            assert!(
                matches!(err, EngineError::Storage(StoreError::CorruptCeiling(_))),
                "{key}={value}: {err:?}"
            );
            assert!(err.to_string().contains(key), "{err}");
            set_meta(&c, key, good);
        }
        c.execute("DELETE FROM meta WHERE key = 'token_ceiling_boot'", [])
            .unwrap();
        let err = e
            .acquire(&spec("c1", ExpiryPolicy::Redispatch), T)
            .unwrap_err();
        assert!(
            err.to_string().contains("token_ceiling_boot is missing"),
            "{err}"
        );
        assert_eq!(e.wal.syncs, 1);
    }

    fn wal_len(db: &Path) -> u64 {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::metadata(PathBuf::from(wal)).map_or(0, |m| m.len())
    }

    #[test]
    fn tidy_truncates_a_large_wal_and_never_waits_for_a_peer() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("l.db");
        let mut e = FileEngine::open(&db, T).unwrap();
        let churn = |e: &mut FileEngine, n: usize| -> u64 {
            let mut last = 0;
            for _ in 0..n {
                let g = e.acquire(&spec("w", ExpiryPolicy::Redispatch), T).unwrap();
                assert!(g.token > last);
                last = g.token;
                e.release(&g.lease_id, g.token, "", T).unwrap();
            }
            last
        };
        churn(&mut e, 5);
        assert!(wal_len(&db) < TIDY_AFTER_RELEASE);
        assert_eq!(e.tidy(TIDY_AFTER_RELEASE), Tidied::Small);
        churn(&mut e, 100);
        assert!(wal_len(&db) > TIDY_AFTER_RELEASE, "{}", wal_len(&db));

        // A reader on an old snapshot: the pages after it cannot be copied.
        let peer = Connection::open(&db).unwrap();
        peer.execute_batch("BEGIN; SELECT COUNT(*) FROM seq;")
            .unwrap();
        churn(&mut e, 1);
        assert_eq!(e.tidy(TIDY_AFTER_RELEASE), Tidied::Busy);
        peer.execute_batch("COMMIT").unwrap();
        // A writer in its transaction: the truncation would need its lock.
        peer.execute_batch("BEGIN IMMEDIATE").unwrap();
        assert_eq!(e.tidy(TIDY_AFTER_RELEASE), Tidied::Busy);
        peer.execute_batch("COMMIT").unwrap();

        assert_eq!(e.tidy(TIDY_AFTER_RELEASE), Tidied::Truncated);
        assert_eq!(wal_len(&db), 0);
        // Nothing was lost: the sequence goes on from where it was.
        let last = rows::last_issued(&peer).unwrap();
        assert_eq!(last, 106);
        assert!(churn(&mut e, 1) > last);
        let ok: String = peer
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }

    #[test]
    fn a_stopped_peer_holding_the_gate_does_not_stall_a_call() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("l.db");
        let mut e = FileEngine::open(&db, T).unwrap();
        let peer = Gate::open(&db).unwrap();
        let _stuck = peer.enter(Instant::now() + T).unwrap();
        let start = Instant::now();
        e.acquire(&spec("s", ExpiryPolicy::Redispatch), Duration::from_secs(2))
            .unwrap();
        let took = start.elapsed();
        // It waited for its turn (half the time), then went without one.
        assert!(took >= Duration::from_millis(900), "{took:?}");
    }

    #[test]
    fn pages_cover_every_lease_once_in_order() {
        let d = tempfile::tempdir().unwrap();
        let mut e = FileEngine::open(&d.path().join("l.db"), T).unwrap();
        for i in 0..25 {
            e.acquire(&spec(&format!("t{i:02}"), ExpiryPolicy::Redispatch), T)
                .unwrap();
        }
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let p = e.leases_page(after.as_deref(), 10, T).unwrap();
            assert!(p.leases.len() <= 10);
            seen.extend(p.leases.into_iter().map(|l| l.task));
            match p.next_after {
                Some(a) => after = Some(a),
                None => break,
            }
        }
        let want: Vec<String> = (0..25).map(|i| format!("t{i:02}")).collect();
        assert_eq!(seen, want);
    }
}
