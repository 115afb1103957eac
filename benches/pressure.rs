//! Benchmark (not a test): renewal lateness while the job exhausts one
//! resource at a time: CPU, memory, processes, its own network link, disk.
//!
//! `sudo cargo bench --bench pressure` (add `-- --seconds N` to change the
//! length of each phase, default 20, or `-- --only NAME` for one phase).
//! Needs root: cgroups, network namespaces, `tc`, a tmpfs mount. Every phase
//! runs the agent with `--ttl 3s --heartbeat 500ms` and a job that:
//!
//! | phase | the job | authority |
//! |---|---|---|
//! | cpu | 4 x nproc busy processes | in-process fake |
//! | memory | pins 40 MiB in a tmpfs and reads a 256 MiB file over and over, in a 64 MiB memory cgroup it shares with the agent (constant reclaim) | in-process fake |
//! | processes | forks until its pids cgroup (40 tasks, shared with the agent) refuses | in-process fake |
//! | network | four TCP streams over a 1 Mbit/s veth (tbf, pfifo_fast under it) that the renewals also use | `leaseagent serve` in another network namespace |
//! | disk | writes 1 MiB blocks and fsyncs every 8 MiB on the filesystem of the embedded authority's database | embedded (`sqlite:`) |
//!
//! Lateness is read on the agent's side, the same way for every authority:
//! the job publishes `LEASEAGENT_STATE_FILE`, the bench polls it every 5 ms
//! and records each new `deadline_boot_ms` (= the renewal's send time + the
//! ttl budget, exact whatever the file's write delay). A renewal's lateness
//! is its send time minus (the previous one's + 500 ms), so a failed try and
//! its retry count in it. "held" means the agent exited with the job's own
//! status 0 and never published the state `lost`.
//!
//! `LEASEAGENT_BIN=PATH` runs another build of the agent (e.g. an older
//! one, to compare two builds on equal terms).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leaseagent_testkit::*;

const HEARTBEAT_MS: f64 = 500.0;
const TIMING: [&str; 4] = ["--ttl", "3s", "--heartbeat", "500ms"];

fn bin() -> PathBuf {
    leaseagent_testkit::bench_bin(env!("CARGO_BIN_EXE_leaseagent"))
}

fn helper(name: &str) -> String {
    format!("{}/tests/helpers/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn sh(cmd: &str) {
    let st = Command::new("sh").arg("-c").arg(cmd).status().expect("sh");
    assert!(st.success(), "failed: {cmd}");
}

/// One phase's outcome.
struct Outcome {
    renewals: usize,
    late_ms: Vec<f64>,
    held: bool,
    exit: Option<i32>,
    hwm_kib: u64,
}

/// Runs `agent` (whose job is wrapped to publish its state file's path in
/// `mark`) to the end, polling the state file.
fn observe(mut agent: Command, mark: &Path, pid_of_agent: impl Fn(u32) -> u32) -> Outcome {
    agent
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = agent.spawn().expect("start the agent");
    let mut deadlines: Vec<u64> = Vec::new();
    let mut lost = false;
    let mut hwm = 0;
    let mut state: Option<PathBuf> = None;
    let status = loop {
        if state.is_none() {
            state = std::fs::read_to_string(mark)
                .ok()
                .map(|s| PathBuf::from(s.trim()))
                .filter(|p| !p.as_os_str().is_empty());
        }
        if let Some(v) = state
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        {
            if let Some(d) = v["deadline_boot_ms"].as_u64() {
                if deadlines.last() != Some(&d) {
                    deadlines.push(d);
                }
            }
            lost |= v["state"] == "lost";
        }
        if let Some(h) = vm_hwm_kib(pid_of_agent(child.id())) {
            hwm = hwm.max(h);
        }
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    // The first value is the grant's; each later one a renewal's.
    let mut late: Vec<f64> = deadlines
        .windows(2)
        .map(|w| (w[1].saturating_sub(w[0]) as f64 - HEARTBEAT_MS).max(0.0))
        .collect();
    late.sort_by(|a, b| a.total_cmp(b));
    let held = status.code() == Some(0) && !lost;
    if !held {
        eprintln!("agent stderr:\n{err}");
    }
    Outcome {
        renewals: late.len(),
        late_ms: late,
        held,
        exit: status.code(),
        hwm_kib: hwm,
    }
}

/// The agent command: `authority`, the bench's timing, and `job` wrapped to
/// write `$LEASEAGENT_STATE_FILE` to `mark` first.
fn agent_cmd(program: &mut Command, authority: &str, task: &str, mark: &Path, job: &[&str]) {
    program
        .args(["--authority", authority, "--task", task])
        .args(TIMING)
        .env("RUST_LOG", "warn")
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo \"$LEASEAGENT_STATE_FILE\" > {}; exec \"$@\"",
            mark.display()
        ))
        .arg("sh")
        .args(job);
}

