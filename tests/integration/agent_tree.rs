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
    /// The job's leader and its three escapees, once the job said ready.
    fn leader_and_escapees(&self) -> (i32, Vec<i32>) {
        let mut pids = wait_for(T, || {
            let ready = std::fs::read_to_string(self.out()).unwrap_or_default();
            let pids = read_pids(&self.pids_file());
            (ready.contains("ready") && pids.len() >= 4).then_some(pids)
        })
        .expect("job did not start its escapees");
        let leader = pids.remove(0);
        (leader, pids)
    }
    /// The three escapees, once the job said ready.
    fn escapees(&self) -> Vec<i32> {
        let (_, pids) = self.leader_and_escapees();
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
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(0), "{err}");
    // Gone by the time the agent exited (it released after TreeGone).
    for &p in &pids {
        assert!(!alive(p), "escapee {p} outlived the agent; {err}");
    }
    let releases = fake.requests_to("/v1/release");
    assert_eq!(releases.len(), 1, "{err}");
    assert_eq!(releases[0].body["outcome"], "succeeded");
}

/// The keeper (the job's parent) has exited and been reaped by the time
/// the agent exits, on the embedded authority and over HTTP: an agent that
/// gave up waiting for it would leave it behind, re-parented to init. The
/// job's cgroup (as root there is one) is gone too: the keeper removes it
/// as the tree ends, while the agent releases.
#[test]
fn the_keeper_is_gone_when_the_agent_exits() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let embedded = format!("sqlite:{}", dir.path("leases.sqlite3").display());
    // Ten runs each: how the end races with the keeper's loop varies.
    for authority in [fake.url(), embedded]
        .iter()
        .flat_map(|a| std::iter::repeat_n(a.clone(), 10))
    {
        let mut c = agent(&authority, "keeper-gone");
        c.args(["--", "sh", "-c", "echo $PPID"]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
        let (status, err) = wait_agent(&mut child, T);
        assert_eq!(status.code(), Some(0), "{authority}: {err}");
        let keeper: i32 = out.trim().parse().unwrap_or_else(|_| panic!("{out:?}"));
        let cmdline = std::fs::read(format!("/proc/{keeper}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("__keeper"),
            "{authority}: keeper {keeper} outlived the agent; {err}"
        );
        let cgroup = err
            .split("the job runs in cgroup ")
            .nth(1)
            .and_then(|rest| rest.split(';').next());
        if rustix::process::geteuid().is_root() {
            let cgroup = cgroup.unwrap_or_else(|| panic!("root: no job cgroup; {err}"));
            assert!(
                !std::path::Path::new(cgroup).exists(),
                "{authority}: {cgroup} outlived the run; {err}"
            );
        }
    }
}

/// The keeper starts before the acquire; when the task is held (exit 75)
/// it never starts the job and is gone soon after the agent, whose end
/// closes its control pipe.
#[test]
fn a_keeper_started_for_a_refused_acquire_starts_nothing_and_exits() {
    let dir = Dir::new();
    let authority = format!("sqlite:{}", dir.path("leases.sqlite3").display());
    let ran = dir.path("ran");
    let held = dir.path("held");
    let mut holder = agent(&authority, "held-by-other");
    holder
        .args(["--", "sh", "-c"])
        .arg(format!("touch {}; exec sleep 30", held.display()));
    let mut holder = spawn(holder);
    wait_for(T, || held.exists().then_some(())).expect("the holder's job runs");
    // A marker only the refused agent's keeper carries in its arguments.
    let marker = format!("refused-keeper-{}", std::process::id());
    let mut c = agent(&authority, "held-by-other");
    c.args(["--", "sh", "-c"])
        .arg(format!("touch {}; : {marker}", ran.display()));
    let mut child = spawn(c);
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(75), "{err}");
    let keeper_left = wait_for(T, || {
        let any = std::fs::read_dir("/proc").ok()?.flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
        });
        (!any).then_some(())
    });
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(
        keeper_left.is_some(),
        "a keeper for the refused run is still alive"
    );
    assert!(!ran.exists(), "the job of a refused run was started");
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
    let (status, err) = wait_agent(&mut child, T);
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
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(143), "{err}");
    for &p in &pids {
        assert!(!alive(p), "escapee {p} outlived the agent; {err}");
    }
    let releases = fake.requests_to("/v1/release");
    assert_eq!(releases[0].body["outcome"], "cancelled", "{err}");
}

/// The agent's keeper process (its child running `leaseagent-keeper`).
fn keeper_of(agent: i32) -> i32 {
    wait_for(T, || {
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid: i32 = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (ppid == agent && cmd.starts_with(b"leaseagent-keeper")).then_some(pid)
        })
    })
    .expect("keeper process")
}

/// Makes the next new process get pid `want` (as root, through
/// /proc/sys/kernel/ns_last_pid), running `sleep 1000` in its own group.
/// Other processes on the machine may take the pid first: retried.
pub(crate) fn recycle_pid(want: i32) -> Option<Child> {
    use std::os::unix::process::CommandExt;
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (want - 1).to_string())
            .expect("writing ns_last_pid needs root");
        let mut c = std::process::Command::new("sleep")
            .arg("1000")
            .process_group(0)
            .spawn()
            .unwrap();
        if c.id() as i32 == want {
            return Some(c);
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    None
}

