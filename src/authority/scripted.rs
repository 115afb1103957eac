//! A scripted lease client for unit tests: it answers from queues given in
//! advance and records which calls were made, so that a test of the agent's
//! wait loop or of the checks around a client asserts what was called, in
//! what order, without a network or a database.

use std::collections::VecDeque;
use std::time::Duration;

use super::client::*;

/// Answers from its queues (an empty queue answers a transient failure)
/// and records each call's name in `calls`.
#[derive(Default)]
pub struct Scripted {
    pub acquired: VecDeque<Result<Grant, AcquireError>>,
    pub renewed: VecDeque<Result<Renewed, RenewError>>,
    /// Whether it offers a queue ([`Waiter`]).
    pub queue: bool,
    /// `Some`: it offers the operator calls, and lists these leases.
    pub leases: Option<Vec<LeaseInfo>>,
    pub calls: Vec<&'static str>,
}

/// A grant of `ttl` with `token` for task `t`.
pub fn grant(token: u64, ttl: Duration) -> Grant {
    Grant {
        lease_id: "l1".into(),
        task: "t".into(),
        token,
        ttl,
    }
}

/// `held by h`, free in about `retry_after`.
pub fn held(retry_after: Option<Duration>) -> AcquireError {
    AcquireError::Held {
        holder: "h".into(),
        retry_after,
    }
}

fn unscripted() -> Failure {
    Failure::new(FailureKind::Other, "no answer scripted")
}

impl Scripted {
    fn next_acquired(&mut self) -> Result<Grant, AcquireError> {
        self.acquired
            .pop_front()
            .unwrap_or_else(|| Err(AcquireError::Transient(unscripted())))
    }
}

impl LeaseClient for Scripted {
    fn url(&self) -> String {
        "scripted:".into()
    }

    fn acquire(
        &mut self,
        _req: &AcquireRequest,
        _timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        self.calls.push("acquire");
        self.next_acquired()
    }

    fn renew(&mut self, _lease: &LeaseRef, _timeout: Duration) -> Result<Renewed, RenewError> {
        self.calls.push("renew");
        self.renewed
            .pop_front()
            .unwrap_or_else(|| Err(RenewError::Transient(unscripted())))
    }

    fn release(
        &mut self,
        _lease: &LeaseRef,
        _outcome: Outcome,
        _exit_code: Option<i32>,
        _timeout: Duration,
    ) -> Result<(), RenewError> {
        self.calls.push("release");
        Ok(())
    }

    /// A handle that gets the renewal answers.
    fn renewer(&mut self) -> Box<dyn Renewer> {
        self.calls.push("renewer");
        Box::new(Renewing(Scripted {
            renewed: std::mem::take(&mut self.renewed),
            ..Scripted::default()
        }))
    }

    fn waiter(&mut self) -> Option<Box<dyn Waiter + '_>> {
        if !self.queue {
            return None;
        }
        Some(Box::new(self))
    }

    fn operator(&mut self) -> Option<Box<dyn Operator + '_>> {
        self.leases.as_ref()?;
        Some(Box::new(self))
    }
}

impl Waiter for Scripted {
    fn acquire_wait(
        &mut self,
        _req: &AcquireRequest,
        _wait: Duration,
        _timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        self.calls.push("acquire_wait");
        self.next_acquired()
    }

    fn abandon_wait(&mut self, _timeout: Duration) {
        self.calls.push("abandon_wait");
    }
}

impl Operator for Scripted {
    fn leases(&mut self, _timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError> {
        self.calls.push("leases");
        Ok(self.leases.clone().unwrap_or_default())
    }

    fn revoke(
        &mut self,
        _task: &str,
        force: bool,
        _timeout: Duration,
    ) -> Result<Revoked, OperatorError> {
        self.calls.push("revoke");
        Ok(Revoked::forced(force))
    }

    fn clear(&mut self, _task: &str, _timeout: Duration) -> Result<(), OperatorError> {
        self.calls.push("clear");
        Ok(())
    }

    fn history(
        &mut self,
        _task: Option<&str>,
        _since_ms: u64,
        _timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError> {
        self.calls.push("history");
        Ok(Vec::new())
    }
}
