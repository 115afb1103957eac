//! A real PostgreSQL 15 (Debian's `postgresql-15`) for the tests of
//! `serve --store`: a fresh cluster per test, made by `initdb` and run by
//! the unprivileged user `nobody` in a temporary directory, on a free
//! loopback port, with password (SCRAM) authentication.
//!
//! The server is this test process's own child (`postgres` itself, not
//! daemonized by `pg_ctl`), so dropping the guard stops it on every exit
//! path, a panicking test included: SIGQUIT (PostgreSQL's immediate
//! shutdown, which ends its backends too), then SIGKILL if it is still
//! there after a deadline; the temporary directory goes with it.
//!
//! A missing PostgreSQL is a failure, never a skip (`scripts/test`
//! installs `postgresql-15`).

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// Debian's PostgreSQL 15 programs.
pub const BIN: &str = "/usr/lib/postgresql/15/bin";
/// The role the tests' `serve` logs in as (the cluster's superuser).
pub const USER: &str = "leaseagent";
/// Its password (in the password file serve is given).
const PASSWORD: &str = "pg-test-S3cret";
const NOBODY: u32 = 65534;
const NOGROUP: u32 = 65534;
/// How long the cluster may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Fails the test when PostgreSQL 15 is not installed.
pub fn require() {
    for p in ["initdb", "postgres", "pg_isready", "psql", "pg_basebackup"] {
        let path = Path::new(BIN).join(p);
        assert!(
            path.exists(),
            "{} is missing: apt-get install postgresql-15 (scripts/test does)",
            path.display()
        );
    }
}

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    l.local_addr().expect("local addr").port()
}

/// One PostgreSQL cluster, stopped and removed on drop.
pub struct Postgres {
    /// The cluster's directory (nobody's).
    dir: tempfile::TempDir,
    _secrets: tempfile::TempDir,
    child: Option<Child>,
    /// More `-c` settings of the server.
    settings: Vec<String>,
    pub port: u16,
    /// The password, in a file of mode 0600 owned by root (for serve).
    pub password_file: PathBuf,
    pub log: PathBuf,
    /// The network namespace it listens in (the pid of a process in it,
    /// e.g. a booted systemd's), when not the machine's.
    netns: Option<i32>,
}

/// `program` run in the network namespace of `netns` when given (nsenter
/// execs it: no process in between), else as it is.
fn in_netns(netns: Option<i32>, program: &str) -> Command {
    match netns {
        None => Command::new(program),
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.args(["-t", &pid.to_string(), "-n", "--", program]);
            c
        }
    }
}

fn as_nobody(program: &str) -> Command {
    as_nobody_in(None, program)
}

fn as_nobody_in(netns: Option<i32>, program: &str) -> Command {
    let mut c = in_netns(netns, "setpriv");
    c.args([
        &format!("--reuid={NOBODY}"),
        &format!("--regid={NOGROUP}"),
        "--clear-groups",
        "--",
    ])
    .arg(Path::new(BIN).join(program));
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C.UTF-8");
    c
}

impl Postgres {
    /// initdb, then the server; returns once it accepts connections.
    pub fn start() -> Postgres {
        Self::start_with(None)
    }

    /// [`Postgres::start`], and with `tls` (a certificate and its key) the
    /// server takes TCP connections over TLS only (`hostssl` in
    /// `pg_hba.conf`: a plain connection is refused).
    pub fn start_with(tls: Option<(&Path, &Path)>) -> Postgres {
        Self::start_full(tls, None, None)
    }

    /// [`Postgres::start_with`] `tls`, also listening on `addr` (an
    /// address of this namespace, e.g. a [`super::netns::Wire`]'s) and
    /// taking password logins from its /24.
    pub fn start_tls_also_on(tls: (&Path, &Path), addr: &str) -> Postgres {
        Self::start_full(Some(tls), Some(addr), None)
    }

    /// [`Postgres::start`], listening on the loopback of the network
    /// namespace of process `pid` (a booted systemd's: `support::sysns`)
    /// instead of the machine's; its files stay on the machine.
    pub fn start_in_netns(pid: i32) -> Postgres {
        Self::start_full(None, None, Some(pid))
    }

