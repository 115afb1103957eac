//! Real partitions: agents and authorities on different "hosts" (network
//! namespaces on one switch, `support_netns`); a host's link is cut so its
//! packets vanish. The cut agent's job must be dead before the authority's
//! expiry, a standby on another host takes over with a higher token, and the
//! cut agent's late write is refused at the fenced sink once the link heals.

use crate::support::{alive, netns};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netns::{Net, Proc};

const LONG: Duration = Duration::from_secs(60);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_leaseagent")
}

/// The job: records its pid and token, publishes "NAME TOKEN" to SINK/out
/// through `leaseagent publish`, then waits; exits at once on SIGTERM.
const JOB: &str = r#"#!/bin/sh
echo $$ > "$W/$NAME.pid"
echo "$LEASE_TOKEN" > "$W/$NAME.token"
echo "$NAME $LEASE_TOKEN" > "$SINK/.out.$NAME.tmp"
"$LA" publish "$SINK/.out.$NAME.tmp" "$SINK/out" || exit 3
echo published >> "$W/$NAME.state"
trap 'kill $s 2>/dev/null; echo term >> "$W/$NAME.state"; exit 0' TERM
sleep 1000 & s=$!
wait $s
"#;

struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        // On tmpfs: the etcd members' WALs live here, and an fsync stalled
        // by a busy shared disk would read as a partition (see
        // support/etcd.rs).
        let dir = tempfile::tempdir_in("/dev/shm").expect("a temp dir on /dev/shm");
        std::fs::create_dir(dir.path().join("sink")).unwrap();
        std::fs::write(dir.path().join("job.sh"), JOB).unwrap();
        Scene { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path().join(name)).unwrap_or_default()
    }

    /// An agent on host `host` of `net` running the job as NAME.
    fn agent(&self, net: &Net, host: usize, authority: &str, name: &str, extra: &[&str]) -> Proc {
        self.agent_with(
            net,
            host,
            authority,
            name,
            &["--ttl", "6s", "--grace", "2s"],
            extra,
        )
    }

    fn agent_with(
        &self,
        net: &Net,
        host: usize,
        authority: &str,
        name: &str,
        timing: &[&str],
        extra: &[&str],
    ) -> Proc {
        let log = std::fs::File::create(self.path().join(format!("{name}.log"))).unwrap();
        let child = net
            .cmd(host, bin())
            .args(["--authority", authority, "--task", "part"])
            .args(timing)
            .args(["--holder", name])
            // The job writes its pid (`$$`) for the test to watch.
            .arg("--no-pid-namespace")
            .args(extra)
            .arg("--")
            .arg("sh")
            .arg(self.path().join("job.sh"))
            .env("W", self.path())
            .env("NAME", name)
            .env("SINK", self.path().join("sink"))
            .env("LA", bin())
            .env(
                "LEASEAGENT_STATE_DIR",
                self.path().join(format!("state-{name}")),
            )
            .env("RUST_LOG", "leaseagent=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Proc(child)
    }

    fn token(&self, name: &str) -> u64 {
        self.read(&format!("{name}.token")).trim().parse().unwrap()
    }

    fn job_pid(&self, name: &str) -> i32 {
        self.read(&format!("{name}.pid")).trim().parse().unwrap()
    }

    fn wait_published(&self, name: &str) {
        let until = Instant::now() + LONG;
        while !self.read(&format!("{name}.state")).contains("published") {
            assert!(
                Instant::now() < until,
                "{name} did not publish; log:\n{}",
                self.read(&format!("{name}.log"))
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `leaseagent publish --token T` of a fresh file to SINK/out from host `host`.
    fn late_publish(&self, net: &Net, host: usize, token: u64) -> i32 {
        let src = self.path().join("sink/.late.tmp");
        std::fs::write(&src, "late write\n").unwrap();
        net.cmd(host, bin())
            .args(["publish", "--token", &token.to_string()])
            .arg(&src)
            .arg(self.path().join("sink/out"))
            .status()
            .unwrap()
            .code()
            .unwrap_or(-1)
    }
}

/// Waits for the job to die; returns when it was first seen dead.
fn death_of(pid: i32, within: Duration) -> Instant {
    let until = Instant::now() + within;
    loop {
        if !alive(pid) {
            return Instant::now();
        }
        assert!(
            Instant::now() < until,
            "job {pid} still alive after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The remaining time of the task's lease as the serve authority on `host` sees it.
fn serve_expires_in(net: &Net, host: usize) -> Duration {
    let out = net
        .cmd(host, bin())
        .args(["leases", "--json", "--authority", "http://127.0.0.1:7878"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "leases --json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let arr = v
        .as_array()
        .cloned()
        .or_else(|| v.get("leases").and_then(|l| l.as_array()).cloned())
        .unwrap_or_default();
    let lease = arr
        .iter()
        .find(|l| l["task"] == "part")
        .unwrap_or_else(|| panic!("no lease on part: {v}"));
    Duration::from_millis(lease["expires_in_ms"].as_u64().unwrap())
}

#[test]
fn a_cut_agent_stops_before_serve_expires_it_and_its_late_write_is_refused() {
    let scene = Scene::new();
    let net = Net::new(3);
    let _serve = Proc(
        net.cmd(1, bin())
            .args([
                "serve",
                "--no-auth",
                "--insecure-listen",
                "--listen",
                "0.0.0.0:7878",
                "--db",
            ])
            .arg(scene.path().join("leases.sqlite3"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://{}:7878", net.ip(1));
    let until = Instant::now() + LONG;
    while !net
        .cmd(2, bin())
        .args(["leases", "--authority", &url])
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(Instant::now() < until, "serve not reachable from host 2");
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut a = scene.agent(&net, 2, &url, "a", &[]);
    scene.wait_published("a");
    let (a_token, a_job) = (scene.token("a"), scene.job_pid("a"));

    net.cut(2);
    // Measured after the answer: the real expiry is no later than this.
    let expires_in = serve_expires_in(&net, 1);
    let expiry = Instant::now() + expires_in;
    let mut b = scene.agent(
        &net,
        3,
        &format!("http://{}:7878", net.ip(1)),
        "b",
        &["--wait", "60s"],
    );

    let dead = death_of(a_job, LONG);
    assert!(
        dead < expiry,
        "job of the cut agent died {:?} after the authority's expiry",
        dead - expiry
    );
    eprintln!(
        "cut agent's job died {:?} before serve's expiry",
        expiry - dead
    );
    let code = a.wait(LONG).map(|s| s.code());
    assert_eq!(
        code,
        Some(Some(124)),
        "cut agent's exit; log:\n{}",
        scene.read("a.log")
    );

    scene.wait_published("b");
    let b_token = scene.token("b");
    assert!(b_token > a_token, "standby token {b_token} after {a_token}");
    assert_eq!(scene.read("sink/out"), format!("b {b_token}\n"));

    net.heal(2);
    assert_eq!(
        scene.late_publish(&net, 2, a_token),
        1,
        "late write not refused"
    );
    assert_eq!(scene.read("sink/out"), format!("b {b_token}\n"));

    let _ = b.0.kill();
    let _ = b.wait(LONG);
    let leftover = net.existing();
    assert_eq!(leftover.len(), 4, "{leftover:?}");
}

#[test]
fn namespaces_are_removed_on_drop() {
    let net = Net::new(2);
    let prefix = net.prefix.clone();
    assert_eq!(net.existing().len(), 3);
    drop(net);
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&prefix));
}

/// A 3-member etcd cluster, member `i` on host `i` (client port 2379, peer 2380).
fn etcd_cluster(net: &Net, scene: &Scene) -> Vec<Proc> {
    let cluster = (1..=3)
        .map(|i| format!("m{i}=http://{}:2380", net.ip(i)))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::new();
    for i in 1..=3 {
        let ip = net.ip(i);
        let log = std::fs::File::create(scene.path().join(format!("etcd{i}.log"))).unwrap();
        let child = net
            .cmd(i, "etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(scene.path().join(format!("etcd{i}")))
            .args(["--listen-client-urls", &format!("http://{ip}:2379")])
            .args(["--advertise-client-urls", &format!("http://{ip}:2379")])
            .args(["--listen-peer-urls", &format!("http://{ip}:2380")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{ip}:2380"),
            ])
            .args(["--initial-cluster", &cluster])
            .args(["--initial-cluster-token", &net.prefix])
            .args(["--initial-cluster-state", "new"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd must be installed (.ci/install-etcd.sh)");
        members.push(Proc(child));
    }
    let until = Instant::now() + LONG;
    loop {
        let ok = net
            .cmd(2, "etcdctl")
            .arg(format!(
                "--endpoints={}:2379,{}:2379,{}:2379",
                net.ip(1),
                net.ip(2),
                net.ip(3)
            ))
            .args(["endpoint", "health"])
            .output()
            .expect("etcdctl must be installed (.ci/install-etcd.sh)")
            .status
            .success();
        if ok {
            return members;
        }
        assert!(
            Instant::now() < until,
            "etcd cluster not healthy:\n{}",
            scene.read("etcd1.log")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Makes sure member 1 is not the leader (moves leadership to member 2 if it
/// is). etcd 3.4 lets an isolated leader renew leases until it steps down, so
/// with the leader cut off the agent's renewals would keep succeeding there for
/// a while; the test is about an agent next to a cut-off follower.
fn leader_off_member_1(net: &Net) {
    let all = format!(
        "--endpoints={}:2379,{}:2379,{}:2379",
        net.ip(1),
        net.ip(2),
        net.ip(3)
    );
    let until = Instant::now() + LONG;
    loop {
        let out = net
            .cmd(2, "etcdctl")
            .args([all.as_str(), "endpoint", "status", "-w", "json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let ids: Vec<(String, u64, u64)> = v
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| {
                        Some((
                            e["Endpoint"].as_str()?.to_string(),
                            e["Status"]["header"]["member_id"].as_u64()?,
                            e["Status"]["leader"].as_u64()?,
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        if ids.len() == 3 {
            let m1 = ids.iter().find(|e| e.0.contains(&net.ip(1))).unwrap().1;
            let m2 = ids.iter().find(|e| e.0.contains(&net.ip(2))).unwrap().1;
            let leader = ids[0].2;
            if leader != 0 && leader != m1 && ids.iter().all(|e| e.2 == leader) {
                return;
            }
            if leader == m1 {
                eprintln!("member 1 leads: moving leadership to member 2");
                let _ = net
                    .cmd(2, "etcdctl")
                    .arg(format!("--endpoints={}:2379", net.ip(1)))
                    .args(["move-leader", &format!("{m2:x}")])
                    .output();
            }
        }
        assert!(Instant::now() < until, "leader still on member 1: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A lower bound of the expiry of the only lease, as the majority (members 2
/// and 3, asked from host `host`) sees it: `timetolive` rounds down to seconds
/// and the clock is read before asking.
fn etcd_expiry_lower_bound(net: &Net, host: usize) -> Instant {
    let eps = format!("--endpoints={}:2379,{}:2379", net.ip(2), net.ip(3));
    let until = Instant::now() + LONG;
    loop {
        let before = Instant::now();
        let list = net
            .cmd(host, "etcdctl")
            .args([&eps, "--command-timeout=2s", "lease", "list"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&list.stdout).into_owned();
        let ids: Vec<&str> = text
            .lines()
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        if list.status.success() && ids.len() == 1 {
            let ttl = net
                .cmd(host, "etcdctl")
                .args([&eps, "--command-timeout=2s", "lease", "timetolive", ids[0]])
                .output()
                .unwrap();
            let t = String::from_utf8_lossy(&ttl.stdout).into_owned();
            // "lease 694d... granted with TTL(8s), remaining(5s)"
            let remaining = t
                .split("remaining(")
                .nth(1)
                .and_then(|r| r.split('s').next())
                .and_then(|n| n.parse::<u64>().ok());
            if let (true, Some(r)) = (ttl.status.success(), remaining) {
                return before + Duration::from_secs(r);
            }
        }
        assert!(Instant::now() < until, "no lease on the majority: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_agent_with_a_cut_off_etcd_member_stops_before_the_majority_expires_it() {
    let scene = Scene::new();
    let net = Net::new(4);
    let _etcd = etcd_cluster(&net, &scene);
    leader_off_member_1(&net);
    let timing = ["--ttl", "8s", "--grace", "3s"];
    // Agent A on host 1, next to member 1 and talking to it only.
    let mut a = scene.agent_with(
        &net,
        1,
        &format!("etcd://{}:2379", net.ip(1)),
        "a",
        &timing,
        &[],
    );
    scene.wait_published("a");
    let (a_token, a_job) = (scene.token("a"), scene.job_pid("a"));

    // Host 1 (member 1 and agent A) is cut off from the majority.
    net.cut(1);
    let expiry = etcd_expiry_lower_bound(&net, 4);
    let majority = format!("etcd://{}:2379,{}:2379", net.ip(2), net.ip(3));
    let mut b = scene.agent_with(&net, 4, &majority, "b", &timing, &["--wait", "60s"]);

    let dead = death_of(a_job, LONG);
    assert!(
        dead < expiry,
        "job on the cut-off side died {:?} after the majority's expiry",
        dead - expiry
    );
    eprintln!(
        "cut-off job died {:?} before the majority's expiry",
        expiry - dead
    );
    let code = a.wait(LONG).map(|s| s.code());
    assert_eq!(
        code,
        Some(Some(124)),
        "cut-off agent's exit; log:\n{}",
        scene.read("a.log")
    );

    scene.wait_published("b");
    let b_token = scene.token("b");
    assert!(b_token > a_token, "standby token {b_token} after {a_token}");

    net.heal(1);
    assert_eq!(
        scene.late_publish(&net, 1, a_token),
        1,
        "late write not refused"
    );
    assert_eq!(scene.read("sink/out"), format!("b {b_token}\n"));
    let _ = b.0.kill();
    let _ = b.wait(LONG);
}
