//! The one exit-status table of `leaseagent` (the conventions of `timeout(1)`,
//! plus 75 for a task held elsewhere). Every path out of the agent ends in one
//! of these; nothing else picks a number.
//!
//! | status | when |
//! |---|---|
//! | the command's own | the command exited by itself |
//! | 128 + N | the command was killed by signal N, not by the agent |
//! | 124 | the lease was lost (refused or expired) while the command ran |
//! | 75 | the task is held by another holder and was not acquired |
//! | 125 | the agent failed: bad usage, authority unreachable or malformed at acquire |
//! | 126 | the command was found but could not be run |
//! | 127 | the command was not found |

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
    fn passthrough_follows_shell_conventions() {
        assert_eq!(ChildStatus::Exited(3).passthrough(), 3);
        assert_eq!(ChildStatus::Exited(256 + 7).passthrough(), 7);
        assert_eq!(ChildStatus::Signaled(9).passthrough(), 137);
        assert_eq!(ChildStatus::Signaled(15).exit_code(), None);
    }
}
