//! Both ends of the keeper's two pipes, typed: what the agent asks
//! ([`Command`], one byte each on the ctl pipe) and what the keeper reports
//! ([`Report`], one line each on the report pipe).
//!
//! One definition for both processes, so the writer's `Display` and the
//! reader's `FromStr` cannot drift apart (a unit test round-trips every
//! variant). Free text (error messages, survivor command lines) is escaped
//! to one line before it is written, so a line is always one report.

use std::fmt;
use std::str::FromStr;

use crate::exit::ChildStatus;
use crate::sys::signal::Sig;

/// What the agent asks of the keeper; one byte on the ctl pipe.
///
/// EOF on the ctl pipe is not a command: it means the agent is gone, and the
/// keeper kills the whole tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Relay this signal to the members of the job's process group.
    Relay(Sig),
    /// SIGTERM to every descendant, whatever its group or session.
    Term,
    /// SIGKILL to every descendant, repeated until none is left.
    Kill,
    /// The agent is finishing: kill whatever is left (nothing, normally),
    /// then exit.
    Done,
}

impl Command {
    pub fn to_byte(self) -> u8 {
        match self {
            // Signal numbers are below every letter used here.
            Command::Relay(sig) => sig.number() as u8,
            Command::Term => b'T',
            Command::Kill => b'K',
            Command::Done => b'D',
        }
    }

    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1..=64 => Sig::from_number(i32::from(b)).map(Command::Relay),
            b'T' => Some(Command::Term),
            b'K' => Some(Command::Kill),
            b'D' => Some(Command::Done),
            _ => None,
        }
    }
}

/// Why the command could not be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpawnFailure {
    NotFound,
    Permission,
    Other,
}

impl SpawnFailure {
    fn as_str(self) -> &'static str {
        match self {
            SpawnFailure::NotFound => "not_found",
            SpawnFailure::Permission => "permission",
            SpawnFailure::Other => "other",
        }
    }
}

/// What the keeper tells the agent; one line on the report pipe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// The job runs; its process group id is its pid. `P pid`
    Started { pid: i32 },
    /// The job could not be started (or the keeper could not guard it).
    /// `E kind message`
    SpawnFailed { kind: SpawnFailure, message: String },
    /// The job's leader was reaped, at `at_ms` on the boot clock.
    /// `X exit|signal n at_ms`
    Exited { status: ChildStatus, at_ms: u64 },
    /// Every descendant is gone (and the job's cgroup, if any, is empty).
    /// `G`
    TreeGone,
    /// A process of the tree still lives after SIGKILL. `S pid command`
    Survivor { pid: i32, command: String },
    /// Something the agent should log as a warning (a failed `setsid`, no
    /// cgroup of our own). `W message`
    Warning(String),
    /// Something the agent should log as information (how the tree is
    /// stopped). `I message`
    Info(String),
}

/// One line: newlines and control characters become visible escapes.
fn one_line(s: &str) -> String {
    crate::escape::escape(s)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::Started { pid } => write!(f, "P {pid}"),
            Report::SpawnFailed { kind, message } => {
                write!(f, "E {} {}", kind.as_str(), one_line(message))
            }
            Report::Exited {
                status: ChildStatus::Exited(n),
                at_ms,
            } => write!(f, "X exit {n} {at_ms}"),
            Report::Exited {
                status: ChildStatus::Signaled(n),
                at_ms,
            } => write!(f, "X signal {n} {at_ms}"),
            Report::TreeGone => write!(f, "G"),
            Report::Survivor { pid, command } => write!(f, "S {pid} {}", one_line(command)),
            Report::Warning(m) => write!(f, "W {}", one_line(m)),
            Report::Info(m) => write!(f, "I {}", one_line(m)),
        }
    }
}

/// A line that is not a report.
#[derive(Debug, PartialEq, Eq)]
pub struct BadReport(pub String);

impl fmt::Display for BadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a keeper report: {:?}", self.0)
    }
}

impl std::error::Error for BadReport {}

impl FromStr for Report {
    type Err = BadReport;

