//! Test helpers for the authority: a real `leaseagent serve` process, a raw
//! HTTP/1.1 client (so malformed requests can be sent byte for byte), and
//! polling with deadlines.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_leaseagent"))
}

/// A `leaseagent serve` just started: the process, the `host:port` it
/// printed in its listening line, and its stderr lines as they come (a
/// thread drains the pipe, so serve never blocks on it).
pub struct Spawned {
    pub child: Child,
    pub addr: String,
    pub stderr: std::sync::mpsc::Receiver<String>,
}

/// Where a `serve` keeps its state: a SQLite file (`--db`), or a
/// PostgreSQL store that several replicas may share (`--store`).
#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(PathBuf),
    Postgres {
        url: String,
        password_file: PathBuf,
        /// `--leader-ttl` (short in tests: a restarted replica takes over
        /// from its killed predecessor after about this long).
        leader_ttl: &'static str,
    },
}

impl Store {
    /// The `serve` flags naming the store.
    pub fn args(&self) -> Vec<std::ffi::OsString> {
        match self {
            Store::Sqlite(db) => vec!["--db".into(), db.into()],
            Store::Postgres {
                url,
                password_file,
                leader_ttl,
            } => vec![
                "--store".into(),
                url.into(),
                "--store-password-file".into(),
                password_file.into(),
                "--leader-ttl".into(),
                leader_ttl.into(),
            ],
        }
    }
}

/// Starts `leaseagent serve --db DB ARGS...` and waits (up to 30 s) for its
/// listening line, whatever the scheme.
/// Without `--auth-file` in ARGS it adds `--no-auth` (serve refuses to run
/// without either).
pub fn spawn_serve(db: &Path, args: &[std::ffi::OsString]) -> Spawned {
    spawn_serve_on(&Store::Sqlite(db.to_path_buf()), args)
}

/// [`spawn_serve`] on any store.
pub fn spawn_serve_on(store: &Store, args: &[std::ffi::OsString]) -> Spawned {
    spawn_serve_via(Command::new(bin()), store, args)
}

/// [`spawn_serve_on`] with `cmd` as the `leaseagent` to run (e.g. `ip
/// netns exec NS .../leaseagent`, which execs it: the child is serve).
pub fn spawn_serve_via(mut cmd: Command, store: &Store, args: &[std::ffi::OsString]) -> Spawned {
    let mut child = cmd
        .arg("serve")
        .args(store.args())
        .args(args)
        .args(no_auth_unless_given(args))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn leaseagent serve");
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut said = Vec::new();
    let addr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|_| {
            let st = child.try_wait();
            panic!(
                "serve did not print its listening line ({st:?}); it said:\n{}",
                said.join("\n")
            )
        });
        said.push(line.clone());
        if let Some(rest) = line.strip_prefix("leaseagent serve: listening on ") {
            let url = rest.split_whitespace().next().unwrap();
            break url.split("://").nth(1).unwrap().to_string();
        }
    };
    Spawned {
        child,
        addr,
        stderr: rx,
    }
}

/// A running `leaseagent serve`.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub db: PathBuf,
    /// Where its state is (`db` is that of a SQLite store, else empty).
    pub store: Store,
    /// Keeps the stderr reader draining after start-up (its lines are not read).
    _stderr: std::sync::mpsc::Receiver<String>,
}

impl Server {
    /// Starts a server on a free loopback port with its database at `db`.
    pub fn start(db: &Path) -> Server {
        Server::start_with(db, &[])
    }

    /// The same, with more `serve` flags.
    pub fn start_with(db: &Path, flags: &[&str]) -> Server {
        Server::start_on(&Store::Sqlite(db.to_path_buf()), flags)
    }

    /// Starts a server on `store`; returns once it leads (a replica on a
    /// PostgreSQL store starts as a standby and answers lease calls only
    /// once it took over).
    pub fn start_on(store: &Store, flags: &[&str]) -> Server {
        let mut args: Vec<std::ffi::OsString> = vec!["--listen".into(), "127.0.0.1:0".into()];
        args.extend(flags.iter().map(Into::into));
        let s = spawn_serve_on(store, &args);
        let server = Server {
            child: s.child,
            addr: s.addr,
            db: match store {
                Store::Sqlite(db) => db.clone(),
                Store::Postgres { .. } => PathBuf::new(),
            },
            store: store.clone(),
            _stderr: s.stderr,
        };
        if matches!(store, Store::Postgres { .. }) {
            server.wait_leading(Duration::from_secs(30));
        }
        server
    }

