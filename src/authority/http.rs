//! Lease protocol v1 over HTTP(S), on ureq 3 with rustls: the lease calls
//! and the operator calls (`GET /v1/leases`, `GET /v1/history`,
//! `POST /v1/revoke`, `POST /v1/clear`), on one ureq agent per handle and
//! with one reader of the protocol's error bodies.
//!
//! Every request carries its own timeout (the caller's, which the heartbeat
//! thread keeps below the time the lease has left) and every response body is
//! read with a 64 KiB cap (an operator listing, which may be long, 64 MiB): a
//! slow or hostile authority can delay a renewal only until the timeout, and
//! can never make the agent buffer without bound.
//!
//! Answers are classified exactly as the protocol's "How the agent reads
//! answers" says. Only a `200` whose body is a JSON object of the expected
//! shape is a success; only a `409`/`404` whose body names one of the refusal
//! codes is a refusal; everything else (refused or reset connections,
//! timeouts, 5xx, 408, 429, bodies that are text, the wrong shape or too
//! large, any other status) is transient.
//!
//! Trust (`trust.md`): the bearer token from `--auth-token-file` goes with
//! every call. At acquire, 401, 403 and TLS failures are
//! [`AcquireError::Trust`] (exit 125 naming `unauthenticated`, `forbidden`
//! or `certificate`); during renewal and release they are transient like any
//! other failure, but logged at error level since they rarely heal alone.
//!
//! Replicas (`--authority https://a:7878,https://b:7878`, the spec's
//! "Replicas"): each call starts at the replica that answered last and,
//! within its one timeout, goes on from a `503 not_leader` (to the leader
//! it names, only if that is one of the URLs given: a hostile replica
//! cannot send the agent elsewhere), a refused connection or a timeout to
//! the next URL; which replica answered is logged when it changes. The
//! deadline arithmetic does not change: to the agent a failover is
//! renewals failing for a while.
//!
//! The operator calls live in [`operator`] (a module of their own so that
//! the linker can keep their code away from an agent's: see
//! `link/code-groups.ld`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::client::*;
use super::transport::Failure;
use super::trust::ClientTrust;
use crate::protocol::v1::{
    AcquireBody, ErrorBody, ErrorCode, GrantBody, LeaseRefBody, ReleaseBody, RenewBody,
};
use crate::time::ms;

pub use super::transport::BODY_LIMIT;

/// The largest operator answer read (a listing page may be long).
const LISTING_LIMIT: u64 = 64 << 20;

/// A lease protocol v1 client, of one authority or of its replicas.
pub struct HttpAuthority {
    /// The base URLs given (`--authority a,b`), without trailing slashes.
    bases: Vec<String>,
    /// Which of them answered last (the next call starts there). Only this
    /// handle's own: the renewer learns on its own.
    current: AtomicUsize,
    agent: ureq::Agent,
    trust: Arc<ClientTrust>,
    /// This handle's waiter id while `--wait` waits ([`Waiter`]).
    waiter: Option<String>,
}

