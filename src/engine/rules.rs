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

use super::error::EngineError;

/// The current lease of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub token: u64,
    /// The random part of the lease id (see [`lease_id`]); empty for a lease
    /// written by an older version, which then matches no id.
    pub key: String,
    /// Who acquired it: only this principal may renew or release it
    /// (`""` when the authority has no principals).
    pub principal: String,
    pub holder: String,
    pub ttl_ms: u64,
    pub policy: ExpiryPolicy,
    pub grace_ms: u64,
    /// Boot-clock milliseconds at which the lease expires.
    pub expires_ms: u64,
    /// Revoked by an operator: the next renewal is refused, and the task is
    /// free once `expires_ms` has passed (no grace, no hold).
    pub revoked: bool,
    /// Seen expired under policy hold, and recorded so: held for an
    /// operator whatever the clock says (survives a restart of serve, which
    /// otherwise gives every lease on record a fresh ttl).
    pub held: bool,
}

/// Everything the engine keeps about one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRow {
    pub task: String,
    /// The highest token issued for the task since its row was last
    /// compacted (0: none). Only tells `superseded` from `unknown_lease`:
    /// new tokens come from the global sequence, which is above it.
    pub last_token: u64,
    pub lease: Option<Lease>,
    /// The last lease that ended early (forced revoke, cleared hold) and the
    /// refusal its holder's renewal now gets.
    pub ended: Option<(u64, RefusalReason)>,
    /// The principal whose lease `ended` is: only it is told why (see
    /// [`TaskRow::owned`]).
    pub ended_by: String,
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
        if self.held {
            return Phase::Held;
        }
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
    /// The principal acquiring (`""` without principals); it owns the lease.
    pub principal: String,
    pub holder: String,
    pub ttl_ms: u64,
    pub policy: ExpiryPolicy,
    pub grace_ms: u64,
    /// The principal's limit on live leases (serve's auth file, `max_leases`);
    /// `None`: no limit of its own.
    pub max_leases: Option<u64>,
}

/// Random bytes in a lease id's key: 128 bits, so no id can be guessed from
/// another grant's.
pub const KEY_BYTES: usize = 16;

/// A fresh random lease key (32 lowercase hex digits) from the kernel's
/// CSPRNG (`/dev/urandom`, opened once per process).
pub fn new_key() -> std::io::Result<String> {
    use std::io::Read;
    static URANDOM: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    let file = match URANDOM.get() {
        Some(f) => f,
        None => {
            let f = std::fs::File::open("/dev/urandom")?;
            URANDOM.get_or_init(|| f)
        }
    };
    let mut b = [0u8; KEY_BYTES];
    (&*file).read_exact(&mut b)?;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    Ok(b.iter()
        .flat_map(|x| [HEX[usize::from(x >> 4)], HEX[usize::from(x & 15)]])
        .map(char::from)
        .collect())
}

/// The lease id: the random key, a dot, the task. The task lets a renewal
/// be routed to its row without an index; the key is what must match.
pub fn lease_id(key: &str, task: &str) -> String {
    format!("{key}.{task}")
}

/// Splits a lease id into (key, task); `None` unless the key is 32 hex digits.
pub fn parse_lease_id(id: &str) -> Option<(&str, &str)> {
    let (key, task) = id.split_once('.')?;
    (key.len() == 2 * KEY_BYTES
        && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && !task.is_empty())
    .then_some((key, task))
}

/// The (key, task) a lease id names; an id that cannot be one of ours is
/// refused as `unknown_lease`.
pub fn task_of(id: &str) -> Result<(&str, &str), EngineError> {
    parse_lease_id(id).ok_or(EngineError::Refused(RefusalReason::UnknownLease))
}

/// A new lease's identity, chosen by the caller: the next token of the
/// global sequence and a fresh random key.
#[derive(Clone, Debug)]
pub struct NewLease {
    pub token: u64,
    pub key: String,
}

impl TaskRow {
    pub fn new(task: &str) -> Self {
        TaskRow {
            task: task.to_string(),
            last_token: 0,
            lease: None,
            ended: None,
            ended_by: String::new(),
        }
    }