    /// Polls `/healthz` until it answers 200 (this replica leads).
    pub fn wait_leading(&self, within: Duration) {
        poll("serve to lead (/healthz 200)", within, || {
            let (st, _) =
                request(&self.addr, "GET", "/healthz", b"", Duration::from_secs(5)).ok()?;
            (st == 200).then_some(())
        });
    }

    /// The same on a chosen address (`--listen ADDR`), to come back on it
    /// after a kill.
    pub fn start_with_listen(db: &Path, listen: &str) -> Server {
        let s = spawn_serve(db, &["--listen".into(), listen.into()]);
        Server {
            child: s.child,
            addr: s.addr,
            db: db.to_path_buf(),
            store: Store::Sqlite(db.to_path_buf()),
            _stderr: s.stderr,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// kill -9 and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits (up to 10 s) for serve to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.child.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        poll("serve to exit", Duration::from_secs(10), || {
            self.child.try_wait().unwrap()
        })
    }

    /// kill -9, then start again on the same database (new port).
    pub fn crash_restart(&mut self) {
        self.kill9();
        *self = Server::start_on(&self.store.clone(), &[]);
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post(&self.addr, path, body)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let (s, b) = request(&self.addr, "GET", path, b"", Duration::from_secs(10)).unwrap();
        (s, String::from_utf8_lossy(&b).into_owned())
    }

    pub fn acquire(&self, task: &str, holder: &str, ttl_ms: u64) -> (u16, Value) {
        self.post(
            "/v1/acquire",
            &serde_json::json!({"task": task, "holder": holder, "ttl_ms": ttl_ms}),
        )
    }

    pub fn renew(&self, grant: &Value) -> (u16, Value) {
        self.post(
            "/v1/renew",
            &serde_json::json!({"lease_id": grant["lease_id"], "token": grant["token"]}),
        )
    }

    pub fn release(&self, grant: &Value) -> (u16, Value) {
        self.post(
            "/v1/release",
            &serde_json::json!({"lease_id": grant["lease_id"], "token": grant["token"],
                                "outcome": "succeeded", "exit_code": 0}),
        )
    }

    /// The state of `task` in `GET /v1/leases`, or None when not listed.
    pub fn state_of(&self, task: &str) -> Option<String> {
        let (s, body) = self.get("/v1/leases");
        assert_eq!(s, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["task"] == task)
            .map(|l| l["state"].as_str().unwrap().to_string())
    }

    /// The value of an unlabelled metric line `name VALUE`.
    pub fn metric(&self, name: &str) -> f64 {
        let (s, body) = self.get("/metrics");
        assert_eq!(s, 200);
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no metric {name} in\n{body}"))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on a fresh connection (`Connection: close`); `Err` on any
/// I/O error or timeout.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<(u16, Vec<u8>)> {
    // serve takes only its listen address, or `localhost` on loopback, as
    // the `Host` (no DNS rebinding).
    let host = if addr.starts_with("127.") {
        "localhost"
    } else {
        addr
    };
    let mut raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw_request(addr, &raw, timeout)
}

/// Sends raw bytes, reads the answer until the server closes.
pub fn raw_request(addr: &str, raw: &[u8], timeout: Duration) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(raw)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out);
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad answer: {text:?}")))?;
    let body = match out.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(p) => out[p + 4..].to_vec(),
        None => Vec::new(),
    };
    Ok((status, body))
}

pub fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let (s, b) = request(
        addr,
        "POST",
        path,
        body.to_string().as_bytes(),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let v = serde_json::from_slice(&b)
        .unwrap_or_else(|e| panic!("POST {path}: answer not JSON ({e}): {b:?}"));
    (s, v)
}

/// Polls `f` until it returns Some, or panics at the deadline.
pub fn poll<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    super::poll_every(what, timeout, Duration::from_millis(25), f)
}

/// `["--no-auth"]` unless `args` has `--auth-file` or `--no-auth`: what a
/// test that starts serve without principals must say.
pub fn no_auth_unless_given<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Vec<&'static str> {
    let given = args.iter().any(|a| {
        let a = a.as_ref().to_string_lossy();
        a == "--no-auth" || a == "--auth-file" || a.starts_with("--auth-file=")
    });
    if given { Vec::new() } else { vec!["--no-auth"] }
}
