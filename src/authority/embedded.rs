//! The embedded per-host authority: the lease engine opened in-process on a
//! SQLite file shared by every agent on the host.
//!
//! Each handle opens its own connection lazily, once, on first use (and
//! again only after a failed open). The heartbeat thread's handle
//! ([`LeaseClient::renewer`]) is a new one that opens at its first renewal,
//! which a short run never reaches, so the renewal thread never shares a
//! connection with the main thread, and the handle that made the grant
//! keeps its connection for the release: opening is the costly part of a
//! run (the WAL index is rebuilt, the schema checked, the first sync pays
//! a directory fsync). Cross-process exclusion and durability are the engine's
//! (see `engine::file`): one immediate transaction per call, the write lock
//! taken in turns with other processes and waited for until the call's
//! timeout, so every call returns within its timeout and a busy or broken
//! database is a transient failure, never a grant or a renewal. There are no
//! principals here: every lease is owned by `""`.
//!
//! The WAL is checkpointed (never waiting for anyone) after a release and
//! after the heartbeat thread has reported a renewal ([`Renewer::renew`]),
//! once it has grown past a small bound: never inside a grant or a renewal,
//! whose answers someone waits for.

use std::path::PathBuf;
use std::time::Duration;

use super::client::*;
use crate::engine::EngineError;
use crate::engine::file::{FileEngine, TIDY_AFTER_RELEASE, TIDY_AFTER_RENEWAL};
use crate::engine::rules::AcquireSpec;

pub struct EmbeddedAuthority {
    path: PathBuf,
    engine: Option<FileEngine>,
    /// This handle's id in the engine's queue of waiters, made at its
    /// first `--wait` ([`Waiter`]).
    waiter: Option<String>,
}

impl EmbeddedAuthority {
    pub fn new(path: PathBuf) -> Self {
        EmbeddedAuthority {
            path,
            engine: None,
            waiter: None,
        }
    }

    /// Checkpoints the WAL if it has grown past the renewals' bound (never
    /// waiting for anyone). Done by the heartbeat's handle once a renewal's
    /// answer is on its way ([`EmbeddedRenewer`]).
    pub fn after_renewal(&mut self) {
        if let Some(engine) = &mut self.engine {
            engine.tidy(TIDY_AFTER_RENEWAL);
        }
    }

    /// Opens the handle's connection now, waiting for the database's locks
    /// `within` at most (the agent's scribe opens it while the agent starts
    /// its keeper); a failure is left to the first call, which opens again.
    pub fn open_now(&mut self, within: Duration) {
        let _ = self.engine(within);
    }

    /// The handle's connection, opened on first use.
    fn engine(&mut self, timeout: Duration) -> Result<&mut FileEngine, NotOpened> {
        let engine = match self.engine.take() {
            Some(e) => e,
            None => FileEngine::open(&self.path, timeout).map_err(|source| NotOpened {
                url: self.url(),
                source,
            })?,
        };
        Ok(self.engine.insert(engine))
    }
}

/// The database could not be opened (a transient failure: the next call
/// tries again).
#[derive(Debug, thiserror::Error)]
#[error("{url}: {source}")]
struct NotOpened {
    url: String,
    #[source]
    source: EngineError,
}

impl NotOpened {
    fn failure(&self) -> Failure {
        Failure::new(FailureKind::Store, self.to_string())
    }
}

/// An engine error that is not an answer: the database failed, was busy
/// past the deadline, or holds something it should not.
fn store_failure(e: &EngineError) -> Failure {
    Failure::new(FailureKind::Store, e.to_string())
}

fn renew_error(e: EngineError) -> RenewError {
    match e {
        EngineError::Refused(reason) => RenewError::Refused {
            reason,
            message: String::new(),
        },
        other => RenewError::Transient(store_failure(&other)),
    }
}

fn operator_error(e: EngineError) -> OperatorError {
    match e {
        EngineError::NotFound(m) => OperatorError::NotFound(m),
        other => OperatorError::Failed(store_failure(&other)),
    }
}

/// The heartbeat thread's handle: checkpoints a grown WAL once a renewal's
/// answer has been reported, never before.
pub struct EmbeddedRenewer(EmbeddedAuthority);

impl Renewer for EmbeddedRenewer {
    fn renew(
        &mut self,
        lease: &LeaseRef,
        timeout: Duration,
        report: &mut dyn FnMut(Result<Renewed, RenewError>),
    ) {
        let answer = self.0.renew(lease, timeout);
        let renewed = answer.is_ok();
        report(answer);
        if renewed {
            self.0.after_renewal();
        }
    }
}

