//! Real etcd processes for the etcd tests: one member or a small cluster on
//! free loopback ports, data in a temp dir, every member killed on drop.
//!
//! etcd and etcdctl must be installed (`.ci/install-etcd.sh`): a missing
//! binary is a test failure, never a skip.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// How long a cluster may take to elect a leader and answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub fn require(bin: &str) {
    let found = Command::new(bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found || Command::new(bin).arg("version").output().is_ok(),
        "`{bin}` is not installed: run .ci/install-etcd.sh (apt-get install etcd-server etcd-client)"
    );
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    l.local_addr().expect("local addr").port()
}

pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
    fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid().and_then(|p| Pid::from_raw(p as i32)) {
            kill_process(pid, sig).expect("signal etcd");
        }
    }
    /// SIGSTOP: the member stops answering but keeps its sockets open.
    /// Returns once every thread of it is stopped: `kill` only queues the
    /// stop, and a thread busy on another CPU (a loaded CI machine) could
    /// still answer a request meanwhile.
    pub fn freeze(&self) {
        self.signal(Signal::STOP);
        let Some(pid) = self.pid() else { return };
        let stopped = super::all_threads_stopped(pid, Duration::from_secs(10));
        assert!(stopped.is_some(), "etcd member {} did not stop", self.name);
    }
    pub fn thaw(&self) {
        self.signal(Signal::CONT);
    }
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct Etcd {
    /// Holds the members' data directories until the cluster is dropped.
    _dir: tempfile::TempDir,
    pub members: Vec<Member>,
    /// TLS on the client port (`etcds://`).
    pub tls: Option<Tls>,
    /// etcd auth is on: etcdctl logs in as root with this password.
    pub root_password: Option<String>,
}

/// TLS files of a secured etcd: the CA, the server pair (valid for
/// 127.0.0.1), and the client pair etcdctl presents.
#[derive(Clone, Debug)]
pub struct Tls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// `--client-cert-auth`: etcd requires a client certificate.
    pub require_client_cert: bool,
}

/// How a secured cluster is started.
#[derive(Clone, Debug, Default)]
pub struct Secure {
    pub tls: Option<Tls>,
    /// `--auth-token-ttl` (seconds) for etcd's simple tokens.
    pub auth_token_ttl: Option<u32>,
}

impl Etcd {
    /// One member.
    pub fn start() -> Etcd {
        Self::start_cluster(1)
    }

    /// `n` members forming one cluster; returns once it answers.
    pub fn start_cluster(n: usize) -> Etcd {
        Self::start_secure(n, Secure::default())
    }

