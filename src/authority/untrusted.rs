//! What the agent believes of an authority's answer, written once for every
//! client (HTTP, etcd).
//!
//! An authority is a remote party: broken, misconfigured or hostile, it must
//! not be able to bend the agent. So:
//! - a granted or renewed ttl above the one asked is capped at the one asked
//!   (a 3,600 s grant for a 3 s ask would keep a job running an hour after
//!   the authority went silent);
//! - a token is a number `serve` and SQLite can store: 1 ..= 2^63-1, else the
//!   answer is malformed;
//! - a lease id is 1..=256 characters of `[A-Za-z0-9._:/@+=-]` (room for
//!   ids that embed a task name), else the answer is malformed (it is echoed
//!   to the job's environment and to the authority on every renewal);
//! - every string that reaches a log line or a terminal goes through
//!   [`escape`], so a holder name with a newline cannot forge a log line and
//!   an ESC cannot drive the terminal.

use std::time::Duration;

pub use crate::escape::escape;

use super::client::{
    AcquireError, AcquireRequest, Attempt, Failure, FailureKind, Grant, LeaseClient, LeaseInfo,
    LeaseRef, Operator, OperatorError, Outcome, RenewError, Renewed, Renewer, Revoked, Waiter,
};

/// The largest token accepted: what `serve` (SQLite INTEGER) can store.
pub const MAX_TOKEN: u64 = i64::MAX as u64;

/// The longest lease id accepted.
pub const MAX_LEASE_ID: usize = 256;

/// The ttl the agent works with: never more than it asked for.
pub fn cap_ttl(granted: Duration, asked: Duration) -> Duration {
    granted.min(asked)
}

/// Whether a token is in the range every part of the system can hold.
pub fn token_ok(token: u64) -> bool {
    (1..=MAX_TOKEN).contains(&token)
}

/// A part of an answer the agent does not believe.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("authority sent token {0}, outside 1..={MAX_TOKEN}")]
    Token(u64),
    /// Holds the id as sent; the message shows it escaped.
    #[error(
        "authority sent a malformed lease id \"{}\" (1 to {MAX_LEASE_ID} characters of A-Z a-z 0-9 . _ : / @ + = -)",
        escape(.0)
    )]
    LeaseId(String),
}

/// Checks a token; the error names what was wrong.
pub fn check_token(token: u64) -> Result<u64, Malformed> {
    if token_ok(token) {
        Ok(token)
    } else {
        Err(Malformed::Token(token))
    }
}

/// Checks a lease id's length and characters; the error shows it escaped.
pub fn check_lease_id(id: &str) -> Result<(), Malformed> {
    let chars_ok = id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._:/@+=-".contains(&b));
    if !id.is_empty() && id.len() <= MAX_LEASE_ID && chars_ok {
        Ok(())
    } else {
        Err(Malformed::LeaseId(id.to_string()))
    }
}

/// Every authority the agent talks to, behind these checks: [`open`]
/// (`super::open`) wraps each client in one, so the rules hold for HTTP,
/// etcd and the embedded database alike, in one place.
///
/// It implements every method of [`LeaseClient`] itself (none has a default
/// body), and wraps each capability the inner client offers ([`Renewer`],
/// [`Waiter`], [`Operator`]) in a checked one: a capability added to the
/// trait does not compile until it is checked here too.
///
/// [`open`]: super::open
pub struct Checked {
    inner: Box<dyn LeaseClient>,
    /// The ttl of the last acquire: renewals are capped at it.
    asked: Option<Duration>,
}

impl Checked {
    pub fn new(inner: Box<dyn LeaseClient>) -> Self {
        Checked { inner, asked: None }
    }
}

/// A grant as the agent may believe it: token and lease id in range, ttl
/// capped at the ask.
fn check_grant(g: Grant, asked: Duration) -> Result<Grant, AcquireError> {
    let malformed = |m: Malformed| {
        AcquireError::Transient(Failure::new(
            FailureKind::Malformed,
            format!("malformed grant: {m}"),
        ))
    };
    check_token(g.token).map_err(malformed)?;
    check_lease_id(&g.lease_id).map_err(malformed)?;
    Ok(Grant {
        ttl: cap_ttl(g.ttl, asked),
        ..g
    })
}

/// An acquire's answer as the agent may believe it.
fn check_acquired(
    answer: Result<Grant, AcquireError>,
    asked: Duration,
) -> Result<Grant, AcquireError> {
    check_grant(answer.map_err(acquire_error)?, asked)
}

/// A renewal's answer as the agent may believe it: ttl capped at the ask.
fn check_renewed(
    answer: Result<Renewed, RenewError>,
    asked: Option<Duration>,
) -> Result<Renewed, RenewError> {
    let r = answer.map_err(renew_error)?;
    Ok(Renewed {
        ttl: asked.map_or(r.ttl, |a| cap_ttl(r.ttl, a)),
    })
}

