//! Lease protocol v1 over the HTTP layer: routing, strict request decoding
//! (every malformed input is a 400 `bad_request` whose message names the
//! field), and the answers' exact JSON shapes.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};

use super::auth::{Action, Auth, Principal};
use super::http::{Answer, Handler, Request, Response};
use super::metrics::{self, Latency};
use super::replica::{NotLeader, Replica, Term};
use crate::engine::Granted;
use crate::engine::batched::{BatchedEngine, COMMIT_WAIT, Queued};
use crate::engine::rules::AcquireSpec;
use crate::engine::{CapScope, EngineError, MAX_PAGE, RequestError, parse_policy};
use crate::lease::{LeaseInfo, Outcome, RefusalReason};
use crate::protocol::v1::{ErrorBody, ErrorCode, HistoryBody, LeasesBody};

/// The request handler of `serve`.
pub struct Api {
    /// This replica: the engine of its term while it leads.
    pub replica: Arc<Replica>,
    pub latency: Latency,
    pub auth: Arc<Auth>,
    pub conns: Arc<super::http::ConnStats>,
    /// The cap on a principal's live leases when its entry sets none.
    pub default_max_leases: u64,
    /// The status page (`GET /`) and its per-minute figures.
    pub status: Arc<super::status::Status>,
    /// Most tasks named in each per-task family of `/metrics`.
    pub metrics_max_tasks: usize,
    /// Seals `/v1/history` cursors (`super::cursor`).
    pub cursors: super::cursor::Sealer,
}

/// Most history rows one `/v1/history` request reads, in scope or not: a
/// reader whose tasks are rare pages on with the cursor instead of making
/// one request scan the whole history.
const HISTORY_SCAN: usize = 10_000;

type Obj = Map<String, Value>;

/// An error answer: the code's own status, `{"error": code, "message": m}`.
fn error(code: ErrorCode, m: &str) -> Response {
    Response::error(code.status(), code.as_str(), m)
}

fn bad(m: impl Into<String>) -> Response {
    error(ErrorCode::BadRequest, &m.into())
}

/// A field the engine's rules refuse: 400, the message names the field.
fn invalid(e: RequestError) -> Response {
    bad(e.to_string())
}

fn object(body: &[u8]) -> Result<Obj, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad("the body must be a JSON object")),
        Err(e) => Err(bad(format!("the body is not JSON: {e}"))),
    }
}

fn field<'a>(o: &'a Obj, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

fn req_str<'a>(o: &'a Obj, name: &str) -> Result<&'a str, Response> {
    match field(o, name) {
        None => Err(bad(format!("`{name}` is missing"))),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(bad(format!("`{name}` must be a string"))),
    }
}

fn opt_u64(o: &Obj, name: &str) -> Result<Option<u64>, Response> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
            bad(format!(
                "`{name}` must be a non-negative integer that fits in 64 bits (got {n})"
            ))
        }),
        Some(_) => Err(bad(format!("`{name}` must be an integer"))),
    }
}

fn req_u64(o: &Obj, name: &str) -> Result<u64, Response> {
    opt_u64(o, name)?.ok_or_else(|| bad(format!("`{name}` is missing")))
}

fn opt_bool(o: &Obj, name: &str) -> Result<bool, Response> {
    match field(o, name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(format!("`{name}` must be true or false"))),
    }
}

fn task(o: &Obj) -> Result<String, Response> {
    let t = req_str(o, "task")?;
    crate::engine::validate_task(t).map_err(invalid)?;
    Ok(t.to_string())
}