    fn from_str(line: &str) -> Result<Self, Self::Err> {
        let bad = || BadReport(line.to_string());
        let (tag, rest) = match line.split_once(' ') {
            Some((t, r)) => (t, Some(r)),
            None => (line, None),
        };
        match (tag, rest) {
            ("P", Some(pid)) => Ok(Report::Started {
                pid: pid.parse().map_err(|_| bad())?,
            }),
            ("E", Some(rest)) => {
                let (kind, message) = rest.split_once(' ').unwrap_or((rest, ""));
                let kind = match kind {
                    "not_found" => SpawnFailure::NotFound,
                    "permission" => SpawnFailure::Permission,
                    "other" => SpawnFailure::Other,
                    _ => return Err(bad()),
                };
                Ok(Report::SpawnFailed {
                    kind,
                    message: message.to_string(),
                })
            }
            ("X", Some(rest)) => {
                let mut parts = rest.split(' ');
                let (Some(how), Some(n), Some(at), None) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    return Err(bad());
                };
                let n: i32 = n.parse().map_err(|_| bad())?;
                let at_ms: u64 = at.parse().map_err(|_| bad())?;
                let status = match how {
                    "exit" => ChildStatus::Exited(n),
                    "signal" => ChildStatus::Signaled(n),
                    _ => return Err(bad()),
                };
                Ok(Report::Exited { status, at_ms })
            }
            ("G", None) => Ok(Report::TreeGone),
            ("S", Some(rest)) => {
                let (pid, command) = rest.split_once(' ').unwrap_or((rest, ""));
                Ok(Report::Survivor {
                    pid: pid.parse().map_err(|_| bad())?,
                    command: command.to_string(),
                })
            }
            ("W", Some(m)) => Ok(Report::Warning(m.to_string())),
            ("I", Some(m)) => Ok(Report::Info(m.to_string())),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_report_round_trips() {
        let all = [
            Report::Started { pid: 42 },
            Report::SpawnFailed {
                kind: SpawnFailure::NotFound,
                message: "No such file or directory (os error 2)".into(),
            },
            Report::SpawnFailed {
                kind: SpawnFailure::Permission,
                message: "denied".into(),
            },
            Report::SpawnFailed {
                kind: SpawnFailure::Other,
                message: "x".into(),
            },
            Report::Exited {
                status: ChildStatus::Exited(3),
                at_ms: 1500,
            },
            Report::Exited {
                status: ChildStatus::Signaled(9),
                at_ms: 10,
            },
            Report::TreeGone,
            Report::Survivor {
                pid: 7,
                command: "sleep 1001".into(),
            },
            Report::Warning("cannot setsid: EPERM".into()),
            Report::Info("stopping the tree with cgroup.kill".into()),
        ];
        for r in all {
            let line = r.to_string();
            assert!(!line.contains('\n'), "{line:?}");
            assert_eq!(line.parse::<Report>(), Ok(r.clone()), "{line}");
        }
    }

    #[test]
    fn free_text_stays_on_one_line() {
        let r = Report::Survivor {
            pid: 9,
            command: "evil\nX exit 0 1\u{1b}[2J".into(),
        };
        let line = r.to_string();
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line:?}");
        assert!(matches!(
            line.parse::<Report>(),
            Ok(Report::Survivor { pid: 9, .. })
        ));
    }

    #[test]
    fn malformed_lines_are_refused() {
        for line in [
            "",
            "Q",
            "P x",
            "P",
            "X exit 3",
            "X oops 3 4",
            "G extra",
            "E weird m",
        ] {
            assert!(line.parse::<Report>().is_err(), "{line:?}");
        }
    }

    #[test]
    fn commands_round_trip() {
        for c in [
            Command::Relay(Sig::Hup),
            Command::Relay(Sig::Usr1),
            Command::Relay(Sig::Int),
            Command::Term,
            Command::Kill,
            Command::Done,
        ] {
            assert_eq!(Command::from_byte(c.to_byte()), Some(c));
        }
        assert_eq!(Command::from_byte(0), None);
        assert_eq!(Command::from_byte(63), None);
        assert_eq!(Command::from_byte(b'z'), None);
    }
}
