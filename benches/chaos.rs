//! Chaos soak with an invariant checker.
//!
//! ```text
//! cargo test --bench chaos -- --minutes 3 --authority all     # debug build, as CI runs it
//! cargo bench --bench chaos -- --minutes 30                   # both authorities, 15 min each
//! ```
//!
//! N agents (`--agents`, default 6) compete for K tasks (`--tasks`, default 2)
//! against `leaseagent serve` or a 3-member etcd cluster (`--authority
//! serve|etcd|both`, default both, the time split between them), or three
//! `serve` replicas on one PostgreSQL store (`--authority replicas`, or
//! `all` for the three kinds, as CI runs it: the
//! agents are given every replica; a PostgreSQL 15 started as `nobody` by
//! the tests' harness, `tests/integration/support/postgres.rs`). Each agent
//! reaches the authority through its own loopback TCP proxy, so it can be
//! partitioned alone. Every job (this binary re-executed with `--job`) writes
//! rows through the fenced SQLite store (`FencedStore`, one shared database:
//! the sink) until it is stopped or superseded.
//!
//! Faults, one every 0.3-1.5 s at random: kill -9 and restart of the authority
//! (serve, one etcd member, or one replica, the leader or a standby); SIGSTOP of an agent for 1-8 s, then SIGCONT
//! (its job keeps running: a zombie once the lease is gone); kill -9 of an
//! agent; a partition of one agent (its proxy stops forwarding, bytes wait,
//! nothing is reset) for 1-8 s. An agent that ended is restarted after a
//! pause, as systemd would: 0.1-0.5 s, or 1-2 s after exit 125.
//!
//! The checker, afterwards, from the sink and the processes:
//! - per task, accepted writes in non-decreasing token order, and strictly
//!   increasing from one attempt to the next (no token shared by attempts);
//! - no two attempts' accepted writes interleaved (once another attempt has
//!   written, an earlier one never writes again);
//! - no process outlived its attempt: when an agent is reaped its job is gone
//!   (within 5 s when the agent was SIGKILLed: the keeper's kill), and no
//!   process of the run is left at the end;
//! - every lease released or expired at the end (the authority lists none
//!   once the agents were stopped and one ttl has passed).
//!
//! Prints the figures (faults by kind, attempts, exits, writes accepted and
//! refused, violations) and exits 1 on any violation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leaseagent::fence::sqlite::SqliteStore;
use leaseagent::fence::{FenceError, FencedStore};
use leaseagent_testkit::alive;

#[allow(
    dead_code,
    reason = "the integration tests' PostgreSQL harness, of which the soak uses a part"
)]
#[path = "../tests/integration/support/postgres.rs"]
mod postgres;

const TTL_S: u64 = 3;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--job") {
        std::process::exit(job(&args[2..]));
    }
    let mut minutes = 1.0f64;
    let mut which = "both".to_string();
    let mut agents = 6usize;
    let mut tasks = 2usize;
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--minutes" => minutes = v.parse().expect("--minutes N"),
            "--authority" => which = v,
            "--agents" => agents = v.parse().expect("--agents N"),
            "--tasks" => tasks = v.parse().expect("--tasks K"),
            "--seed" => seed = v.parse().expect("--seed S"),
            _ => {
                i += 1; // `--bench` from cargo bench, and anything else
                continue;
            }
        }
        i += 2;
    }
    let kinds: Vec<&str> = match which.as_str() {
        "serve" => vec!["serve"],
        "etcd" => vec!["etcd"],
        "both" => vec!["serve", "etcd"],
        "replicas" => vec!["replicas"],
        "all" => vec!["serve", "etcd", "replicas"],
        w => panic!("--authority serve|etcd|both|replicas|all, not {w}"),
    };
    checker_self_test();
    let each = Duration::from_secs_f64(minutes * 60.0 / kinds.len() as f64);
    let mut failed = false;
    for (n, kind) in kinds.iter().enumerate() {
        let report = soak(kind, each, agents, tasks, seed.wrapping_add(n as u64));
        report.print();
        failed |= !report.violations.is_empty();
    }
    std::process::exit(if failed { 1 } else { 0 });
}

