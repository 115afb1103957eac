//! Both ends of the keeper's two channels, typed: what the agent asks
//! ([`Command`], one byte each on the ctl socket) and what the keeper
//! reports ([`Report`], one line each on the report socket). Before any
//! command, the ctl socket carries one "go" frame ([`encode_go`],
//! [`GoReader`]): the job's environment from the grant, the keeper's cue to
//! start the job.
//!
//! The channels are two `AF_UNIX` stream socket pairs, not pipes: a pipe
//! can be reopened, for writing, through `/proc/PID/fd/N` by anyone who may
//! open that link, and the report pipe of an earlier version was how a job
//! wrote a forged `X exit 0` / `G` into it. A socket cannot be opened
//! through `/proc` at all (ENXIO), both guardians are non-dumpable (their
//! `/proc/PID/fd` is root's), and a report is never enough to release: the
//! agent confirms the tree gone itself (`keeper::handle`).
//!
//! One definition for both processes, so the writer's `Display` and the
//! reader's `FromStr` cannot drift apart (a unit test round-trips every
//! variant). Free text (error messages, survivor command lines) is escaped
//! to one line before it is written, so a line is always one report.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::exit::ChildStatus;
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;
use crate::time::deadline::Deadline;

/// What the agent asks of the keeper, on the ctl pipe: one byte each, but
/// for [`Command::Arm`], a fixed frame of [`ARM_FRAME`] bytes, on a stream
/// socket. A frame this small is queued whole or not at all by a
/// non-blocking send (one socket buffer), so a reader never sees half a
/// frame from one write, though one `read` may end inside a frame when
/// several are queued ([`Decoder`] keeps the rest).
///
/// End of file on the ctl socket is not a command: it means the agent is
/// gone, and the keeper kills the whole tree.
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
    /// The lease's deadline as of the latest grant or renewal: the keeper
    /// stops the tree by it on its own unless a newer one replaces it.
    Arm(Arm),
}

/// A deadline for the keeper's own timer, in microseconds on
/// `CLOCK_BOOTTIME` (one clock for both processes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arm {
    /// The local deadline: the tree must be dead by then.
    pub deadline_us: u64,
    /// SIGTERM this long before the deadline.
    pub grace_us: u64,
    /// SIGKILL this long before the deadline (as the agent sized it).
    pub kill_lead_us: u64,
    /// The granted ttl, which bounds the lead the keeper sizes itself.
    pub ttl_us: u64,
}

impl Arm {
    /// The frame of `deadline` (whole microseconds, rounded down).
    pub fn of(deadline: Deadline) -> Self {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        Arm {
            deadline_us: us(deadline.at.since_boot()),
            grace_us: us(deadline.grace),
            kill_lead_us: us(deadline.kill_lead),
            ttl_us: us(deadline.ttl),
        }
    }

    /// The deadline this frame carries.
    pub fn deadline(self) -> Deadline {
        Deadline {
            at: BootInstant::from_since_boot(Duration::from_micros(self.deadline_us)),
            grace: Duration::from_micros(self.grace_us),
            kill_lead: Duration::from_micros(self.kill_lead_us),
            ttl: Duration::from_micros(self.ttl_us),
        }
    }
}

/// The tag byte of [`Command::Arm`].
const ARM_TAG: u8 = b'A';
/// The length of an [`Command::Arm`] frame: the tag and four u64 (LE).
pub const ARM_FRAME: usize = 33;

impl Command {
    /// The bytes of this command on the ctl pipe.
    pub fn encode(self) -> Vec<u8> {
        match self {
            // Signal numbers are below every letter used here.
            Command::Relay(sig) => vec![sig.number() as u8],
            Command::Term => vec![b'T'],
            Command::Kill => vec![b'K'],
            Command::Done => vec![b'D'],
            Command::Arm(a) => {
                let mut v = Vec::with_capacity(ARM_FRAME);
                v.push(ARM_TAG);
                for n in [a.deadline_us, a.grace_us, a.kill_lead_us, a.ttl_us] {
                    v.extend_from_slice(&n.to_le_bytes());
                }
                v
            }
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1..=64 => Sig::from_number(i32::from(b)).map(Command::Relay),
            b'T' => Some(Command::Term),
            b'K' => Some(Command::Kill),
            b'D' => Some(Command::Done),
            _ => None,
        }
    }
}

/// Turns the ctl pipe's bytes back into commands, keeping an incomplete
/// [`Command::Arm`] frame until its rest arrives. Unknown bytes are skipped.
#[derive(Default)]
pub struct Decoder {
    pending: Vec<u8>,
}