fn escaped(f: Failure) -> Failure {
    f.map_message(escape)
}

fn acquire_error(e: AcquireError) -> AcquireError {
    match e {
        AcquireError::Held {
            holder,
            retry_after,
        } => AcquireError::Held {
            holder: escape(&holder),
            retry_after,
        },
        AcquireError::HeldForOperator { holder, lease_id } => AcquireError::HeldForOperator {
            holder: escape(&holder),
            lease_id: escape(&lease_id),
        },
        AcquireError::Rejected(m) => AcquireError::Rejected(escape(&m)),
        AcquireError::Trust(m) => AcquireError::Trust(escape(&m)),
        AcquireError::Transient(f) => AcquireError::Transient(escaped(f)),
    }
}

fn renew_error(e: RenewError) -> RenewError {
    match e {
        RenewError::Refused { reason, message } => RenewError::Refused {
            reason,
            message: escape(&message),
        },
        RenewError::Transient(f) => RenewError::Transient(escaped(f)),
    }
}

fn operator_error(e: OperatorError) -> OperatorError {
    match e {
        OperatorError::Unsupported(m) => OperatorError::Unsupported(escape(&m)),
        OperatorError::NotFound(m) => OperatorError::NotFound(escape(&m)),
        OperatorError::Failed(f) => OperatorError::Failed(escaped(f)),
    }
}

impl LeaseClient for Checked {
    fn url(&self) -> String {
        self.inner.url()
    }

    fn acquire(&mut self, req: &AcquireRequest, timeout: Duration) -> Result<Grant, AcquireError> {
        self.asked = Some(req.ttl);
        check_acquired(self.inner.acquire(req, timeout), req.ttl)
    }

    fn renew(&mut self, lease: &LeaseRef, timeout: Duration) -> Result<Renewed, RenewError> {
        check_renewed(self.inner.renew(lease, timeout), self.asked)
    }

    fn release(
        &mut self,
        lease: &LeaseRef,
        outcome: Outcome,
        exit_code: Option<i32>,
        timeout: Duration,
    ) -> Result<(), RenewError> {
        self.inner
            .release(lease, outcome, exit_code, timeout)
            .map_err(renew_error)
    }

    fn renewer(&mut self) -> Box<dyn Renewer> {
        Box::new(CheckedRenewer {
            inner: self.inner.renewer(),
            asked: self.asked,
        })
    }

    fn waiter(&mut self) -> Option<Box<dyn Waiter + '_>> {
        let inner = self.inner.waiter()?;
        Some(Box::new(CheckedWaiter {
            inner,
            asked: &mut self.asked,
        }))
    }

    fn operator(&mut self) -> Option<Box<dyn Operator + '_>> {
        Some(Box::new(CheckedOperator(self.inner.operator()?)))
    }
}

/// The heartbeat's handle, behind the same checks.
struct CheckedRenewer {
    inner: Box<dyn Renewer>,
    asked: Option<Duration>,
}

impl Renewer for CheckedRenewer {
    fn renew(
        &mut self,
        lease: &LeaseRef,
        timeout: Duration,
        report: &mut dyn FnMut(Result<Renewed, RenewError>),
    ) {
        let asked = self.asked;
        self.inner.renew(lease, timeout, &mut |answer| {
            report(check_renewed(answer, asked))
        });
    }
}

/// The inner client's queue, behind the same checks.
struct CheckedWaiter<'a> {
    inner: Box<dyn Waiter + 'a>,
    asked: &'a mut Option<Duration>,
}

impl Waiter for CheckedWaiter<'_> {
    fn acquire_wait(
        &mut self,
        req: &AcquireRequest,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        *self.asked = Some(req.ttl);
        check_acquired(self.inner.acquire_wait(req, wait, timeout), req.ttl)
    }

    fn abandon_wait(&mut self, timeout: Duration) {
        self.inner.abandon_wait(timeout)
    }
}

/// The inner client's operator calls, their strings escaped.
struct CheckedOperator<'a>(Box<dyn Operator + 'a>);

