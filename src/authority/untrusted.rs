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
//! - a lease id is 1..=128 characters of `[A-Za-z0-9._:/+=-]`, else the
//!   answer is malformed (it is echoed to the job's environment and to the
//!   authority on every renewal);
//! - every string that reaches a log line or a terminal goes through
//!   [`escape`], so a holder name with a newline cannot forge a log line and
//!   an ESC cannot drive the terminal.

use std::time::Duration;

/// The largest token accepted: what `serve` (SQLite INTEGER) can store.
pub const MAX_TOKEN: u64 = i64::MAX as u64;

/// The longest lease id accepted.
pub const MAX_LEASE_ID: usize = 128;

/// The longest string from an authority printed whole; longer ones are cut.
const MAX_PRINTED: usize = 512;

/// `s` made safe for one log line: control characters (newline, ESC, DEL,
/// C1 controls, ...) and backslashes become visible escapes, and very long
/// strings are cut.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_PRINTED) + 8);
    for (n, c) in s.chars().enumerate() {
        if n >= MAX_PRINTED {
            out.push_str("...");
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || is_format_trick(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// Bidirectional overrides and line/paragraph separators: they reorder or
/// break a terminal line without being control characters.
fn is_format_trick(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
}

/// The ttl the agent works with: never more than it asked for.
pub fn cap_ttl(granted: Duration, asked: Duration) -> Duration {
    granted.min(asked)
}

/// Whether a token is in the range every part of the system can hold.
pub fn token_ok(token: u64) -> bool {
    (1..=MAX_TOKEN).contains(&token)
}

/// Checks a token; the error names what was wrong.
pub fn check_token(token: u64) -> Result<u64, String> {
    if token_ok(token) {
        Ok(token)
    } else {
        Err(format!(
            "authority sent token {token}, outside 1..={MAX_TOKEN}"
        ))
    }
}

/// Checks a lease id's length and characters; the error shows it escaped.
pub fn check_lease_id(id: &str) -> Result<(), String> {
    let chars_ok = id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._:/+=-".contains(&b));
    if !id.is_empty() && id.len() <= MAX_LEASE_ID && chars_ok {
        Ok(())
    } else {
        Err(format!(
            "authority sent a malformed lease id \"{}\" (1 to {MAX_LEASE_ID} characters of A-Z a-z 0-9 . _ : / + = -)",
            escape(id)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(check_token(0).is_err());
        assert!(check_token(u64::MAX).is_err());
        assert!(check_token(MAX_TOKEN + 1).is_err());
        assert_eq!(check_token(1), Ok(1));
        assert_eq!(check_token(MAX_TOKEN), Ok(MAX_TOKEN));
    }

    #[test]
    fn lease_ids_are_checked() {
        assert!(check_lease_id("a1B2-c3_d4.e5:f6/g7+h8=").is_ok());
        assert!(check_lease_id("").is_err());
        assert!(check_lease_id(&"a".repeat(129)).is_err());
        assert!(check_lease_id("x\ny").is_err());
        assert!(check_lease_id("x y").is_err());
        let msg = check_lease_id("\u{1b}[2J").unwrap_err();
        assert!(!msg.contains('\u{1b}'));
    }
}
