//! Lease protocol v1 over the HTTP layer: routing, strict request decoding
//! (every malformed input is a 400 `bad_request` whose message names the
//! field), and the answers' exact JSON shapes.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};

use super::http::{Handler, Request, Response};
use super::metrics::{self, Latency};
use crate::engine::batched::ServeEngine;
use crate::engine::rules::AcquireSpec;
use crate::engine::{CapScope, EngineError, parse_policy};
use crate::lease::{Outcome, RefusalReason};
use crate::protocol::v1::{ErrorBody, ErrorCode, LeasesBody};

/// The request handler of `serve`.
pub struct Api {
    pub engine: Arc<ServeEngine>,
    pub latency: Latency,
}

type Obj = Map<String, Value>;

/// An error answer: the code's own status, `{"error": code, "message": m}`.
fn error(code: ErrorCode, m: &str) -> Response {
    Response::error(code.status(), code.as_str(), m)
}

fn bad(m: impl Into<String>) -> Response {
    error(ErrorCode::BadRequest, &m.into())
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
    crate::engine::validate_task(t).map_err(bad)?;
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
        } => with_body(ErrorBody {
            message: Some(format!("the task is held by {holder}")),
            holder: Some(holder),
            retry_after_ms: Some(retry_after_ms),
            ..ErrorBody::new(ErrorCode::Held, "")
        }),
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
        EngineError::BadRequest(m) => bad(m),
        EngineError::NotOwner { .. } => Response::error(403, "forbidden", &msg),
        EngineError::TooManyLeases {
            scope: CapScope::Principal,
            ..
        } => Response::error(429, "too_many_leases", &msg),
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

impl Api {
    fn acquire(&self, body: &[u8]) -> Result<Response, Response> {
        let o = object(body)?;
        let task = task(&o)?;
        let holder = req_str(&o, "holder")?.to_string();
        crate::engine::validate_holder(&holder).map_err(bad)?;
        let ttl_ms = req_u64(&o, "ttl_ms")?;
        crate::engine::validate_ttl(ttl_ms).map_err(bad)?;
        let policy = match field(&o, "on_expiry") {
            None => crate::lease::ExpiryPolicy::Redispatch,
            Some(Value::String(s)) => parse_policy(s).map_err(bad)?,
            Some(_) => return Err(bad("`on_expiry` must be a string")),
        };
        let grace_ms = opt_u64(&o, "grace_ms")?.unwrap_or(0);
        crate::engine::validate_grace(grace_ms).map_err(bad)?;
        let spec = AcquireSpec {
            task,
            principal: String::new(),
            max_leases: None,
            holder,
            ttl_ms,
            policy,
            grace_ms,
        };
        let g = self.engine.acquire(&spec).map_err(engine_error)?;
        Ok(Response::json(
            200,
            json!({"lease_id": g.lease_id, "task": spec.task, "token": g.token, "ttl_ms": g.ttl_ms})
                .to_string(),
        ))
    }

    fn lease_ref(o: &Obj) -> Result<(String, u64), Response> {
        let id = req_str(o, "lease_id")?.to_string();
        if id.is_empty() || id.len() > 512 {
            return Err(bad("`lease_id` must be 1 to 512 bytes"));
        }
        Ok((id, req_u64(o, "token")?))
    }

    fn renew(&self, body: &[u8]) -> Result<Response, Response> {
        let o = object(body)?;
        let (id, token) = Self::lease_ref(&o)?;
        let ttl = self.engine.renew(&id, token, "").map_err(engine_error)?;
        Ok(Response::json(200, format!("{{\"ttl_ms\":{ttl}}}")))
    }

    fn release(&self, body: &[u8]) -> Result<Response, Response> {
        let o = object(body)?;
        let (id, token) = Self::lease_ref(&o)?;
        let outcome = req_str(&o, "outcome")?;
        if Outcome::parse(outcome).is_none() {
            return Err(bad(format!(
                "`outcome` must be one of succeeded, failed, cancelled, lost (got {outcome:?})"
            )));
        }
        match field(&o, "exit_code") {
            None => {}
            Some(Value::Number(n)) if n.as_i64().is_some_and(|c| i32::try_from(c).is_ok()) => {}
            Some(_) => return Err(bad("`exit_code` must be null or a 32-bit integer")),
        }
        self.engine.release(&id, token, "").map_err(engine_error)?;
        Ok(Response::json(200, "{}"))
    }

    fn revoke(&self, body: &[u8]) -> Result<Response, Response> {
        let o = object(body)?;
        let task = task(&o)?;
        let force = opt_bool(&o, "force")?;
        let token = self.engine.revoke(&task, force).map_err(engine_error)?;
        Ok(Response::json(
            200,
            json!({"task": task, "token": token, "force": force}).to_string(),
        ))
    }

    fn clear(&self, body: &[u8]) -> Result<Response, Response> {
        let o = object(body)?;
        let task = task(&o)?;
        let token = self.engine.clear(&task).map_err(engine_error)?;
        Ok(Response::json(
            200,
            json!({"task": task, "token": token}).to_string(),
        ))
    }

    fn route(&self, req: &Request) -> Response {
        let post = |f: fn(&Api, &[u8]) -> Result<Response, Response>| {
            if req.method == "POST" {
                f(self, &req.body).unwrap_or_else(|r| r)
            } else {
                not_allowed(&req.method, &req.path)
            }
        };
        let get = |f: &dyn Fn() -> Response| {
            if req.method == "GET" || req.method == "HEAD" {
                f()
            } else {
                not_allowed(&req.method, &req.path)
            }
        };
        match req.path.as_str() {
            "/v1/renew" => post(Api::renew),
            "/v1/acquire" => post(Api::acquire),
            "/v1/release" => post(Api::release),
            "/v1/revoke" => post(Api::revoke),
            "/v1/clear" => post(Api::clear),
            "/v1/leases" => get(&|| {
                let body = LeasesBody {
                    leases: self.engine.leases(),
                };
                Response::json(200, serde_json::to_vec(&body).unwrap_or_default())
            }),
            "/healthz" => get(&|| {
                if self.engine.healthy() {
                    Response::json(200, "{\"ok\":true}")
                } else {
                    error(ErrorCode::Unavailable, "the lease database failed a commit")
                }
            }),
            "/metrics" => get(&|| Response {
                status: 200,
                content_type: "text/plain; version=0.0.4",
                body: metrics::render(&self.engine, &self.latency).into_bytes(),
            }),
            p => error(ErrorCode::NotFound, &format!("no such endpoint: {p}")),
        }
    }
}

fn not_allowed(method: &str, path: &str) -> Response {
    error(
        ErrorCode::MethodNotAllowed,
        &format!("{method} is not allowed on {path}"),
    )
}

impl Handler for Api {
    fn handle(&self, req: &Request) -> Response {
        let start = Instant::now();
        let resp = self.route(req);
        self.latency.observe(start.elapsed());
        resp
    }
}
