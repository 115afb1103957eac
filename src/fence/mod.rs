//! Fenced writes at the sink: the token check and the write in one
//! transaction.
//!
//! Why this exists: the lease only bounds how long an attempt *should* run.
//! A process that was paused (SIGSTOP, a VM freeze, a GC pause, a laptop lid)
//! past its lease wakes up believing it still holds it, and nothing the agent
//! does can stop the write it was about to make. Only the sink can: every
//! write carries the attempt's fencing token (`LEASE_TOKEN`), the sink
//! remembers the highest token it ever accepted for a *partition* (the unit
//! that one task writes: an output path, a table partition, an object key),
//! and refuses anything lower. The authority issues strictly increasing
//! tokens per task, so a later grant always beats an earlier one.
//!
//! The rule ([`admit`]): a write with token `t` is accepted when no token was
//! ever recorded for the partition, or when `t >= highest`. Equal is allowed
//! so the same attempt may write twice (retries, several commits of one run).
//! On acceptance the record becomes `t` *in the same transaction* as the
//! data; a check in one step and the write in another would let a zombie
//! pass the check, pause, and write after the new holder.
//!
//! Two stores ship, both behind [`FencedStore`]:
//! - [`sqlite::SqliteStore`]: a `leaseagent_fence(partition, token)` table,
//!   read, compared and updated inside the same `BEGIN IMMEDIATE`
//!   transaction as the caller's rows. A refused write leaves no rows.
//! - [`dir::DirStore`]: files and directories under one parent directory,
//!   the highest token per entry kept in a hidden record file next to it,
//!   the check, the record and the atomic rename under one `flock`. This is
//!   what `leaseagent publish` uses.
//!
//! Invariants both keep:
//! - The record never goes down, and it is durable no later than the data.
//! - A refused write changes nothing (no rows, DEST untouched).
//! - Writers of one partition are serialized (SQLite's write lock, `flock`),
//!   so "check, then write" cannot interleave with another writer.

pub mod dir;
pub mod sqlite;

/// A write refused because a higher token was already accepted for the
/// partition: the attempt that holds `token` has been superseded by a later
/// grant and must not write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("token {token} superseded by {highest}")]
pub struct Superseded {
    /// The token the refused write carried.
    pub token: u64,
    /// The highest token the partition has accepted.
    pub highest: u64,
}

/// The fence rule: `token` may write when nothing was recorded yet or when it
/// is at least the highest recorded token.
pub fn admit(token: u64, highest: Option<u64>) -> Result<(), Superseded> {
    match highest {
        Some(h) if token < h => Err(Superseded { token, highest: h }),
        _ => Ok(()),
    }
}

/// A sink whose writes are fenced by a token per partition.
///
/// `write` runs `f` inside the store's transaction, after the fence check
/// and together with the record update: either the fence advances *and*
/// everything `f` wrote becomes visible, or nothing does. `f` returning an
/// error aborts the transaction as well.
pub trait FencedStore {
    /// What `f` writes through while the transaction is open.
    type Txn<'a>
    where
        Self: 'a;
    /// The store's error; [`FenceError::superseded`] tells a refusal apart.
    type Error: FenceError;

    /// The highest token accepted for `partition`, if any.
    fn highest(&mut self, partition: &str) -> Result<Option<u64>, Self::Error>;

    /// Checks `token` against `partition`'s fence and, in the same
    /// transaction, records it and runs `f`.
    fn write<R, E>(
        &mut self,
        partition: &str,
        token: u64,
        f: impl FnOnce(&mut Self::Txn<'_>) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<Self::Error>;
}

/// Errors of a [`FencedStore`]: anything, plus "superseded".
pub trait FenceError: std::error::Error {
    /// `Some` when the write was refused by the fence.
    fn superseded(&self) -> Option<Superseded>;
}

/// Reads `LEASE_TOKEN` as a job does: a decimal `u64`.
pub fn token_from_env() -> Result<u64, TokenEnvError> {
    match std::env::var_os(crate::lease::env::TOKEN) {
        None => Err(TokenEnvError::Unset),
        Some(v) => {
            let s = v.to_string_lossy().into_owned();
            parse_token(&s).ok_or(TokenEnvError::Malformed(s))
        }
    }
}

/// A token as the contract writes it: decimal digits only (no sign, no
/// spaces), fitting a `u64`.
pub fn parse_token(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `LEASE_TOKEN` is missing or not a decimal u64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenEnvError {
    #[error("LEASE_TOKEN is not set")]
    Unset,
    #[error("LEASE_TOKEN `{0}` is not a decimal token (0..=2^64-1)")]
    Malformed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_higher_are_admitted_lower_is_not() {
        assert_eq!(admit(1, None), Ok(()));
        assert_eq!(admit(5, Some(5)), Ok(()));
        assert_eq!(admit(6, Some(5)), Ok(()));
        let e = admit(4, Some(5)).unwrap_err();
        assert_eq!(
            e,
            Superseded {
                token: 4,
                highest: 5
            }
        );
        assert_eq!(e.to_string(), "token 4 superseded by 5");
    }

    #[test]
    fn tokens_are_strict_decimals() {
        assert_eq!(parse_token("42"), Some(42));
        assert_eq!(parse_token("18446744073709551615"), Some(u64::MAX));
        for bad in ["", "+1", "-1", " 1", "1 ", "0x10", "18446744073709551616"] {
            assert_eq!(parse_token(bad), None, "{bad:?}");
        }
    }
}