/// A response: status and (capped) body, or a transport failure.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl HttpAuthority {
    /// `base`: one base URL, or several (the replicas of one authority)
    /// separated by commas, as [`super::AuthoritySpec::Http`] holds them.
    pub fn with_trust(base: &str, trust: Arc<ClientTrust>) -> Self {
        HttpAuthority {
            bases: base
                .split(',')
                .map(|b| b.trim_end_matches('/').to_string())
                .collect(),
            current: AtomicUsize::new(0),
            agent: super::transport::agent(&trust),
            trust,
            waiter: None,
        }
    }

    /// The replica the next call goes to first.
    fn base(&self) -> &str {
        let i = self.current.load(Ordering::Relaxed);
        self.bases
            .get(i)
            .or(self.bases.first())
            .map_or("", |b| b.as_str())
    }

    /// One call: `GET` when `body` is `None`, else `POST` of it as JSON.
    ///
    /// With several replicas, all within the one `timeout`: an answer
    /// `503 not_leader` goes on to the leader it names if that is one of
    /// the URLs given (a named URL that is not is never followed), else to
    /// the next URL; so does a refused connection or a timeout (the latter
    /// leaves no budget: the next call starts at the next URL). Each
    /// replica is asked at most twice per call. The answer of the last
    /// replica asked is the answer.
    fn call(
        &self,
        path: &str,
        body: Option<&[u8]>,
        timeout: Duration,
        limit: u64,
    ) -> Result<Answer, Failure> {
        let deadline = std::time::Instant::now() + timeout;
        let auth = self.trust.bearer_header();
        let n = self.bases.len().max(1);
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut at = first;
        for tries in 1.. {
            let base = self.bases.get(at).map_or("", |b| b.as_str());
            let url = format!("{base}{path}");
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let r = super::transport::call(&self.agent, &url, body, auth.as_deref(), left, limit)
                .map(|(status, body)| Answer { status, body });
            let next = match &r {
                Ok(a) if a.status == ErrorCode::NotLeader.status() => {
                    match error_body(&a.body).filter(|e| e.code() == Some(ErrorCode::NotLeader)) {
                        Some(e) => Some(self.named(e.leader.flatten().as_deref(), at)),
                        None => None,
                    }
                }
                Err(f) if matches!(f.kind, FailureKind::Connect | FailureKind::Timeout) => {
                    Some((at + 1) % n)
                }
                _ => None,
            };
            match next {
                Some(to) if n > 1 => {
                    self.current.store(to, Ordering::Relaxed);
                    let why = match &r {
                        Ok(_) => "does not lead".to_string(),
                        Err(f) => f.message.clone(),
                    };
                    let out_of_time = std::time::Instant::now() >= deadline;
                    if tries >= 2 * n || out_of_time {
                        return r;
                    }
                    log::warn!(
                        "authority {base}: {why}; trying {}",
                        self.bases.get(to).map_or("", |b| b.as_str())
                    );
                    at = to;
                }
                _ => {
                    if r.is_ok() && at != first {
                        log::warn!("authority {base} answered (replica {} of {n})", at + 1);
                    }
                    return r;
                }
            }
        }
        Err(Failure::new(FailureKind::Other, "no replica asked"))
    }

    /// Where to go after replica `at` answered `not_leader` naming
    /// `leader`: that replica if it is one of ours, else the next.
    fn named(&self, leader: Option<&str>, at: usize) -> usize {
        let named = leader.map(|l| l.trim_end_matches('/'));
        self.bases
            .iter()
            .position(|b| Some(b.as_str()) == named)
            .filter(|i| *i != at)
            .unwrap_or((at + 1) % self.bases.len().max(1))
    }

    /// POSTs `body` as JSON to `path`.
    fn post(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let bytes = json(body)?;
        self.call(path, Some(&bytes), timeout, BODY_LIMIT)
    }
}

/// A request body as JSON.
fn json(body: &impl serde::Serialize) -> Result<Vec<u8>, Failure> {
    serde_json::to_vec(body).map_err(|e| Failure::new(FailureKind::Encode, e.to_string()))
}

/// The trust cause of a 401/403 answer.
fn denied(status: u16) -> Option<&'static str> {
    ErrorCode::from_status(status).map(ErrorCode::as_str)
}

/// A call failure at acquire: trust problems are final, including those
/// only a probe can name (`transport::trust_failure`).
fn acquire_failure(base: &str, f: Failure, timeout: Duration) -> AcquireError {
    match super::transport::trust_failure(base, &f, timeout) {
        Some(named) => AcquireError::Trust(named.message),
        None => AcquireError::Transient(f),
    }
}

/// A call failure during renewal or release: always transient, trust
/// problems logged at error level.
fn renew_failure(what: &str, f: Failure) -> RenewError {
    if let Some(cause) = f.trust() {
        log::error!(
            "{what}: {cause}: {} (retried until the local deadline)",
            f.message
        );
    }
    RenewError::Transient(f)
}

/// A non-200 answer to renew or release that is not a refusal.
fn renew_status(what: &str, status: u16, body: &[u8]) -> RenewError {
    if let Some(r) = refusal(status, body) {
        return r;
    }
    let f = transient_status(status, body);
    if let Some(cause) = denied(status) {
        log::error!("{what}: {cause}: {f} (retried until the local deadline)");
    }
    RenewError::Transient(f)
}