    fn start_full(
        tls: Option<(&Path, &Path)>,
        also_on: Option<&str>,
        netns: Option<i32>,
    ) -> Postgres {
        require();
        let dir = tempfile::tempdir().expect("temp dir");
        own_file(dir.path());
        let pg_pw = dir.path().join("initdb-pw");
        std::fs::write(&pg_pw, format!("{PASSWORD}\n")).unwrap();
        std::fs::set_permissions(&pg_pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        own_file(&pg_pw);
        let data = dir.path().join("data");
        let out = as_nobody("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                USER,
                "--auth=scram-sha-256",
                "--no-sync",
                "-E",
                "UTF8",
            ])
            .arg(format!("--pwfile={}", pg_pw.display()))
            .stdin(Stdio::null())
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::remove_file(&pg_pw).unwrap();
        let mut settings = Vec::new();
        if let Some((cert, key)) = tls {
            for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
                let dest = data.join(to);
                std::fs::copy(from, &dest).expect("copy the TLS files");
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).unwrap();
                own_file(&dest);
            }
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all scram-sha-256\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
            )
            .unwrap();
            settings.extend(["ssl=on".to_string()]);
        }
        if let Some(addr) = also_on {
            let hba = data.join("pg_hba.conf");
            let mut text = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
            text.push_str(&format!("hostssl all all {addr}/24 scram-sha-256\n"));
            std::fs::write(&hba, text).expect("write pg_hba.conf");
            // The later setting wins over launch's loopback-only one.
            settings.push(format!("listen_addresses=127.0.0.1,{addr}"));
        }
        Self::run(dir, settings, netns)
    }

    /// A streaming standby of `primary` (asynchronous unless the primary
    /// names it in `synchronous_standby_names`), made by `pg_basebackup -R`
    /// and run like any cluster here.
    pub fn standby_of(primary: &Postgres) -> Postgres {
        let dir = tempfile::tempdir().expect("temp dir");
        own_file(dir.path());
        let out = as_nobody("pg_basebackup")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                USER,
            ])
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-R", "-X", "stream", "--no-sync"])
            .env("PGPASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .output()
            .expect("run pg_basebackup");
        assert!(
            out.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self::run(dir, Vec::new(), None)
    }

    /// Runs the cluster in `dir`/data with more `-c` settings.
    fn run(dir: tempfile::TempDir, settings: Vec<String>, netns: Option<i32>) -> Postgres {
        // serve's copy, in a directory of root's own (serve refuses a
        // secret in a directory another user could change).
        let secrets = tempfile::tempdir().expect("temp dir");
        let password_file = secrets.path().join("pg-password");
        std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
        std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let log = dir.path().join("postgres.log");
        let mut pg = Postgres {
            port: 0,
            dir,
            _secrets: secrets,
            child: None,
            settings,
            password_file,
            log,
            netns,
        };
        pg.launch();
        pg
    }

    /// Starts the server on a free port.
    fn launch(&mut self) {
        self.port = free_port();
        let log = std::fs::File::create(&self.log).expect("postgres log");
        own_file(&self.log);
        let child = as_nobody_in(self.netns, "postgres")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("port={}", self.port)])
            .args([
                "-c",
                &format!("unix_socket_directories={}", self.dir.path().display()),
            ])
            .args(["-c", "fsync=off", "-c", "max_connections=60"])
            .args(["-c", "shared_buffers=16MB", "-c", "logging_collector=off"])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn postgres");
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let ready = in_netns(self.netns, &format!("{BIN}/pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-t", "2"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("postgres exited ({st}): {}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within {START_TIMEOUT:?}: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The store URL of database `db` (`postgres` always exists).
    pub fn url(&self, db: &str) -> String {
        format!("postgresql://{USER}@127.0.0.1:{}/{db}", self.port)
    }

    /// Runs SQL through psql (as the test's superuser); its stdout, or a
    /// panic with psql's error.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        psql_at(self.port, USER, PASSWORD, db, sql)
    }

    /// SIGQUIT (immediate shutdown), then SIGKILL after 10 s; reaped.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            let _ = kill_process(pid, Signal::QUIT);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Runs SQL through psql on the loopback server at `port`, logged in as
/// `user` with `password`; its stdout, or a panic with psql's error.
pub fn psql_at(port: u16, user: &str, password: &str, db: &str, sql: &str) -> String {
    let out = Command::new(Path::new(BIN).join("psql"))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", user])
        .args(["-d", db, "-c", sql])
        .env("PGPASSWORD", password)
        .stdin(Stdio::null())
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql {sql:?} on port {port}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub fn own_file(p: &Path) {
    rustix::fs::chown(
        p,
        Some(rustix::fs::Uid::from_raw(NOBODY)),
        Some(rustix::fs::Gid::from_raw(NOGROUP)),
    )
    .expect("chown to nobody");
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