impl EmbeddedAuthority {
    /// An acquire as `waiter` (its place in the engine's queue kept), or as
    /// a newcomer (`None`).
    fn acquire_as(
        &mut self,
        req: &AcquireRequest,
        waiter: Option<&str>,
        timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let spec = AcquireSpec {
            task: req.task.clone(),
            principal: String::new(),
            holder: req.holder.clone(),
            ttl_ms: ms(req.ttl),
            policy: req.on_expiry,
            grace_ms: if req.on_expiry == ExpiryPolicy::Grace {
                ms(req.grace)
            } else {
                0
            },
            max_leases: None,
        };
        // A malformed request is rejected without touching the database.
        crate::engine::validate_acquire(&spec)
            .map_err(|e| AcquireError::Rejected(e.to_string()))?;
        let engine = self
            .engine(timeout)
            .map_err(|e| AcquireError::Transient(e.failure()))?;
        match engine.acquire_queued(&spec, waiter, timeout) {
            Ok(g) => Ok(Grant {
                lease_id: g.lease_id,
                task: req.task.clone(),
                token: g.token,
                ttl: Duration::from_millis(g.ttl_ms),
            }),
            Err(EngineError::Held {
                holder,
                retry_after_ms,
            }) => Err(AcquireError::Held {
                holder,
                retry_after: Some(Duration::from_millis(retry_after_ms)),
            }),
            Err(EngineError::HeldForOperator { holder, lease_id }) => {
                Err(AcquireError::HeldForOperator { holder, lease_id })
            }
            Err(EngineError::BadRequest(e)) => Err(AcquireError::Rejected(e.to_string())),
            Err(e) => Err(AcquireError::Transient(store_failure(&e))),
        }
    }
}

/// `--wait` on the embedded authority: asks every 100
/// ms as the same waiter, so its place in the engine's queue is
/// kept (and not forgotten) until it is granted or gives the place up.
impl Waiter for EmbeddedAuthority {
    fn acquire_wait(
        &mut self,
        req: &AcquireRequest,
        _wait: Duration,
        timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        // The id is taken out of `self` for the ask, which borrows all of
        // `self`, and put back whatever the answer.
        let mut slot = self.waiter.take();
        let answer = ask_in_turn(&mut slot, ASK_EVERY, |id| {
            self.acquire_as(req, Some(id), timeout)
        });
        self.waiter = slot;
        answer
    }

    fn abandon_wait(&mut self, timeout: Duration) {
        let Some(id) = self.waiter.take() else {
            return;
        };
        let Ok(engine) = self.engine(timeout) else {
            return;
        };
        // Best effort: a place not given up is forgotten anyway once it
        // stops asking (`engine::sqlite::waiters::FORGET_AFTER_MS`).
        if let Err(e) = engine.leave_queue(&id, timeout) {
            log::debug!("leaving the queue: {e}");
        }
    }
}

/// How often a waiter asks again while it waits in the queue.
const ASK_EVERY: Duration = Duration::from_millis(100);

impl LeaseClient for EmbeddedAuthority {
    fn url(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    fn acquire(&mut self, req: &AcquireRequest, timeout: Duration) -> Result<Grant, AcquireError> {
        self.acquire_as(req, None, timeout)
    }
    fn renew(&mut self, lease: &LeaseRef, timeout: Duration) -> Result<Renewed, RenewError> {
        let engine = self
            .engine(timeout)
            .map_err(|e| RenewError::Transient(e.failure()))?;
        engine
            .renew(&lease.lease_id, lease.token, "", timeout)
            .map(|ttl| Renewed {
                ttl: Duration::from_millis(ttl),
            })
            .map_err(renew_error)
    }

    fn release(
        &mut self,
        lease: &LeaseRef,
        outcome: Outcome,
        exit_code: Option<i32>,
        timeout: Duration,
    ) -> Result<(), RenewError> {
        let engine = self
            .engine(timeout)
            .map_err(|e| RenewError::Transient(e.failure()))?;
        let released = engine
            .release_reporting(
                &lease.lease_id,
                lease.token,
                "",
                Some(outcome),
                exit_code,
                timeout,
            )
            .map_err(renew_error);
        // After the answer is known and nothing of this run is left to
        // wait for: keep the WAL small for everyone who opens it next.
        engine.tidy(TIDY_AFTER_RELEASE);
        released
    }

    /// A new handle, which opens its connection at its first renewal; this
    /// one keeps the connection that made the grant, for the release.
    fn renewer(&mut self) -> Box<dyn Renewer> {
        Box::new(EmbeddedRenewer(EmbeddedAuthority::new(self.path.clone())))
    }

    /// The engine's queue: a `--wait` keeps its place in arrival order.
    fn waiter(&mut self) -> Option<Box<dyn Waiter + '_>> {
        Some(Box::new(self))
    }

    fn operator(&mut self) -> Option<Box<dyn Operator + '_>> {
        Some(Box::new(self))
    }
}

