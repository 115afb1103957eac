//! The whole agent (`leaseagent --authority etcd://… --task … -- cmd`)
//! against real etcd processes on loopback ports.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use support::etcd::{Etcd, etcdctl_lock, poll, read_rev};

/// A running agent, killed on drop.
struct Agent(Child);

impl Agent {
    fn wait_within(&mut self, within: Duration) -> ExitStatus {
        poll(within, "the agent to exit", || {
            self.0.try_wait().ok().flatten()
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent(etcd: &Etcd, state: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
    c.env("LEASEAGENT_STATE_DIR", state)
        .env("XDG_RUNTIME_DIR", state)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .args(["--authority", &etcd.url()])
        .args(args)
        .stdin(Stdio::null());
    c
}

fn run(etcd: &Etcd, state: &Path, args: &[&str]) -> Output {
    agent(etcd, state, args).output().expect("run leaseagent")
}

fn spawn(etcd: &Etcd, state: &Path, args: &[&str]) -> Agent {
    Agent(
        agent(etcd, state, args)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn leaseagent"),
    )
}

fn read_file(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .filter(|s| s.ends_with('\n'))
        .map(|s| s.trim().to_string())
}

#[test]
fn token_relay_exit_code_and_cleanup() {
    let etcd = Etcd::start();
    let st = tempfile::tempdir().unwrap();
    let env = r#"echo "$LEASE_TOKEN $LEASE_ID $LEASE_TASK $LEASE_AUTHORITY $LEASE_TTL_MS""#;
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let out = run(
            &etcd,
            st.path(),
            &["--task", "tr", "--ttl", "3s", "--", "sh", "-c", env],
        );
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 5, "{line}");
        assert!(u64::from_str_radix(f[1], 16).is_ok(), "LEASE_ID {}", f[1]);
        assert_eq!(f[2], "tr");
        assert_eq!(f[3], etcd.url());
        assert_eq!(f[4], "3000");
        tokens.push(f[0].parse::<u64>().expect("LEASE_TOKEN"));
        // Released on exit: no key, no lease.
        assert!(etcd.keys("tr/").is_empty(), "key left after exit");
        assert!(etcd.leases().is_empty(), "lease left after exit");
    }
    assert!(tokens[1] > tokens[0], "{tokens:?}");
    let out = run(
        &etcd,
        st.path(),
        &["--task", "tr", "--", "sh", "-c", "exit 7"],
    );
    assert_eq!(out.status.code(), Some(7));
    assert!(etcd.keys("tr/").is_empty() && etcd.leases().is_empty());
}

#[test]
fn held_by_etcdctl_lock_gives_75_without_wait() {
    let etcd = Etcd::start();
    let st = tempfile::tempdir().unwrap();
    let lk = tempfile::tempdir().unwrap();
    let mut lock = etcdctl_lock(&etcd, "h", lk.path());
    poll(Duration::from_secs(10), "etcdctl lock", || {
        read_rev(lk.path())
    });
    let out = run(&etcd, st.path(), &["--task", "h", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert_eq!(etcd.keys("h/").len(), 1, "the refused agent left its key");
    std::fs::write(lk.path().join("release"), b"").unwrap();
    assert!(lock.wait().unwrap().success());
}

#[test]
fn waits_for_etcdctl_lock_and_etcdctl_lock_waits_for_it() {
    let etcd = Etcd::start();
    let st = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();

    // etcdctl first, the agent waits.
    let lk = tempfile::tempdir().unwrap();
    let mut lock = etcdctl_lock(&etcd, "i", lk.path());
    let rev1 = poll(Duration::from_secs(10), "etcdctl lock", || {
        read_rev(lk.path())
    });
    let tok = work.path().join("token");
    let script = format!("echo $LEASE_TOKEN > {}", tok.display());
    let mut a = spawn(
        &etcd,
        st.path(),
        &[
            "--task", "i", "--ttl", "5s", "--wait", "60s", "--", "sh", "-c", &script,
        ],
    );
    // Give the agent time to try (it is refused while etcdctl holds).
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        read_file(&tok).is_none(),
        "the agent ran while etcdctl held the lock"
    );
    std::fs::write(lk.path().join("release"), b"").unwrap();
    assert!(lock.wait().unwrap().success());
    let status = a.wait_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
    let token: u64 = read_file(&tok).unwrap().parse().unwrap();
    assert!(token > rev1, "token {token} !> ETCD_LOCK_REV {rev1}");

    // The agent first, etcdctl waits.
    let started = work.path().join("started");
    let release = work.path().join("release");
    let script = format!(
        "echo $LEASE_TOKEN > {}; while [ ! -e {} ]; do sleep 0.05; done",
        started.display(),
        release.display()
    );
    let mut a = spawn(
        &etcd,
        st.path(),
        &["--task", "i", "--ttl", "5s", "--", "sh", "-c", &script],
    );
    let token: u64 = poll(Duration::from_secs(10), "the job", || read_file(&started))
        .parse()
        .unwrap();
    let lk2 = tempfile::tempdir().unwrap();
    let mut lock = etcdctl_lock(&etcd, "i", lk2.path());
    poll(Duration::from_secs(10), "etcdctl to queue", || {
        (etcd.keys("i/").len() == 2).then_some(())
    });
    assert_eq!(
        read_rev(lk2.path()),
        None,
        "etcdctl got the lock while the agent held it"
    );
    std::fs::write(&release, b"").unwrap();
    assert_eq!(a.wait_within(Duration::from_secs(30)).code(), Some(0));
    let rev2 = poll(Duration::from_secs(10), "etcdctl lock", || {
        read_rev(lk2.path())
    });
    assert!(rev2 > token, "ETCD_LOCK_REV {rev2} !> token {token}");
    std::fs::write(lk2.path().join("release"), b"").unwrap();
    assert!(lock.wait().unwrap().success());
    assert!(etcd.keys("i/").is_empty());
}

#[test]
fn lease_revoked_from_outside_stops_the_job_with_124() {
    let etcd = Etcd::start();
    let st = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let id_file = work.path().join("id");
    let script = format!("echo $LEASE_ID > {}; exec sleep 120", id_file.display());
    // A long ttl: only a refusal (not local expiry) can stop it soon.
    let mut a = spawn(
        &etcd,
        st.path(),
        &[
            "--task",
            "rv",
            "--ttl",
            "60s",
            "--heartbeat",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let id = poll(Duration::from_secs(10), "the job", || read_file(&id_file));
    let out = etcd.etcdctl(&["lease", "revoke", &id]);
    assert!(out.status.success(), "{out:?}");
    let revoked = Instant::now();
    let status = a.wait_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(124));
    // Far below the 60 s ttl: the refusal at the next heartbeat stopped it
    // (the exact figure, about one heartbeat, is in docs/etcd.md).
    assert!(revoked.elapsed() < Duration::from_secs(30));
}

/// Seconds since boot (`CLOCK_BOOTTIME`, as /proc/uptime shows it).
fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn frozen_etcd_stops_the_job_before_the_lease_could_expire() {
    let etcd = Etcd::start();
    let st = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let beat = work.path().join("beat");
    // The job records the boot clock every 50 ms while it lives.
    let script = format!(
        "while :; do cut -d' ' -f1 /proc/uptime > {b}.tmp; mv {b}.tmp {b}; sleep 0.05; done",
        b = beat.display()
    );
    let ttl = 4.0;
    let mut a = spawn(
        &etcd,
        st.path(),
        &["--task", "fz", "--ttl", "4s", "--", "sh", "-c", &script],
    );
    poll(Duration::from_secs(10), "the job", || {
        std::fs::metadata(&beat).ok()
    });
    // Let a renewal or two go through, then freeze etcd.
    std::thread::sleep(Duration::from_millis(1500));
    let frozen_at = uptime();
    etcd.members[0].freeze();
    let status = a.wait_within(Duration::from_secs(30));
    let exited_at = uptime();
    etcd.members[0].thaw();
    assert_eq!(status.code(), Some(124));
    // Nothing is left to revoke once the lease has run out by the agent's
    // clock: the agent does not linger in a release etcd cannot answer
    // (it used to, for up to 5 s more). 2 s of margin for a busy machine.
    assert!(
        exited_at < frozen_at + ttl + 2.0,
        "agent exited {:.1}s after the freeze (ttl {ttl}s)",
        exited_at - frozen_at
    );
    let last_beat: f64 = std::fs::read_to_string(&beat)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Every successful renewal was sent before the freeze, so the lease ran
    // out at frozen_at + ttl at the latest: the job must be dead before it.
    assert!(
        last_beat < frozen_at + ttl,
        "job still ran at {last_beat}, lease expired by {}",
        frozen_at + ttl
    );
}

#[test]
fn a_leader_killed_mid_run_does_not_stop_the_job() {
    let mut etcd = Etcd::start_cluster(3);
    let st = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let started = work.path().join("started");
    let script = format!("echo x > {}; sleep 8", started.display());
    let mut a = spawn(
        &etcd,
        st.path(),
        &["--task", "ld", "--ttl", "6s", "--", "sh", "-c", &script],
    );
    poll(Duration::from_secs(10), "the job", || read_file(&started));
    std::thread::sleep(Duration::from_millis(1000));
    let leader = etcd.leader();
    etcd.members[leader].kill();
    let status = a.wait_within(Duration::from_secs(40));
    assert_eq!(status.code(), Some(0), "job stopped by a leader election");
    assert!(etcd.keys("ld/").is_empty(), "key left after exit");
}

#[test]
fn waiters_keep_their_order_through_a_leader_change() {
    // The review: an etcd leader change made 2 of 3 `--wait` agents exit
    // 125. Now they wait through it, and keep their places.
    let mut etcd = Etcd::start_cluster(3);
    let st = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (order, go) = (work.path().join("order"), work.path().join("go"));
    let holder_script = format!(
        "echo H >> {o}; while [ ! -e {g} ]; do sleep 0.05; done",
        o = order.display(),
        g = go.display()
    );
    let mut holder = spawn(
        &etcd,
        st.path(),
        &[
            "--task",
            "lw",
            "--ttl",
            "6s",
            "--",
            "sh",
            "-c",
            &holder_script,
        ],
    );
    poll(Duration::from_secs(10), "the holder's job", || {
        read_file(&order)
    });
    let mut waiters = Vec::new();
    for i in 0..3 {
        let script = format!("echo W{i} >> {}", order.display());
        waiters.push(spawn(
            &etcd,
            st.path(),
            &[
                "--task", "lw", "--ttl", "6s", "--wait", "60s", "--", "sh", "-c", &script,
            ],
        ));
        // Its key in the queue before the next one arrives.
        poll(Duration::from_secs(10), "the waiter's key", || {
            (etcd.keys("lw/").len() == i + 2).then_some(())
        });
    }
    let leader = etcd.leader();
    etcd.members[leader].kill();
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&go, "").unwrap();
    assert_eq!(holder.wait_within(Duration::from_secs(60)).code(), Some(0));
    for (i, w) in waiters.iter_mut().enumerate() {
        let st = w.wait_within(Duration::from_secs(60));
        assert_eq!(st.code(), Some(0), "waiter {i} ended {st:?}");
    }
    let got = std::fs::read_to_string(&order).unwrap();
    assert_eq!(got, "H\nW0\nW1\nW2\n");
}
