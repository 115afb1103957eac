//! The lease rules as pure functions over one task's record and "now".
//!
//! Both ways of running the engine (in memory under `serve`, in the shared
//! SQLite file for the embedded default) load a [`TaskRow`], apply one of
//! these functions, and store the row back. Keeping the rules free of I/O is
//! what makes the two modes agree exactly, and lets them be unit-tested
//! without clocks.
//!
//! Time is integer milliseconds on one monotonic clock (`CLOCK_BOOTTIME`):
//! the caller reads it once when the request arrives and passes it in, so a
//! lease expires `ttl` after the authority *received* the request.

use crate::lease::{ExpiryPolicy, LeaseInfo, LeaseState, RefusalReason};

use super::EngineError;

/// The current lease of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub token: u64,
    pub holder: String,
    pub ttl_ms: u64,
    pub policy: ExpiryPolicy,
    pub grace_ms: u64,
    /// Boot-clock milliseconds at which the lease expires.
    pub expires_ms: u64,
    /// Revoked by an operator: the next renewal is refused, and the task is
    /// free once `expires_ms` has passed (no grace, no hold).
    pub revoked: bool,
}

/// Everything the engine keeps about one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRow {
    pub task: String,
    /// The highest token ever issued for the task (0: none yet).
    pub last_token: u64,
    pub lease: Option<Lease>,
    /// The last lease that ended early (forced revoke, cleared hold) and the
    /// refusal its holder's renewal now gets.
    pub ended: Option<(u64, RefusalReason)>,
}

/// Where a lease stands at a given instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Live: renewable (unless revoked); acquires are told `held`.
    Active { expires_ms: u64 },
    /// Expired under policy grace: not renewable, acquires still `held`.
    Grace { free_ms: u64 },
    /// Expired under policy hold: nobody gets it until cleared.
    Held,
    /// Expired and free.
    Free,
}

impl Lease {
    pub fn phase(&self, now_ms: u64) -> Phase {
        if now_ms < self.expires_ms {
            return Phase::Active {
                expires_ms: self.expires_ms,
            };
        }
        if self.revoked {
            return Phase::Free;
        }
        match self.policy {
            ExpiryPolicy::Redispatch => Phase::Free,
            ExpiryPolicy::Grace => {
                let free_ms = self.expires_ms.saturating_add(self.grace_ms);
                if now_ms < free_ms {
                    Phase::Grace { free_ms }
                } else {
                    Phase::Free
                }
            }
            ExpiryPolicy::Hold => Phase::Held,
        }
    }
}

/// What an acquirer asks for (validated by the caller).
#[derive(Clone, Debug)]
pub struct AcquireSpec {
    pub task: String,
    pub holder: String,
    pub ttl_ms: u64,
    pub policy: ExpiryPolicy,
    pub grace_ms: u64,
}

/// The lease id names the authority instance, the token and the task, so a
/// renewal can be routed to its task without an index and an id from another
/// database (a deleted and recreated file) is never mistaken for a live one.
pub fn lease_id(instance: &str, token: u64, task: &str) -> String {
    format!("{instance}.{token}.{task}")
}

/// Splits a lease id into (instance, token, task).
pub fn parse_lease_id(id: &str) -> Option<(&str, u64, &str)> {
    let mut it = id.splitn(3, '.');
    let inst = it.next()?;
    let token = it.next()?.parse().ok()?;
    let task = it.next()?;
    Some((inst, token, task))
}

impl TaskRow {
    pub fn new(task: &str) -> Self {
        TaskRow {
            task: task.to_string(),
            last_token: 0,
            lease: None,
            ended: None,
        }
    }