impl Operator for EmbeddedAuthority {
    fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError> {
        let engine = self
            .engine(timeout)
            .map_err(|e| OperatorError::Failed(e.failure()))?;
        engine.leases(timeout).map_err(operator_error)
    }

    fn revoke(
        &mut self,
        task: &str,
        force: bool,
        timeout: Duration,
    ) -> Result<Revoked, OperatorError> {
        let engine = self
            .engine(timeout)
            .map_err(|e| OperatorError::Failed(e.failure()))?;
        engine
            .revoke(task, force, timeout)
            .map_err(operator_error)?;
        Ok(Revoked::forced(force))
    }

    fn history(
        &mut self,
        task: Option<&str>,
        since_ms: u64,
        timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError> {
        let deadline = std::time::Instant::now() + timeout;
        let engine = self
            .engine(timeout)
            .map_err(|e| OperatorError::Failed(e.failure()))?;
        let mut all = Vec::new();
        let mut before = None;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let page = engine
                .history_page(task, before, crate::engine::MAX_PAGE, left)
                .map_err(operator_error)?;
            let full = page.len() == crate::engine::MAX_PAGE;
            before = page.last().map(|r| r.token);
            for r in page {
                if r.acquired_ms < since_ms || all.len() >= MAX_HISTORY {
                    return Ok(all);
                }
                all.push(r.attempt());
            }
            if !full {
                return Ok(all);
            }
        }
    }

    fn clear(&mut self, task: &str, timeout: Duration) -> Result<(), OperatorError> {
        let engine = self
            .engine(timeout)
            .map_err(|e| OperatorError::Failed(e.failure()))?;
        engine
            .clear(task, timeout)
            .map(|_| ())
            .map_err(operator_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(task: &str) -> AcquireRequest {
        AcquireRequest {
            task: task.into(),
            holder: "me/1".into(),
            ttl: Duration::from_secs(5),
            on_expiry: ExpiryPolicy::Redispatch,
            grace: Duration::ZERO,
        }
    }

    #[test]
    fn grant_renew_release_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = EmbeddedAuthority::new(dir.path().join("sub/l.sqlite3"));
        let t = Duration::from_secs(5);
        let g = a.acquire(&req("x"), t).unwrap();
        let mut b = EmbeddedAuthority::new(dir.path().join("sub/l.sqlite3"));
        let e = b.acquire(&req("x"), t);
        assert!(matches!(e, Err(AcquireError::Held { .. })), "{e:?}");
        b.renew(&g.lease_ref(), t).unwrap();
        a.release(&g.lease_ref(), Outcome::Succeeded, Some(0), t)
            .unwrap();
        let g2 = b.acquire(&req("x"), t).unwrap();
        assert!(g2.token > g.token);
        assert!(matches!(
            a.renew(&g.lease_ref(), t),
            Err(RenewError::Refused {
                reason: RefusalReason::Superseded,
                ..
            })
        ));
        let mut bad = req("x y");
        bad.task = "x y".into();
        assert!(matches!(a.acquire(&bad, t), Err(AcquireError::Rejected(_))));
        assert_eq!(a.leases(t).unwrap().len(), 1);
        a.revoke("x", true, t).unwrap();
        assert!(matches!(
            b.renew(&g2.lease_ref(), t),
            Err(RenewError::Refused {
                reason: RefusalReason::Revoked,
                ..
            })
        ));
    }

    #[test]
    fn the_renewer_reports_before_it_checkpoints_a_grown_wal() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.sqlite3");
        let wal = dir.path().join("l.sqlite3-wal");
        let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());
        let t = Duration::from_secs(5);
        let mut a = EmbeddedAuthority::new(db.clone());
        let g = a.acquire(&req("x"), t).unwrap();
        let mut renewer = a.renewer();
        // Another writer grows the WAL past the renewals' bound (the grant's
        // connection stays open, so closing this one checkpoints nothing).
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(
            "CREATE TABLE pad(b); INSERT INTO pad VALUES (zeroblob(2000000)); DROP TABLE pad;",
        )
        .unwrap();
        drop(c);
        assert!(wal_len() > TIDY_AFTER_RENEWAL, "{}", wal_len());
        let mut reported = Vec::new();
        renewer.renew(&g.lease_ref(), t, &mut |answer| {
            reported.push((answer, wal_len()));
        });
        let [(answer, wal_when_reported)] = &reported[..] else {
            panic!("{} answers", reported.len());
        };
        assert_eq!(answer, &Ok(Renewed { ttl: g.ttl }));
        assert!(
            *wal_when_reported > TIDY_AFTER_RENEWAL,
            "tidied before the answer"
        );
        assert!(wal_len() < TIDY_AFTER_RENEWAL, "not tidied: {}", wal_len());
        // The handle that made the grant still releases on its connection.
        a.release(&g.lease_ref(), Outcome::Succeeded, Some(0), t)
            .unwrap();
    }
}