    /// Records that the lease expired under policy hold (see
    /// [`Lease::held`]); true when the row changed and should be stored.
    pub fn settle(&mut self, now_ms: u64) -> bool {
        match &mut self.lease {
            Some(l) if !l.held && l.phase(now_ms) == Phase::Held => {
                l.held = true;
                true
            }
            _ => false,
        }
    }

    /// Grants the task if it is free, as lease `new` (whose token must be
    /// above every token this task ever had: the caller takes it from the
    /// global sequence).
    pub fn acquire(
        &mut self,
        spec: &AcquireSpec,
        now_ms: u64,
        new: NewLease,
    ) -> Result<(), EngineError> {
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
                        lease_id: lease_id(&l.key, &self.task),
                    });
                }
                Phase::Free => {}
            }
        }
        if new.token <= self.last_token {
            return Err(EngineError::SequenceBehind {
                task: self.task.clone(),
                next: new.token,
                last: self.last_token,
            });
        }
        self.last_token = new.token;
        self.lease = Some(Lease {
            token: new.token,
            key: new.key,
            principal: spec.principal.clone(),
            holder: spec.holder.clone(),
            ttl_ms: spec.ttl_ms,
            policy: spec.policy,
            grace_ms: spec.grace_ms,
            expires_ms: now_ms.saturating_add(spec.ttl_ms),
            revoked: false,
            held: false,
        });
        Ok(())
    }

    /// The current lease if `key` and `token` name it and `principal` owns it.
    ///
    /// No oracle: an id that is not the current lease's tells the caller
    /// why (`superseded`, `revoked`, ...) only if the task's current lease
    /// is the caller's principal's own; anyone else gets `unknown_lease`,
    /// the same answer as for a task that does not exist, so a forged id
    /// reveals neither the task nor its token. (Without principals, every
    /// caller is `""` and keeps the detailed answer.)
    fn owned(&mut self, key: &str, token: u64, principal: &str) -> Result<&mut Lease, EngineError> {
        let gone = self.gone(token);
        let mine = match (&self.lease, &self.ended) {
            (_, Some((t, _))) if *t == token => self.ended_by == principal,
            (Some(l), _) => l.principal == principal,
            (None, Some(_)) => self.ended_by == principal,
            (None, None) => principal.is_empty(),
        };
        match &mut self.lease {
            Some(l) if l.token == token && !l.key.is_empty() && l.key == key => {
                if l.principal == principal {
                    Ok(l)
                } else {
                    Err(EngineError::NotOwner {
                        task: self.task.clone(),
                    })
                }
            }
            _ if mine => Err(EngineError::Refused(gone)),
            _ => Err(EngineError::Refused(RefusalReason::UnknownLease)),
        }
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

    /// Renews the lease `key`/`token` for its owner `principal`; returns
    /// the ttl now in force.
    pub fn renew(
        &mut self,
        key: &str,
        token: u64,
        principal: &str,
        now_ms: u64,
    ) -> Result<u64, EngineError> {
        let l = self.owned(key, token, principal)?;
        if l.revoked {
            Err(EngineError::Refused(RefusalReason::Revoked))
        } else if now_ms >= l.expires_ms || l.held {
            Err(EngineError::Refused(RefusalReason::Expired))
        } else {
            l.expires_ms = now_ms.saturating_add(l.ttl_ms);
            Ok(l.ttl_ms)
        }
    }

    /// Releases the lease `key`/`token` for its owner: the task is free at
    /// once. An earlier lease's early end is forgotten too (its holder has
    /// been superseded since), so the row is empty and can be compacted.
    pub fn release(
        &mut self,
        key: &str,
        token: u64,
        principal: &str,
        now_ms: u64,
    ) -> Result<(), EngineError> {
        let l = self.owned(key, token, principal)?;
        if (now_ms >= l.expires_ms || l.held) && !l.revoked {
            // Expired: the expiry policy (grace, hold) stays in force.
            return Err(EngineError::Refused(RefusalReason::Expired));
        }
        self.lease = None;
        self.ended = None;
        self.ended_by.clear();
        Ok(())
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
            self.ended_by = std::mem::take(&mut l.principal);
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
                self.ended_by = l.principal.clone();
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
    pub fn info(&self, now_ms: u64) -> Option<LeaseInfo> {
        let l = self.lease.as_ref()?;
        let (state, expires_in_ms) = match l.phase(now_ms) {
            Phase::Active { expires_ms } => (LeaseState::Active, Some(expires_ms - now_ms)),
            Phase::Grace { free_ms } => (LeaseState::Grace, Some(free_ms - now_ms)),
            Phase::Held => (LeaseState::HeldForOperator, None),
            Phase::Free => return None,
        };
        Some(LeaseInfo {
            task: self.task.clone(),
            lease_id: lease_id(&l.key, &self.task),
            token: l.token,
            holder: l.holder.clone(),
            principal: l.principal.clone(),
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
            principal: "p".into(),
            holder: "h".into(),
            ttl_ms: 1000,
            policy,
            grace_ms: 500,
            max_leases: None,
        }
    }

    /// Grants with the next token after the row's, keyed by the token.
    fn grant(
        r: &mut TaskRow,
        policy: ExpiryPolicy,
        now: u64,
    ) -> Result<(String, u64), EngineError> {
        let token = r.last_token + 1;
        let key = format!("{token:032x}");
        r.acquire(
            &spec(policy),
            now,
            NewLease {
                token,
                key: key.clone(),
            },
        )?;
        Ok((key, token))
    }

    #[test]
    fn a_forged_id_tells_another_principal_nothing() {
        let refused = |r: Result<u64, EngineError>| match r {
            Err(EngineError::Refused(why)) => why,
            other => panic!("{other:?}"),
        };
        let mut r = TaskRow::new("t");
        let (k1, t1) = grant(&mut r, ExpiryPolicy::Redispatch, 0).unwrap();
        let (_, t2) = grant(&mut r, ExpiryPolicy::Redispatch, 2000).unwrap();
        // The owner ("p") learns its lease was superseded; anyone else,
        // whatever token it tries, gets what a missing task gives.
        assert_eq!(
            refused(r.renew(&k1, t1, "p", 2001)),
            RefusalReason::Superseded
        );
        for token in [t1, t2, t2 + 1, 0] {
            assert_eq!(
                refused(r.renew(&k1, token, "mallory", 2001)),
                RefusalReason::UnknownLease
            );
        }
        // A forced revoke: its holder is told, nobody else.
        r.revoke(true, 2001).unwrap();
        assert_eq!(refused(r.renew(&k1, t2, "p", 2002)), RefusalReason::Revoked);
        assert_eq!(
            refused(r.renew(&k1, t2, "mallory", 2002)),
            RefusalReason::UnknownLease
        );
    }

    #[test]
    fn tokens_increase_and_old_leases_are_superseded() {
        let mut r = TaskRow::new("t");
        let (k1, t1) = grant(&mut r, ExpiryPolicy::Redispatch, 0).unwrap();
        assert!(matches!(
            grant(&mut r, ExpiryPolicy::Redispatch, 10),
            Err(EngineError::Held {
                retry_after_ms: 990,
                ..
            })
        ));
        assert_eq!(r.renew(&k1, t1, "p", 999).unwrap(), 1000);
        assert!(matches!(
            r.renew(&k1, t1, "p", 2000),
            Err(EngineError::Refused(RefusalReason::Expired))
        ));
        let (k2, t2) = grant(&mut r, ExpiryPolicy::Redispatch, 2000).unwrap();
        assert!(t2 > t1);
        assert!(matches!(
            r.renew(&k1, t1, "p", 2001),
            Err(EngineError::Refused(RefusalReason::Superseded))
        ));
        assert!(matches!(
            r.renew(&k2, t2 + 1, "p", 2001),
            Err(EngineError::Refused(RefusalReason::UnknownLease))
        ));
        r.release(&k2, t2, "p", 2002).unwrap();
        assert!(matches!(
            r.renew(&k2, t2, "p", 2003),
            Err(EngineError::Refused(RefusalReason::UnknownLease))
        ));
    }

    #[test]
    fn only_the_owner_renews_or_releases_and_the_key_must_match() {
        let mut r = TaskRow::new("t");
        let (k, t) = grant(&mut r, ExpiryPolicy::Redispatch, 0).unwrap();
        assert!(matches!(
            r.renew(&k, t, "q", 10),
            Err(EngineError::NotOwner { .. })
        ));
        assert!(matches!(
            r.release(&k, t, "", 10),
            Err(EngineError::NotOwner { .. })
        ));
        let forged = format!("{:032x}", 99);
        assert!(matches!(
            r.renew(&forged, t, "p", 10),
            Err(EngineError::Refused(RefusalReason::UnknownLease))
        ));
        assert_eq!(r.info(10).unwrap().principal, "p");
        r.release(&k, t, "p", 10).unwrap();
    }

    #[test]
    fn a_token_not_above_the_tasks_last_is_refused() {
        let mut r = TaskRow::new("t");
        r.last_token = 5;
        let e = r
            .acquire(
                &spec(ExpiryPolicy::Redispatch),
                0,
                NewLease {
                    token: 5,
                    key: "k".into(),
                },
            )
            .unwrap_err();
        assert!(matches!(e, EngineError::SequenceBehind { .. }), "{e:?}");
        assert!(r.lease.is_none());
    }

    #[test]
    fn grace_and_hold() {
        let mut r = TaskRow::new("t");
        grant(&mut r, ExpiryPolicy::Grace, 0).unwrap();
        assert!(matches!(
            grant(&mut r, ExpiryPolicy::Grace, 1200),
            Err(EngineError::Held {
                retry_after_ms: 300,
                ..
            })
        ));
        assert_eq!(r.info(1200).unwrap().state, LeaseState::Grace);
        grant(&mut r, ExpiryPolicy::Hold, 1500).unwrap();
        assert!(!r.settle(2000), "still live");
        assert!(r.settle(9000), "expired under hold: recorded");
        assert!(!r.settle(9000), "recorded once");
        // Held whatever the clock says (a restart gives leases a fresh expiry).
        r.lease.as_mut().unwrap().expires_ms = u64::MAX;
        assert!(matches!(
            grant(&mut r, ExpiryPolicy::Hold, 9000),
            Err(EngineError::HeldForOperator { .. })
        ));
        assert!(r.revoke(false, 9000).is_err());
        r.clear(9000).unwrap();
        assert!(r.clear(9000).is_err());
        assert!(grant(&mut r, ExpiryPolicy::Hold, 9001).is_ok());
    }

    #[test]
    fn revoke_refuses_renewal_and_frees_after_expiry() {
        let mut r = TaskRow::new("t");
        let (k1, t1) = grant(&mut r, ExpiryPolicy::Hold, 0).unwrap();
        r.revoke(false, 10).unwrap();
        assert!(matches!(
            r.renew(&k1, t1, "p", 20),
            Err(EngineError::Refused(RefusalReason::Revoked))
        ));
        assert!(grant(&mut r, ExpiryPolicy::Hold, 500).is_err());
        assert!(grant(&mut r, ExpiryPolicy::Hold, 1000).is_ok());
        let mut r = TaskRow::new("t");
        let (k1, t1) = grant(&mut r, ExpiryPolicy::Redispatch, 0).unwrap();
        r.revoke(true, 10).unwrap();
        assert!(matches!(
            r.renew(&k1, t1, "p", 20),
            Err(EngineError::Refused(RefusalReason::Revoked))
        ));
        assert!(grant(&mut r, ExpiryPolicy::Redispatch, 20).is_ok());
        assert!(matches!(
            r.renew(&k1, t1, "p", 30),
            Err(EngineError::Refused(RefusalReason::Revoked))
        ));
    }

    #[test]
    fn lease_ids_round_trip_and_keys_are_random() {
        let k = new_key().unwrap();
        assert_eq!(k.len(), 32);
        assert_ne!(k, new_key().unwrap());
        let id = lease_id(&k, "a.b:c/d");
        assert_eq!(parse_lease_id(&id), Some((k.as_str(), "a.b:c/d")));
        assert_eq!(parse_lease_id("x"), None);
        assert_eq!(parse_lease_id("abcd.7.t"), None, "the old id format");
        assert_eq!(parse_lease_id(&format!("{}.t", "G".repeat(32))), None);
    }
}