/// An error answer whose body carries more than code and message.
fn with_body(body: ErrorBody) -> Response {
    let status = body.code().map_or(500, ErrorCode::status);
    Response::json(
        status,
        serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// `409 held`, with a waiter's place in the queue when it has one.
fn held(holder: String, retry_after_ms: u64, position: Option<u64>) -> Response {
    with_body(ErrorBody {
        message: Some(format!("the task is held by {holder}")),
        holder: Some(holder),
        retry_after_ms: Some(retry_after_ms),
        position,
        ..ErrorBody::new(ErrorCode::Held, "")
    })
}

fn refusal(r: RefusalReason) -> Response {
    let message = match r {
        RefusalReason::Expired => "the lease expired before this request arrived",
        RefusalReason::Superseded => "the task has been granted again with a higher token",
        RefusalReason::Revoked => "an operator revoked the lease",
        RefusalReason::UnknownLease => "no such lease",
    };
    error(ErrorCode::Refused(r), message)
}

fn engine_error(e: EngineError) -> Response {
    let msg = e.to_string();
    match e {
        EngineError::Held {
            holder,
            retry_after_ms,
        } => held(holder, retry_after_ms, None),
        EngineError::HeldForOperator { holder, lease_id } => with_body(ErrorBody {
            message: Some(format!(
                "lease {lease_id} of {holder} expired under policy hold; an operator must clear the task"
            )),
            holder: Some(holder),
            lease_id: Some(lease_id),
            ..ErrorBody::new(ErrorCode::HeldForOperator, "")
        }),
        EngineError::Refused(r) => refusal(r),
        EngineError::NotFound(m) => error(ErrorCode::NotFound, &m),
        EngineError::BadRequest(e) => invalid(e),
        EngineError::NotOwner { .. } => forbidden(),
        EngineError::TooManyLeases {
            scope: CapScope::Principal,
            ..
        }
        | EngineError::TooManyNewTasks { .. } => error(ErrorCode::TooManyLeases, &msg),
        EngineError::TooManyLeases {
            scope: CapScope::Global,
            ..
        }
        | EngineError::SequenceBehind { .. }
        | EngineError::Storage(_)
        | EngineError::Commit(_)
        | EngineError::Unavailable(_) => error(ErrorCode::Unavailable, &msg),
    }
}

/// A waiter id as lease protocol v1 defines it.
fn valid_waiter(s: &str) -> bool {
    (16..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Api {
    fn acquire(
        &self,
        engine: &BatchedEngine,
        body: &[u8],
        who: &Principal,
    ) -> Result<Commit, Response> {
        let o = object(body)?;
        let task = task(&o)?;
        if !who.covers(&task) {
            return Err(forbidden());
        }
        let holder = req_str(&o, "holder")?.to_string();
        crate::engine::validate_holder(&holder).map_err(invalid)?;
        let ttl_ms = req_u64(&o, "ttl_ms")?;
        crate::engine::validate_ttl(ttl_ms).map_err(invalid)?;
        let policy = match field(&o, "on_expiry") {
            None => crate::lease::ExpiryPolicy::Redispatch,
            Some(Value::String(s)) => parse_policy(s).map_err(invalid)?,
            Some(_) => return Err(bad("`on_expiry` must be a string")),
        };
        let grace_ms = opt_u64(&o, "grace_ms")?.unwrap_or(0);
        crate::engine::validate_grace(grace_ms).map_err(invalid)?;
        // Lease protocol v1, "Waiting": the caller's place in the task's
        // queue while it waits. `wait_ms` is checked, not needed: a waiter
        // keeps its place by asking again.
        let waiter = match field(&o, "waiter") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if valid_waiter(s) => Some(s.clone()),
            Some(_) => {
                return Err(bad("`waiter` must be 16 to 64 bytes of A-Z a-z 0-9 - _"));
            }
        };
        opt_u64(&o, "wait_ms")?;
        let spec = AcquireSpec {
            task,
            principal: who.name.clone(),
            max_leases: Some(who.max_leases.unwrap_or(self.default_max_leases)),
            holder,
            ttl_ms,
            policy,
            grace_ms,
        };
        let q = match engine.acquire_queued(&spec, waiter.as_deref()) {
            Ok(q) => q,
            // A waiter is told its place ("Waiting").
            Err(EngineError::Held {
                holder,
                retry_after_ms,
            }) => {
                let position = waiter
                    .as_deref()
                    .and_then(|w| engine.waiter_position(&spec.task, w))
                    .and_then(|p| u64::try_from(p).ok());
                return Err(held(holder, retry_after_ms, position));
            }
            Err(e) => return Err(engine_error(e)),
        };
        Ok(Commit::Grant(q, spec.task))
    }

    /// The lease id and token of a renewal or release, checked against the
    /// caller's scope as it is now (a reload may have narrowed it since
    /// the acquire): a task outside it is 403, whether or not it exists.
    fn lease_ref(o: &Obj, who: &Principal) -> Result<(String, u64), Response> {
        let id = req_str(o, "lease_id")?.to_string();
        if id.is_empty() || id.len() > 512 {
            return Err(bad("`lease_id` must be 1 to 512 bytes"));
        }
        let token = req_u64(o, "token")?;
        if let Some((_, task)) = crate::engine::rules::parse_lease_id(&id) {
            if !who.covers(task) {
                return Err(forbidden());
            }
        }
        Ok((id, token))
    }

    fn renew(
        &self,
        engine: &BatchedEngine,
        body: &[u8],
        who: &Principal,
    ) -> Result<Response, Response> {
        let o = object(body)?;
        let (id, token) = Self::lease_ref(&o, who)?;
        let ttl = engine.renew(&id, token, &who.name).map_err(engine_error)?;
        Ok(Response::json(200, format!("{{\"ttl_ms\":{ttl}}}")))
    }

    fn release(
        &self,
        engine: &BatchedEngine,
        body: &[u8],
        who: &Principal,
    ) -> Result<Commit, Response> {
        let o = object(body)?;
        let (id, token) = Self::lease_ref(&o, who)?;
        let outcome = req_str(&o, "outcome")?;
        let Some(outcome) = Outcome::parse(outcome) else {
            return Err(bad(format!(
                "`outcome` must be one of succeeded, failed, cancelled, lost (got {outcome:?})"
            )));
        };
        let exit_code = match field(&o, "exit_code") {
            None => None,
            Some(Value::Number(n)) => match n.as_i64().and_then(|c| i32::try_from(c).ok()) {
                Some(c) => Some(c),
                None => return Err(bad("`exit_code` must be null or a 32-bit integer")),
            },
            Some(_) => return Err(bad("`exit_code` must be null or a 32-bit integer")),
        };
        let q = engine
            .release_queued(&id, token, &who.name, Some(outcome), exit_code)
            .map_err(engine_error)?;
        Ok(Commit::Release(q))
    }

    fn revoke(
        &self,
        engine: &BatchedEngine,
        body: &[u8],
        who: &Principal,
    ) -> Result<Commit, Response> {
        let o = object(body)?;
        let task = task(&o)?;
        if !who.covers(&task) {
            return Err(forbidden());
        }
        let force = opt_bool(&o, "force")?;
        let q = engine.revoke_queued(&task, force).map_err(engine_error)?;
        Ok(Commit::Revoke(q, task, force))
    }

    fn clear(
        &self,
        engine: &BatchedEngine,
        body: &[u8],
        who: &Principal,
    ) -> Result<Commit, Response> {
        let o = object(body)?;
        let task = task(&o)?;
        if !who.covers(&task) {
            return Err(forbidden());
        }
        let q = engine.clear_queued(&task).map_err(engine_error)?;
        Ok(Commit::Clear(q, task))
    }

    /// Waits for a change's commit, at most [`COMMIT_WAIT`].
    async fn durable<T>(engine: &BatchedEngine, q: Queued<T>) -> Result<T, EngineError> {
        tokio::time::timeout(COMMIT_WAIT, engine.committed(q))
            .await
            .unwrap_or_else(|_| Err(engine.commit_timed_out()))
    }

    /// Answers a change once it is committed, if this replica still leads
    /// the term that made it (else `not_leader`: a leader past its deadline
    /// answers no lease call, even one whose commit it saw).
    async fn committed(&self, term: Arc<Term>, c: Commit) -> Response {
        let engine = &term.engine;
        let r = match c {
            Commit::Release(q) => Self::durable(engine, q).await.map(|()| json!({})),
            Commit::Grant(q, task) => Self::durable(engine, q).await.map(|g| {
                json!({"lease_id": g.lease_id, "task": task, "token": g.token, "ttl_ms": g.ttl_ms})
            }),
            Commit::Revoke(q, task, force) => Self::durable(engine, q)
                .await
                .map(|token| json!({"task": task, "token": token, "force": force})),
            Commit::Clear(q, task) => Self::durable(engine, q)
                .await
                .map(|token| json!({"task": task, "token": token})),
        };
        if !term.valid() {
            return not_leader(
                &self
                    .replica
                    .leading()
                    .err()
                    .unwrap_or(NotLeader { leader: None }),
            );
        }
        match r {
            Ok(v) => Response::json(200, v.to_string()),
            Err(e) => engine_error(e),
        }
    }

    /// The principal the request speaks for, or the 401 to answer.
    fn principal(&self, req: &Request) -> Result<Arc<Principal>, Response> {
        if !self.auth.enabled() {
            return Ok(Principal::anyone());
        }
        let principals = self.auth.current();
        match principals.identify(req.bearer.as_deref(), &req.cert_names) {
            Some(p) => Ok(p.clone()),
            None => {
                let code = ErrorCode::Unauthenticated;
                let mut r = Response::json(code.status(), code.bare_body());
                r.headers.push(("www-authenticate", "Bearer".to_string()));
                Err(r)
            }
        }
    }

    /// The endpoint, its method, and what it needs; `Err` is 404/405.
    fn endpoint(req: &Request) -> Result<(Endpoint, Action), Response> {
        let (e, a, m) = match req.path.as_str() {
            "/v1/renew" => (Endpoint::Renew, Action::Hold, "POST"),
            "/v1/acquire" => (Endpoint::Acquire, Action::Hold, "POST"),
            "/v1/release" => (Endpoint::Release, Action::Hold, "POST"),
            "/v1/revoke" => (Endpoint::Revoke, Action::Operate, "POST"),
            "/v1/clear" => (Endpoint::Clear, Action::Operate, "POST"),
            "/v1/leases" => (Endpoint::Leases, Action::Read, "GET"),
            "/v1/history" => (Endpoint::History, Action::Read, "GET"),
            "/" => (Endpoint::Status, Action::Read, "GET"),
            "/metrics" => (Endpoint::Metrics, Action::Read, "GET"),
            "/healthz" => (Endpoint::Health, Action::Read, "GET"),
            p => {
                return Err(Response::error(
                    404,
                    "not_found",
                    &format!("no such endpoint: {p}"),
                ));
            }
        };
        let ok = req.method == m || (m == "GET" && req.method == "HEAD");
        if !ok {
            return Err(not_allowed(&req.method, &req.path));
        }
        Ok((e, a))
    }

    fn health(&self) -> Response {
        match self.replica.leading() {
            Ok(t) if t.engine.healthy() => Response::json(200, "{\"ok\":true}"),
            Ok(_) => error(ErrorCode::Unavailable, "the lease database failed a commit"),
            Err(nl) => super::standby::health(&nl),
        }
    }

    /// Routes a request. Nothing here waits: a change to commit comes back
    /// as [`Routed::Commit`], work that takes a while (a listing, the
    /// metrics) as [`Routed::Blocking`].
    fn route(&self, req: &Request) -> Routed {
        if req.path == "/healthz" {
            return Routed::Now(match Self::endpoint(req) {
                Ok(_) => self.health(),
                Err(r) => r,
            });
        }
        let who = match self.principal(req) {
            Ok(p) => p,
            Err(r) => return Routed::Now(r),
        };
        // It spoke for a principal (any request but /healthz, without an
        // auth file): its connection leaves the unauthenticated pool.
        req.authenticate();
        let (ep, action) = match Self::endpoint(req) {
            Ok(x) => x,
            Err(r) => return Routed::Now(r),
        };
        if !who.role.may(action) {
            return Routed::Now(forbidden());
        }
        let body = &req.body[..];
        // Lease calls and the listing need the leader (the spec's
        // "Replicas": a standby answers them `not_leader`).
        let term = match ep {
            Endpoint::Renew
            | Endpoint::Release
            | Endpoint::Acquire
            | Endpoint::Revoke
            | Endpoint::Clear
            | Endpoint::Leases => match self.replica.leading() {
                Ok(t) => Some(t),
                Err(nl) => return Routed::Now(not_leader(&nl)),
            },
            _ => None,
        };
        let commit = |c: Result<Commit, Response>| match (c, term.clone()) {
            (Ok(c), Some(t)) => Routed::Commit(t, c),
            (Err(r), _) => Routed::Now(r),
            (Ok(_), None) => Routed::Now(error(ErrorCode::Unavailable, "no term")),
        };
        let now = |r: Result<Response, Response>| Routed::Now(r.unwrap_or_else(|r| r));
        let engine = term.as_ref().map(|t| t.engine.clone());
        match (ep, engine) {
            (Endpoint::Renew, Some(e)) => now(self.renew(&e, body, &who)),
            (Endpoint::Release, Some(e)) => commit(self.release(&e, body, &who)),
            (Endpoint::Acquire, Some(e)) => commit(self.acquire(&e, body, &who)),
            (Endpoint::Revoke, Some(e)) => commit(self.revoke(&e, body, &who)),
            (Endpoint::Clear, Some(e)) => commit(self.clear(&e, body, &who)),
            (Endpoint::Leases, Some(e)) => {
                let query = req.query.clone();
                Routed::Blocking(Box::new(move |api| api.list(&e, query.as_deref(), &who)))
            }
            (Endpoint::Renew | Endpoint::Release | Endpoint::Acquire, None)
            | (Endpoint::Revoke | Endpoint::Clear | Endpoint::Leases, None) => {
                Routed::Now(error(ErrorCode::Unavailable, "no term"))
            }
            (Endpoint::Health, _) => Routed::Now(self.health()),
            (Endpoint::History, _) => {
                let query = req.query.clone();
                Routed::Blocking(Box::new(move |api| api.history(query.as_deref(), &who)))
            }
            (Endpoint::Status, _) => Routed::Blocking(Box::new(move |api| {
                super::standby::status_page(&api.replica, &api.status, &api.conns, &|t| {
                    who.covers(t)
                })
            })),
            (Endpoint::Metrics, _) => Routed::Blocking(Box::new(move |api| {
                let mut body = match api.replica.leading() {
                    Ok(t) => metrics::render(
                        &t.engine,
                        &api.latency,
                        &api.conns,
                        &api.auth.stats,
                        &|t| who.covers(t),
                        api.metrics_max_tasks,
                    ),
                    Err(_) => super::standby::metrics(&api.conns),
                };
                super::standby::replica_metrics(&mut body, &api.replica);
                Response {
                    status: 200,
                    content_type: "text/plain; version=0.0.4",
                    headers: Vec::new(),
                    body: body.into_bytes(),
                }
            })),
        }
    }

    /// `GET /v1/leases[?limit=N&after=TASK]`: the leases in the caller's
    /// scope, sorted by task, without lease ids.
    fn list(&self, engine: &BatchedEngine, query: Option<&str>, who: &Principal) -> Response {
        let mut limit: usize = MAX_PAGE;
        let mut after: Option<String> = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "limit" => match v.parse::<usize>() {
                    Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                    _ => return bad(format!("`limit` must be an integer from 1 to {MAX_PAGE}")),
                },
                "after" => match percent_decode(v) {
                    Some(t) => after = Some(t),
                    None => return bad("`after` is not valid percent-encoded UTF-8"),
                },
                _ => return bad(format!("unknown query parameter `{k}`")),
            }
        }
        // Engine pages (each bounded work under the engine lock), filtered
        // to the caller's scope, until `limit` leases in scope are found or
        // the leases end. `next_after` is always a task the caller may see
        // (the last one returned): a name outside its scope never shows.
        let mut leases: Vec<LeaseInfo> = Vec::new();
        let mut cursor = after;
        let more = loop {
            let page = engine.leases_page(cursor.as_deref(), limit);
            for mut l in page.leases.into_iter().filter(|l| who.covers(&l.task)) {
                if leases.len() == limit {
                    break;
                }
                l.lease_id.clear();
                leases.push(l);
            }
            match page.next_after {
                Some(next) if leases.len() < limit => cursor = Some(next),
                next => break next.is_some() || leases.len() == limit,
            }
        };
        let next_after = if more {
            leases.last().map(|l| l.task.clone())
        } else {
            None
        };
        let body = LeasesBody { leases, next_after };
        match serde_json::to_string(&body) {
            Ok(text) => Response::json(200, text),
            Err(e) => error(
                ErrorCode::Unavailable,
                &format!("cannot encode the listing: {e}"),
            ),
        }
    }
}

impl Api {
    /// `GET /v1/history[?task=T&after=CURSOR&limit=N]`: attempts in the
    /// caller's scope, newest first, without lease ids. The cursor is the
    /// token of the last attempt of the page (opaque to clients).
    fn history(&self, query: Option<&str>, who: &Principal) -> Response {
        let mut limit: usize = 100;
        let mut after: Option<u64> = None;
        let mut task: Option<String> = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "limit" => match v.parse::<usize>() {
                    Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                    _ => return bad(format!("`limit` must be an integer from 1 to {MAX_PAGE}")),
                },
                "after" => match self.cursors.open(&who.name, v) {
                    Some(n) => after = Some(n),
                    None => {
                        return bad(
                            "`after` must be a `next_after` cursor this server gave this \
                             principal",
                        );
                    }
                },
                "task" => match percent_decode(v) {
                    Some(t) => {
                        if let Err(e) = crate::engine::validate_task(&t) {
                            return invalid(e);
                        }
                        if !who.covers(&t) {
                            return forbidden();
                        }
                        task = Some(t);
                    }
                    None => return bad("`task` is not valid percent-encoded UTF-8"),
                },
                _ => return bad(format!("unknown query parameter `{k}`")),
            }
        }
        let leading = self.replica.leading();
        let pages = |t: Option<&str>, b: Option<u64>, n: usize| match &leading {
            Ok(term) => term.engine.history_page(t, b, n),
            Err(_) => self.replica.standby_history(t, b, n),
        };
        let scan = super::status::history_in_scope(
            &pages,
            (task.as_deref(), after),
            limit,
            HISTORY_SCAN,
            &|t| who.covers(t),
        );
        let (page, resume) = match scan {
            Ok(x) => x,
            Err(e) => return engine_error(e),
        };
        let next_after = match resume {
            None => None,
            Some(t) => match self.cursors.seal(&who.name, t) {
                Some(c) => Some(c),
                None => {
                    return error(ErrorCode::Unavailable, "no random bytes for the cursor");
                }
            },
        };
        let body = HistoryBody {
            attempts: page.iter().map(|r| r.attempt()).collect(),
            next_after,
        };
        match serde_json::to_string(&body) {
            Ok(text) => Response::json(200, text),
            Err(e) => error(
                ErrorCode::Unavailable,
                &format!("cannot encode the history: {e}"),
            ),
        }
    }
}

