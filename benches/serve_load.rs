//! Load benchmark of `leaseagent serve` (not a test; run it yourself):
//!
//!     cargo bench --bench serve_load            # defaults below
//!     LOAD_SECS=20 LOAD_LEASES=10000 LOAD_CLIENTS=8 cargo bench --bench serve_load
//!
//! 1. Durable grants/s: LOAD_GRANTERS keep-alive clients acquire
//!    LOAD_LEASES distinct tasks (each answer comes after its fsync'd commit).
//! 2. Renewals/s and latency: LOAD_CLIENTS keep-alive clients renew those
//!    leases round-robin for LOAD_SECS seconds; latency is measured by the
//!    client, from writing a request to reading its whole answer.
//!
//! The load generator runs on the same machine as the server, so they share
//! the CPUs; the figures are for both together.
//!
//! `LOAD_STORE=postgresql://USER@HOST:PORT/DB` (with
//! `LOAD_STORE_PASSWORD_FILE=FILE`) runs `serve --store` on that PostgreSQL
//! database instead of a SQLite file (one replica: the leader); "fsync'd
//! commits" are then PostgreSQL's commits.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Conn {
    fn new(addr: &str) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Conn {
            w: s.try_clone().unwrap(),
            r: BufReader::new(s),
        }
    }

    /// POST on the kept-alive connection; returns (status, body).
    fn post(&mut self, path: &str, body: &str) -> (u16, String) {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.w.write_all(req.as_bytes()).unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut len = 0;
        loop {
            line.clear();
            self.r.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap();
                }
            }
        }
        let mut b = vec![0; len];
        self.r.read_exact(&mut b).unwrap();
        (status, String::from_utf8(b).unwrap())
    }
}

fn field<'a>(body: &'a str, name: &str) -> &'a str {
    let key = format!("\"{name}\":");
    let start = body.find(&key).unwrap() + key.len();
    let rest = &body[start..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim_matches('"')
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let leases = env("LOAD_LEASES", 10_000) as usize;
    let clients = env("LOAD_CLIENTS", 8) as usize;
    let granters = env("LOAD_GRANTERS", 32) as usize;
    let secs = env("LOAD_SECS", 10);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
    cmd.args(["serve", "--no-auth", "--listen", "127.0.0.1:0"]);
    let store = std::env::var("LOAD_STORE").ok();
    match &store {
        Some(url) => {
            cmd.args(["--store", url]);
            if let Ok(f) = std::env::var("LOAD_STORE_PASSWORD_FILE") {
                cmd.args(["--store-password-file", &f]);
            }
        }
        None => {
            cmd.arg("--db").arg(&db);
        }
    }
    let mut server = Server(cmd.stderr(Stdio::piped()).spawn().unwrap());
    let mut err = BufReader::new(server.0.stderr.take().unwrap());
    // Its listening line (a warning may come first: serve logs on stderr).
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "serve ended before it listened"
        );
    }
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    // A replica answers lease calls once it leads.
    let leads = Instant::now() + Duration::from_secs(60);
    while store.is_some() {
        let mut h = TcpStream::connect(&addr).unwrap();
        h.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        h.read_to_string(&mut text).unwrap();
        if text.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < leads,
            "serve did not lead within 60 s: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "store: {}",
        store.as_deref().unwrap_or("SQLite (a file on this disk)")
    );
    println!(
        "server {addr}, {leases} leases, {clients} renewing clients, {granters} granting clients"
    );

    // 1. Durable grants.
    let start = Instant::now();
    let per = leases.div_ceil(granters);
    let hs: Vec<_> = (0..granters)
        .map(|g| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = Conn::new(&addr);
                let mut out = Vec::new();
                for i in (g * per)..((g + 1) * per).min(leases) {
                    let (s, b) = c.post(
                        "/v1/acquire",
                        &format!(r#"{{"task":"bench-{i}","holder":"bench","ttl_ms":600000}}"#),
                    );
                    assert_eq!(s, 200, "{b}");
                    out.push((
                        field(&b, "lease_id").to_string(),
                        field(&b, "token").to_string(),
                    ));
                }
                out
            })
        })
        .collect();
    let granted: Vec<(String, String)> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let el = start.elapsed();
    println!(
        "grants: {} in {:.2}s = {:.0} durable grants/s",
        granted.len(),
        el.as_secs_f64(),
        granted.len() as f64 / el.as_secs_f64()
    );

    let mut m = TcpStream::connect(&addr).unwrap();
    m.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    m.read_to_string(&mut text).unwrap();
    let metric = |n: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{n} ")))
            .unwrap_or("?")
            .to_string()
    };
    println!(
        "  in {} fsync'd commits ({} changes)",
        metric("leaseagent_db_commits_total"),
        metric("leaseagent_db_committed_changes_total")
    );

    // 2. Renewals.
    let bodies: Vec<String> = granted
        .iter()
        .map(|(id, tok)| format!(r#"{{"lease_id":"{id}","token":{tok}}}"#))
        .collect();
    let bodies = std::sync::Arc::new(bodies);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let hs: Vec<_> = (0..clients)
        .map(|k| {
            let (addr, bodies) = (addr.clone(), bodies.clone());
            std::thread::spawn(move || {
                let mut c = Conn::new(&addr);
                let mut lat = Vec::with_capacity(1 << 20);
                let mut i = k;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let (s, b) = c.post("/v1/renew", &bodies[i % bodies.len()]);
                    lat.push(t.elapsed());
                    assert_eq!(s, 200, "{b}");
                    i += clients;
                }
                lat
            })
        })
        .collect();
    leaseagent_testkit::report_renewals(hs, start);
    drop(server);
}

/// The server, killed however the benchmark ends (a failed assertion
/// included: it would otherwise hold the terminal's output open).
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
