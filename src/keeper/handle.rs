//! The agent's side of the job: starting the keeper, signalling the job's
//! group, and turning the keeper's reports into events.
//!
//! [`JobGroup::for_kill`] is the one place that turns a pid into a group
//! kill: every signal the agent sends goes to `-pgid`, so grandchildren are
//! never missed. The keeper (see `keeper.rs`) is the job's parent; this
//! module reads its report pipe on a thread of its own and never waits on a
//! process itself, so the supervisor loop cannot block on the job.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use rustix::io::{FdFlags, fcntl_setfd};
use rustix::pipe::{PipeFlags, pipe_with};
use rustix::process::{Pid, kill_process_group, test_kill_process_group};

use crate::agent::machine::Event;
use crate::exit::ChildStatus;
use crate::keeper::{DONE, KEEPER_ARG};
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;

/// The job's process group, ready to be signalled as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobGroup(Pid);

impl JobGroup {
    /// The group led by `pid` (the job runs with `pgid == pid`).
    pub fn for_kill(pid: i32) -> Option<Self> {
        Pid::from_raw(pid).map(JobGroup)
    }

    pub fn pgid(&self) -> i32 {
        self.0.as_raw_nonzero().get()
    }

    /// Sends `sig` to every process of the group. A group that is already
    /// gone (ESRCH) is not an error.
    pub fn signal(&self, sig: Sig) -> std::io::Result<()> {
        match kill_process_group(self.0, sig.to_rustix()) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the group provably has no member left (not even a zombie):
    /// `kill(-pgid, 0)` finds nobody.
    pub fn is_empty(&self) -> bool {
        matches!(
            test_kill_process_group(self.0),
            Err(rustix::io::Errno::SRCH)
        )
    }
}

/// The running keeper.
pub struct Keeper {
    child: Child,
    ctl: Option<std::fs::File>,
}

/// Starts the keeper, which starts `command` with `env` added to the agent's
/// environment and `env_remove` taken out. Reports arrive on `events`.
pub fn spawn_keeper(
    command: &[OsString],
    env: &[(String, String)],
    env_remove: &[&str],
    events: Sender<Event>,
) -> std::io::Result<Keeper> {
    let (ctl_r, ctl_w) = pipe_with(PipeFlags::CLOEXEC)?;
    let (rep_r, rep_w) = pipe_with(PipeFlags::CLOEXEC)?;
    // Only the keeper's ends are inherited, and only by this one spawn: the
    // agent starts no other process.
    fcntl_setfd(&ctl_r, FdFlags::empty())?;
    fcntl_setfd(&rep_w, FdFlags::empty())?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("leaseagent-keeper")
        .arg(KEEPER_ARG)
        .arg(ctl_r.as_raw_fd().to_string())
        .arg(rep_w.as_raw_fd().to_string())
        .arg("--")
        .args(command);
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in env_remove {
        cmd.env_remove(k);
    }
    let child = cmd.spawn()?;
    drop(ctl_r);
    drop(rep_w);
    let reader = std::fs::File::from(rep_r);
    std::thread::Builder::new()
        .name("keeper-reports".into())
        .spawn(move || read_reports(reader, &events))?;
    Ok(Keeper {
        child,
        ctl: Some(std::fs::File::from(ctl_w)),
    })
}

/// Parses one report line of the keeper.
pub fn parse_report(line: &str) -> Option<Event> {
    let mut parts = line.splitn(3, ' ');
    match (parts.next()?, parts.next(), parts.next()) {
        ("P", Some(pid), _) => Some(Event::ChildStarted {
            pid: pid.parse().ok()?,
        }),
        ("E", Some(kind), msg) => Some(Event::SpawnFailed {
            not_found: kind == "not_found",
            message: msg.unwrap_or(kind).to_string(),
        }),
        ("X", Some(how), Some(rest)) => {
            let mut rest = rest.split(' ');
            let n: i32 = rest.next()?.parse().ok()?;
            let at = rest
                .next()
                .and_then(|ms| ms.parse::<u64>().ok())
                .map(|ms| BootInstant::from_since_boot(Duration::from_millis(ms)))
                .unwrap_or_else(BootInstant::now);
            let status = match how {
                "exit" => ChildStatus::Exited(n),
                "signal" => ChildStatus::Signaled(n),
                _ => return None,
            };
            Some(Event::ChildExited { status, at })
        }
        ("G", None, None) => Some(Event::TreeGone),
        _ => None,
    }
}

fn read_reports(reader: std::fs::File, events: &Sender<Event>) {
    let mut saw_gone = false;
    for line in BufReader::new(reader).lines() {
        let Ok(line) = line else { break };
        match parse_report(&line) {
            Some(ev) => {
                saw_gone |= matches!(ev, Event::TreeGone | Event::SpawnFailed { .. });
                if events.send(ev).is_err() {
                    return;
                }
            }
            None => log::warn!("keeper sent an unknown report: {line:?}"),
        }
    }
    if !saw_gone {
        let _ = events.send(Event::KeeperLost);
    }
}

impl Keeper {
    /// Tells the keeper to exit without killing, and reaps it (bounded).
    pub fn finish(mut self, within: Duration) {
        if let Some(mut ctl) = self.ctl.take() {
            let _ = ctl.write_all(&[DONE]);
        }
        let until = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= until => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_reports() {
        assert_eq!(parse_report("P 42"), Some(Event::ChildStarted { pid: 42 }));
        assert_eq!(parse_report("G"), Some(Event::TreeGone));
        assert_eq!(
            parse_report("E not_found No such file"),
            Some(Event::SpawnFailed {
                not_found: true,
                message: "No such file".into()
            })
        );
        assert_eq!(
            parse_report("X exit 3 1500"),
            Some(Event::ChildExited {
                status: ChildStatus::Exited(3),
                at: BootInstant::from_since_boot(Duration::from_millis(1500))
            })
        );
        assert_eq!(
            parse_report("X signal 9 10").map(|e| matches!(
                e,
                Event::ChildExited {
                    status: ChildStatus::Signaled(9),
                    ..
                }
            )),
            Some(true)
        );
        assert_eq!(parse_report("Q"), None);
        assert_eq!(parse_report("P x"), None);
    }
}
