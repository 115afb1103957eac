//! The one place where the supervisor's typed notices and statuses become
//! words.
//!
//! The state machine decides, the reporter words: [`crate::agent::machine`] emits
//! [`Notice`]s (what happened, with its numbers), and [`Reporter::line`]
//! turns each into a level and a sentence; it emits [`Status`]es (what
//! systemd's `STATUS=` says), and [`Reporter::status`] words them. Tests and
//! the README quote some of these sentences ("renewal failing", "lease
//! lost", "recovered", "holding token"), so their wording is part of the
//! outward behaviour.

use std::time::Duration;

use crate::exit::ChildStatus;
use crate::lease::{Outcome, RefusalReason};
use crate::sys::signal::Sig;
use crate::time::duration::format;

/// Why the lease counts as lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostWhy {
    /// `deadline - grace` reached without a renewal; SIGKILL follows in `kill_in`.
    NoRenewal { kill_in: Duration },
    /// The deadline itself passed (the agent was paused, or grace is shorter
    /// than the kill lead).
    DeadlinePassed,
    /// The authority refused a renewal.
    Refused {
        reason: RefusalReason,
        message: String,
    },
    /// The command ended only after the lease's deadline.
    EndedAfterDeadline,
}

/// How the lease was lost, as the status line says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The deadline passed.
    Expired,
    /// No renewal came in time.
    RenewalsFailed,
    /// The authority refused a renewal.
    Refused(RefusalReason),
}

/// The run's state as systemd's `STATUS=` line (and `READY=1`,
/// `STOPPING=1`) says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The lease is held.
    Holding,
    /// The lease is held and the command runs (with `READY=1`).
    CommandRunning,
    /// The latest renewal failed; the lease may still be valid.
    RenewalsFailing,
    /// Renewals have been failing this long.
    RenewalsFailingFor(Duration),
    Lost(Loss),
    /// Stopping the command for the lease or the keeper (with
    /// `STOPPING=1`).
    StoppingCommand,
    /// Stopping the command for a signal to the agent (with `STOPPING=1`).
    StoppingForSignal(Sig),
    /// The run after a stop signal to the agent.
    SignalStop(Sig),
}

/// Something the supervisor has to say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    LeaseLost(LostWhy),
    /// The first failed renewal; the lease is valid for `left` at most.
    RenewalFailing {
        error: String,
        left: Duration,
    },
    /// Another failed renewal, failing `since` this long.
    RenewalStillFailing {
        error: String,
        since: Duration,
    },
    /// A renewal succeeded after failures.
    RenewalsRecovered {
        after: Duration,
        left: Duration,
    },
    /// A renewal granted a different ttl; heartbeat and grace were refitted.
    TtlChanged {
        ttl: Duration,
        was: Duration,
        grace: Duration,
    },
    /// A stop signal reached the agent.
    Cancelling {
        sig: Sig,
    },
    /// The job's tree got SIGTERM; SIGKILL follows in `kill_in`.
    Stopping {
        kill_in: Duration,
    },
    CommandStarted {
        pgid: i32,
        containment: crate::keeper::protocol::Containment,
    },
    CommandEnded {
        status: ChildStatus,
    },
    SpawnFailed {
        message: String,
    },
    /// The grant arrived with less than grace left: the command is not
    /// started.
    GrantTooLate,
    /// The keeper could not be handed the job.
    KeeperNotStarted {
        error: String,
    },
    /// The keeper died on its own; `tree_gone`: the tree with it (proven
    /// by the agent), else processes of it were left.
    KeeperLost {
        tree_gone: bool,
    },
    /// The leader ended, SIGKILL went out, but the tree was not reported gone.
    LeftoversOutsideGroup,
    /// SIGKILL went out and the leader was never reported gone.
    GroupNotGone {
        waited: Duration,
    },
    /// The run's result, decided before any release.
    Finished {
        outcome: Outcome,
        status: u8,
    },
    Released {
        outcome: Outcome,
    },
    /// The authority refused the release: it had dropped the lease already.
    ReleaseRefused {
        reason: RefusalReason,
    },
    ReleaseFailed {
        error: String,
    },
    /// The release gave no answer within its window (a stalled filesystem
    /// under the embedded authority's database): not waited for longer.
    ReleaseUnanswered {
        waited: Duration,
    },
    /// The tree was not reported gone: no release, the lease expires.
    NotReleasing,
}

/// Words notices for one lease.
#[derive(Clone, Debug)]
pub struct Reporter {
    task: String,
    token: u64,
}

impl Reporter {
    pub fn new(task: &str, token: u64) -> Self {
        Reporter {
            task: task.to_string(),
            token,
        }
    }