// ------------------------------------------------------------------ the job

/// `--job DB TASK ATTEMPT PIDFILE`: writes rows through the fence until
/// refused (exit 1) or killed.
fn job(args: &[String]) -> i32 {
    let (db, task, attempt, pidfile) = (&args[0], &args[1], &args[2], &args[3]);
    let token = match leaseagent::fence::token_from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("chaos job: {e}");
            return 2;
        }
    };
    let _ = std::fs::write(pidfile, format!("{}\n", std::process::id()));
    let mut store = loop {
        match SqliteStore::open(Path::new(db)) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut seq = 0u64;
    loop {
        seq += 1;
        let r = store.write(task, token, |tx| {
            tx.execute(
                "INSERT INTO writes (task, token, attempt, seq) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![task, token as i64, attempt, seq as i64],
            )?;
            Ok::<(), leaseagent::fence::sqlite::Error>(())
        });
        match r {
            Ok(()) => {}
            Err(e) if e.superseded().is_some() => {
                let _ = store.connection().execute(
                    "INSERT INTO refused (task, token, attempt) VALUES (?1, ?2, ?3)",
                    rusqlite::params![task, token as i64, attempt],
                );
                return 1;
            }
            Err(_) => seq -= 1, // busy: try again
        }
        std::thread::sleep(Duration::from_millis(20 + fastrand::u64(0..40)));
    }
}

// ---------------------------------------------------------------- the proxy