impl Decoder {
    /// The commands completed by `bytes`, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Command> {
        let mut out = Vec::new();
        for &b in bytes {
            if !self.pending.is_empty() {
                self.pending.push(b);
                if self.pending.len() == ARM_FRAME {
                    let n = |i: usize| {
                        let mut w = [0u8; 8];
                        w.copy_from_slice(&self.pending[1 + 8 * i..9 + 8 * i]);
                        u64::from_le_bytes(w)
                    };
                    out.push(Command::Arm(Arm {
                        deadline_us: n(0),
                        grace_us: n(1),
                        kill_lead_us: n(2),
                        ttl_us: n(3),
                    }));
                    self.pending.clear();
                }
            } else if b == ARM_TAG {
                self.pending.push(b);
            } else if let Some(c) = Command::from_byte(b) {
                out.push(c);
            }
        }
        out
    }
}

/// The longest "go" frame taken (the job's environment from the grant is
/// a few hundred bytes).
pub const GO_MAX: usize = 1 << 20;

/// The "go" frame: a u32 (LE) length, then `KEY=VALUE` entries, each ended
/// by a NUL byte (neither part of an environment entry can hold one).
pub fn encode_go(env: &[(String, String)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in env {
        body.extend_from_slice(k.as_bytes());
        body.push(b'=');
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// Reads the "go" frame from bytes as they arrive.
#[derive(Default)]
pub struct GoReader {
    buf: Vec<u8>,
}

/// A "go" frame that cannot be one.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadGo {
    #[error("go frame of {0} bytes (most {GO_MAX})")]
    TooLong(usize),
    #[error("go frame entry without '=': {0:?}")]
    NoEquals(String),
}

impl GoReader {
    /// Takes `bytes`; once the frame is complete, its entries and the bytes
    /// after it (commands sent right behind it).
    #[allow(clippy::type_complexity)]
    pub fn push(
        &mut self,
        bytes: &[u8],
    ) -> Result<Option<(Vec<(std::ffi::OsString, std::ffi::OsString)>, Vec<u8>)>, BadGo> {
        use std::os::unix::ffi::OsStrExt;
        self.buf.extend_from_slice(bytes);
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let mut n = [0u8; 4];
        n.copy_from_slice(&self.buf[..4]);
        let len = u32::from_le_bytes(n) as usize;
        if len > GO_MAX {
            return Err(BadGo::TooLong(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let mut env = Vec::new();
        for entry in self.buf[4..4 + len]
            .split(|&b| b == 0)
            .filter(|e| !e.is_empty())
        {
            let Some(eq) = entry.iter().position(|&b| b == b'=') else {
                return Err(BadGo::NoEquals(String::from_utf8_lossy(entry).into_owned()));
            };
            env.push((
                std::ffi::OsStr::from_bytes(&entry[..eq]).to_owned(),
                std::ffi::OsStr::from_bytes(&entry[eq + 1..]).to_owned(),
            ));
        }
        let rest = self.buf[4 + len..].to_vec();
        Ok(Some((env, rest)))
    }
}

/// What holds the job's tree (`LEASE_CONTAINMENT`): the keeper's PID
/// namespace, a cgroup of the job's own, or the tree walk alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Containment {
    /// The keeper is PID 1 of a PID namespace of the job's own: the
    /// kernel kills the namespace with it, the job cannot name the agent
    /// nor stop or kill the keeper.
    Pidns,
    /// No namespace, a cgroup v2 of the job's own (`cgroup.kill`).
    Cgroup,
    /// Neither: the keeper (a child subreaper) finds the tree in `/proc`.
    Tree,
}

impl Containment {
    /// The word of `LEASE_CONTAINMENT` and the state file.
    pub fn as_str(self) -> &'static str {
        match self {
            Containment::Pidns => "pidns",
            Containment::Cgroup => "cgroup",
            Containment::Tree => "tree",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Containment::Pidns, Containment::Cgroup, Containment::Tree]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// The variable that tells the job its containment.
pub const ENV_CONTAINMENT: &str = "LEASE_CONTAINMENT";

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

/// Why a process of the tree outlived the keeper's SIGKILL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Survival {
    /// The keeper may not signal it (EPERM: another user's, setuid).
    CannotSignal,
    /// In uninterruptible sleep (D): it dies when it wakes, if ever.
    Uninterruptible,
    /// In a frozen cgroup: it dies when the cgroup is thawed.
    Frozen,
    /// Signalled, still there, no known reason.
    Unknown,
}

impl Survival {
    pub fn as_str(self) -> &'static str {
        match self {
            Survival::CannotSignal => "eperm",
            Survival::Uninterruptible => "d_state",
            Survival::Frozen => "frozen",
            Survival::Unknown => "alive",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Survival::CannotSignal,
            Survival::Uninterruptible,
            Survival::Frozen,
            Survival::Unknown,
        ]
        .into_iter()
        .find(|w| w.as_str() == s)
    }

    /// Why, in words, for the log line.
    pub fn describe(self) -> &'static str {
        match self {
            Survival::CannotSignal => "it may not be signalled (EPERM: another user's or setuid)",
            Survival::Uninterruptible => "it is in uninterruptible sleep (D state)",
            Survival::Frozen => "it is in a frozen cgroup",
            Survival::Unknown => "it survived SIGKILL",
        }
    }
}

/// What the keeper tells the agent; one line on the report pipe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// The job runs; its process group id is its pid (in the keeper's PID
    /// namespace when it has one), held by `containment`.
    /// `P pid containment`
    Started { pid: i32, containment: Containment },
    /// The tree as the keeper last sampled it, how busy the host was and
    /// how late the keeper's timed wakes were (for the kill lead).
    /// `Z procs private_kib busy_milli late_us` (a line without `late_us`
    /// reads as 0).
    Size {
        procs: u32,
        private_kib: u64,
        busy_milli: u32,
        late_us: u32,
    },
    /// The job could not be started (or the keeper could not guard it).
    /// `E kind message`
    SpawnFailed { kind: SpawnFailure, message: String },
    /// The job's leader was reaped, at `at_ms` on the boot clock.
    /// `X exit|signal n at_ms`
    Exited { status: ChildStatus, at_ms: u64 },
    /// Every descendant is gone (and the job's cgroup, if any, is empty).
    /// `G`
    TreeGone,
    /// The job's leader stopped (Ctrl-Z at its terminal, SIGTTIN, a
    /// SIGSTOP): the agent's front process stops too, so the shell that
    /// waits on it gets its prompt back (`agent/front.rs`). `T`
    Stopped,
    /// A process of the tree still lives after SIGKILL, and why.
    /// `S pid why command`
    Survivor {
        pid: i32,
        command: String,
        why: Survival,
    },
    /// Something the agent should log as a warning (a failed `setsid`, no
    /// cgroup of our own). `W message`
    Warning(String),
    /// Something the agent should log as information (how the tree is
    /// stopped). `I message`
    Info(String),
}

/// The tree size a [`Report::Size`] carries.
pub fn tree_size(
    procs: u32,
    private_kib: u64,
    busy_milli: u32,
    late_us: u32,
) -> crate::time::deadline::TreeSize {
    crate::time::deadline::TreeSize {
        procs,
        private_bytes: private_kib.saturating_mul(1024),
        busy_milli,
        late_us,
    }
}

/// One line: newlines and control characters become visible escapes.
fn one_line(s: &str) -> String {
    crate::escape::escape(s)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::Started { pid, containment } => write!(f, "P {pid} {}", containment.as_str()),
            Report::Size {
                procs,
                private_kib,
                busy_milli,
                late_us,
            } => write!(f, "Z {procs} {private_kib} {busy_milli} {late_us}"),
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
            Report::Stopped => write!(f, "T"),
            Report::Survivor { pid, command, why } => {
                write!(f, "S {pid} {} {}", why.as_str(), one_line(command))
            }
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
            ("P", Some(rest)) => {
                let (pid, containment) = rest.split_once(' ').ok_or_else(bad)?;
                Ok(Report::Started {
                    pid: pid.parse().map_err(|_| bad())?,
                    containment: Containment::parse(containment).ok_or_else(bad)?,
                })
            }
            ("Z", Some(rest)) => {
                let mut f = rest.split(' ');
                let mut num = || f.next().ok_or_else(bad);
                let (procs, kib, busy) = (num()?, num()?, num()?);
                let late = f.next().unwrap_or("0");
                if f.next().is_some() {
                    return Err(bad());
                }
                Ok(Report::Size {
                    procs: procs.parse().map_err(|_| bad())?,
                    private_kib: kib.parse().map_err(|_| bad())?,
                    busy_milli: busy.parse().map_err(|_| bad())?,
                    late_us: late.parse().map_err(|_| bad())?,
                })
            }
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
            ("T", None) => Ok(Report::Stopped),
            ("S", Some(rest)) => {
                let (pid, rest) = rest.split_once(' ').ok_or_else(bad)?;
                let (why, command) = rest.split_once(' ').unwrap_or((rest, ""));
                Ok(Report::Survivor {
                    pid: pid.parse().map_err(|_| bad())?,
                    command: command.to_string(),
                    why: Survival::parse(why).ok_or_else(bad)?,
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
    fn a_go_frame_round_trips_in_any_pieces_and_keeps_what_follows() {
        let env = vec![
            ("LEASE_TOKEN".to_string(), "42".to_string()),
            ("EMPTY".to_string(), String::new()),
            ("WITH_EQ".to_string(), "a=b=c".to_string()),
        ];
        let mut bytes = encode_go(&env);
        bytes.extend_from_slice(&Command::Term.encode());
        for cut in 0..bytes.len() {
            let mut r = GoReader::default();
            // Bytes after a completed frame are the caller's to read.
            let got = match r.push(&bytes[..cut]).unwrap() {
                Some((env, mut rest)) => {
                    rest.extend_from_slice(&bytes[cut..]);
                    (env, rest)
                }
                None => r.push(&bytes[cut..]).unwrap().expect("complete"),
            };
            let want: Vec<(std::ffi::OsString, std::ffi::OsString)> =
                env.iter().map(|(k, v)| (k.into(), v.into())).collect();
            assert_eq!(got.0, want, "cut at {cut}");
            assert_eq!(got.1, vec![b'T'], "cut at {cut}");
        }
    }

    #[test]
    fn a_bad_go_frame_is_refused() {
        let mut r = GoReader::default();
        let huge = ((GO_MAX + 1) as u32).to_le_bytes();
        assert_eq!(r.push(&huge), Err(BadGo::TooLong(GO_MAX + 1)));
        let mut r = GoReader::default();
        let mut f = 4u32.to_le_bytes().to_vec();
        f.extend_from_slice(b"abc\0");
        assert!(matches!(r.push(&f), Err(BadGo::NoEquals(_))));
    }

    #[test]
    fn every_report_round_trips() {
        let all = [
            Report::Started {
                pid: 42,
                containment: Containment::Pidns,
            },
            Report::Started {
                pid: 2,
                containment: Containment::Tree,
            },
            Report::Size {
                procs: 2_000,
                private_kib: 4 << 20,
                busy_milli: 15_000,
                late_us: 12_345,
            },
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
            Report::Stopped,
            Report::Survivor {
                pid: 7,
                command: "sleep 1001".into(),
                why: Survival::CannotSignal,
            },
            Report::Survivor {
                pid: 8,
                command: "".into(),
                why: Survival::Frozen,
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
            why: Survival::Uninterruptible,
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
            "P 4",
            "P 4 jail",
            "Z 1",
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
        let all = [
            Command::Relay(Sig::Hup),
            Command::Relay(Sig::Usr1),
            Command::Relay(Sig::Int),
            Command::Term,
            Command::Kill,
            Command::Done,
            Command::Arm(Arm {
                deadline_us: u64::MAX - 7,
                grace_us: 500_000,
                kill_lead_us: 20_000,
                ttl_us: 4_000_000,
            }),
        ];
        let mut d = Decoder::default();
        for c in all {
            assert_eq!(d.push(&c.encode()), vec![c]);
        }
        assert_eq!(d.push(&[0, 63, b'z']), vec![]);
        // Frames cut anywhere by the reader come out whole, in order.
        let stream: Vec<u8> = all.iter().flat_map(|c| c.encode()).collect();
        for cut in 0..stream.len() {
            let mut d = Decoder::default();
            let mut got = d.push(&stream[..cut]);
            got.extend(d.push(&stream[cut..]));
            assert_eq!(got, all.to_vec(), "cut at {cut}");
        }
        const { assert!(ARM_FRAME <= 512, "an Arm frame fits in PIPE_BUF") };
    }

    #[test]
    fn a_deadline_goes_out_in_whole_microseconds_rounded_down() {
        let d = Deadline {
            at: BootInstant::from_since_boot(Duration::new(5, 123_456_789)),
            grace: Duration::from_nanos(1_500_999),
            kill_lead: Duration::from_millis(20),
            ttl: Duration::from_secs(4),
        };
        let arm = Arm::of(d);
        assert_eq!(
            arm,
            Arm {
                deadline_us: 5_123_456,
                grace_us: 1_500,
                kill_lead_us: 20_000,
                ttl_us: 4_000_000,
            }
        );
        let mut frame = vec![b'A'];
        for n in [5_123_456u64, 1_500, 20_000, 4_000_000] {
            frame.extend_from_slice(&n.to_le_bytes());
        }
        assert_eq!(Command::Arm(arm).encode(), frame);
        let back = arm.deadline();
        assert_eq!(
            back.at,
            BootInstant::from_since_boot(Duration::new(5, 123_456_000))
        );
        assert_eq!(Arm::of(back), arm);
    }
}