/// A cgroup with one limit, on the hierarchy that has the controller (v1
/// or v2); its processes are killed and it is removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(controller: &str, name: &str, limits: &[(&str, &str)]) -> Cgroup {
        let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let mut root = None;
        for l in info.lines() {
            let Some((left, right)) = l.split_once(" - ") else {
                continue;
            };
            let mut r = right.split_whitespace();
            let (fs, _, opts) = (r.next(), r.next(), r.next().unwrap_or(""));
            let mount = left.split_whitespace().nth(4).map(PathBuf::from);
            if fs == Some("cgroup") && opts.split(',').any(|o| o == controller) {
                root = mount.map(|m| (m, false));
                break;
            }
            if fs == Some("cgroup2") && root.is_none() {
                root = mount.map(|m| (m, true));
            }
        }
        let (root, v2) = root.expect("a cgroup hierarchy");
        if v2 {
            let _ = std::fs::write(
                root.join("cgroup.subtree_control"),
                format!("+{controller}"),
            );
        }
        let dir = root.join(format!("leaseagent-bench-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("create a cgroup (run as root)");
        for (file, value) in limits {
            // v1 and v2 name some files differently: the first that exists.
            for f in file.split('|') {
                if std::fs::write(dir.join(f), value).is_ok() {
                    break;
                }
            }
        }
        Cgroup(dir)
    }

    fn wrap(&self, inner: &Command) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
                self.0.display()
            ))
            .arg(inner.get_program())
            .args(inner.get_args());
        for (k, v) in inner.get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        c
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..200 {
            let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() {
                break;
            }
            for p in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                kill(p, 9);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn cpu(seconds: u64, dir: &Path) -> Outcome {
    let fake = FakeAuthority::start();
    let nproc = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mark = dir.join("cpu.state");
    let mut c = Command::new(bin());
    let (n, s) = ((4 * nproc).to_string(), seconds.to_string());
    agent_cmd(
        &mut c,
        &fake.url(),
        "bench-cpu",
        &mark,
        &[&helper("burn.sh"), &n, &s],
    );
    observe(c, &mark, |p| p)
}

/// The agent runs under the cgroup's `sh`, which execs it: same pid.
fn memory(seconds: u64, dir: &Path) -> Outcome {
    let fake = FakeAuthority::start();
    let big = dir.join("big");
    sh(&format!("head -c 256M /dev/urandom > {}", big.display()));
    let fs = dir.join("tmpfs");
    std::fs::create_dir(&fs).expect("mkdir");
    sh(&format!("mount -t tmpfs -o size=1g tmpfs {}", fs.display()));
    let cg = Cgroup::new(
        "memory",
        "memory",
        &[
            ("memory.max|memory.limit_in_bytes", "67108864"),
            ("memory.swap.max|memory.swappiness", "0"),
        ],
    );
    let mark = dir.join("memory.state");
    let script = format!(
        "head -c 40M /dev/zero > {fs}/keep; end=$(( $(date +%s) + {seconds} )); \
         while [ $(date +%s) -lt $end ]; do cat {big} > /dev/null; done",
        fs = fs.display(),
        big = big.display()
    );
    let mut inner = Command::new(bin());
    agent_cmd(
        &mut inner,
        &fake.url(),
        "bench-memory",
        &mark,
        &["sh", "-c", &script],
    );
    let out = observe(cg.wrap(&inner), &mark, |p| p);
    drop(cg);
    let _ = Command::new("umount").arg(&fs).status();
    let _ = std::fs::remove_file(&big);
    out
}

fn processes(seconds: u64, dir: &Path) -> Outcome {
    let fake = FakeAuthority::start();
    let cg = Cgroup::new("pids", "pids", &[("pids.max", "40")]);
    let mark = dir.join("pids.state");
    let s = seconds.to_string();
    let mut inner = Command::new(bin());
    agent_cmd(
        &mut inner,
        &fake.url(),
        "bench-pids",
        &mark,
        &["python3", &helper("fork-fill.py"), &s],
    );
    observe(cg.wrap(&inner), &mark, |p| p)
}

/// Two network namespaces joined by a veth; removed on drop.
struct Link(String);

impl Link {
    fn new() -> Link {
        let p = format!("lab{}", std::process::id());
        sh(&format!(
            "ip netns add {p}a && ip netns add {p}b && \
             ip link add eth0 netns {p}a type veth peer name eth0 netns {p}b && \
             ip -n {p}a addr add 10.98.0.1/24 dev eth0 && ip -n {p}b addr add 10.98.0.2/24 dev eth0 && \
             ip -n {p}a link set eth0 up && ip -n {p}b link set eth0 up && \
             ip -n {p}a link set lo up && ip -n {p}b link set lo up && \
             ip netns exec {p}b tc qdisc add dev eth0 root handle 1: tbf rate 1mbit burst 16kb latency 10s && \
             ip netns exec {p}b tc qdisc add dev eth0 parent 1:1 handle 10: pfifo_fast"
        ));
        Link(p)
    }
    fn cmd(&self, side: char, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{}{side}", self.0), program]);
        c
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for s in ["a", "b"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &format!("{}{s}", self.0)])
                .status();
        }
    }
}

