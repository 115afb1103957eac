//! A real Patroni cluster (Debian's `patroni`) of PostgreSQL 15 members on
//! one etcd, for the tests of `serve --store` across a failover of
//! PostgreSQL itself: each member is a `patroni` process run as `nobody`
//! in a temporary directory of its own, on free loopback ports (PostgreSQL
//! and Patroni's REST API), in `synchronous_mode`.
//!
//! Patroni starts `postgres` detached (its own session, re-parented away
//! from the test), so a member's guard cannot rely on its child alone: on
//! drop it SIGKILLs `patroni` (so it restarts nothing), then SIGQUITs and
//! SIGKILLs every process whose working directory is the member's data
//! directory (PostgreSQL's postmaster and each of its backends run there,
//! and nothing else does: the directory is a fresh temporary one), and
//! waits until none is left before the directory is removed.
//!
//! A missing Patroni is a failure, never a skip (`scripts/test` installs
//! `patroni`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

use super::etcd::Etcd;
use super::postgres::{BIN, free_port, own_file as own, psql_at};

/// The role `serve` (and Patroni) logs in as: the cluster's superuser.
pub const USER: &str = "leaseagent";
const PASSWORD: &str = "patroni-test-S3cret";
const REPLICATOR_PASSWORD: &str = "patroni-repl-S3cret";
const NOBODY: u32 = 65534;
const NOGROUP: u32 = 65534;
/// Patroni's leader key ttl (seconds): a killed primary is replaced after
/// about this long. `loop_wait + 2 * retry_timeout <= ttl`, as Patroni
/// asks.
pub const TTL_S: u64 = 10;
const LOOP_WAIT_S: u64 = 1;
const RETRY_TIMEOUT_S: u64 = 4;
/// The cluster's name in etcd.
const SCOPE: &str = "leaseagent-test";

/// Fails the test when Patroni (or PostgreSQL 15) is not installed.
pub fn require() {
    super::postgres::require();
    for p in ["/usr/bin/patroni", "/usr/bin/patronictl"] {
        assert!(
            Path::new(p).exists(),
            "{p} is missing: apt-get install patroni (scripts/test does)"
        );
    }
}