/// A body that is a JSON object of `T`'s shape (anything else: `None`).
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if !v.is_object() {
        return None;
    }
    serde_json::from_value(v).ok()
}

/// The protocol's error body, if the answer carries one: the one reader of
/// error bodies, for the lease calls and the operator calls alike.
fn error_body(body: &[u8]) -> Option<ErrorBody> {
    parse(body)
}

fn transient_status(status: u16, body: &[u8]) -> Failure {
    let detail = error_body(body)
        .map(|e| format!(": {} {}", e.error, e.message.unwrap_or_default()))
        .unwrap_or_default();
    Failure::new(
        FailureKind::Status(status),
        format!("authority answered HTTP {status}{detail}"),
    )
}

fn malformed(message: &str) -> Failure {
    Failure::new(FailureKind::Malformed, message)
}

/// A refusal, if the answer is one: 409/404 with a refusal code.
fn refusal(status: u16, body: &[u8]) -> Option<RenewError> {
    if status != 409 && status != 404 {
        return None;
    }
    let e = error_body(body)?;
    let ErrorCode::Refused(reason) = e.code()? else {
        return None;
    };
    Some(RenewError::Refused {
        reason,
        message: e.message.unwrap_or_default(),
    })
}

impl HttpAuthority {
    /// An acquire as `waiter` (lease protocol v1, "Waiting": serve keeps
    /// its place in the task's queue), or as a newcomer (`None`).
    fn acquire_as(
        &mut self,
        req: &AcquireRequest,
        waiter: Option<&str>,
        timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        let body = AcquireBody {
            task: req.task.clone(),
            holder: req.holder.clone(),
            ttl_ms: ms(req.ttl),
            on_expiry: req.on_expiry.as_str().to_string(),
            grace_ms: (req.on_expiry == ExpiryPolicy::Grace).then(|| ms(req.grace)),
            waiter: waiter.map(str::to_owned),
        };
        let a = self
            .post("/v1/acquire", &body, timeout)
            .map_err(|f| acquire_failure(self.base(), f, timeout))?;
        match a.status {
            200 => {
                let bytes = a.body;
                let g: GrantBody = parse(&bytes).ok_or_else(|| {
                    AcquireError::Transient(malformed(
                        "authority answered 200 to acquire with a malformed body",
                    ))
                })?;
                if g.lease_id.is_empty() || g.ttl_ms == 0 {
                    return Err(AcquireError::Transient(malformed(
                        "authority granted a lease with an empty lease_id or a zero ttl",
                    )));
                }
                if g.task.as_deref().is_some_and(|t| t != req.task) {
                    return Err(AcquireError::Transient(malformed(
                        "authority granted a lease for another task",
                    )));
                }
                Ok(Grant {
                    lease_id: g.lease_id,
                    task: req.task.clone(),
                    token: g.token,
                    ttl: Duration::from_millis(g.ttl_ms),
                })
            }
            409 => match error_body(&a.body) {
                Some(e) if e.code() == Some(ErrorCode::Held) => Err(AcquireError::Held {
                    holder: e.holder.unwrap_or_else(|| "another holder".into()),
                    retry_after: e.retry_after_ms.map(Duration::from_millis),
                }),
                Some(e) if e.code() == Some(ErrorCode::HeldForOperator) => {
                    Err(AcquireError::HeldForOperator {
                        holder: e.holder.unwrap_or_default(),
                        lease_id: e.lease_id.unwrap_or_default(),
                    })
                }
                _ => Err(AcquireError::Transient(transient_status(409, &a.body))),
            },
            400 => {
                let msg = error_body(&a.body)
                    .map(|e| e.message.unwrap_or(e.error))
                    .unwrap_or_else(|| "bad request".into());
                Err(AcquireError::Rejected(msg))
            }
            s if denied(s).is_some() => Err(AcquireError::Trust(format!(
                "{}: {} (see --auth-token-file, --client-cert)",
                denied(s).unwrap_or_default(),
                transient_status(s, &a.body)
            ))),
            s => Err(AcquireError::Transient(transient_status(s, &a.body))),
        }
    }
}

