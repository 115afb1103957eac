//! Processes a test stops (SIGSTOP), or that its job stops, and what
//! becomes of them however the test ends.
//!
//! A stopped process never ends by itself: a test that stops an agent, a
//! keeper or a job and then fails before resuming it (an assertion panics, a
//! deadline passes, the test thread unwinds) would leave it stopped for good,
//! holding its pid, its cgroup and whatever it had open, for the next run to
//! trip over. A [`StopGuard`] watches every such process and, when dropped
//! (at the test's end, or while a panic unwinds), SIGKILLs each one still
//! there: a SIGKILL ends a stopped process at once, and ending an agent or a
//! keeper is a case the suite proves leaves nothing behind (the keeper kills
//! the job's tree when its agent dies; the agent kills the group when its
//! keeper dies). Resuming instead would let it run on against a test
//! authority that is already gone, for up to a ttl.
//!
//! A keeper killed so leaves the job's cgroup (`leaseagent-job-<agent pid>`,
//! below the keeper's own cgroup v2, which is the agent's), which only a living keeper or agent
//! removes: the guard kills what is left in it (`cgroup.kill`) and removes
//! it, for each process it killed.
//!
//! Each process is held by a pidfd opened while it is known to be alive, and
//! every signal goes through it: a process that ended, and whose pid was
//! reused meanwhile, is never signalled (nor its pid's cgroup touched). A
//! process the test resumed stays watched: at the end of a passing test it
//! is gone already, and the guard does nothing.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

/// Every process stopped by the test (or by its job), killed on drop if
/// still there.
#[derive(Default)]
pub struct StopGuard {
    procs: Vec<Watched>,
}

struct Watched {
    pid: i32,
    /// Its parent when it was watched (a keeper's is its agent).
    ppid: Option<i32>,
    fd: OwnedFd,
    /// The process's cgroup v2 directory when it was watched: where a
    /// keeper makes its job's cgroup.
    cgroup: Option<PathBuf>,
}

impl StopGuard {
    pub fn new() -> StopGuard {
        StopGuard::default()
    }

    /// A guard that has just stopped `pid` (SIGSTOP).
    pub fn stopping(pid: i32) -> StopGuard {
        let mut g = StopGuard::new();
        g.stop(pid);
        g
    }

    /// Watches `pid` (alive now) without signalling it: a process that the
    /// job under test stops, or that stops itself.
    pub fn watch(&mut self, pid: i32) {
        if self.procs.iter().any(|w| w.pid == pid) {
            return;
        }
        let fd = Pid::from_raw(pid)
            .ok_or(rustix::io::Errno::INVAL)
            .and_then(|p| pidfd_open(p, PidfdFlags::empty()))
            .unwrap_or_else(|e| panic!("pidfd_open({pid}): {e} (the process is gone?)"));
        // Read after the pidfd: if the pid was already someone else's, the
        // pidfd is that one's too, and the path is of what we hold.
        let cgroup = cgroup_v2_dir(pid);
        let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()?
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()
            });
        self.procs.push(Watched {
            pid,
            ppid,
            fd,
            cgroup,
        });
    }

    /// Watches `pid` and stops it (SIGSTOP; it may take a moment to stop).
    pub fn stop(&mut self, pid: i32) {
        self.watch(pid);
        self.signal(pid, Signal::STOP);
    }

    /// Resumes `pid` (SIGCONT); it stays watched.
    pub fn resume(&self, pid: i32) {
        self.signal(pid, Signal::CONT);
    }

    fn signal(&self, pid: i32, sig: Signal) {
        let w = self
            .procs
            .iter()
            .find(|w| w.pid == pid)
            .unwrap_or_else(|| panic!("process {pid} is not watched"));
        // ESRCH: it ended already, which is no error here.
        let _ = pidfd_send_signal(&w.fd, sig);
    }
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        // Ok: it was there, and dies now.
        let killed: Vec<&Watched> = self
            .procs
            .iter()
            .filter(|w| pidfd_send_signal(&w.fd, Signal::KILL).is_ok())
            .collect();
        for w in killed {
            // Named by the agent: the watched process, or (a keeper) its
            // parent.
            if let Some(dir) = &w.cgroup {
                for agent in std::iter::once(w.pid).chain(w.ppid) {
                    remove_job_cgroup(&dir.join(format!("leaseagent-job-{agent}")));
                }
            }
        }
    }
}

