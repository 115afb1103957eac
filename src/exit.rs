//! The one exit-status table of `leaseagent` (the conventions of `timeout(1)`,
//! plus 75 for a task held elsewhere). Every path out of the agent ends in one
//! of these; nothing else picks a number.
//!
//! [`TABLE`] is the table's only wording: the README's and
//! `docs/failures.md`'s tables are rendered from it ([`markdown`]; the unit
//! test `tests::the_docs_carry_the_table` holds them to it, and
//! `LEASEAGENT_BLESS=1` rewrites them), the man page's EXIT STATUS section
//! is rendered from it, and the run path's `--help` carries its one-line
//! summary (held to it by `cmd`'s tests).

/// One row of the exit-status table.
#[derive(Clone, Copy, Debug)]
pub struct Status {
    /// The status, as the table shows it (`124`, `128 + N`, …).
    pub status: &'static str,
    /// What it means in a few words, as `--help`'s one-line summary has it
    /// (which the tests hold to this table).
    #[cfg(test)]
    pub short: &'static str,
    /// When the agent exits with it.
    pub when: &'static str,
}

/// Every status the agent can exit with, in the order the docs show them.
pub const TABLE: [Status; 7] = [
    Status {
        status: "the command's own",
        #[cfg(test)]
        short: "the command's own",
        when: "the command exited by itself",
    },
    Status {
        status: "128 + N",
        #[cfg(test)]
        short: "128+N killed by signal N",
        when: "the command was killed by signal N, not by the agent",
    },
    Status {
        status: "124",
        #[cfg(test)]
        short: "124 lease lost",
        when: "the lease was lost (refused or expired) while the command ran: the agent stopped \
               it, or it ended only after the lease had already run out (the agent was paused); \
               or the grant arrived with less than `--grace` left and the command was never \
               started",
    },
    Status {
        status: "75",
        #[cfg(test)]
        short: "75 task held elsewhere",
        when: "the task is held by another holder and was not acquired (`--wait` ran out, or no \
               `--wait`)",
    },
    Status {
        status: "125",
        #[cfg(test)]
        short: "125 agent failed",
        when: "the agent failed: bad usage (flags that cannot work are refused before anything \
               is sent), authority unreachable or malformed at acquire, a TLS or credential \
               problem at acquire; or processes of the command could not be proven stopped (a \
               SIGKILL survivor, one it may not signal, a lost keeper): the lease is then left \
               to expire, never released",
    },
    Status {
        status: "126",
        #[cfg(test)]
        short: "126 cannot execute",
        when: "the command was found but could not be run",
    },
    Status {
        status: "127",
        #[cfg(test)]
        short: "127 not found",
        when: "the command was not found",
    },
];

/// The table in Markdown, as the README and `docs/failures.md` carry it
/// (checked, and rewritten on bless, by this module's tests).
#[cfg(test)]
pub fn markdown() -> String {
    let mut out = String::from("| status | when |\n|---|---|\n");
    for s in TABLE {
        out.push_str(&format!("| {} | {} |\n", s.status, s.when));
    }
    out
}

/// The table in one line, as the run path's `--help` ends (checked by
/// `cmd`'s tests).
#[cfg(test)]
pub fn summary() -> String {
    let shorts: Vec<&str> = TABLE.iter().map(|s| s.short).collect();
    format!("Exit status: {}.", shorts.join("; "))
}

/// The lease was lost while the command ran.
pub const LEASE_LOST: u8 = 124;
/// The agent itself failed (usage, authority at acquire, internal error).
pub const AGENT_FAILED: u8 = 125;
/// The command exists but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;
/// The task is held by another holder (EX_TEMPFAIL).
pub const HELD: u8 = 75;

/// How the command's leader process ended, as `wait` reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildStatus {
    Exited(i32),
    Signaled(i32),
}

impl ChildStatus {
    /// The status the agent passes on when the lease was not lost.
    pub fn passthrough(self) -> u8 {
        match self {
            ChildStatus::Exited(code) => (code & 0xff) as u8,
            ChildStatus::Signaled(sig) => (128 + (sig & 0x7f)) as u8,
        }
    }

    /// The exit code for the release call (`null` when killed by a signal).
    pub fn exit_code(self) -> Option<i32> {
        match self {
            ChildStatus::Exited(code) => Some(code),
            ChildStatus::Signaled(_) => None,
        }
    }

    pub fn success(self) -> bool {
        self == ChildStatus::Exited(0)
    }
}

impl std::fmt::Display for ChildStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildStatus::Exited(c) => write!(f, "exit code {c}"),
            ChildStatus::Signaled(s) => write!(f, "signal {s}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_constant_once() {
        for code in [LEASE_LOST, AGENT_FAILED, CANNOT_EXECUTE, NOT_FOUND, HELD] {
            let rows = TABLE
                .iter()
                .filter(|s| s.status == code.to_string())
                .count();
            assert_eq!(rows, 1, "{code} in the table");
            assert!(
                TABLE
                    .iter()
                    .any(|s| s.short.starts_with(&format!("{code} "))),
                "{code} in the summary"
            );
        }
        assert!(
            markdown()
                .lines()
                .all(|l| l.starts_with('|') && l.ends_with('|'))
        );
        assert!(
            !markdown().contains("  "),
            "no line joins with double spaces"
        );
    }

    /// The README and `docs/failures.md` carry [`markdown`] between their
    /// markers; `LEASEAGENT_BLESS=1` rewrites the blocks.
    #[test]
    fn the_docs_carry_the_table() {
        const START: &str = "<!-- exit-status: generated from src/exit.rs (LEASEAGENT_BLESS=1 cargo test --lib exit:: rewrites it) -->\n";
        const END: &str = "<!-- end of exit-status -->\n";
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for doc in ["README.md", "docs/failures.md"] {
            let path = root.join(doc);
            let text = std::fs::read_to_string(&path).unwrap();
            let from = text
                .find(START)
                .unwrap_or_else(|| panic!("{doc}: no start marker"))
                + START.len();
            let to = from
                + text[from..]
                    .find(END)
                    .unwrap_or_else(|| panic!("{doc}: no end marker"));
            if std::env::var_os("LEASEAGENT_BLESS").is_some() {
                let fresh = format!("{}{}{}", &text[..from], markdown(), &text[to..]);
                std::fs::write(&path, fresh).unwrap();
                continue;
            }
            assert_eq!(
                &text[from..to],
                markdown(),
                "{doc}'s exit-status table is not src/exit.rs's (LEASEAGENT_BLESS=1 rewrites it)"
            );
        }
    }

    #[test]
    fn passthrough_follows_shell_conventions() {
        assert_eq!(ChildStatus::Exited(3).passthrough(), 3);
        assert_eq!(ChildStatus::Exited(256 + 7).passthrough(), 7);
        assert_eq!(ChildStatus::Signaled(9).passthrough(), 137);
        assert_eq!(ChildStatus::Signaled(15).exit_code(), None);
    }
}