/// `--wait` against a lease server: asks every 250 ms (`ASK_EVERY`) as one
/// waiter (a random id for the run), so a server that queues (serve does)
/// keeps its place in arrival order; one that does not ignores the id. A
/// place is never given up explicitly: the server forgets a waiter that
/// stops asking.
impl Waiter for HttpAuthority {
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

    fn abandon_wait(&mut self, _timeout: Duration) {
        self.waiter = None;
    }
}

/// How often a waiter asks again while it waits.
const ASK_EVERY: Duration = Duration::from_millis(250);

impl LeaseClient for HttpAuthority {
    fn url(&self) -> String {
        self.bases.join(",")
    }

    fn acquire(&mut self, req: &AcquireRequest, timeout: Duration) -> Result<Grant, AcquireError> {
        self.acquire_as(req, None, timeout)
    }

    fn renew(&mut self, lease: &LeaseRef, timeout: Duration) -> Result<Renewed, RenewError> {
        let body = LeaseRefBody {
            lease_id: lease.lease_id.clone(),
            token: lease.token,
        };
        let what = format!("renewal of task {}", lease.task);
        let a = self
            .post("/v1/renew", &body, timeout)
            .map_err(|f| renew_failure(&what, f))?;
        if a.status == 200 {
            let bytes = a.body;
            return match parse::<RenewBody>(&bytes) {
                Some(r) if r.ttl_ms > 0 => Ok(Renewed {
                    ttl: Duration::from_millis(r.ttl_ms),
                }),
                _ => Err(RenewError::Transient(malformed(
                    "authority answered 200 to renew with a malformed body",
                ))),
            };
        }
        Err(renew_status(&what, a.status, &a.body))
    }

    fn release(
        &mut self,
        lease: &LeaseRef,
        outcome: Outcome,
        exit_code: Option<i32>,
        timeout: Duration,
    ) -> Result<(), RenewError> {
        let body = ReleaseBody {
            lease_id: lease.lease_id.clone(),
            token: lease.token,
            outcome: outcome.as_str().to_string(),
            exit_code,
        };
        let what = format!("release of task {}", lease.task);
        let a = self
            .post("/v1/release", &body, timeout)
            .map_err(|f| renew_failure(&what, f))?;
        if a.status == 200 {
            return Ok(());
        }
        Err(renew_status(&what, a.status, &a.body))
    }

    /// The renewer gets the connection the grant came over (kept alive, it
    /// serves the renewals); this handle, which releases, opens its own.
    fn renewer(&mut self) -> Box<dyn Renewer> {
        let fresh = super::transport::agent(&self.trust);
        Box::new(Renewing(HttpAuthority {
            bases: self.bases.clone(),
            current: AtomicUsize::new(self.current.load(Ordering::Relaxed)),
            agent: std::mem::replace(&mut self.agent, fresh),
            trust: self.trust.clone(),
            waiter: None,
        }))
    }

    /// A server's queue, if it keeps one: `--wait` asks as one waiter.
    fn waiter(&mut self) -> Option<Box<dyn Waiter + '_>> {
        Some(Box::new(self))
    }

    fn operator(&mut self) -> Option<Box<dyn Operator + '_>> {
        Some(Box::new(self))
    }
}

impl Operator for HttpAuthority {
    fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError> {
        operator::leases(self, timeout)
    }

    fn revoke(
        &mut self,
        task: &str,
        force: bool,
        timeout: Duration,
    ) -> Result<Revoked, OperatorError> {
        operator::revoke(self, task, force, timeout)
    }

    fn clear(&mut self, task: &str, timeout: Duration) -> Result<(), OperatorError> {
        operator::clear(self, task, timeout)
    }

    fn history(
        &mut self,
        task: Option<&str>,
        since_ms: u64,
        timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError> {
        operator::history(self, task, since_ms, timeout)
    }
}

/// The operator calls of lease protocol v1. Every call is bounded by its
/// timeout; an answer is read up to 64 KiB (a listing page up to 64 MiB).
pub mod operator {
    use std::time::Duration;