/// A change made in memory whose write is queued, and what its answer says.
enum Commit {
    Release(Queued<()>),
    Grant(Queued<Granted>, String),
    Revoke(Queued<u64>, String, bool),
    Clear(Queued<u64>, String),
}

/// Where [`Api::route`] sent a request.
enum Routed {
    Now(Response),
    /// Answered once committed ([`Api::committed`]), by the term that made it.
    Commit(Arc<Term>, Commit),
    /// Answered on a blocking thread, by this.
    Blocking(Box<dyn FnOnce(&Api) -> Response + Send>),
}

#[derive(Clone, Copy)]
enum Endpoint {
    Renew,
    Acquire,
    Release,
    Revoke,
    Clear,
    Leases,
    History,
    Status,
    Metrics,
    Health,
}

/// A lease call to a replica that does not lead: `503 not_leader`, naming
/// the leader as this replica last saw it (the spec's "Replicas").
fn not_leader(nl: &NotLeader) -> Response {
    super::standby::not_leader(nl)
}

fn forbidden() -> Response {
    let code = ErrorCode::Forbidden;
    Response::json(code.status(), code.bare_body())
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn not_allowed(method: &str, path: &str) -> Response {
    error(
        ErrorCode::MethodNotAllowed,
        &format!("{method} is not allowed on {path}"),
    )
}

impl Handler for Api {
    fn answer(self: Arc<Self>, req: &Request) -> Answer {
        let start = Instant::now();
        match self.route(req) {
            Routed::Now(r) => {
                self.latency.observe(start.elapsed());
                Answer::Now(r)
            }
            Routed::Commit(t, c) => Answer::Later(Box::pin(async move {
                let r = self.committed(t, c).await;
                self.latency.observe(start.elapsed());
                r
            })),
            Routed::Blocking(f) => Answer::Blocking(Box::new(move || {
                let r = f(&self);
                self.latency.observe(start.elapsed());
                r
            })),
        }
    }
}