#[test]
fn a_keeper_never_signals_a_recycled_group_after_the_tree_was_reaped() {
    let fake = FakeAuthority::start();
    // The release hangs: the agent is still there, its job long reaped.
    fake.script("/v1/release", vec![Reply::Blackhole]);
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let mut c = agent(&fake.url(), "tree-recycle");
    // The job's parent is the keeper.
    c.args(["--ttl", "30s", "--", "sh", "-c"])
        .arg(format!("echo $$ $PPID | tr ' ' '\\n' > {}", pids.display()));
    let mut child = spawn(c);
    wait_for(T, || {
        (!fake.requests_to("/v1/release").is_empty()).then_some(())
    })
    .expect("agent reached its release");
    let (pgid, keeper) = match read_pids(&pids)[..] {
        [pgid, keeper] => (pgid, keeper),
        ref other => panic!("pids file: {other:?}"),
    };
    assert!(!exists(pgid), "the job was reaped before the release");
    let mut decoy = recycle_pid(pgid).expect("could not recycle the job's pid");
    // The agent dies now: the keeper (if it has not finished already: it
    // is told to before the release) must not kill what holds the old pgid.
    child.kill().unwrap();
    let _ = child.wait();
    wait_for(T, || (!exists(keeper)).then_some(())).expect("keeper exits");
    let decoy_alive = alive(decoy.id() as i32);
    let _ = decoy.kill();
    let _ = decoy.wait();
    assert!(
        decoy_alive,
        "an unrelated process with the recycled pgid was killed"
    );
}

#[test]
fn a_stopped_keeper_does_not_save_the_group_and_its_tree_dies_when_it_resumes() {
    let fake = FakeAuthority::start();
    let e = Escaper::new();
    let mut child = spawn(e.command(
        &fake.url(),
        "tree-stopped-keeper",
        &["--ttl", "10s", "--heartbeat", "300ms", "--grace", "1s"],
        1000,
    ));
    let (leader, pids) = e.leader_and_escapees();
    let keeper = keeper_of(child.id() as i32);
    let stopped = stop::StopGuard::stopping(keeper);
    fake.set_renew(Reply::Refuse("superseded"));
    let status = wait_exit(&mut child, T);
    let leader_alive = alive(leader);
    if status.is_none() {
        let _ = child.kill();
    }
    // The keeper shares the agent's stderr: resume it before reading.
    stopped.resume(keeper);
    let err = stderr_of(&mut child);
    let status = status.expect("agent exits");
    assert!(
        !leader_alive,
        "job leader alive after the agent exited; {err}"
    );
    assert_eq!(status.code(), Some(124), "{err}");
    // Refused: nothing to release (the authority dropped it).
    assert!(fake.requests_to("/v1/release").is_empty(), "{err}");
    // Resumed, the keeper finishes the job's whole tree.
    assert_gone(&pids, Duration::from_secs(10));
}

#[test]
fn a_lost_keeper_still_gets_the_group_killed_by_the_agent() {
    let fake = FakeAuthority::start();
    let e = Escaper::new();
    let mut child = spawn(e.command(&fake.url(), "tree-lost-keeper", &["--ttl", "30s"], 1000));
    let (leader, pids) = e.leader_and_escapees();
    let keeper = keeper_of(child.id() as i32);
    kill(keeper, 9);
    let status = wait_exit(&mut child, T).expect("agent exits");
    // Whatever of the tree is left holds the agent's stderr open: cleaned
    // up here before stderr is read to its end (the agent's last sweep
    // normally got them already).
    for &p in &pids {
        kill(p, 9);
    }
    let err = support::stderr_of(&mut child);
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(
        !alive(leader),
        "the agent's own SIGKILL reaches the group; {err}"
    );
    // Released only with a provably empty group, as `failed`.
    for r in fake.requests_to("/v1/release") {
        assert_eq!(r.body["outcome"], "failed", "{err}");
    }
}

/// The cgroup v2 mount point (fails the test if there is none).
fn cgroup2_mount() -> std::path::PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split_whitespace().next() == Some("cgroup2"))
                .then(|| left.split_whitespace().nth(4).map(std::path::PathBuf::from))?
        })
        .expect("a cgroup v2 hierarchy is needed (mounted, writable by root)")
}

#[test]
fn in_a_writable_cgroup_the_job_gets_its_own_and_cgroup_kill_takes_the_tree() {
    let fake = FakeAuthority::start();
    fake.script("/v1/renew", vec![Reply::Refuse("superseded")]);
    let cg = cgroup2_mount().join(format!("leaseagent-test-{}", std::process::id()));
    std::fs::create_dir(&cg).expect("create a test cgroup (as root)");
    let e = Escaper::new();
    let inner = e.command(
        &fake.url(),
        "tree-cgroup",
        &["--ttl", "10s", "--heartbeat", "300ms", "--grace", "1s"],
        1000,
    );
    // Enter the test cgroup, then become the agent.
    let mut c = std::process::Command::new("sh");
    c.arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
            cg.display()
        ))
        .arg(inner.get_program())
        .args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.stdin(Stdio::null());
    let mut child = spawn(c);
    let pids = e.escapees();
    let (status, err) = wait_agent(&mut child, T);
    let leftovers: Vec<_> = std::fs::read_dir(&cg)
        .unwrap()
        .flatten()
        .filter(|d| {
            d.file_name()
                .to_string_lossy()
                .starts_with("leaseagent-job-")
        })
        .map(|d| d.path())
        .collect();
    let gone = pids.iter().all(|&p| !alive(p));
    for &p in &pids {
        kill(p, 9);
    }
    for d in &leftovers {
        let _ = std::fs::remove_dir(d);
    }
    let _ = std::fs::remove_dir(&cg);
    assert_eq!(status.code(), Some(124), "{err}");
    assert!(err.contains("cgroup.kill"), "the log says how: {err}");
    assert!(gone, "escapees outlived the agent; {err}");
    assert!(
        leftovers.is_empty(),
        "the job's cgroup is removed: {leftovers:?}"
    );
}
