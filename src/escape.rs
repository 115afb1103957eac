//! Text from outside made safe to print.
//!
//! Holder names, messages and lease ids come from an authority; command
//! lines come from the job's processes. Any of them may carry a newline (to
//! forge a log line), ESC (to drive the terminal) or a bidirectional
//! override (to reorder what is shown). Everything such goes through
//! [`escape`] before it reaches a log line or a terminal.

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