    /// The level and text of the log line for `n`.
    pub fn line(&self, n: &Notice) -> (log::Level, String) {
        use log::Level::{Debug, Error, Info, Warn};
        let (task, token) = (&self.task, self.token);
        match n {
            Notice::LeaseLost(why) => (Error, self.lost(why)),
            Notice::RenewalFailing { error, left } => (
                Warn,
                format!(
                    "renewal failing: task {task} token {token}: {error}; lease valid for {} more at most",
                    format(*left)
                ),
            ),
            Notice::RenewalStillFailing { error, since } => (
                Debug,
                format!("renewal still failing after {}: {error}", format(*since)),
            ),
            Notice::RenewalsRecovered { after, left } => (
                Info,
                format!(
                    "renewals recovered after {}: task {task} token {token}, {} left",
                    format(*after),
                    format(*left)
                ),
            ),
            Notice::TtlChanged { ttl, was, grace } => (
                Warn,
                format!(
                    "task {task} token {token}: the authority renewed with a ttl of {} (was {}); deadline, heartbeat and grace ({}) follow it",
                    format(*ttl),
                    format(*was),
                    format(*grace)
                ),
            ),
            Notice::Cancelling { sig } => (
                Warn,
                format!(
                    "signal {sig} received: stopping the command and releasing task {task} token {token}"
                ),
            ),
            Notice::Stopping { kill_in } => (
                Warn,
                format!(
                    "stopping: task {task} token {token}: signal {} sent, SIGKILL in {}",
                    Sig::Term,
                    format(*kill_in)
                ),
            ),
            Notice::CommandStarted { pgid, containment } => {
                use crate::keeper::protocol::Containment;
                match containment {
                    Containment::Pidns => (
                        Info,
                        format!(
                            "command started (pid {pgid} in a PID namespace of its own, the keeper its init; LEASE_CONTAINMENT=pidns)"
                        ),
                    ),
                    other => (
                        Warn,
                        format!(
                            "command started (process group {pgid}) without a PID namespace (LEASE_CONTAINMENT={}): a command that signals its own supervisors (kill -9 of the agent and the keeper) can outlive them; see docs/failures.md",
                            other.as_str()
                        ),
                    ),
                }
            }
            Notice::CommandEnded { status } => (Info, format!("command ended with {status}")),
            Notice::SpawnFailed { message } => {
                (Error, format!("cannot run the command: {message}"))
            }
            Notice::GrantTooLate => (
                Error,
                format!(
                    "the grant of task {task} token {token} arrived with less than the grace left on the lease; not starting the command"
                ),
            ),
            Notice::KeeperNotStarted { error } => {
                (Error, format!("cannot start the keeper process: {error}"))
            }
            Notice::KeeperLost { tree_gone: false } => (
                Error,
                "the keeper process died and processes of the job's tree are left; killing them from the agent, the lease will not be released".into(),
            ),
            Notice::KeeperLost { tree_gone: true } => (
                Error,
                "the keeper process died, and the job's tree with it (the agent found nothing left)".into(),
            ),
            Notice::LeftoversOutsideGroup => (
                Warn,
                "processes the command started were not reported gone after SIGKILL; not waiting for them".into(),
            ),
            Notice::GroupNotGone { waited } => (
                Error,
                format!(
                    "task {task} token {token}: the command was not reported gone {} after SIGKILL (a process that survives SIGKILL or may not be signalled); giving up on it",
                    format(*waited)
                ),
            ),
            Notice::Finished { outcome, status } => (
                Info,
                format!(
                    "finished: task {task} token {token}, outcome {}, exit status {status}",
                    outcome.as_str()
                ),
            ),
            Notice::Released { outcome } => (
                Info,
                format!("released task {task} token {token} ({})", outcome.as_str()),
            ),
            Notice::ReleaseRefused { reason } => (
                Info,
                format!(
                    "release of task {task} token {token}: the authority had already dropped the lease ({reason})"
                ),
            ),
            Notice::ReleaseFailed { error } => (
                Warn,
                format!(
                    "release of task {task} token {token} failed ({error}); the lease will expire by itself"
                ),
            ),
            Notice::ReleaseUnanswered { waited } => (
                Warn,
                format!(
                    "release of task {task} token {token}: no answer within {} (a stalled disk or filesystem under the authority's store?); not waiting longer, the lease will expire by itself",
                    format(*waited)
                ),
            ),
            Notice::NotReleasing => (
                Warn,
                format!(
                    "not releasing task {task} token {token}: processes of the command may still run; the lease will expire by itself"
                ),
            ),
        }
    }