/// A child killed and reaped on drop.
struct Bg(std::process::Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn network(seconds: u64, dir: &Path) -> Outcome {
    let link = Link::new();
    let b = bin();
    let _serve = Bg(link
        .cmd('a', b.to_str().expect("utf-8 path"))
        .args([
            "serve",
            "--no-auth",
            "--insecure-listen",
            "--listen",
            "10.98.0.1:7878",
            "--db",
        ])
        .arg(dir.join("net.sqlite3"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve"));
    let _sink = Bg(link
        .cmd('a', "python3")
        .arg(helper("sink.py"))
        .args(["10.98.0.1", "9000"])
        .arg(dir.join("sunk"))
        .spawn()
        .expect("python3"));
    let url = "http://10.98.0.1:7878";
    let until = Instant::now() + Duration::from_secs(30);
    while !link
        .cmd('b', b.to_str().expect("utf-8 path"))
        .args(["leases", "--authority", url])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(Instant::now() < until, "serve not reachable");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mark = dir.join("net.state");
    let mut c = link.cmd('b', b.to_str().expect("utf-8 path"));
    let s = seconds.to_string();
    agent_cmd(
        &mut c,
        url,
        "bench-net",
        &mark,
        &["python3", &helper("blast.py"), "10.98.0.1", "9000", &s],
    );
    // `ip netns exec` execs the agent: same pid.
    observe(c, &mark, |p| p)
}

const DISK_FILL: &str = r#"
import os, sys, time
end = time.monotonic() + float(sys.argv[2])
block = os.urandom(1 << 20)
with open(sys.argv[1], "wb") as f:
    n = 0
    while time.monotonic() < end:
        f.write(block)
        n += 1
        if n % 8 == 0:
            f.flush()
            os.fsync(f.fileno())
        if n % 256 == 0:
            f.seek(0)
os.unlink(sys.argv[1])
"#;

fn disk(seconds: u64, dir: &Path) -> Outcome {
    let db = dir.join("disk");
    std::fs::create_dir(&db).expect("mkdir");
    let mark = dir.join("disk.state");
    let authority = format!("sqlite:{}", db.join("leases.sqlite3").display());
    let junk = db.join("junk");
    let mut c = Command::new(bin());
    let s = seconds.to_string();
    agent_cmd(
        &mut c,
        &authority,
        "bench-disk",
        &mark,
        &[
            "python3",
            "-c",
            DISK_FILL,
            junk.to_str().expect("utf-8 path"),
            &s,
        ],
    );
    observe(c, &mark, |p| p)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: u64 = value("--seconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let only = value("--only");
    // On the disk, not in a tmpfs: the disk phase needs a real filesystem.
    let dir = tempfile::Builder::new()
        .prefix("leaseagent-pressure")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir");
    type Phase = fn(u64, &Path) -> Outcome;
    let phases: [(&str, Phase); 5] = [
        ("cpu", cpu),
        ("memory", memory),
        ("processes", processes),
        ("network", network),
        ("disk", disk),
    ];
    println!(
        "renewal lateness under pressure, {seconds}s per phase, ttl 3s, heartbeat 500ms, agent {}",
        bin().display()
    );
    for (name, phase) in phases {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let o = phase(seconds, dir.path());
        println!(
            "{name:<10} renewals {:>3}  lateness p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  held: {}  (exit {:?}, agent VmHWM {:.2} MiB)",
            o.renewals,
            leaseagent_testkit::percentile(&o.late_ms, 0.5),
            leaseagent_testkit::percentile(&o.late_ms, 0.99),
            o.late_ms.last().copied().unwrap_or(f64::NAN),
            if o.held { "yes" } else { "NO" },
            o.exit,
            o.hwm_kib as f64 / 1024.0
        );
    }
}