    use super::{Answer, BODY_LIMIT, HttpAuthority, LISTING_LIMIT, error_body};
    use crate::authority::client::{
        Attempt, Failure, FailureKind, LeaseInfo, OperatorError, Revoked,
    };
    use crate::authority::transport;
    use crate::protocol::v1::{ClearBody, ErrorCode, HistoryBody, LeasesBody, RevokeBody};

    /// Most pages one listing follows (1,000 leases each on `serve`).
    pub const MAX_PAGES: usize = 1000;

    fn failed(kind: FailureKind, message: String) -> OperatorError {
        OperatorError::Failed(Failure::new(kind, message))
    }

    /// A call that gave no answer: trust problems named (a probe included,
    /// `transport::trust_failure`), as at acquire.
    fn no_answer(a: &HttpAuthority, f: Failure, timeout: Duration) -> OperatorError {
        OperatorError::Failed(transport::trust_failure(a.base(), &f, timeout).unwrap_or(f))
    }

    /// Most bytes one listing or history reads, all its pages together: a
    /// hostile authority's endless pages once made `leaseagent leases` take
    /// 1.5 GB.
    pub const MAX_READ_BYTES: u64 = LISTING_LIMIT;
    /// Most leases one listing keeps.
    pub const MAX_LEASES: usize = 200_000;

    /// `GET path` (a listing page): the body of a 200, else the
    /// authority's error. `budget` is what is left of
    /// [`MAX_READ_BYTES`]; the body counts against it.
    fn get(
        a: &HttpAuthority,
        path: &str,
        timeout: Duration,
        budget: &mut u64,
    ) -> Result<String, OperatorError> {
        let answer = a
            .call(path, None, timeout, LISTING_LIMIT.min(*budget))
            .map_err(|f| match f.kind {
                FailureKind::TooLarge => failed(
                    FailureKind::TooLarge,
                    format!(
                        "the authority's answers come to more than {MAX_READ_BYTES} bytes in \
                         all; stopped"
                    ),
                ),
                _ => no_answer(a, f, timeout),
            })?;
        *budget = budget.saturating_sub(answer.body.len() as u64);
        ok_body(answer)
    }