    fn lost(&self, why: &LostWhy) -> String {
        let (task, token) = (&self.task, self.token);
        match why {
            LostWhy::NoRenewal { kill_in } => format!(
                "lease lost: task {task} token {token}: no renewal for too long; stopping the command, SIGKILL in {}",
                format(*kill_in)
            ),
            LostWhy::DeadlinePassed => {
                format!("lease lost: task {task} token {token}: deadline passed without a renewal")
            }
            LostWhy::Refused { reason, message } => format!(
                "lease lost: task {task} token {token}: renewal refused ({reason}) {message}"
            ),
            LostWhy::EndedAfterDeadline => format!(
                "lease lost: task {task} token {token}: the command ended after the lease's deadline (was the agent paused?)"
            ),
        }
    }

    /// The text of the status line for `s`.
    pub fn status(&self, s: &Status) -> String {
        let token = self.token;
        match s {
            Status::Holding => format!("holding token {token}"),
            Status::CommandRunning => format!("holding token {token}, command running"),
            Status::RenewalsFailing => format!("holding token {token}, renewals failing"),
            Status::RenewalsFailingFor(since) => {
                format!(
                    "holding token {token}, renewals failing for {}",
                    format(*since)
                )
            }
            Status::Lost(Loss::Expired) => format!("lease lost (expired), token {token}"),
            Status::Lost(Loss::RenewalsFailed) => {
                format!("lease lost (renewals failed), token {token}")
            }
            Status::Lost(Loss::Refused(reason)) => format!("lease lost ({reason}), token {token}"),
            Status::StoppingCommand => format!("stopping the command (token {token})"),
            Status::StoppingForSignal(sig) => format!("stopping the command (signal {sig})"),
            Status::SignalStop(sig) => format!("stopping (signal {sig}), token {token}"),
        }
    }

    /// Logs `n`.
    pub fn report(&self, n: &Notice) {
        let (level, text) = self.line(n);
        match n {
            Notice::Finished { outcome, .. } | Notice::Released { outcome } => {
                crate::agent::logging::log_outcome(level, outcome.as_str(), &text)
            }
            _ => log::log!(level, "{text}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quoted_sentences_keep_their_words() {
        let r = Reporter::new("t", 7);
        let (l, s) = r.line(&Notice::RenewalFailing {
            error: "timeout".into(),
            left: Duration::from_secs(3),
        });
        assert_eq!(l, log::Level::Warn);
        assert!(
            s.starts_with("renewal failing: task t token 7: timeout"),
            "{s}"
        );
        let (l, s) = r.line(&Notice::LeaseLost(LostWhy::Refused {
            reason: RefusalReason::Superseded,
            message: "m".into(),
        }));
        assert_eq!(l, log::Level::Error);
        assert!(s.starts_with("lease lost: task t token 7:") && s.contains("superseded"));
        let (_, s) = r.line(&Notice::RenewalsRecovered {
            after: Duration::from_secs(1),
            left: Duration::from_secs(2),
        });
        assert!(s.starts_with("renewals recovered after 1"), "{s}");
    }

    #[test]
    fn every_status_line_keeps_its_words() {
        let r = Reporter::new("t", 7);
        for (status, line) in [
            (Status::Holding, "holding token 7"),
            (Status::CommandRunning, "holding token 7, command running"),
            (Status::RenewalsFailing, "holding token 7, renewals failing"),
            (
                Status::RenewalsFailingFor(Duration::from_millis(1500)),
                "holding token 7, renewals failing for 1.5s",
            ),
            (Status::Lost(Loss::Expired), "lease lost (expired), token 7"),
            (
                Status::Lost(Loss::RenewalsFailed),
                "lease lost (renewals failed), token 7",
            ),
            (
                Status::Lost(Loss::Refused(RefusalReason::Revoked)),
                "lease lost (revoked), token 7",
            ),
            (Status::StoppingCommand, "stopping the command (token 7)"),
            (
                Status::StoppingForSignal(Sig::Int),
                "stopping the command (signal 2)",
            ),
            (Status::SignalStop(Sig::Int), "stopping (signal 2), token 7"),
        ] {
            assert_eq!(r.status(&status), line);
        }
    }

    #[test]
    fn the_stops_before_the_command_keep_their_words() {
        let r = Reporter::new("t", 7);
        assert_eq!(
            r.line(&Notice::GrantTooLate),
            (
                log::Level::Error,
                "the grant of task t token 7 arrived with less than the grace left on the lease; not starting the command".into()
            )
        );
        assert_eq!(
            r.line(&Notice::KeeperNotStarted {
                error: "no pipe".into()
            }),
            (
                log::Level::Error,
                "cannot start the keeper process: no pipe".into()
            )
        );
        assert_eq!(
            r.line(&Notice::Stopping {
                kill_in: Duration::from_secs(2)
            })
            .1,
            "stopping: task t token 7: signal 15 sent, SIGKILL in 2s"
        );
    }
}