impl Operator for CheckedOperator<'_> {
    fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError> {
        let list = self.0.leases(timeout).map_err(operator_error)?;
        Ok(list
            .into_iter()
            .map(|l| LeaseInfo {
                task: escape(&l.task),
                lease_id: escape(&l.lease_id),
                holder: escape(&l.holder),
                ..l
            })
            .collect())
    }

    fn revoke(
        &mut self,
        task: &str,
        force: bool,
        timeout: Duration,
    ) -> Result<Revoked, OperatorError> {
        self.0.revoke(task, force, timeout).map_err(operator_error)
    }

    fn clear(&mut self, task: &str, timeout: Duration) -> Result<(), OperatorError> {
        self.0.clear(task, timeout).map_err(operator_error)
    }

    fn history(
        &mut self,
        task: Option<&str>,
        since_ms: u64,
        timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError> {
        let list = self
            .0
            .history(task, since_ms, timeout)
            .map_err(operator_error)?;
        Ok(list
            .into_iter()
            .map(|a| Attempt {
                task: escape(&a.task),
                holder: escape(&a.holder),
                acquired_at: escape(&a.acquired_at),
                ended_at: a.ended_at.as_deref().map(escape),
                ..a
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::client::{ExpiryPolicy, LeaseState};
    use crate::authority::scripted::{Scripted, grant};

    fn req(ttl: Duration) -> AcquireRequest {
        AcquireRequest {
            task: "t".into(),
            holder: "h".into(),
            ttl,
            on_expiry: ExpiryPolicy::Redispatch,
            grace: Duration::ZERO,
        }
    }

    #[test]
    fn every_capability_answers_through_the_checks() {
        let asked = Duration::from_secs(3);
        let long = Duration::from_secs(3600);
        let inner = Scripted {
            acquired: [Ok(grant(0, long)), Ok(grant(7, long))].into(),
            renewed: [Ok(Renewed { ttl: long })].into(),
            queue: true,
            leases: Some(vec![LeaseInfo {
                task: "t".into(),
                lease_id: "l1".into(),
                token: 7,
                holder: "bob\nleaseagent: info: released\u{1b}[2J".into(),
                principal: String::new(),
                state: LeaseState::Active,
                expires_in_ms: None,
            }]),
            ..Scripted::default()
        };
        let mut c = Checked::new(Box::new(inner));
        let t = Duration::from_secs(1);
        // The queue's grants pass the checks acquire's do.
        let mut queue = c.waiter().expect("the inner client's queue");
        match queue.acquire_wait(&req(asked), t, t) {
            Err(AcquireError::Transient(f)) => {
                assert_eq!(f.kind, FailureKind::Malformed);
                assert!(f.message.starts_with("malformed grant: "), "{f}");
            }
            other => panic!("token 0 believed: {other:?}"),
        }
        let g = queue.acquire_wait(&req(asked), t, t).unwrap();
        assert_eq!(g.ttl, asked);
        drop(queue);
        // The heartbeat's handle caps renewals at the ask.
        let mut renewer = c.renewer();
        let mut answers = Vec::new();
        renewer.renew(&g.lease_ref(), t, &mut |a| answers.push(a));
        assert_eq!(answers, vec![Ok(Renewed { ttl: asked })]);
        // The operator's strings are escaped.
        let list = c.operator().expect("the inner client's operator").leases(t);
        let holder = &list.unwrap()[0].holder;
        assert!(!holder.chars().any(char::is_control), "{holder:?}");
    }

    #[test]
    fn a_capability_the_inner_client_lacks_is_none() {
        let mut c = Checked::new(Box::new(Scripted::default()));
        assert!(c.waiter().is_none());
        assert!(c.operator().is_none());
    }

    #[test]
    fn escape_leaves_one_harmless_line() {
        let e = escape("bob\nleaseagent: info: released\u{1b}[2J\u{7}\r\u{202e}x\\");
        assert!(!e.chars().any(|c| c.is_control()), "{e:?}");
        assert_eq!(
            e,
            "bob\\nleaseagent: info: released\\u{1b}[2J\\u{7}\\r\\u{202e}x\\\\"
        );
        assert_eq!(escape("host-1/42"), "host-1/42");
        assert!(escape(&"a".repeat(10_000)).len() < 600);
    }

    #[test]
    fn ttl_is_capped_at_the_ask() {
        let asked = Duration::from_secs(3);
        assert_eq!(cap_ttl(Duration::from_secs(3600), asked), asked);
        assert_eq!(
            cap_ttl(Duration::from_secs(1), asked),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn tokens_out_of_range_are_refused() {
        assert_eq!(
            check_token(0).unwrap_err().to_string(),
            format!("authority sent token 0, outside 1..={MAX_TOKEN}")
        );
        assert!(check_token(u64::MAX).is_err());
        assert!(check_token(MAX_TOKEN + 1).is_err());
        assert_eq!(check_token(1), Ok(1));
        assert_eq!(check_token(MAX_TOKEN), Ok(MAX_TOKEN));
    }

    #[test]
    fn lease_ids_are_checked() {
        assert!(check_lease_id("a1B2-c3_d4.e5:f6/g7+h8=").is_ok());
        assert!(check_lease_id("").is_err());
        assert!(check_lease_id(&"a".repeat(257)).is_err());
        assert!(check_lease_id("7c81baa3.1.etl/a.b_c:d@e").is_ok());
        assert!(check_lease_id("x\ny").is_err());
        assert!(check_lease_id("x y").is_err());
        let msg = check_lease_id("\u{1b}[2J").unwrap_err().to_string();
        assert_eq!(
            msg,
            "authority sent a malformed lease id \"\\u{1b}[2J\" (1 to 256 characters of A-Z a-z 0-9 . _ : / @ + = -)"
        );
    }
}
