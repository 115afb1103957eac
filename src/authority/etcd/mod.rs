//! etcd as the lease authority (`--authority etcd://host:port[,host:port…]`,
//! or `etcds://…` over TLS; TLS, etcd logins and endpoint rotation live in
//! [`gateway`]).
//!
//! Why this shape: users who outgrow one machine already run etcd, and their
//! scripts already use `etcdctl lock`. So a leaseagent lease *is* an etcd
//! concurrency-package mutex, the same one `etcdctl lock NAME` takes, and the
//! two tools exclude each other in both directions:
//! - An etcd lease (ttl rounded up to whole seconds; etcd may raise it to its
//!   minimum, and we use the granted ttl) is the liveness of the holder.
//! - The holder's key is `<task>/<lease id in hex>`, put with that lease in a
//!   txn guarded by `create_revision == 0` (so a retried txn cannot create
//!   the key twice) whose both branches also read the first-created key
//!   under `<task>/`. A task name with `/` has each `/` written `%2F` in
//!   its prefix, so that no task's range holds another task's keys (see
//!   `task_of_prefix`). The owner is the key with the lowest create revision;
//!   everyone behind it waits for the deletion of the key just before theirs.
//!   The value is the holder string (`etcdctl lock` stores an empty one).
//! - The fencing token is the store revision at which ownership was
//!   confirmed: the header revision of the txn/read that showed our key first,
//!   exactly what `etcdctl lock` exports as `ETCD_LOCK_REV`. The previous
//!   owner's key was deleted at a revision above that owner's own token, and
//!   our confirming read sees that deletion, so tokens strictly increase across
//!   both tools. (Not our key's create revision: a waiter queued early has a
//!   create revision below the token of the holder it waits for.)
//!
//! Renewal = keepalive (TTL <= 0 or "lease not found" is a refusal), then a
//! read of our key: if it is gone (someone deleted it, or revoked the lease)
//! or now belongs to another lease or a later creation, that is a refusal too,
//! because another agent or `etcdctl lock` may already own the task.
//! Release = revoke the lease, which deletes the key in the same raft entry;
//! skipped once the lease has run out by this process's clock (`LeaseClock`),
//! and never given more time than the lease has left, so a lost lease on an
//! unreachable etcd does not hold up the agent's exit.
//!
//! Only `--on-expiry redispatch` exists here: etcd frees the key when the lease
//! expires and has no grace or hold state, so the other policies are refused
//! rather than silently weakened.
//!
//! Waiting (`--wait`) goes through the client's [`Waiter`] capability
//! ([`Waiter::acquire_wait`]): the queued key is kept (and its lease kept
//! alive) between calls, so a waiter keeps its place in the queue like
//! `etcdctl lock` does instead of re-entering at the back. "Still queued" and
//! a transient failure (a leader change; not a TLS or credential problem)
//! keep the place, since the agent asks again and calls
//! [`Waiter::abandon_wait`] when it stops waiting; every other way out of a
//! wait revokes it. The place is given up as lost only when a linearizable
//! read shows our key gone (see `refresh_queued`).
//!
//! The operator calls ([`Operator`]): `leases` lists the lock keys, `revoke`
//! revokes the holder's lease; etcd keeps no run history and no task held
//! for an operator, so `history` and `clear` answer so, in words.
//!
//! Shared state: the `LeaseClock` is shared (behind a mutex held for a map
//! lookup only) by the handles of one agent, since the heartbeat thread
//! renews on one handle and the supervisor releases on another.

mod gateway;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gateway::{CallError, Gateway};
use wire::{
    Compare, KeepAliveStreamItem, KeyValue, LeaseGrantRequest, LeaseGrantResponse, LeaseIdRequest,
    PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse,
};

use super::client::*;

/// How often a waiter looks at the key ahead of it.
const WAIT_POLL: Duration = Duration::from_millis(200);

/// A place in a task's queue kept by [`Waiter::acquire_wait`].
struct Queued {
    task: String,
    lease: i64,
    ttl_secs: i64,
    key: Vec<u8>,
    create_rev: i64,
    last_keepalive: Instant,
}

pub struct EtcdAuthority {
    gw: Gateway,
    queued: Option<Queued>,
    /// When each of our leases runs out at the latest, by this process's
    /// monotonic clock, shared with clones (the heartbeat thread renews on
    /// one handle, the supervisor releases on another).
    clock: Arc<LeaseClock>,
}

/// Per lease: the send instant of the last grant or keepalive etcd answered
/// plus the ttl it gave. etcd counts from when it received the request, so
/// by this instant the lease has run out on etcd too, and releasing it is
/// pointless (there is nothing left to revoke).
#[derive(Default)]
struct LeaseClock(Mutex<HashMap<i64, Instant>>);

impl LeaseClock {
    fn extend(&self, lease: i64, sent: Instant, ttl_secs: i64) {
        if let Ok(mut m) = self.0.lock() {
            let until = sent + Duration::from_secs(ttl_secs.unsigned_abs());
            let e = m.entry(lease).or_insert(until);
            *e = (*e).max(until);
        }
    }
    fn forget(&self, lease: i64) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(&lease);
        }
    }
    fn runs_out(&self, lease: i64) -> Option<Instant> {
        self.0.lock().ok().and_then(|m| m.get(&lease).copied())
    }
}