    /// Grants the task if it is free; returns the new token.
    pub fn acquire(
        &mut self,
        spec: &AcquireSpec,
        now_ms: u64,
        instance: &str,
    ) -> Result<u64, EngineError> {
        if let Some(l) = &self.lease {
            match l.phase(now_ms) {
                Phase::Active { expires_ms } => {
                    return Err(EngineError::Held {
                        holder: l.holder.clone(),
                        retry_after_ms: expires_ms - now_ms,
                    });
                }
                Phase::Grace { free_ms } => {
                    return Err(EngineError::Held {
                        holder: l.holder.clone(),
                        retry_after_ms: free_ms - now_ms,
                    });
                }
                Phase::Held => {
                    return Err(EngineError::HeldForOperator {
                        holder: l.holder.clone(),
                        lease_id: lease_id(instance, l.token, &self.task),
                    });
                }
                Phase::Free => {}
            }
        }
        let token = self
            .last_token
            .checked_add(1)
            .ok_or_else(|| EngineError::Storage("token counter exhausted".into()))?;
        self.last_token = token;
        self.lease = Some(Lease {
            token,
            holder: spec.holder.clone(),
            ttl_ms: spec.ttl_ms,
            policy: spec.policy,
            grace_ms: spec.grace_ms,
            expires_ms: now_ms.saturating_add(spec.ttl_ms),
            revoked: false,
        });
        Ok(token)
    }

    /// The refusal for a lease token that is not the current live lease.
    fn gone(&self, token: u64) -> RefusalReason {
        if let Some((t, r)) = self.ended {
            if t == token {
                return r;
            }
        }
        if let Some(l) = &self.lease {
            if token < l.token {
                return RefusalReason::Superseded;
            }
        }
        if token > self.last_token {
            return RefusalReason::UnknownLease;
        }
        if token < self.last_token {
            RefusalReason::Superseded
        } else {
            RefusalReason::UnknownLease
        }
    }

    /// Renews lease `token`; returns the ttl now in force.
    pub fn renew(&mut self, token: u64, now_ms: u64) -> Result<u64, RefusalReason> {
        match &mut self.lease {
            Some(l) if l.token == token => {
                if l.revoked {
                    Err(RefusalReason::Revoked)
                } else if now_ms >= l.expires_ms {
                    Err(RefusalReason::Expired)
                } else {
                    l.expires_ms = now_ms.saturating_add(l.ttl_ms);
                    Ok(l.ttl_ms)
                }
            }
            _ => Err(self.gone(token)),
        }
    }

    /// Releases lease `token`: the task is free at once.
    pub fn release(&mut self, token: u64, now_ms: u64) -> Result<(), RefusalReason> {
        match &self.lease {
            Some(l) if l.token == token => {
                if now_ms >= l.expires_ms && !l.revoked {
                    // Expired: the expiry policy (grace, hold) stays in force.
                    return Err(RefusalReason::Expired);
                }
                self.lease = None;
                Ok(())
            }
            _ => Err(self.gone(token)),
        }
    }

    /// Operator revoke of the current live (or grace) lease.
    pub fn revoke(&mut self, force: bool, now_ms: u64) -> Result<u64, EngineError> {
        let Some(l) = &mut self.lease else {
            return Err(EngineError::NotFound(format!(
                "task `{}` has no lease",
                self.task
            )));
        };
        match l.phase(now_ms) {
            Phase::Free => {
                return Err(EngineError::NotFound(format!(
                    "task `{}` has no live lease",
                    self.task
                )));
            }
            Phase::Held => {
                return Err(EngineError::NotFound(format!(
                    "task `{}` is held for an operator: use clear",
                    self.task
                )));
            }
            Phase::Active { .. } | Phase::Grace { .. } => {}
        }
        let token = l.token;
        if force {
            self.lease = None;
            self.ended = Some((token, RefusalReason::Revoked));
        } else {
            l.revoked = true;
        }
        Ok(token)
    }

    /// Operator clear of a `held_for_operator` task.
    pub fn clear(&mut self, now_ms: u64) -> Result<u64, EngineError> {
        match &self.lease {
            Some(l) if l.phase(now_ms) == Phase::Held => {
                let token = l.token;
                self.lease = None;
                self.ended = Some((token, RefusalReason::Expired));
                Ok(token)
            }
            _ => Err(EngineError::NotFound(format!(
                "task `{}` is not held for an operator",
                self.task
            ))),
        }
    }

