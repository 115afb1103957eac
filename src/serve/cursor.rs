//! The history cursor (`next_after` of `GET /v1/history`): opaque, of one
//! fixed size, and bound to the principal it was given to.
//!
//! Why sealed: a page of the history is filled by scanning attempts newest
//! first and keeping those in the caller's scope, a bounded number of rows
//! per request. When the scan stops on a row outside the scope, the next
//! page must start there, so the cursor has to carry that row's place (its
//! token), which belongs to another principal's task. Sealed with an AEAD
//! under a key made at start, the cursor tells its holder nothing (the
//! tokens of other principals were visible in it before), cannot be forged
//! or moved, and is refused (400) when used by another principal, after a
//! restart, or when it is anything else than what this server gave out.

use base64::Engine as _;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The characters of a cursor: base64url of nonce, sealed token and tag.
pub const CURSOR_LEN: usize = (NONCE_LEN + 8 + 16) * 4 / 3;

/// Seals and opens cursors under a key of this process.
pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

fn aad(principal: &str) -> Vec<u8> {
    let mut a = b"leaseagent history cursor v1\0".to_vec();
    a.extend_from_slice(principal.as_bytes());
    a
}

impl Sealer {
    /// A sealer with a fresh random key.
    pub fn new() -> std::io::Result<Self> {
        let rng = SystemRandom::new();
        let mut raw = [0u8; 32];
        rng.fill(&mut raw)
            .map_err(|_| std::io::Error::other("no random bytes for the cursor key"))?;
        let key = UnboundKey::new(&CHACHA20_POLY1305, &raw)
            .map_err(|_| std::io::Error::other("the cursor key was refused"))?;
        Ok(Sealer {
            key: LessSafeKey::new(key),
            rng,
        })
    }

    /// The cursor that resumes the history below `token`, for `principal`;
    /// `None` only if the kernel gives no random bytes.
    pub fn seal(&self, principal: &str, token: u64) -> Option<String> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut data = token.to_be_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(principal)),
                &mut data,
            )
            .ok()?;
        let mut raw = nonce.to_vec();
        raw.extend_from_slice(&data);
        Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw))
    }

    /// The token a cursor of `principal` carries; `None` for anything this
    /// server did not give that principal.
    pub fn open(&self, principal: &str, cursor: &str) -> Option<u64> {
        if cursor.len() != CURSOR_LEN {
            return None;
        }
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(cursor)
            .ok()?;
        let (nonce, sealed) = raw.split_at_checked(NONCE_LEN)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut data = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad(principal)), &mut data)
            .ok()?;
        Some(u64::from_be_bytes(<[u8; 8]>::try_from(&plain[..]).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_opaque_bound_and_unforgeable() {
        let s = Sealer::new().unwrap();
        let c = s.seal("alice", 12_345).unwrap();
        assert_eq!(c.len(), CURSOR_LEN);
        assert!(!c.contains("12345"));
        assert_eq!(s.open("alice", &c), Some(12_345));
        // Two cursors for one place differ (fresh nonce).
        assert_ne!(s.seal("alice", 12_345).unwrap(), c);
        // Another principal, another server, a flipped bit, junk: nothing.
        assert_eq!(s.open("bob", &c), None);
        assert_eq!(Sealer::new().unwrap().open("alice", &c), None);
        let mut flipped = c.clone().into_bytes();
        flipped[20] = if flipped[20] == b'A' { b'B' } else { b'A' };
        assert_eq!(s.open("alice", &String::from_utf8(flipped).unwrap()), None);
        for junk in ["", "12345", "9223372036854775808", &"A".repeat(CURSOR_LEN)] {
            assert_eq!(s.open("alice", junk), None, "{junk}");
        }
    }
}