/// A loopback TCP proxy to one upstream; `cut` stops forwarding both ways
/// (bytes wait in the kernel buffers, nothing is reset).
struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        l.set_nonblocking(true).expect("nonblocking");
        let addr = l.local_addr().expect("addr");
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (cut.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((down, _)) => {
                        let _ = down.set_nonblocking(false);
                        let Ok(up) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2))
                        else {
                            continue; // authority down: the client sees a close
                        };
                        for (from, to) in [
                            (down.try_clone(), up.try_clone()),
                            (up.try_clone(), down.try_clone()),
                        ] {
                            if let (Ok(from), Ok(to)) = (from, to) {
                                let (c, s) = (c.clone(), s.clone());
                                std::thread::spawn(move || pipe(from, to, c, s));
                            }
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Proxy { addr, cut, stop }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, cut: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 16384];
    loop {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if cut.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                while cut.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

// ------------------------------------------------------------ the authority

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `program` run through `setpriv --pdeathsig KILL` (same pid, it execs):
/// if this harness dies, its agents and authorities die with it.
fn guarded(program: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--pdeathsig", "KILL", program]);
    c
}

/// The binary under test; `CHAOS_LEASEAGENT` overrides it (a copy, for a
/// long run that must survive rebuilds of `target/`).
fn bin() -> String {
    std::env::var("CHAOS_LEASEAGENT")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_leaseagent").to_string())
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

enum Authority {
    Serve {
        port: u16,
        db: PathBuf,
        child: Option<Child>,
    },
    Etcd {
        dir: PathBuf,
        cluster: String,
        members: Vec<Member>,
    },
    /// `serve` replicas on one PostgreSQL store (fixed ports: a restarted
    /// replica is where the agents' URLs say).
    Replicas {
        ports: Vec<u16>,
        children: Vec<Option<Child>>,
        pg: postgres::Postgres,
    },
}

impl Authority {
    fn start(kind: &str, dir: &Path) -> Authority {
        let mut a = match kind {
            "serve" => Authority::Serve {
                port: free_port(),
                db: dir.join("authority.sqlite3"),
                child: None,
            },
            "replicas" => Authority::Replicas {
                ports: (0..3).map(|_| free_port()).collect(),
                children: (0..3).map(|_| None).collect(),
                pg: postgres::Postgres::start(),
            },
            _ => {
                let members: Vec<Member> = (0..3)
                    .map(|i| Member {
                        name: format!("m{i}"),
                        client: free_port(),
                        peer: free_port(),
                        child: None,
                    })
                    .collect();
                let cluster = members
                    .iter()
                    .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
                    .collect::<Vec<_>>()
                    .join(",");
                Authority::Etcd {
                    dir: dir.to_path_buf(),
                    cluster,
                    members,
                }
            }
        };
        let n = a.upstreams().len();
        for i in 0..n {
            a.start_one(i);
        }
        a.wait_ready();
        a
    }

    fn upstreams(&self) -> Vec<SocketAddr> {
        match self {
            Authority::Serve { port, .. } => vec![SocketAddr::from(([127, 0, 0, 1], *port))],
            Authority::Replicas { ports, .. } => ports
                .iter()
                .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
                .collect(),
            Authority::Etcd { members, .. } => members
                .iter()
                .map(|m| SocketAddr::from(([127, 0, 0, 1], m.client)))
                .collect(),
        }
    }

    fn start_one(&mut self, i: usize) {
        match self {
            Authority::Serve { port, db, child } => {
                *child = Some(
                    guarded(&bin())
                        .args([
                            "serve",
                            "--no-auth",
                            "--listen",
                            &format!("127.0.0.1:{port}"),
                            "--db",
                        ])
                        .arg(&*db)
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("start serve"),
                );
            }
            Authority::Replicas {
                ports,
                children,
                pg,
            } => {
                children[i] = Some(
                    guarded(&bin())
                        .args(["serve", "--listen", &format!("127.0.0.1:{}", ports[i])])
                        .args(["--store", &pg.url("postgres"), "--leader-ttl", "1s"])
                        .arg("--no-auth")
                        .arg("--store-password-file")
                        .arg(&pg.password_file)
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("start a serve replica"),
                );
            }
            Authority::Etcd {
                dir,
                cluster,
                members,
            } => {
                let m = &mut members[i];
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(format!("{}.log", m.name)))
                    .expect("etcd log");
                let c = format!("http://127.0.0.1:{}", m.client);
                let p = format!("http://127.0.0.1:{}", m.peer);
                m.child = Some(
                    guarded("etcd")
                        .args(["--name", &m.name])
                        .arg("--data-dir")
                        .arg(dir.join(&m.name))
                        .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
                        .args([
                            "--listen-peer-urls",
                            &p,
                            "--initial-advertise-peer-urls",
                            &p,
                        ])
                        .args(["--initial-cluster", cluster.as_str()])
                        .args([
                            "--initial-cluster-token",
                            &format!("chaos-{}", std::process::id()),
                        ])
                        .args(["--initial-cluster-state", "new"])
                        .stdin(Stdio::null())
                        .stdout(log.try_clone().expect("log"))
                        .stderr(log)
                        .spawn()
                        .expect("etcd must be installed (.ci/install-etcd.sh)"),
                );
            }
        }
    }

    fn kill_one(&mut self, i: usize) {
        let c = match self {
            Authority::Serve { child, .. } => child,
            Authority::Replicas { children, .. } => &mut children[i],
            Authority::Etcd { members, .. } => &mut members[i].child,
        };
        if let Some(mut c) = c.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Processes of the authority that ended (and are reaped now).
    fn ended(&mut self) -> Vec<usize> {
        let children: Vec<&mut Option<Child>> = match self {
            Authority::Serve { child, .. } => vec![child],
            Authority::Replicas { children, .. } => children.iter_mut().collect(),
            Authority::Etcd { members, .. } => members.iter_mut().map(|m| &mut m.child).collect(),
        };
        let mut out = Vec::new();
        for (i, c) in children.into_iter().enumerate() {
            if let Some(ch) = c.as_mut() {
                if let Ok(Some(_)) = ch.try_wait() {
                    *c = None;
                    out.push(i);
                }
            }
        }
        out
    }

    fn direct_url(&self) -> String {
        match self {
            Authority::Serve { port, .. } => format!("http://127.0.0.1:{port}"),
            Authority::Replicas { ports, .. } => ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(","),
            Authority::Etcd { members, .. } => format!(
                "etcd://{}",
                members
                    .iter()
                    .map(|m| format!("127.0.0.1:{}", m.client))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }

    fn endpoints(&self) -> String {
        self.upstreams()
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Leases the authority still has (empty when all are released or expired).
    fn leases(&self) -> Option<Vec<String>> {
        let out = match self {
            Authority::Serve { .. } | Authority::Replicas { .. } => guarded(&bin())
                .args(["leases", "--json", "--authority", &self.direct_url()])
                .output()
                .ok()?,
            Authority::Etcd { .. } => Command::new("etcdctl")
                .arg(format!("--endpoints={}", self.endpoints()))
                .args(["--command-timeout=5s", "lease", "list"])
                .output()
                .ok()?,
        };
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        Some(match self {
            Authority::Serve { .. } | Authority::Replicas { .. } => {
                let v: serde_json::Value = serde_json::from_str(&text).ok()?;
                let arr = v
                    .as_array()
                    .cloned()
                    .or_else(|| v.get("leases").and_then(|l| l.as_array()).cloned())
                    .unwrap_or_default();
                arr.iter().map(|l| l.to_string()).collect()
            }
            Authority::Etcd { .. } => text
                .lines()
                .skip(1) // "found N leases"
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string)
                .collect(),
        })
    }

    fn wait_ready(&self) {
        let until = Instant::now() + Duration::from_secs(60);
        while self.leases().is_none() {
            assert!(Instant::now() < until, "authority did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Authority {
    fn drop(&mut self) {
        let n = self.upstreams().len();
        for i in 0..n {
            self.kill_one(i);
        }
    }
}

// ------------------------------------------------------------------ the soak

struct Slot {
    task: String,
    proxies: Vec<Proxy>,
    child: Option<Child>,
    attempt: String,
    attempts: u64,
    killed: bool,
    stopped_until: Option<Instant>,
    cut_until: Option<Instant>,
    restart_at: Instant,
}

/// A soak that ends early (a panic) leaves no agent behind, stopped or
/// not: SIGKILL ends a stopped one too, and its keeper then kills the job.
/// The wind-down takes every child first, so a full run never gets here
/// with one.
impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Default)]
struct Report {
    authority: String,
    seconds: f64,
    faults: BTreeMap<&'static str, u64>,
    attempts: u64,
    exits: BTreeMap<String, u64>,
    /// Exit code and last error line (or panic line) of agents that exited
    /// 125 (numbers and ids replaced, to group them) or 101 (a panic).
    failures: BTreeMap<String, u64>,
    accepted: u64,
    refused: u64,
    violations: Vec<String>,
}

impl Report {
    fn print(&self) {
        println!(
            "chaos {}: {:.0}s, faults {:?}, attempts {}, agent exits {:?}, writes accepted {}, refused {}, violations {}",
            self.authority,
            self.seconds,
            self.faults,
            self.attempts,
            self.exits,
            self.accepted,
            self.refused,
            self.violations.len()
        );
        for (f, n) in &self.failures {
            println!("  exit x{n}: {f}");
        }
        for v in self.violations.iter().take(20) {
            println!("  VIOLATION {v}");
        }
    }

    /// Drops the jobs of reaped attempts that are gone; one still there at
    /// its deadline (attempt, pid file, deadline) is a violation.
    fn check_jobs(&mut self, pending: &mut Vec<(String, PathBuf, Instant)>, now: Instant) {
        pending.retain(|(attempt, pidfile, deadline)| {
            if job_gone(pidfile) {
                return false;
            }
            if now >= *deadline {
                self.violations
                    .push(format!("job of attempt {attempt} outlived its agent"));
                return false;
            }
            true
        });
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// A log line with ids, numbers and addresses replaced by `#`, to group
/// agent failures by kind.
fn group_key(line: &str) -> String {
    line.split_whitespace()
        .map(|w| {
            let hexish = w.len() >= 3 && w.chars().all(|c| c.is_ascii_hexdigit());
            if hexish || w.chars().any(|c| c.is_ascii_digit()) {
                "#"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(100)
        .collect()
}

/// Whether the job an attempt started (its pid file) is gone, or never ran.
/// Whether no job process of the attempt whose pid file is `pidfile` is
/// left, found by its command line (`EXE --job SINK TASK ATTEMPT PIDFILE`),
/// not by the pid it wrote: in its own PID namespace (the default where
/// the agent may have one) that pid is the namespace's, not this host's.
fn job_gone(pidfile: &Path) -> bool {
    let want = pidfile.as_os_str().as_encoded_bytes();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return true;
    };
    !rd.flatten().any(|e| {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            return false;
        };
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
        args.get(1) == Some(&b"--job".as_slice()) && args.last() == Some(&want) && alive(p)
    })
}

/// Live processes whose environment carries `CHAOS_RUN=run`.
fn processes_of_run(run: &str) -> Vec<i32> {
    let marker = format!("CHAOS_RUN={run}");
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let env = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            if env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) && alive(p) {
                out.push(p);
            }
        }
    }
    out
}

fn soak(kind: &str, run_for: Duration, agents: usize, tasks: usize, seed: u64) -> Report {
    fastrand::seed(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().to_path_buf();
    let run = format!("{}-{kind}-{seed}", std::process::id());
    let sink = d.join("sink.sqlite3");
    {
        let store = SqliteStore::open(&sink).expect("sink");
        store
            .connection()
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS writes (task TEXT, token INTEGER, attempt TEXT, seq INTEGER);
                 CREATE TABLE IF NOT EXISTS refused (task TEXT, token INTEGER, attempt TEXT);",
            )
            .expect("sink tables");
    }
    std::fs::create_dir_all(d.join("attempts")).expect("attempts dir");
    let mut auth = Authority::start(kind, &d);
    let mut report = Report {
        authority: kind.to_string(),
        ..Report::default()
    };
    let exe = std::env::current_exe().expect("own path");
    let now = Instant::now();
    let mut slots: Vec<Slot> = (0..agents)
        .map(|i| Slot {
            task: format!("chaos-{}", i % tasks),
            proxies: auth.upstreams().into_iter().map(Proxy::start).collect(),
            child: None,
            attempt: String::new(),
            attempts: 0,
            killed: false,
            stopped_until: None,
            cut_until: None,
            restart_at: now,
        })
        .collect();
    // (attempt, job pid file, deadline by which the job must be gone)
    let mut pending: Vec<(String, PathBuf, Instant)> = Vec::new();
    let mut auth_down_until: Option<(usize, Instant)> = None;
    let start = Instant::now();
    let end = start + run_for;
    let mut next_fault = start + Duration::from_secs(2);

    while Instant::now() < end {
        let now = Instant::now();
        for (i, s) in slots.iter_mut().enumerate() {
            // Reap.
            if let Some(c) = s.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    let key = match st.code() {
                        Some(c) => format!("exit {c}"),
                        None => "signal".to_string(),
                    };
                    if matches!(st.code(), Some(101) | Some(125)) {
                        let log = std::fs::read_to_string(
                            d.join("attempts").join(format!("{}.log", s.attempt)),
                        )
                        .unwrap_or_default();
                        // A panic's message is the line naming the panic.
                        // A panic's message is the line naming the panic;
                        // else the last error line (the reason for 125).
                        let last = log
                            .lines()
                            .find(|l| l.contains("panicked at"))
                            .or_else(|| log.lines().rev().find(|l| l.contains("error:")))
                            .or_else(|| log.lines().rev().find(|l| !l.trim().is_empty()));
                        let reason: String = if st.code() == Some(101) {
                            last.unwrap_or("").chars().take(120).collect()
                        } else {
                            group_key(last.unwrap_or(""))
                        };
                        let code = st.code().unwrap_or(0);
                        *report
                            .failures
                            .entry(format!("{code} {reason}"))
                            .or_default() += 1;
                    }
                    *report.exits.entry(key).or_default() += 1;
                    let pidfile = d.join("attempts").join(format!("{}.pid", s.attempt));
                    let grace = if s.killed {
                        Duration::from_secs(5)
                    } else {
                        Duration::from_millis(500)
                    };
                    pending.push((s.attempt.clone(), pidfile, now + grace));
                    s.child = None;
                    s.killed = false;
                    s.stopped_until = None;
                    // Like a unit's RestartSec=: short after a job's end,
                    // longer after "authority unreachable" (125), so a dead
                    // authority does not turn the soak into spawn churn.
                    let pause = if st.code() == Some(125) {
                        1000 + fastrand::u64(0..1000)
                    } else {
                        100 + fastrand::u64(0..400)
                    };
                    s.restart_at = now + Duration::from_millis(pause);
                }
            }
            // Thaw, heal.
            if s.stopped_until.is_some_and(|t| now >= t) {
                if let Some(c) = &s.child {
                    signal(c.id(), rustix::process::Signal::CONT);
                }
                s.stopped_until = None;
            }
            if s.cut_until.is_some_and(|t| now >= t) {
                s.proxies
                    .iter()
                    .for_each(|p| p.cut.store(false, Ordering::SeqCst));
                s.cut_until = None;
            }
            // (Re)start.
            if s.child.is_none() && now >= s.restart_at {
                s.attempts += 1;
                s.attempt = format!("s{i}n{}", s.attempts);
                report.attempts += 1;
                let url = match kind {
                    "serve" => format!("http://{}", s.proxies[0].addr),
                    // Every replica, each through this agent's own proxy.
                    "replicas" => s
                        .proxies
                        .iter()
                        .map(|p| format!("http://{}", p.addr))
                        .collect::<Vec<_>>()
                        .join(","),
                    _ => format!(
                        "etcd://{}",
                        s.proxies
                            .iter()
                            .map(|p| p.addr.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                };
                let pidfile = d.join("attempts").join(format!("{}.pid", s.attempt));
                let child = guarded(&bin())
                    .args(["--authority", &url, "--task", &s.task])
                    .args([
                        "--ttl",
                        &format!("{TTL_S}s"),
                        "--grace",
                        "1s",
                        "--wait",
                        "5s",
                    ])
                    .args(["--holder", &s.attempt, "--"])
                    .arg(&exe)
                    .arg("--job")
                    .arg(&sink)
                    .arg(&s.task)
                    .arg(&s.attempt)
                    .arg(&pidfile)
                    .env("CHAOS_RUN", &run)
                    .env("LEASEAGENT_STATE_DIR", d.join(format!("state{i}")))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::File::create(
                            d.join("attempts").join(format!("{}.log", s.attempt)),
                        )
                        .map(Stdio::from)
                        .unwrap_or(Stdio::null()),
                    )
                    .spawn()
                    .expect("start agent");
                s.child = Some(child);
            }
        }
        // Jobs of reaped attempts must be gone by their deadline.
        report.check_jobs(&mut pending, now);
        // The authority comes back; one that ended by itself is restarted.
        if let Some((i, t)) = auth_down_until {
            if now >= t {
                auth.start_one(i);
                auth_down_until = None;
            }
        }
        for i in auth.ended() {
            if auth_down_until.map(|(m, _)| m) != Some(i) {
                *report
                    .faults
                    .entry("authority ended by itself")
                    .or_default() += 1;
                auth.start_one(i);
            }
        }
        // A fault.
        if now >= next_fault {
            next_fault = now + Duration::from_millis(300 + fastrand::u64(0..1200));
            let i = fastrand::usize(0..slots.len());
            let pause = Duration::from_millis(1000 + fastrand::u64(0..7000));
            match fastrand::u8(0..4) {
                0 if auth_down_until.is_none() => {
                    let n = auth.upstreams().len();
                    let m = fastrand::usize(0..n);
                    auth.kill_one(m);
                    auth_down_until =
                        Some((m, now + Duration::from_millis(200 + fastrand::u64(0..2500))));
                    *report.faults.entry("authority kill -9").or_default() += 1;
                }
                1 => {
                    let s = &mut slots[i];
                    if let (Some(c), None) = (&s.child, s.stopped_until) {
                        signal(c.id(), rustix::process::Signal::STOP);
                        s.stopped_until = Some(now + pause);
                        *report.faults.entry("agent SIGSTOP").or_default() += 1;
                    }
                }
                2 => {
                    let s = &mut slots[i];
                    if let Some(c) = &s.child {
                        signal(c.id(), rustix::process::Signal::KILL);
                        s.killed = true;
                        *report.faults.entry("agent kill -9").or_default() += 1;
                    }
                }
                _ => {
                    let s = &mut slots[i];
                    if s.cut_until.is_none() {
                        s.proxies
                            .iter()
                            .for_each(|p| p.cut.store(true, Ordering::SeqCst));
                        s.cut_until = Some(now + pause);
                        *report.faults.entry("partition").or_default() += 1;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // Wind down: everything healed and running, then SIGTERM to every agent.
    if let Some((i, _)) = auth_down_until.take() {
        auth.start_one(i);
    }
    for s in slots.iter_mut() {
        s.proxies
            .iter()
            .for_each(|p| p.cut.store(false, Ordering::SeqCst));
        if let Some(c) = &s.child {
            signal(c.id(), rustix::process::Signal::CONT);
            signal(c.id(), rustix::process::Signal::TERM);
        }
    }
    let until = Instant::now() + Duration::from_secs(60);
    for s in slots.iter_mut() {
        if let Some(mut c) = s.child.take() {
            loop {
                if let Ok(Some(st)) = c.try_wait() {
                    let key = match st.code() {
                        Some(c) => format!("exit {c}"),
                        None => "signal".to_string(),
                    };
                    *report.exits.entry(key).or_default() += 1;
                    let pidfile = d.join("attempts").join(format!("{}.pid", s.attempt));
                    pending.push((
                        s.attempt.clone(),
                        pidfile,
                        Instant::now() + Duration::from_millis(500),
                    ));
                    break;
                }
                if Instant::now() >= until {
                    report.violations.push(format!(
                        "agent of attempt {} ignored SIGTERM for 60s",
                        s.attempt
                    ));
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let until = Instant::now() + Duration::from_secs(10);
    while !pending.is_empty() {
        let now = Instant::now();
        report.check_jobs(&mut pending, now);
        if now >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = processes_of_run(&run);
    if !left.is_empty() {
        report
            .violations
            .push(format!("processes of the run left at the end: {left:?}"));
        for p in left {
            signal(p as u32, rustix::process::Signal::KILL);
        }
    }
    // Every lease released or expired: none listed after one ttl (+ slack).
    let until = Instant::now() + Duration::from_secs(TTL_S * 2 + 20);
    loop {
        match auth.leases() {
            Some(l) if l.is_empty() => break,
            other => {
                if Instant::now() >= until {
                    report
                        .violations
                        .push(format!("leases left at the end: {other:?}"));
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    report.seconds = start.elapsed().as_secs_f64();
    check_sink(&sink, &mut report);
    drop(slots);
    drop(auth);
    report
}

/// The sink's invariants, from its rows in acceptance order.
fn check_sink(sink: &Path, report: &mut Report) {
    let conn = rusqlite::Connection::open(sink).expect("open sink");
    let mut stmt = conn
        .prepare("SELECT task, token, attempt, seq FROM writes ORDER BY rowid")
        .expect("query");
    let rows: Vec<(String, i64, String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .expect("rows")
        .filter_map(Result::ok)
        .collect();
    report.accepted = rows.len() as u64;
    report.refused = conn
        .query_row("SELECT count(*) FROM refused", [], |r| r.get::<_, i64>(0))
        .unwrap_or(0) as u64;
    struct TaskState {
        token: i64,
        attempt: String,
        seq: i64,
        done: HashSet<String>,
        owner: HashMap<i64, String>,
    }
    let mut tasks: HashMap<String, TaskState> = HashMap::new();
    for (task, token, attempt, seq) in rows {
        let Some(t) = tasks.get_mut(&task) else {
            let mut owner = HashMap::new();
            owner.insert(token, attempt.clone());
            tasks.insert(
                task,
                TaskState {
                    token,
                    attempt,
                    seq,
                    done: HashSet::new(),
                    owner,
                },
            );
            continue;
        };
        if token < t.token {
            report.violations.push(format!(
                "{task}: token {token} ({attempt}) accepted after {} ({})",
                t.token, t.attempt
            ));
        }
        if let Some(o) = t.owner.get(&token) {
            if *o != attempt {
                report.violations.push(format!(
                    "{task}: token {token} written by {o} and {attempt}"
                ));
            }
        }
        t.owner.insert(token, attempt.clone());
        if attempt != t.attempt {
            if t.done.contains(&attempt) {
                report.violations.push(format!(
                    "{task}: {attempt} wrote again after {} had written (interleaved)",
                    t.attempt
                ));
            }
            if token <= t.token {
                report.violations.push(format!(
                    "{task}: {attempt} (token {token}) followed {} (token {}) without a higher token",
                    t.attempt, t.token
                ));
            }
            let prev = std::mem::replace(&mut t.attempt, attempt);
            t.done.insert(prev);
        } else if seq <= t.seq {
            report
                .violations
                .push(format!("{task}: {attempt} seq {seq} after {}", t.seq));
        }
        t.token = token;
        t.seq = seq;
    }
}

/// The checker must be able to fail: sinks with each kind of violation.
fn checker_self_test() {
    type Row = (&'static str, i64, &'static str, i64);
    let cases: [(&str, &[Row]); 5] = [
        (
            "clean",
            &[("t", 1, "a", 1), ("t", 1, "a", 2), ("t", 3, "b", 1)],
        ),
        ("token down", &[("t", 2, "a", 1), ("t", 1, "b", 1)]),
        ("shared token", &[("t", 2, "a", 1), ("t", 2, "b", 1)]),
        (
            "interleaved",
            &[("t", 1, "a", 1), ("t", 2, "b", 1), ("t", 2, "a", 2)],
        ),
        ("seq", &[("t", 1, "a", 2), ("t", 1, "a", 1)]),
    ];
    for (name, rows) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        let sink = dir.path().join("sink.sqlite3");
        let conn = rusqlite::Connection::open(&sink).expect("sink");
        conn.execute_batch(
            "CREATE TABLE writes (task TEXT, token INTEGER, attempt TEXT, seq INTEGER);
             CREATE TABLE refused (task TEXT, token INTEGER, attempt TEXT);",
        )
        .expect("tables");
        for (t, tok, a, seq) in rows {
            conn.execute(
                "INSERT INTO writes VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![t, tok, a, seq],
            )
            .expect("row");
        }
        let mut r = Report::default();
        check_sink(&sink, &mut r);
        assert_eq!(
            r.violations.is_empty(),
            name == "clean",
            "checker self-test {name}: {:?}",
            r.violations
        );
    }
}