/// The cgroup v2 directory `pid` is in (its `0::` line under the cgroup2
/// mount), if any.
pub fn cgroup_v2_dir(pid: i32) -> Option<PathBuf> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2"))
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    Some(mount.join(rel.trim_start_matches('/')))
}

/// Kills everything in a job cgroup left behind and removes it (within 10 s).
fn remove_job_cgroup(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::{alive, wait_for};
    use std::process::Command;
    use std::time::Duration;

    fn state(pid: i32) -> Option<char> {
        crate::support::fence::proc_state(pid)
    }

    #[test]
    fn a_guard_dropped_by_a_panic_leaves_no_stopped_process() {
        let mut child = Command::new("sleep").arg("1000").spawn().unwrap();
        let pid = child.id() as i32;
        let unwound = std::panic::catch_unwind(|| {
            let _g = StopGuard::stopping(pid);
            wait_for(Duration::from_secs(10), || {
                (state(pid) == Some('T')).then_some(())
            })
            .expect("stopped");
            panic!("a test failing while its process is stopped");
        });
        assert!(unwound.is_err());
        let status = wait_for(Duration::from_secs(10), || child.try_wait().unwrap());
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.and_then(|s| s.signal()),
            Some(9),
            "killed by the guard"
        );
    }

    /// A whole attempt stopped (agent, keeper, job), then the test fails:
    /// nothing of it is left, the job's cgroup included.
    #[test]
    fn a_panic_with_an_agent_and_its_keeper_stopped_leaves_no_process_nor_cgroup() {
        let fake = crate::support::FakeAuthority::start();
        let dir = crate::support::Dir::new();
        let pids = dir.path("pids");
        let mut c = crate::support::agent(&fake.url(), "stop-guard");
        // Killed, the agent leaves its lease state file: in the test's directory.
        c.env("XDG_RUNTIME_DIR", dir.0.path());
        c.args(["--ttl", "30s", "--", "sh", "-c"])
            .arg(format!("echo $$ > {}; exec sleep 1000", pids.display()));
        let mut child = crate::support::spawn(c);
        let agent = child.id() as i32;
        let job: i32 = wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(&pids).ok()?.trim().parse().ok()
        })
        .expect("the job started");
        let keeper = crate::support::fence::children(agent)[0];
        let job_cgroup = cgroup_v2_dir(keeper)
            .expect("a cgroup v2 hierarchy")
            .join(format!("leaseagent-job-{agent}"));
        assert!(
            job_cgroup.is_dir(),
            "{} (the keeper made none)",
            job_cgroup.display()
        );
        let unwound = std::panic::catch_unwind(|| {
            let mut g = StopGuard::new();
            for p in [agent, keeper, job] {
                g.stop(p);
            }
            panic!("a test failing with the whole attempt stopped");
        });
        assert!(unwound.is_err());
        let gone = wait_for(Duration::from_secs(10), || {
            [agent, keeper, job]
                .iter()
                .all(|p| !alive(*p))
                .then_some(())
        });
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            gone.is_some(),
            "left: agent {agent}, keeper {keeper}, job {job}"
        );
        assert!(!job_cgroup.exists(), "{} left", job_cgroup.display());
    }

    #[test]
    fn a_resumed_process_runs_on_and_an_ended_one_is_never_signalled() {
        let mut child = Command::new("sleep").arg("1000").spawn().unwrap();
        let pid = child.id() as i32;
        let g = StopGuard::stopping(pid);
        wait_for(Duration::from_secs(10), || {
            (state(pid) == Some('T')).then_some(())
        })
        .expect("stopped");
        g.resume(pid);
        wait_for(Duration::from_secs(10), || {
            (state(pid) == Some('S')).then_some(())
        })
        .expect("resumed");
        assert!(alive(pid));
        // Ended and reaped: its pid may be anyone's now; the pidfd knows.
        child.kill().unwrap();
        child.wait().unwrap();
        let mut decoy = crate::agent_tree::recycle_pid(pid).expect("recycle the pid");
        drop(g);
        let decoy_alive = alive(decoy.id() as i32);
        let _ = decoy.kill();
        let _ = decoy.wait();
        assert!(decoy_alive, "the guard signalled a recycled pid");
    }
}