/// One step of waiting in a task's queue.
enum Step {
    /// Our key is first: the task is ours.
    Granted(Grant),
    /// Someone is ahead (the owner, if the answer named it).
    Behind(Option<KeyValue>),
    /// Our place is gone (lease expired, key deleted): queue again at once.
    PlaceLost,
    /// A transient failure; the place (if any) is kept.
    Failed(Failure),
}

/// The result of putting our key in the queue.
struct Enqueued {
    create_rev: i64,
    /// Header revision of the txn: the token if we are the owner.
    revision: i64,
    owner: Option<KeyValue>,
}

/// Why a keepalive did not extend the lease.
#[derive(Debug, thiserror::Error)]
enum KeepAliveError {
    /// The lease is gone for good: a refusal.
    #[error("{1}")]
    Gone(RefusalReason, String),
    /// The call failed; the lease may still be there.
    #[error("etcd keepalive: {0}")]
    Call(#[source] CallError),
    /// etcd answered without a result: its error message, if any.
    #[error("etcd keepalive: {}", .0.as_deref().unwrap_or("empty answer"))]
    NoResult(Option<String>),
}

impl EtcdAuthority {
    /// Keeps the lease of the queued place (see `acquire_wait`) alive.
    /// `Ok(true)`: refreshed; `Ok(false)`: the place is gone and forgotten
    /// (the caller queues again); `Err`: transient, the place is kept.
    ///
    /// A keepalive saying the lease is gone is confirmed by a linearizable
    /// read of our key before the place is given up: an etcd member that
    /// just became leader may not have applied the lease's grant yet and
    /// answer "not found" (TTL 0) for a live lease (etcd-io/etcd#13675).
    /// The key goes with the lease in the same raft entry, so the key still
    /// there means the place is still there; the keepalive is retried at the
    /// next poll.
    fn refresh_queued(&mut self, lease: i64, deadline: Instant) -> Result<bool, KeepAliveError> {
        match self.keepalive(lease, deadline) {
            Ok(_) => {
                if let Some(q) = self.queued.as_mut() {
                    q.last_keepalive = Instant::now();
                }
                Ok(true)
            }
            Err(KeepAliveError::Gone(reason, m)) => {
                let Some((key, create_rev)) =
                    self.queued.as_ref().map(|q| (q.key.clone(), q.create_rev))
                else {
                    return Ok(false);
                };
                // Range reads are linearizable unless asked otherwise.
                let r: RangeResponse = self
                    .gw
                    .call("/v3/kv/range", &RangeRequest::key(&key), deadline)
                    .map_err(KeepAliveError::Call)?;
                if place_held(r.kvs.first(), lease, create_rev) {
                    log::debug!("etcd: keepalive said {m}, but our queued key is still there");
                    return Err(KeepAliveError::Gone(reason, m));
                }
                log::info!("etcd: queued place lost ({m}); queueing again");
                self.queued = None;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Plain `etcd://`, no credentials.
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdAuthority {
            gw: Gateway::new(endpoints),
            queued: None,
            clock: Arc::default(),
        }
    }

    /// `etcds://` when `tls`, with the client trust the flags name.
    pub fn with_trust(
        endpoints: Vec<String>,
        tls: bool,
        trust: Arc<super::trust::ClientTrust>,
    ) -> Self {
        EtcdAuthority {
            gw: Gateway::with_trust(endpoints, tls, trust),
            queued: None,
            clock: Arc::default(),
        }
    }

    /// The key prefix of a task's queue: `<task>/` for a task without `/`
    /// (what `etcdctl lock <task>` uses), else the task with every `/`
    /// written `%2F`, then `/`. See [`task_of_prefix`] for why no two tasks'
    /// ranges overlap.
    fn prefix(task: &str) -> Vec<u8> {
        format!("{}/", task.replace('/', "%2F")).into_bytes()
    }

    fn own_key(task: &str, lease: i64) -> Vec<u8> {
        let mut key = Self::prefix(task);
        key.extend_from_slice(format!("{lease:x}").as_bytes());
        key
    }

    fn parse_lease_id(id: &str) -> Option<i64> {
        i64::from_str_radix(id, 16).ok().filter(|v| *v > 0)
    }

    /// Grants a lease of `ttl` rounded up to whole seconds; returns (id, granted secs).
    fn grant(&mut self, ttl: Duration, deadline: Instant) -> Result<(i64, i64), AcquireError> {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let secs = i64::try_from(secs.max(1))
            .map_err(|_| AcquireError::Rejected(format!("ttl {ttl:?} is too long")))?;
        let sent = Instant::now();
        let r: LeaseGrantResponse = self
            .gw
            .call(
                "/v3/lease/grant",
                &LeaseGrantRequest { ttl: secs },
                deadline,
            )
            .map_err(|e| self.first_call_error("etcd lease grant", e, deadline))?;
        if !r.error.is_empty() || r.id <= 0 || r.ttl <= 0 {
            return Err(AcquireError::Transient(Failure::new(
                FailureKind::Malformed,
                format!(
                    "etcd lease grant gave no lease (id {}, ttl {}): {}",
                    r.id, r.ttl, r.error
                ),
            )));
        }
        self.clock.extend(r.id, sent, r.ttl);
        Ok((r.id, r.ttl))
    }

    /// A failure of the first call of an acquire. A call that failed without
    /// timing out may have reached a port of the other scheme (`etcd://` to
    /// a TLS port or the reverse): one bounded probe names that cause
    /// instead of "unreachable".
    fn first_call_error(&self, what: &str, e: CallError, deadline: Instant) -> AcquireError {
        if let CallError::Transient(f) = &e {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(1));
            let (scheme, hint) = if self.gw.tls() {
                ("https", "etcd speaks plain HTTP there: use etcd://")
            } else {
                ("http", "etcd speaks TLS there: use etcds://")
            };
            if f.kind != FailureKind::Timeout
                && self.gw.endpoints().iter().any(|ep| {
                    super::transport::other_scheme_answers(&format!("{scheme}://{ep}"), left)
                })
            {
                return AcquireError::Trust(format!("TLS: {what}: {f} ({hint})"));
            }
        }
        acquire_error(what, e)
    }

    /// Puts our key (if not there yet) and reads the queue's head, in one txn.
    fn enqueue(
        &mut self,
        task: &str,
        holder: &str,
        lease: i64,
        deadline: Instant,
    ) -> Result<Enqueued, CallError> {
        let key = Self::own_key(task, lease);
        let prefix = Self::prefix(task);
        let txn = TxnRequest {
            compare: vec![Compare {
                key: wire::b64(&key),
                result: "EQUAL",
                target: "CREATE",
                create_revision: 0,
            }],
            success: vec![
                RequestOp::Put(PutRequest {
                    key: wire::b64(&key),
                    value: wire::b64(holder.as_bytes()),
                    lease,
                }),
                RequestOp::Range(RangeRequest::first_created(&prefix)),
            ],
            failure: vec![
                RequestOp::Range(RangeRequest::key(&key)),
                RequestOp::Range(RangeRequest::first_created(&prefix)),
            ],
        };
        let r: TxnResponse = self.gw.call("/v3/kv/txn", &txn, deadline)?;
        let create_rev = if r.succeeded {
            r.header.revision
        } else {
            // Our key already existed: an earlier attempt of this txn landed.
            r.range(0)
                .and_then(|rr| rr.kvs.first())
                .map(|kv| kv.create_revision)
                .unwrap_or(0)
        };
        let owner_range = r.range(1);
        if create_rev <= 0 || r.header.revision <= 0 || owner_range.is_none() {
            return Err(CallError::Transient(lacks_reads()));
        }
        Ok(Enqueued {
            create_rev,
            revision: r.header.revision,
            owner: owner_range.and_then(|rr| rr.kvs.first().cloned()),
        })
    }

    fn keepalive(&mut self, lease: i64, deadline: Instant) -> Result<i64, KeepAliveError> {
        let sent = Instant::now();
        match self.gw.call::<_, KeepAliveStreamItem>(
            "/v3/lease/keepalive",
            &LeaseIdRequest { id: lease },
            deadline,
        ) {
            Ok(KeepAliveStreamItem {
                result: Some(r), ..
            }) => {
                if r.ttl > 0 {
                    self.clock.extend(lease, sent, r.ttl);
                    Ok(r.ttl)
                } else {
                    Err(KeepAliveError::Gone(
                        RefusalReason::Expired,
                        format!("etcd lease {lease:x} is gone (expired or revoked)"),
                    ))
                }
            }
            Ok(KeepAliveStreamItem { error: Some(e), .. }) if e.code == wire::GRPC_NOT_FOUND => {
                Err(KeepAliveError::Gone(
                    RefusalReason::UnknownLease,
                    format!("etcd: {}", e.message),
                ))
            }
            Ok(KeepAliveStreamItem { error, .. }) => {
                Err(KeepAliveError::NoResult(error.map(|e| e.message)))
            }
            Err(CallError::Status { status, .. }) if status.code == wire::GRPC_NOT_FOUND => {
                Err(KeepAliveError::Gone(
                    RefusalReason::UnknownLease,
                    format!("etcd: {}", status.message),
                ))
            }
            Err(e) => {
                if e.is_trust() {
                    log::error!(
                        "etcd keepalive of lease {lease:x}: {e} (retried until the local deadline)"
                    );
                }
                Err(KeepAliveError::Call(e))
            }
        }
    }

    /// Revokes a lease; `Ok(false)` when etcd no longer knew it.
    fn revoke_lease(&mut self, lease: i64, deadline: Instant) -> Result<bool, CallError> {
        match self.gw.call::<_, serde_json::Value>(
            "/v3/lease/revoke",
            &LeaseIdRequest { id: lease },
            deadline,
        ) {
            Ok(_) => {
                self.clock.forget(lease);
                Ok(true)
            }
            Err(CallError::Status { status, .. }) if status.code == wire::GRPC_NOT_FOUND => {
                self.clock.forget(lease);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Seconds the lease has left (`/v3/lease/timetolive`), if etcd says.
    fn time_to_live(&mut self, lease: i64, deadline: Instant) -> Option<i64> {
        self.gw
            .call::<_, wire::TimeToLiveResponse>(
                "/v3/lease/timetolive",
                &LeaseIdRequest { id: lease },
                deadline,
            )
            .ok()
            .map(|r| r.ttl)
            .filter(|t| *t >= 0)
    }

    /// Best effort, within the deadline: a lease we cannot revoke expires by
    /// itself after its ttl.
    fn revoke_quietly(&mut self, lease: i64, deadline: Instant) {
        if let Err(e) = self.revoke_lease(lease, deadline) {
            log::warn!("etcd: could not revoke lease {lease:x} (it expires by itself): {e}");
        }
    }

    fn describe_holder(kv: &KeyValue) -> String {
        let value = kv.value_bytes();
        if value.is_empty() {
            // `etcdctl lock` records no holder: name the key.
            format!("etcd key {}", String::from_utf8_lossy(&kv.key_bytes()))
        } else {
            String::from_utf8_lossy(&value).into_owned()
        }
    }

    fn check_request(req: &AcquireRequest) -> Result<(), AcquireError> {
        if req.on_expiry != ExpiryPolicy::Redispatch {
            return Err(AcquireError::Rejected(format!(
                "etcd frees a task as soon as its lease expires: --on-expiry {} is not available with etcd (use redispatch)",
                req.on_expiry.as_str()
            )));
        }
        if req.task.is_empty() {
            return Err(AcquireError::Rejected("empty task name".into()));
        }
        Ok(())
    }

    fn grant_of(task: &str, lease: i64, token: i64, ttl_secs: i64) -> Result<Grant, Failure> {
        let token = u64::try_from(token).map_err(|_| {
            Failure::new(
                FailureKind::Malformed,
                format!("etcd gave revision {token}"),
            )
        })?;
        Ok(Grant {
            lease_id: format!("{lease:x}"),
            task: task.to_string(),
            token,
            ttl: Duration::from_secs(ttl_secs.unsigned_abs()),
        })
    }

    /// Takes a place in the queue for `req.task`: grant + txn. Returns the
    /// grant if we are first, else keeps the place in `self.queued` and
    /// returns the current owner.
    fn take_place(
        &mut self,
        req: &AcquireRequest,
        deadline: Instant,
    ) -> Result<Result<Grant, KeyValue>, AcquireError> {
        let (lease, ttl_secs) = self.grant(req.ttl, deadline)?;
        let q = match self.enqueue(&req.task, &req.holder, lease, deadline) {
            Ok(q) => q,
            Err(e) => {
                self.revoke_quietly(lease, deadline);
                return Err(acquire_error("etcd txn", e));
            }
        };
        match q.owner {
            Some(owner) if owner.create_revision != q.create_rev => {
                self.queued = Some(Queued {
                    task: req.task.clone(),
                    lease,
                    ttl_secs,
                    key: Self::own_key(&req.task, lease),
                    create_rev: q.create_rev,
                    last_keepalive: Instant::now(),
                });
                Ok(Err(owner))
            }
            // Our key is the first (or, racing a revoke, the only) one.
            _ => Self::grant_of(&req.task, lease, q.revision, ttl_secs)
                .map(Ok)
                .map_err(AcquireError::Transient),
        }
    }

    /// `--wait`: keeps or takes a place in the queue and polls it until the
    /// task is ours or `wait_end` passes (see the module docs).
    fn wait_in_queue(
        &mut self,
        req: &AcquireRequest,
        wait_end: Instant,
        timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        self.resume_place(req, timeout)?;
        let mut last_owner: Option<KeyValue> = None;
        loop {
            let step = match self.queued.is_some() {
                false => self.queue_again(req, Instant::now() + timeout)?,
                true => self.poll_place(req, timeout),
            };
            let last_error = match step {
                Step::Granted(grant) => return Ok(grant),
                Step::PlaceLost => continue,
                Step::Behind(owner) => {
                    last_owner = owner.or(last_owner);
                    None
                }
                Step::Failed(e) => {
                    log::debug!("etcd: waiting for {}: {e}", req.task);
                    Some(e)
                }
            };
            let now = Instant::now();
            if now >= wait_end {
                return Err(match last_error {
                    Some(e) => AcquireError::Transient(e),
                    None => AcquireError::Held {
                        holder: last_owner
                            .as_ref()
                            .map(Self::describe_holder)
                            .unwrap_or_else(|| "another etcd client".into()),
                        // Our place in the queue is kept: call again at once.
                        retry_after: Some(Duration::ZERO),
                    },
                });
            }
            std::thread::sleep(WAIT_POLL.min(wait_end - now));
        }
    }

    /// A place kept from an earlier call: for this task, refresh its lease
    /// first, so that whatever this call returns, the lease was renewed
    /// after the caller started counting the ttl; for another task, give it up.
    fn resume_place(
        &mut self,
        req: &AcquireRequest,
        timeout: Duration,
    ) -> Result<(), AcquireError> {
        if self.queued.as_ref().is_some_and(|q| q.task != req.task) {
            self.abandon_wait(timeout);
        }
        if let Some(lease) = self.queued.as_ref().map(|q| q.lease) {
            self.refresh_queued(lease, Instant::now() + timeout)
                .map_err(|e| AcquireError::Transient(e.failure()))?;
        }
        Ok(())
    }

    /// No place (first call, or it was lost): grant + enqueue. TLS,
    /// credential and request errors end the wait; others are retried.
    fn queue_again(
        &mut self,
        req: &AcquireRequest,
        deadline: Instant,
    ) -> Result<Step, AcquireError> {
        match self.take_place(req, deadline) {
            Ok(Ok(grant)) => Ok(Step::Granted(grant)),
            Ok(Err(owner)) => Ok(Step::Behind(Some(owner))),
            Err(e @ (AcquireError::Rejected(_) | AcquireError::Trust(_))) => Err(e),
            Err(AcquireError::Transient(f)) => Ok(Step::Failed(f)),
            // A place is never refused as held (take_place says who is
            // ahead instead); kept apart only for the match.
            Err(e @ (AcquireError::Held { .. } | AcquireError::HeldForOperator { .. })) => Ok(
                Step::Failed(Failure::new(FailureKind::Other, e.to_string())),
            ),
        }
    }

    /// One look at our place: keepalive if due, then one read at one
    /// revision of the waiter just ahead of us, our own key, and the owner.
    fn poll_place(&mut self, req: &AcquireRequest, timeout: Duration) -> Step {
        let Some(q) = self.queued.as_ref() else {
            return Step::PlaceLost;
        };
        let (lease, ttl_secs, create_rev, key) = (q.lease, q.ttl_secs, q.create_rev, q.key.clone());
        let keepalive_due =
            q.last_keepalive.elapsed() >= Duration::from_secs(ttl_secs.unsigned_abs()) / 3;
        if keepalive_due {
            match self.refresh_queued(lease, Instant::now() + timeout) {
                Ok(true) => {}
                Ok(false) => return Step::PlaceLost,
                // Retried at the next poll (last_keepalive unchanged).
                Err(m) => log::debug!("etcd: {m}"),
            }
        }
        let prefix = Self::prefix(&req.task);
        let txn = TxnRequest {
            compare: vec![],
            success: vec![
                RequestOp::Range(RangeRequest::last_created_up_to(&prefix, create_rev - 1)),
                RequestOp::Range(RangeRequest::key(&key)),
                RequestOp::Range(RangeRequest::first_created(&prefix)),
            ],
            failure: vec![],
        };
        let r = match self
            .gw
            .call::<_, TxnResponse>("/v3/kv/txn", &txn, Instant::now() + timeout)
        {
            Ok(r) => r,
            Err(e) => return Step::Failed(e.into_failure()),
        };
        let (Some(ahead), Some(own)) = (r.range(0), r.range(1)) else {
            return Step::Failed(lacks_reads());
        };
        if !place_held(own.kvs.first(), lease, create_rev) {
            log::info!("etcd: our queued key vanished; queueing again");
            self.queued = None;
            return Step::PlaceLost;
        }
        if ahead.kvs.is_empty() && r.header.revision > 0 {
            self.queued = None;
            return match Self::grant_of(&req.task, lease, r.header.revision, ttl_secs) {
                Ok(g) => Step::Granted(g),
                Err(f) => Step::Failed(f),
            };
        }
        Step::Behind(r.range(2).and_then(|o| o.kvs.first().cloned()))
    }
}

/// Whether an answer of [`Waiter::acquire_wait`] that is not a grant keeps
/// the queued place for the next call.
///
/// "Still queued" does, and so does a transient failure: `--wait` waits
/// through the authority's failures (an etcd leader change answers 503 or
/// times out for a second or two) and asks again, and giving the place up
/// there sent the waiter to the back of the queue, behind waiters that
/// queued after it. The agent calls [`Waiter::abandon_wait`] on every way
/// out of its wait, so no phantom waiter is left ahead of others. A refusal
/// of the request, a TLS or credential problem (etcd RBAC taking our read
/// permission: no leader change fixes that), or any other answer gives it up.
fn keeps_place(answer: &Result<Grant, AcquireError>) -> bool {
    match answer {
        Err(AcquireError::Held {
            retry_after: Some(r),
            ..
        }) => r.is_zero(),
        Err(AcquireError::Transient(f)) => {
            !matches!(f.kind, FailureKind::Trust(_) | FailureKind::Denied)
        }
        _ => false,
    }
}

/// Whether a read of our own queue key shows our place still there: the
/// key exists, was created at our place's revision and carries our lease.
/// Only a linearizable read that says otherwise gives the place up.
fn place_held(own: Option<&KeyValue>, lease: i64, create_rev: i64) -> bool {
    own.is_some_and(|kv| kv.create_revision == create_rev && kv.lease == lease)
}

/// The largest listing read (`leaseagent leases`).
const LISTING_LIMIT: u64 = 64 << 20;

fn operator_error(e: CallError) -> OperatorError {
    OperatorError::Failed(e.into_failure())
}

/// An answer to a txn without the reads it asked for.
fn lacks_reads() -> Failure {
    Failure::new(
        FailureKind::Malformed,
        "etcd txn answer lacks the expected reads",
    )
}

impl KeepAliveError {
    /// A keepalive that did not refuse: transient, of its call's kind.
    fn failure(&self) -> Failure {
        let kind = match self {
            KeepAliveError::Call(e) => e.clone().into_failure().kind,
            KeepAliveError::NoResult(_) => FailureKind::Malformed,
            KeepAliveError::Gone(..) => FailureKind::Other,
        };
        Failure::new(kind, self.to_string())
    }
}

/// Splits a lock key `<prefix>/<lease id in hex>` into the prefix (with its
/// `/`) and the lease id.
fn lock_key(key: &[u8]) -> Option<(&[u8], i64)> {
    let slash = key.iter().rposition(|b| *b == b'/')?;
    let (prefix, hex) = key.split_at(slash + 1);
    if hex.is_empty() || hex.len() > 16 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let id = i64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
    Some((prefix, id))
}

/// The task whose queue uses `prefix` (the inverse of
/// `EtcdAuthority::prefix`).
///
/// Why the ranges of two tasks never overlap: a task without `/` uses
/// `<task>/`, and its keys are `<task>/<hex>`. A task with `/` writes each
/// `/` as `%2F` (`%` is not allowed in task names), so its prefix contains no
/// `/` but the last one, and cannot start with `<other>/` for any task name
/// `<other>`; and two different tasks never share an encoded prefix. A key
/// `etcdctl lock a/b` makes (`a/b/<hex>`) is still inside `a/`'s range, as
/// it is for `etcdctl lock` itself: names with `/` interoperate with
/// leaseagent only, not with `etcdctl lock`.
fn task_of_prefix(prefix: &[u8]) -> Option<String> {
    let p = std::str::from_utf8(prefix).ok()?.strip_suffix('/')?;
    if p.is_empty() {
        return None;
    }
    Some(p.replace("%2F", "/"))
}

/// A failed call at acquire: TLS and credential problems are final (exit
/// 125 naming the cause), everything else transient.
fn acquire_error(what: &str, e: CallError) -> AcquireError {
    if e.is_trust() {
        AcquireError::Trust(e.to_string())
    } else {
        AcquireError::Transient(e.into_failure().context(what))
    }
}

impl LeaseClient for EtcdAuthority {
    fn url(&self) -> String {
        let scheme = if self.gw.tls() { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.gw.endpoints().join(","))
    }

    fn acquire(&mut self, req: &AcquireRequest, timeout: Duration) -> Result<Grant, AcquireError> {
        Self::check_request(req)?;
        let deadline = Instant::now() + timeout;
        self.abandon_wait(timeout);
        match self.take_place(req, deadline)? {
            Ok(grant) => Ok(grant),
            Err(owner) => {
                // No waiting: leave the queue at once (like `etcdctl lock`'s
                // TryLock) so our key never becomes a phantom owner.
                if let Some(q) = self.queued.take() {
                    self.revoke_quietly(q.lease, deadline);
                }
                Err(AcquireError::Held {
                    holder: Self::describe_holder(&owner),
                    retry_after: None,
                })
            }
        }
    }

    fn renew(&mut self, lease: &LeaseRef, timeout: Duration) -> Result<Renewed, RenewError> {
        let deadline = Instant::now() + timeout;
        let Some(id) = Self::parse_lease_id(&lease.lease_id) else {
            return Err(RenewError::Refused {
                reason: RefusalReason::UnknownLease,
                message: format!("`{}` is not an etcd lease id", lease.lease_id),
            });
        };
        let ttl = match self.keepalive(id, deadline) {
            Ok(ttl) => ttl,
            Err(KeepAliveError::Gone(reason, message)) => {
                return Err(RenewError::Refused { reason, message });
            }
            Err(e) => return Err(RenewError::Transient(e.failure())),
        };
        let renewed = Renewed {
            ttl: Duration::from_secs(ttl.unsigned_abs()),
        };
        let key = Self::own_key(&lease.task, id);
        match self
            .gw
            .call::<_, RangeResponse>("/v3/kv/range", &RangeRequest::key(&key), deadline)
        {
            Ok(r) => match r.kvs.first() {
                None => Err(RenewError::Refused {
                    reason: RefusalReason::Revoked,
                    message: format!("etcd key {} was deleted", String::from_utf8_lossy(&key)),
                }),
                Some(kv)
                    if kv.lease != id
                        || u64::try_from(kv.create_revision).map_or(true, |c| c > lease.token) =>
                {
                    Err(RenewError::Refused {
                        reason: RefusalReason::Superseded,
                        message: format!(
                            "etcd key {} was recreated (create revision {}, lease {:x})",
                            String::from_utf8_lossy(&key),
                            kv.create_revision,
                            kv.lease
                        ),
                    })
                }
                Some(_) => Ok(renewed),
            },
            // The keepalive did extend the lease; the key check runs again
            // at the next heartbeat.
            Err(e) => {
                log::warn!("etcd: lease renewed but key check failed: {e}");
                Ok(renewed)
            }
        }
    }

    fn release(
        &mut self,
        lease: &LeaseRef,
        outcome: Outcome,
        exit_code: Option<i32>,
        timeout: Duration,
    ) -> Result<(), RenewError> {
        let deadline = Instant::now() + timeout;
        let Some(id) = Self::parse_lease_id(&lease.lease_id) else {
            return Err(RenewError::Refused {
                reason: RefusalReason::UnknownLease,
                message: format!("`{}` is not an etcd lease id", lease.lease_id),
            });
        };
        log::debug!(
            "etcd: releasing lease {id:x} of {} ({}, exit {exit_code:?}); etcd keeps no outcome",
            lease.task,
            outcome.as_str()
        );
        // Nothing to revoke once the lease has run out by our own clock, and
        // no release is worth waiting past that point (a lost lease on an
        // unreachable etcd must not hold up the agent's exit).
        let deadline = match self.clock.runs_out(id) {
            Some(out) if out <= Instant::now() => {
                self.clock.forget(id);
                return Err(RenewError::Refused {
                    reason: RefusalReason::Expired,
                    message: format!(
                        "etcd lease {id:x} has run out by the agent's clock; nothing to revoke"
                    ),
                });
            }
            Some(out) => deadline.min(out),
            None => deadline,
        };
        match self.revoke_lease(id, deadline) {
            Ok(true) => Ok(()),
            Ok(false) => Err(RenewError::Refused {
                reason: RefusalReason::UnknownLease,
                message: format!("etcd lease {id:x} was already gone"),
            }),
            Err(e) => Err(RenewError::Transient(
                e.into_failure().context("etcd lease revoke"),
            )),
        }
    }

    /// The renewer gets the gateway the grant came over (its connection
    /// kept alive, its login and its endpoint cursor); this handle, which
    /// releases, starts a new one. Both share the lease clock.
    fn renewer(&mut self) -> Box<dyn Renewer> {
        let fresh = Gateway::with_trust(
            self.gw.endpoints().to_vec(),
            self.gw.tls(),
            self.gw.trust().clone(),
        );
        Box::new(Renewing(EtcdAuthority {
            gw: std::mem::replace(&mut self.gw, fresh),
            queued: None,
            clock: self.clock.clone(),
        }))
    }

    fn waiter(&mut self) -> Option<Box<dyn Waiter + '_>> {
        Some(Box::new(self))
    }

    fn operator(&mut self) -> Option<Box<dyn Operator + '_>> {
        Some(Box::new(self))
    }
}

impl Waiter for EtcdAuthority {
    fn acquire_wait(
        &mut self,
        req: &AcquireRequest,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        Self::check_request(req)?;
        let answer = self.wait_in_queue(req, Instant::now() + wait, timeout);
        if answer.is_err() && !keeps_place(&answer) {
            self.abandon_wait(timeout);
        }
        answer
    }

    fn abandon_wait(&mut self, timeout: Duration) {
        if let Some(q) = self.queued.take() {
            self.revoke_quietly(q.lease, Instant::now() + timeout);
        }
    }
}

impl Operator for EtcdAuthority {
    /// Every lock key in etcd (`<prefix>/<own lease id in hex>`, held by
    /// that lease: leaseagent's and `etcdctl lock`'s), one row per key: the
    /// first created of a task is `active`, the others `waiting` in queue
    /// order. The token shown is the key's create revision: the holder's
    /// `LEASE_TOKEN` when it got the task without waiting, a lower bound of
    /// it otherwise (etcd does not record the revision ownership was
    /// confirmed at).
    fn leases(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, OperatorError> {
        let deadline = Instant::now() + timeout;
        let all: RangeResponse = self
            .gw
            .call_limited(
                "/v3/kv/range",
                &RangeRequest::everything(),
                deadline,
                LISTING_LIMIT,
            )
            .map_err(operator_error)?;
        let mut tasks: std::collections::BTreeMap<String, Vec<KeyValue>> = Default::default();
        for kv in all.kvs {
            let key = kv.key_bytes();
            if let Some((prefix, lease)) = lock_key(&key) {
                if lease == kv.lease && lease > 0 {
                    if let Some(task) = task_of_prefix(prefix) {
                        tasks.entry(task).or_default().push(kv);
                    }
                }
            }
        }
        let mut out = Vec::new();
        for (task, mut kvs) in tasks {
            kvs.sort_by_key(|kv| kv.create_revision);
            for (i, kv) in kvs.iter().enumerate() {
                let ttl = self.time_to_live(kv.lease, deadline);
                out.push(LeaseInfo {
                    task: task.clone(),
                    lease_id: format!("{:x}", kv.lease),
                    token: u64::try_from(kv.create_revision).unwrap_or(0),
                    holder: Self::describe_holder(kv),
                    // etcd does not record which user put a key.
                    principal: String::new(),
                    state: if i == 0 {
                        LeaseState::Active
                    } else {
                        LeaseState::Waiting
                    },
                    expires_in_ms: ttl.map(|s| s.unsigned_abs() * 1000),
                });
            }
        }
        Ok(out)
    }

    /// Revokes the etcd lease of the task's current holder: etcd deletes its
    /// key at once, the holder is refused at its next renewal and the next
    /// waiter (if any) gets the task. `force` changes nothing: etcd frees
    /// the task at once either way.
    fn revoke(
        &mut self,
        task: &str,
        _force: bool,
        timeout: Duration,
    ) -> Result<Revoked, OperatorError> {
        let deadline = Instant::now() + timeout;
        let prefix = Self::prefix(task);
        let r: RangeResponse = self
            .gw
            .call(
                "/v3/kv/range",
                &RangeRequest::first_created(&prefix),
                deadline,
            )
            .map_err(operator_error)?;
        let Some(owner) = r.kvs.first() else {
            return Err(OperatorError::NotFound(format!(
                "no lease on task {task} in etcd"
            )));
        };
        if owner.lease <= 0 {
            return Err(OperatorError::Failed(Failure::new(
                FailureKind::Other,
                format!(
                    "etcd key {} has no lease; delete it with etcdctl del",
                    String::from_utf8_lossy(&owner.key_bytes())
                ),
            )));
        }
        match self.revoke_lease(owner.lease, deadline) {
            Ok(true) => Ok(Revoked::Now),
            Ok(false) => Err(OperatorError::NotFound(format!(
                "the lease on task {task} was already gone"
            ))),
            Err(e) => Err(operator_error(e)),
        }
    }

    /// etcd keeps no run history: a lock key is deleted when its holder
    /// releases or its lease expires, and etcd compacts old revisions, so
    /// nothing records who held a task, how it ended or with what outcome.
    fn history(
        &mut self,
        _task: Option<&str>,
        _since_ms: u64,
        _timeout: Duration,
    ) -> Result<Vec<Attempt>, OperatorError> {
        Err(OperatorError::Unsupported(
            "etcd keeps no run history: a lock key is deleted when its holder releases it or its lease expires (and etcd compacts old revisions), so nothing records who held a task or how it ended; use `leaseagent serve` or the embedded authority for history".into(),
        ))
    }

    /// etcd has no held-for-operator state: it frees a task as soon as its
    /// lease expires. There is never anything to clear (exit 1).
    fn clear(&mut self, task: &str, _timeout: Duration) -> Result<(), OperatorError> {
        Err(OperatorError::NotFound(format!(
            "etcd keeps no task held for an operator (it frees {task} when its lease expires): nothing to clear"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_etcdctl_lock() {
        assert_eq!(
            EtcdAuthority::own_key("x", 0x694d7d9d1c6b5a0b),
            b"x/694d7d9d1c6b5a0b"
        );
        assert_eq!(
            EtcdAuthority::parse_lease_id("694d7d9d1c6b5a0b"),
            Some(0x694d7d9d1c6b5a0b)
        );
        assert_eq!(EtcdAuthority::parse_lease_id("zz"), None);
        assert_eq!(EtcdAuthority::parse_lease_id("0"), None);
    }

    #[test]
    fn task_ranges_never_overlap() {
        // Without `/`: exactly `etcdctl lock`'s keys.
        assert_eq!(EtcdAuthority::prefix("a"), b"a/");
        assert_eq!(EtcdAuthority::own_key("a/b", 0x1f), b"a%2Fb/1f");
        let tasks = ["a", "a/b", "a/b/c", "ab", "a:b", "a.b/c", "b/a"];
        for t in tasks {
            let (start, end) = (
                EtcdAuthority::prefix(t),
                wire::prefix_end(&EtcdAuthority::prefix(t)),
            );
            for u in tasks.iter().filter(|u| **u != t) {
                let k = EtcdAuthority::own_key(u, 0x694d7d9d1c6b5a0b);
                assert!(
                    !(k >= start && k < end),
                    "{u}'s key {} is in {t}'s range",
                    String::from_utf8_lossy(&k)
                );
            }
            assert_eq!(
                task_of_prefix(&EtcdAuthority::prefix(t)).as_deref(),
                Some(t)
            );
        }
    }

    #[test]
    fn lock_keys_are_prefix_and_own_lease() {
        assert_eq!(lock_key(b"a/1f"), Some((&b"a/"[..], 0x1f)));
        assert_eq!(
            lock_key(b"a%2Fb/694d7d9d1c6b5a0b").map(|(_, l)| l),
            Some(0x694d7d9d1c6b5a0b)
        );
        assert_eq!(lock_key(b"a/b/zz"), None);
        assert_eq!(lock_key(b"noslash"), None);
        assert_eq!(lock_key(b"a/"), None);
    }

    #[test]
    fn a_transient_failure_keeps_the_queued_place() {
        let held = |r| {
            Err(AcquireError::Held {
                holder: "h".into(),
                retry_after: r,
            })
        };
        assert!(keeps_place(&held(Some(Duration::ZERO))));
        // The review's case: a leader change answered 503 at the end of a
        // slice, and the waiter was sent to the back of the queue.
        assert!(keeps_place(&Err(AcquireError::Transient(Failure::new(
            FailureKind::Status(503),
            "etcdserver: leader changed",
        )))));
        assert!(keeps_place(&Err(AcquireError::Transient(Failure::new(
            FailureKind::Timeout,
            "timed out",
        )))));
        assert!(!keeps_place(&Err(AcquireError::Transient(Failure::new(
            FailureKind::Denied,
            "permission denied",
        )))));
        assert!(!keeps_place(&held(None)));
        assert!(!keeps_place(&held(Some(Duration::from_secs(1)))));
        assert!(!keeps_place(&Err(AcquireError::Rejected("r".into()))));
        assert!(!keeps_place(&Err(AcquireError::Trust("t".into()))));
    }

    #[test]
    fn the_place_is_held_only_by_our_key() {
        let kv = |create_revision, lease| KeyValue {
            create_revision,
            lease,
            ..Default::default()
        };
        assert!(place_held(Some(&kv(7, 0x1f)), 0x1f, 7));
        // Gone, recreated later (a new place at the back), or another lease's.
        assert!(!place_held(None, 0x1f, 7));
        assert!(!place_held(Some(&kv(9, 0x1f)), 0x1f, 7));
        assert!(!place_held(Some(&kv(7, 0x2f)), 0x1f, 7));
    }

    #[test]
    fn refuses_policies_etcd_cannot_keep() {
        let req = AcquireRequest {
            task: "t".into(),
            holder: "h".into(),
            ttl: Duration::from_secs(5),
            on_expiry: ExpiryPolicy::Hold,
            grace: Duration::ZERO,
        };
        assert!(matches!(
            EtcdAuthority::check_request(&req),
            Err(AcquireError::Rejected(_))
        ));
    }
}