    /// The operator view of this task, if it has a lease that matters.
    pub fn info(&self, now_ms: u64, instance: &str) -> Option<LeaseInfo> {
        let l = self.lease.as_ref()?;
        let (state, expires_in_ms) = match l.phase(now_ms) {
            Phase::Active { expires_ms } => (LeaseState::Active, Some(expires_ms - now_ms)),
            Phase::Grace { free_ms } => (LeaseState::Grace, Some(free_ms - now_ms)),
            Phase::Held => (LeaseState::HeldForOperator, None),
            Phase::Free => return None,
        };
        Some(LeaseInfo {
            task: self.task.clone(),
            lease_id: lease_id(instance, l.token, &self.task),
            token: l.token,
            holder: l.holder.clone(),
            state,
            expires_in_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(policy: ExpiryPolicy) -> AcquireSpec {
        AcquireSpec {
            task: "t".into(),
            holder: "h".into(),
            ttl_ms: 1000,
            policy,
            grace_ms: 500,
        }
    }

    #[test]
    fn tokens_increase_and_old_leases_are_superseded() {
        let mut r = TaskRow::new("t");
        let t1 = r.acquire(&spec(ExpiryPolicy::Redispatch), 0, "i").unwrap();
        assert!(matches!(
            r.acquire(&spec(ExpiryPolicy::Redispatch), 10, "i"),
            Err(EngineError::Held {
                retry_after_ms: 990,
                ..
            })
        ));
        assert_eq!(r.renew(t1, 999), Ok(1000));
        assert_eq!(r.renew(t1, 2000), Err(RefusalReason::Expired));
        let t2 = r
            .acquire(&spec(ExpiryPolicy::Redispatch), 2000, "i")
            .unwrap();
        assert!(t2 > t1);
        assert_eq!(r.renew(t1, 2001), Err(RefusalReason::Superseded));
        assert_eq!(r.renew(t2 + 1, 2001), Err(RefusalReason::UnknownLease));
        r.release(t2, 2002).unwrap();
        assert_eq!(r.renew(t2, 2003), Err(RefusalReason::UnknownLease));
    }

    #[test]
    fn grace_and_hold() {
        let mut r = TaskRow::new("t");
        r.acquire(&spec(ExpiryPolicy::Grace), 0, "i").unwrap();
        assert!(matches!(
            r.acquire(&spec(ExpiryPolicy::Grace), 1200, "i"),
            Err(EngineError::Held {
                retry_after_ms: 300,
                ..
            })
        ));
        assert_eq!(r.info(1200, "i").unwrap().state, LeaseState::Grace);
        r.acquire(&spec(ExpiryPolicy::Hold), 1500, "i").unwrap();
        assert!(matches!(
            r.acquire(&spec(ExpiryPolicy::Hold), 9000, "i"),
            Err(EngineError::HeldForOperator { .. })
        ));
        assert!(r.revoke(false, 9000).is_err());
        r.clear(9000).unwrap();
        assert!(r.clear(9000).is_err());
        assert!(r.acquire(&spec(ExpiryPolicy::Hold), 9001, "i").is_ok());
    }

    #[test]
    fn revoke_refuses_renewal_and_frees_after_expiry() {
        let mut r = TaskRow::new("t");
        let t1 = r.acquire(&spec(ExpiryPolicy::Hold), 0, "i").unwrap();
        r.revoke(false, 10).unwrap();
        assert_eq!(r.renew(t1, 20), Err(RefusalReason::Revoked));
        assert!(r.acquire(&spec(ExpiryPolicy::Hold), 500, "i").is_err());
        assert!(r.acquire(&spec(ExpiryPolicy::Hold), 1000, "i").is_ok());
        let mut r = TaskRow::new("t");
        let t1 = r.acquire(&spec(ExpiryPolicy::Redispatch), 0, "i").unwrap();
        r.revoke(true, 10).unwrap();
        assert_eq!(r.renew(t1, 20), Err(RefusalReason::Revoked));
        assert!(r.acquire(&spec(ExpiryPolicy::Redispatch), 20, "i").is_ok());
        assert_eq!(r.renew(t1, 30), Err(RefusalReason::Revoked));
    }

    #[test]
    fn lease_ids_round_trip() {
        let id = lease_id("ab12", 7, "a.b:c/d");
        assert_eq!(parse_lease_id(&id), Some(("ab12", 7, "a.b:c/d")));
        assert_eq!(parse_lease_id("x"), None);
    }
}