    /// `n` members with TLS on the client port and etcd's own options.
    ///
    /// The data directories live on tmpfs: a member fsyncs its WAL on
    /// every commit, and on a disk shared with a busy parallel test run
    /// one fsync can stall past the election and commit timeouts ("failed
    /// to commit proposal: context deadline exceeded") or a client's lease
    /// ttl (Patroni's leader key), which would test the host's disk, not
    /// leaseagent. A power loss is not what these tests simulate (a member
    /// is killed, stopped or cut off instead).
    pub fn start_secure(n: usize, secure: Secure) -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("leaseagent-etcd-")
            .tempdir_in(shm_dir())
            .expect("temp dir on /dev/shm");
        Self::start_in(dir, n, secure)
    }

    /// One member (its data on tmpfs, as every cluster here).
    pub fn start_in_memory() -> Etcd {
        Self::start()
    }

    /// `n` members with their data on this disk (a temporary directory),
    /// each commit fsynced as in production: for benchmarks
    /// (`benches/etcd_load.rs`, which includes this file), never for tests.
    #[allow(dead_code)]
    pub fn start_on_disk(n: usize) -> Etcd {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_in(dir, n, Secure::default())
    }

    fn start_in(dir: tempfile::TempDir, n: usize, secure: Secure) -> Etcd {
        let scheme = if secure.tls.is_some() {
            "https"
        } else {
            "http"
        };
        require("etcd");
        require("etcdctl");
        let mut members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
                log: dir.path().join(format!("m{i}.log")),
            })
            .collect();
        let cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("leaseagent-test-{}", std::process::id());
        for m in members.iter_mut() {
            let data = dir.path().join(&m.name);
            let log = File::create(&m.log).expect("log file");
            let mut cmd = Command::new("etcd");
            if let Some(t) = &secure.tls {
                cmd.arg("--cert-file")
                    .arg(&t.cert)
                    .arg("--key-file")
                    .arg(&t.key)
                    .arg("--trusted-ca-file")
                    .arg(&t.ca);
                if t.require_client_cert {
                    cmd.arg("--client-cert-auth");
                }
            }
            if let Some(ttl) = secure.auth_token_ttl {
                cmd.arg("--auth-token=simple")
                    .arg(format!("--auth-token-ttl={ttl}"));
            }
            let child = cmd
                .args(["--name", &m.name])
                .arg("--data-dir")
                .arg(&data)
                .args([
                    "--listen-client-urls",
                    &format!("{scheme}://127.0.0.1:{}", m.client_port),
                    "--advertise-client-urls",
                    &format!("{scheme}://127.0.0.1:{}", m.client_port),
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{}", m.peer_port),
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{}", m.peer_port),
                    "--initial-cluster",
                    &cluster,
                    "--initial-cluster-token",
                    &token,
                    "--initial-cluster-state",
                    "new",
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("start etcd (is etcd-server installed?)");
            m.child = Some(child);
        }
        let etcd = Etcd {
            _dir: dir,
            members,
            tls: secure.tls,
            root_password: None,
        };
        etcd.wait_healthy();
        etcd
    }

    /// Turns etcd auth on: a root user, and `user` with `password` whose
    /// role may read and write only keys under the given prefixes.
    pub fn enable_auth(&mut self, user: &str, password: &str, prefixes: &[&str]) {
        let ok = |out: Output, what: &str| {
            assert!(out.status.success(), "etcdctl {what}: {out:?}");
        };
        ok(
            self.etcdctl(&["user", "add", "root:root-pw-91"]),
            "user add root",
        );
        ok(self.etcdctl(&["role", "add", "tasks"]), "role add");
        for p in prefixes {
            ok(
                self.etcdctl(&[
                    "role",
                    "grant-permission",
                    "--prefix=true",
                    "tasks",
                    "readwrite",
                    p,
                ]),
                "grant-permission",
            );
        }
        ok(
            self.etcdctl(&["user", "add", &format!("{user}:{password}")]),
            "user add",
        );
        ok(
            self.etcdctl(&["user", "grant-role", user, "tasks"]),
            "grant-role",
        );
        ok(self.etcdctl(&["auth", "enable"]), "auth enable");
        self.root_password = Some("root-pw-91".into());
    }

    /// `etcd://a,b,c` (or `etcds://…` with TLS) for every member.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.endpoints().join(","))
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    fn live_endpoints(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("{scheme}://{}", m.endpoint()))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let out = self.etcdctl(&["endpoint", "health", "--cluster=false"]);
            if out.status.success() {
                return;
            }
            if Instant::now() > deadline {
                let logs: String = self
                    .members
                    .iter()
                    .map(|m| std::fs::read_to_string(&m.log).unwrap_or_default())
                    .collect();
                panic!(
                    "etcd did not become healthy: {}\n{logs}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs etcdctl against the live members.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        self.etcdctl_cmd(args).output().expect("run etcdctl")
    }

    pub fn etcdctl_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.live_endpoints()))
            .arg("--dial-timeout=2s")
            .arg("--command-timeout=5s");
        if let Some(t) = &self.tls {
            c.arg("--cacert")
                .arg(&t.ca)
                .arg("--cert")
                .arg(&t.client_cert)
                .arg("--key")
                .arg(&t.client_key);
        }
        if let Some(pw) = &self.root_password {
            c.arg(format!("--user=root:{pw}"));
        }
        c.args(args);
        c
    }

    /// The keys under `prefix`, in create order... as etcdctl prints them.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let out = self.etcdctl(&["get", "--prefix", "--keys-only", prefix]);
        assert!(out.status.success(), "etcdctl get: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            // etcdctl pads to 16 hex digits; lease ids (and the keys of
            // etcd's mutex, which leaseagent follows) are unpadded.
            .map(|l| match u64::from_str_radix(l.trim(), 16) {
                Ok(id) => format!("{id:x}"),
                Err(_) => l.to_string(),
            })
            .collect()
    }

    /// The value of one key, if it exists.
    pub fn get(&self, key: &str) -> Option<String> {
        let out = self.etcdctl(&["get", "--print-value-only", key]);
        assert!(out.status.success(), "etcdctl get: {out:?}");
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        if s.is_empty() {
            None
        } else {
            Some(s.trim_end_matches('\n').to_string())
        }
    }

    /// Lease ids (hex) etcd still has.
    pub fn leases(&self) -> Vec<String> {
        let out = self.etcdctl(&["lease", "list"]);
        assert!(out.status.success(), "etcdctl lease list: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1) // "found N leases"
            .filter(|l| !l.is_empty())
            // etcdctl pads to 16 hex digits; lease ids (and the keys of
            // etcd's mutex, which leaseagent follows) are unpadded.
            .map(|l| match u64::from_str_radix(l.trim(), 16) {
                Ok(id) => format!("{id:x}"),
                Err(_) => l.to_string(),
            })
            .collect()
    }

    /// The member that is the raft leader now.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let out = self.etcdctl(&["endpoint", "status", "-w", "json"]);
            if out.status.success() {
                let v: serde_json::Value =
                    serde_json::from_slice(&out.stdout).expect("endpoint status json");
                let leader = v
                    .as_array()
                    .and_then(|a| a.first())
                    .and_then(|e| e["Status"]["leader"].as_u64());
                let ids: Vec<(String, Option<u64>)> = v
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|e| {
                                (
                                    e["Endpoint"].as_str().unwrap_or("").to_string(),
                                    e["Status"]["header"]["member_id"].as_u64(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(l) = leader {
                    for (ep, id) in ids {
                        if id == Some(l) {
                            if let Some(i) = self
                                .members
                                .iter()
                                .position(|m| ep.ends_with(&m.endpoint()))
                            {
                                return i;
                            }
                        }
                    }
                }
            }
            assert!(Instant::now() < deadline, "no etcd leader found: {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in self.members.iter_mut() {
            m.thaw();
            m.kill();
        }
    }
}

/// Polls `f` until it gives `Some`, or panics with `what` after `timeout`.
pub fn poll<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    super::poll_every(what, timeout, Duration::from_millis(50), f)
}

/// Starts `etcdctl lock NAME sh -c ...` that writes ETCD_LOCK_REV to a file
/// and holds the lock until `release` exists.
pub fn etcdctl_lock(etcd: &Etcd, name: &str, dir: &std::path::Path) -> std::process::Child {
    let rev = dir.join("rev");
    let release = dir.join("release");
    let script = format!(
        "echo $ETCD_LOCK_REV > {rev}.tmp && mv {rev}.tmp {rev}; while [ ! -e {release} ]; do sleep 0.05; done",
        rev = rev.display(),
        release = release.display()
    );
    let mut cmd = etcd.etcdctl_cmd(&["lock", name, "--", "sh", "-c", &script]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("etcdctl lock")
}

pub fn read_rev(dir: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("rev"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The tmpfs directory etcd's data goes to: `/dev/shm`, which every Linux
/// host that runs this suite has; its absence is named, not skipped.
fn shm_dir() -> &'static Path {
    let p = Path::new("/dev/shm");
    assert!(
        p.is_dir(),
        "/dev/shm is missing: the etcd tests keep their members' data on tmpfs there"
    );
    p
}