/// One member: its `patroni` process and where it lives.
pub struct Member {
    pub name: String,
    /// PostgreSQL's port.
    pub port: u16,
    /// Patroni's REST API port.
    pub api_port: u16,
    /// The member's directory (nobody's): config, data, socket, logs.
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Member {
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("patroni.yml")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log_text(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        let tail = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        format!(
            "--- {} patroni (tail)\n{}\n{}\n--- {} postgres log (tail)\n{}",
            self.name,
            tail(read("patroni.out")),
            tail(read("patroni.log")),
            self.name,
            tail(read("data/log/postgresql.log"))
        )
    }

    /// Patroni's REST API `GET path`: (status, JSON body).
    pub fn api(&self, path: &str) -> Option<(u16, Value)> {
        let (st, b) = super::authority::request(
            &format!("127.0.0.1:{}", self.api_port),
            "GET",
            path,
            b"",
            Duration::from_secs(3),
        )
        .ok()?;
        Some((st, serde_json::from_slice(&b).unwrap_or(Value::Null)))
    }

    /// The processes running in the data directory: the postmaster and
    /// its backends.
    fn postgres_pids(&self) -> Vec<i32> {
        let data = self.data();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == data)
            })
            .collect()
    }

    /// kill -9 of the whole member at once: `patroni` and every PostgreSQL
    /// process of it (a machine lost, as far as the cluster can tell).
    pub fn kill9(&mut self) {
        let pids = self.postgres_pids();
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
        }
        for pid in &pids {
            if let Some(p) = Pid::from_raw(*pid) {
                let _ = kill_process(p, Signal::KILL);
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        self.wait_postgres_gone(Duration::from_secs(20));
    }

    fn wait_postgres_gone(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = self.postgres_pids();
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                for pid in left {
                    if let Some(p) = Pid::from_raw(pid) {
                        let _ = kill_process(p, Signal::KILL);
                    }
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the member for good: patroni first (it would restart
    /// PostgreSQL), then PostgreSQL (SIGQUIT: immediate shutdown; SIGKILL
    /// after a deadline).
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for pid in self.postgres_pids() {
            if let Some(p) = Pid::from_raw(pid) {
                let _ = kill_process(p, Signal::QUIT);
            }
        }
        self.wait_postgres_gone(Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.postgres_pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Patroni cluster; every member stopped (and etcd with it) on drop.
pub struct Cluster {
    pub members: Vec<Member>,
    /// The password of [`USER`], in a file of mode 0600 in a directory of
    /// root's own (for serve's `--store-password-file`).
    pub password_file: PathBuf,
    _secrets: tempfile::TempDir,
    /// Dropped after the members (field order).
    _etcd: Etcd,
}

fn config(name: &str, port: u16, api_port: u16, dir: &Path, etcd: &str) -> String {
    let d = dir.display();
    format!(
        r#"scope: {SCOPE}
name: {name}
log:
  dir: {d}
  file_num: 1
  level: INFO
restapi:
  listen: 127.0.0.1:{api_port}
  connect_address: 127.0.0.1:{api_port}
etcd3:
  hosts: {etcd}
watchdog:
  mode: off
bootstrap:
  dcs:
    ttl: {TTL_S}
    loop_wait: {LOOP_WAIT_S}
    retry_timeout: {RETRY_TIMEOUT_S}
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 60
        shared_buffers: 16MB
        wal_keep_size: 64MB
  initdb:
  - encoding: UTF8
  - auth-host: scram-sha-256
  - auth-local: trust
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port}
  data_dir: {d}/data
  bin_dir: {BIN}
  pgpass: {d}/pgpass
  use_unix_socket: true
  authentication:
    superuser:
      username: {USER}
      password: {PASSWORD}
    replication:
      username: replicator
      password: {REPLICATOR_PASSWORD}
  parameters:
    unix_socket_directories: {d}
    dynamic_shared_memory_type: mmap
    fsync: off
    logging_collector: on
    log_directory: log
    log_filename: postgresql.log
  pg_hba:
  - local all all trust
  - host all {USER} 127.0.0.1/32 scram-sha-256
  - host replication replicator 127.0.0.1/32 scram-sha-256
"#
    )
}

impl Cluster {
    /// etcd (one member, on tmpfs) and `n` Patroni members; returns once
    /// one leads and, with two or more, one is its synchronous standby,
    /// streaming.
    pub fn start(n: usize) -> Cluster {
        require();
        let etcd = Etcd::start_in_memory();
        let endpoint = etcd.members[0].endpoint();
        let secrets = tempfile::tempdir().expect("temp dir");
        let password_file = secrets.path().join("pg-password");
        std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
        std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut cluster = Cluster {
            members: Vec::new(),
            password_file,
            _secrets: secrets,
            _etcd: etcd,
        };
        for i in 0..n {
            let dir = tempfile::Builder::new()
                .prefix("leaseagent-patroni-")
                .tempdir()
                .expect("temp dir");
            own(dir.path());
            let (port, api_port) = (free_port(), free_port());
            let name = format!("pg{i}");
            let cfg = dir.path().join("patroni.yml");
            std::fs::write(&cfg, config(&name, port, api_port, dir.path(), &endpoint)).unwrap();
            own(&cfg);
            let mut m = Member {
                name,
                port,
                api_port,
                dir,
                child: None,
            };
            m.child = Some(spawn_patroni(&m));
            cluster.members.push(m);
            if i == 0 {
                // The first bootstraps the cluster; the others clone it.
                cluster.wait_roles(1, Duration::from_secs(90));
            }
        }
        cluster.wait_roles(n, Duration::from_secs(90));
        cluster
    }

    /// Everything the members logged (for a failure's message).
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(Member::log_text)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Patroni's view of the cluster (`GET /cluster` from any member that
    /// answers): each member's (name, role, state).
    pub fn roles(&self) -> Option<Vec<(String, String, String)>> {
        self.members.iter().find_map(|m| {
            let (st, v) = m.api("/cluster")?;
            if st != 200 {
                return None;
            }
            let ms = v["members"].as_array()?;
            Some(
                ms.iter()
                    .map(|m| {
                        let s = |k: &str| m[k].as_str().unwrap_or("").to_string();
                        (s("name"), s("role"), s("state"))
                    })
                    .collect(),
            )
        })
    }

    /// The leading member's index, per Patroni.
    pub fn leader(&self) -> Option<usize> {
        let roles = self.roles()?;
        let name = roles
            .iter()
            .find(|(_, role, state)| role == "leader" && state == "running")?
            .0
            .clone();
        self.members.iter().position(|m| m.name == name)
    }

    /// Waits until `n` members are up: one leader, running, and (with
    /// `n >= 2`) a synchronous standby streaming from it. The leader's
    /// index.
    pub fn wait_roles(&self, n: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            if let Some(roles) = self.roles() {
                let leader = roles
                    .iter()
                    .filter(|(_, r, s)| r == "leader" && s == "running")
                    .count();
                let sync = roles
                    .iter()
                    .filter(|(_, r, s)| r == "sync_standby" && (s == "streaming" || s == "running"))
                    .count();
                let want_sync = usize::from(n >= 2);
                if roles.len() == n && leader == 1 && sync >= want_sync {
                    if let Some(l) = self.leader() {
                        return l;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "the Patroni cluster did not reach {n} member(s) with a leader{} within \
                 {within:?}: {:?}\n{}",
                if n >= 2 { " and a sync standby" } else { "" },
                self.roles(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The store URL naming every member (libpq's multi-host form;
    /// `serve` adds `target_session_attrs=read-write`, so it reaches
    /// whichever member is the primary).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect();
        format!("postgresql://{USER}@{}/postgres", hosts.join(","))
    }

    /// `patronictl switchover` from member `from` to member `to`; panics
    /// with what it said if it fails.
    pub fn switchover(&self, from: usize, to: usize) {
        let out = Command::new("/usr/bin/patronictl")
            .arg("-c")
            .arg(self.members[from].config())
            .args(["switchover", "--force", "--leader"])
            .arg(&self.members[from].name)
            .arg("--candidate")
            .arg(&self.members[to].name)
            .arg(SCOPE)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LC_ALL", "C.UTF-8")
            .env("HOME", self._secrets.path())
            .stdin(Stdio::null())
            .output()
            .expect("run patronictl");
        assert!(
            out.status.success(),
            "patronictl switchover failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
    }

    /// Runs SQL through psql on member `i` (as the superuser); its stdout.
    pub fn psql(&self, i: usize, sql: &str) -> String {
        psql_at(self.members[i].port, USER, PASSWORD, "postgres", sql)
    }
}

fn spawn_patroni(m: &Member) -> Child {
    let log = std::fs::File::create(m.dir.path().join("patroni.out")).expect("patroni log");
    let mut cmd = Command::new("setpriv");
    cmd.args([
        &format!("--reuid={NOBODY}"),
        &format!("--regid={NOGROUP}"),
        "--clear-groups",
        "--",
        "/usr/bin/patroni",
    ])
    .arg(m.config())
    .env_clear()
    .env("PATH", "/usr/bin:/bin")
    .env("LC_ALL", "C.UTF-8")
    .env("HOME", m.dir.path());
    // scripts/test's run marker, so its hygiene check finds a member (and
    // the PostgreSQL it starts, which inherits it) left behind.
    if let Some(run) = std::env::var_os("LEASEAGENT_CI_RUN") {
        cmd.env("LEASEAGENT_CI_RUN", run);
    }
    cmd.current_dir(m.dir.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn patroni")
}