    /// POSTs `body` to `path`: any answer but 200 is the authority's error.
    fn post_expecting_200(
        a: &HttpAuthority,
        path: &str,
        body: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<(), OperatorError> {
        let bytes = super::json(body).map_err(OperatorError::Failed)?;
        let answer = a
            .call(path, Some(&bytes), timeout, BODY_LIMIT)
            .map_err(|f| no_answer(a, f, timeout))?;
        ok_body(answer).map(drop)
    }

    /// The body of a 200 as text, else the authority's error.
    fn ok_body(answer: Answer) -> Result<String, OperatorError> {
        if answer.status != 200 {
            return Err(failure(answer.status, &answer.body));
        }
        Ok(String::from_utf8_lossy(&answer.body).into_owned())
    }

    /// Turns a non-200 answer into an error carrying the authority's message.
    fn failure(status: u16, body: &[u8]) -> OperatorError {
        let body = error_body(body);
        let code = body.as_ref().map(|b| b.error.as_str()).unwrap_or("");
        let msg = body
            .as_ref()
            .and_then(|b| b.message.clone())
            .unwrap_or_else(|| format!("HTTP {status}"));
        let kind = FailureKind::Status(status);
        match (status, body.as_ref().and_then(|b| b.code())) {
            (404, Some(ErrorCode::NotFound)) => OperatorError::NotFound(msg),
            (404 | 405, _) => OperatorError::Unsupported(format!(
                "the authority does not support this operator call (HTTP {status})"
            )),
            _ if ErrorCode::from_status(status) == Some(ErrorCode::Unauthenticated) => failed(
                kind,
                format!(
                    "{}: HTTP {status}: {msg} (see --auth-token-file, --client-cert)",
                    ErrorCode::Unauthenticated.as_str()
                ),
            ),
            _ if ErrorCode::from_status(status) == Some(ErrorCode::Forbidden) => failed(
                kind,
                format!("{}: HTTP {status}: {msg}", ErrorCode::Forbidden.as_str()),
            ),
            _ => failed(kind, format!("HTTP {status} {code}: {msg}")),
        }
    }

    /// The whole listing: follows `next_after` page by page (each call
    /// within `timeout`) until the authority gives none, at most
    /// [`MAX_PAGES`] pages. A `next_after` that does not move forward is an
    /// error, not a loop.
    pub fn leases(a: &HttpAuthority, timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        let mut budget = MAX_READ_BYTES;
        for _ in 0..MAX_PAGES {
            let path = match &after {
                None => "/v1/leases".to_string(),
                Some(task) => format!("/v1/leases?after={}", percent_encode(task)),
            };
            let text = get(a, &path, timeout, &mut budget)?;
            let page = serde_json::from_str::<LeasesBody>(&text).map_err(|e| {
                failed(
                    FailureKind::Malformed,
                    format!("malformed lease listing: {e}"),
                )
            })?;
            all.extend(page.leases);
            if all.len() > MAX_LEASES {
                return Err(failed(
                    FailureKind::TooLarge,
                    format!("the authority lists more than {MAX_LEASES} leases; stopped"),
                ));
            }
            match page.next_after {
                None => return Ok(all),
                Some(next) if after.as_ref().is_some_and(|a| next.as_str() <= a.as_str()) => {
                    return Err(failed(
                        FailureKind::Malformed,
                        format!(
                            "malformed lease listing: next_after {next:?} does not move past {:?}",
                            after.unwrap_or_default()
                        ),
                    ));
                }
                Some(next) => after = Some(next),
            }
        }
        Err(failed(
            FailureKind::Other,
            format!("the lease listing has more than {MAX_PAGES} pages; stopped"),
        ))
    }

    /// `GET /v1/history`, page by page (each call within `timeout`), until
    /// an attempt acquired before `since_ms`, the last page, or
    /// [`MAX_HISTORY`](crate::authority::client::MAX_HISTORY) attempts. A cursor
    /// that does not move back is an error, not a loop.
    pub fn history(
        a: &HttpAuthority,
        task: Option<&str>,
        since_ms: u64,
        timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        let mut budget = MAX_READ_BYTES;
        let task_q = task
            .map(|t| format!("task={}&", percent_encode(t)))
            .unwrap_or_default();
        for _ in 0..MAX_PAGES {
            let path = match &after {
                None => format!("/v1/history?{task_q}limit=1000"),
                Some(c) => format!("/v1/history?{task_q}limit=1000&after={}", percent_encode(c)),
            };
            let text = get(a, &path, timeout, &mut budget)?;
            let page = serde_json::from_str::<HistoryBody>(&text)
                .map_err(|e| failed(FailureKind::Malformed, format!("malformed history: {e}")))?;
            for at in page.attempts {
                if crate::authority::client::acquired_ms(&at) < since_ms
                    || all.len() >= crate::authority::client::MAX_HISTORY
                {
                    return Ok(all);
                }
                all.push(at);
            }
            match page.next_after {
                None => return Ok(all),
                Some(next) if after.as_ref() == Some(&next) => {
                    return Err(failed(
                        FailureKind::Malformed,
                        format!("malformed history: next_after {next:?} repeats"),
                    ));
                }
                Some(next) => after = Some(next),
            }
        }
        Ok(all)
    }

    /// Percent-encodes everything but RFC 3986 unreserved characters.
    fn percent_encode(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }

    /// `POST /v1/revoke`. Without `force` the authority frees the task once
    /// the lease's current expiry has passed; with it, at once.
    pub fn revoke(
        a: &HttpAuthority,
        task: &str,
        force: bool,
        timeout: Duration,
    ) -> Result<Revoked, OperatorError> {
        let body = RevokeBody {
            task: task.to_string(),
            force,
        };
        post_expecting_200(a, "/v1/revoke", &body, timeout)?;
        Ok(Revoked::forced(force))
    }

    pub fn clear(a: &HttpAuthority, task: &str, timeout: Duration) -> Result<(), OperatorError> {
        let body = ClearBody {
            task: task.to_string(),
        };
        post_expecting_200(a, "/v1/clear", &body, timeout)
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn percent_encode_keeps_unreserved_only() {
            assert_eq!(
                super::percent_encode("etl/a b@c:1.x_y-z~"),
                "etl%2Fa%20b%40c%3A1.x_y-z~"
            );
        }
    }
}

#[cfg(test)]
mod replica_tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A server answering every request `status` with `body`, counting them.
    fn server(status: u16, body: String) -> (String, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        std::thread::spawn(move || {
            for sock in l.incoming() {
                let Ok(sock) = sock else { return };
                sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut r = BufReader::new(sock.try_clone().unwrap());
                let mut len = 0usize;
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut b = vec![0; len];
                let _ = r.read_exact(&mut b);
                h.fetch_add(1, Ordering::SeqCst);
                let mut w = sock;
                let _ = write!(
                    w,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (url, hits)
    }

    fn not_leader(leader: &str) -> String {
        format!(r#"{{"error":"not_leader","message":"m","leader":{leader}}}"#)
    }

    fn lease() -> LeaseRef {
        LeaseRef {
            lease_id: "id".into(),
            token: 1,
            task: "t".into(),
        }
    }

    fn client(bases: &[&str]) -> HttpAuthority {
        HttpAuthority::with_trust(&bases.join(","), Arc::new(ClientTrust::none()))
    }

    #[test]
    fn a_standby_sends_the_call_on_to_the_leader_it_names_if_it_is_one_of_ours() {
        let (leader, leader_hits) = server(200, r#"{"ttl_ms":5000}"#.into());
        let (other, other_hits) = server(200, r#"{"ttl_ms":5000}"#.into());
        let (standby, _) = server(503, not_leader(&format!("\"{leader}/\"")));
        let mut c = client(&[&standby, &other, &leader]);
        let r = c.renew(&lease(), Duration::from_secs(5)).unwrap();
        assert_eq!(r.ttl, Duration::from_millis(5000));
        assert_eq!(
            leader_hits.load(Ordering::SeqCst),
            1,
            "the named leader answered"
        );
        assert_eq!(other_hits.load(Ordering::SeqCst), 0, "not the next URL");
        // The next call starts at the replica that answered.
        c.renew(&lease(), Duration::from_secs(5)).unwrap();
        assert_eq!(leader_hits.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_leader_named_that_was_not_given_is_never_followed() {
        let (outsider, outsider_hits) = server(200, r#"{"ttl_ms":5000}"#.into());
        let (next, next_hits) = server(200, r#"{"ttl_ms":5000}"#.into());
        let (standby, _) = server(503, not_leader(&format!("\"{outsider}\"")));
        let mut c = client(&[&standby, &next]);
        c.renew(&lease(), Duration::from_secs(5)).unwrap();
        assert_eq!(
            outsider_hits.load(Ordering::SeqCst),
            0,
            "followed a URL not given"
        );
        assert_eq!(next_hits.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn refused_connections_go_to_the_next_url_and_all_standbys_end_transient() {
        let dead = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let (leader, hits) = server(200, r#"{"ttl_ms":5000}"#.into());
        let mut c = client(&[&dead, &leader]);
        c.renew(&lease(), Duration::from_secs(5)).unwrap();
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        // Nobody leads: each asked at most twice, then a transient failure.
        let (a, a_hits) = server(503, not_leader("null"));
        let (b, b_hits) = server(503, not_leader("null"));
        let mut c = client(&[&a, &b]);
        match c.renew(&lease(), Duration::from_secs(5)) {
            Err(RenewError::Transient(f)) => {
                assert_eq!(f.kind, FailureKind::Status(503), "{f}")
            }
            other => panic!("{other:?}"),
        }
        let (a, b) = (a_hits.load(Ordering::SeqCst), b_hits.load(Ordering::SeqCst));
        assert!((1..=2).contains(&a) && (1..=2).contains(&b), "{a} {b}");
    }
}
