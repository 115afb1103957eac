//! The job's whole tree dies on every stop, whatever its group or session:
//! processes that left the group with `setsid`, job control (`setpgid`) or
//! a double fork are gone after a lost lease, after the agent is SIGKILLed,
//! after a cancel and after the command ends by itself, and the lease is
//! released only once they are.

use crate::support;

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(60);

struct Escaper {
    dir: tempfile::TempDir,
}

impl Escaper {
    fn new() -> Self {
        Escaper {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn pids_file(&self) -> PathBuf {
        self.dir.path().join("pids")
    }
    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }
    fn command(
        &self,
        authority: &str,
        task: &str,
        flags: &[&str],
        hold: u32,
    ) -> std::process::Command {
        let mut c = agent(authority, task);
        c.env("OUT", self.out())
            .env("PIDS", self.pids_file())
            .env("HOLD", hold.to_string());
        c.args(flags).arg("--").arg(helper("escape.sh"));
        c
    }
    /// The three escapees, once the job said ready; each checked to be
    /// outside the job's group.
    fn escapees(&self) -> Vec<i32> {
        let pids = wait_for(T, || {
            let ready = std::fs::read_to_string(self.out()).unwrap_or_default();
            let pids = read_pids(&self.pids_file());
            (ready.contains("ready") && pids.len() >= 3).then_some(pids)
        })
        .expect("job did not start its escapees");
        for &p in &pids {
            assert!(alive(p), "escapee {p} should be running");
        }
        pids
    }
}

fn pgrp_and_session(pid: i32) -> (i32, i32) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

fn assert_gone(pids: &[i32], within: Duration) {
    let left = wait_for(within, || {
        let alive: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        alive.is_empty().then_some(())
    });
    if left.is_none() {
        let alive: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        for &p in &alive {
            kill(p, 9);
        }
        panic!("escaped processes still alive: {alive:?}");
    }
}

fn spawn(mut c: std::process::Command) -> Child {
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c.spawn().unwrap()
}

fn stderr_of(child: &mut Child) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

#[test]
fn escapees_die_when_the_command_ends_and_before_the_release() {
    let fake = FakeAuthority::start();
    let e = Escaper::new();
    let mut child = spawn(e.command(&fake.url(), "tree-end", &["--grace", "2s"], 1));
    let pids = e.escapees();
    // They really left the job's group (the job's group is its leader's pid,
    // which is no longer around to ask; compare with each other instead).
    // (setsid runs after the pid was written: poll.)
    let distinct = wait_for(Duration::from_secs(10), || {
        let groups: std::collections::HashSet<i32> =
            pids.iter().map(|&p| pgrp_and_session(p).0).collect();
        (groups.len() == 3).then_some(())
    });
    assert!(distinct.is_some(), "three different process groups");
    let status = wait_exit(&mut child, T).expect("agent exits");
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(0), "{err}");
    // Gone by the time the agent exited (it released after TreeGone).
    for &p in &pids {
        assert!(!alive(p), "escapee {p} outlived the agent; {err}");
    }
    let releases = fake.requests_to("/v1/release");
    assert_eq!(releases.len(), 1, "{err}");
    assert_eq!(releases[0].body["outcome"], "succeeded");
}

#[test]
fn escapees_die_when_the_lease_is_lost() {
    let fake = FakeAuthority::start();
    fake.script("/v1/renew", vec![Reply::Refuse("superseded")]);
    let e = Escaper::new();
    let mut child = spawn(e.command(
        &fake.url(),
        "tree-lost",
        &["--ttl", "10s", "--heartbeat", "300ms", "--grace", "1s"],
        1000,
    ));
    let pids = e.escapees();
    let status = wait_exit(&mut child, T).expect("agent exits");
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(124), "{err}");
    for &p in &pids {
        assert!(!alive(p), "escapee {p} outlived the agent; {err}");
    }
}

#[test]
fn escapees_die_when_the_agent_is_sigkilled() {
    let fake = FakeAuthority::start();
    let e = Escaper::new();
    let mut child = spawn(e.command(&fake.url(), "tree-kill9", &["--ttl", "30s"], 1000));
    let pids = e.escapees();
    child.kill().unwrap(); // SIGKILL
    let _ = child.wait();
    assert_gone(&pids, Duration::from_secs(10));
}

#[test]
fn escapees_die_on_cancel() {
    let fake = FakeAuthority::start();
    let e = Escaper::new();
    let mut child = spawn(e.command(&fake.url(), "tree-cancel", &["--grace", "1s"], 1000));
    let pids = e.escapees();
    kill(child.id() as i32, 15);
    let status = wait_exit(&mut child, T).expect("agent exits");
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(143), "{err}");
    for &p in &pids {
        assert!(!alive(p), "escapee {p} outlived the agent; {err}");
    }
    let releases = fake.requests_to("/v1/release");
    assert_eq!(releases[0].body["outcome"], "cancelled", "{err}");
}
