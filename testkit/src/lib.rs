//! Test kit shared by the integration tests and the benchmarks: an
//! in-process fake lease authority with scripted answers, a
//! loopback TCP proxy that can refuse, blackhole and cut, helpers to run the
//! agent binary, and `/proc` checks that processes are gone.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// CLOCK_MONOTONIC now, in ns.
pub fn mono_ns() -> u128 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// CLOCK_BOOTTIME now, in ms.
pub fn boot_ms() -> u128 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    ts.tv_sec as u128 * 1000 + ts.tv_nsec as u128 / 1_000_000
}

/// A monotonic instant in ns (as `Request::mono_ns`), on the boot clock in ms.
pub fn mono_to_boot_ms(at_mono_ns: u128) -> u128 {
    let boot = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let boot_ns = boot.tv_sec as i128 * 1_000_000_000 + boot.tv_nsec as i128;
    let offset_ns = boot_ns - mono_ns() as i128;
    ((at_mono_ns as i128 + offset_ns) / 1_000_000) as u128
}

/// The last boot-clock instant (ms) a `clock-job.sh` recorded in `path`.
pub fn last_clock_record_ms(path: &std::path::Path) -> Option<u128> {
    let text = std::fs::read_to_string(path).ok()?;
    let last = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let (s, cs) = last.trim().split_once('.')?;
    Some(s.parse::<u128>().ok()? * 1000 + cs.parse::<u128>().ok()? * 10)
}

/// Polls `f` until it returns Some or the deadline passes.
pub fn wait_for<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether a pid exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            state != Some("Z") && state != Some("X")
        }
        Err(_) => false,
    }
}

/// Whether the pid entry exists at all (zombies included).
pub fn exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Pids whose process group is `pgid` (from /proc).
pub fn group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                let fields: Vec<&str> = s
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                // fields[0] = state, [1] = ppid, [2] = pgrp
                if fields.get(2).and_then(|p| p.parse::<i32>().ok()) == Some(pgid) {
                    out.push(pid);
                }
            }
        }
    }
    out
}

pub fn kill(pid: i32, sig: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Reads pids a helper script wrote into a file, one per line.
pub fn read_pids(path: &std::path::Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

pub fn wait_exit(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    wait_for(within, || child.try_wait().ok().flatten())
}

// ---------------------------------------------------------------- fake authority

/// How the fake authority answers one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Normal protocol behaviour (grant/renew/release succeed).
    Ok,
    /// A status and a raw body.
    Raw(u16, String),
    /// A refusal with this code.
    Refuse(&'static str),
    /// Accept the request and never answer (until the connection is dropped).
    Blackhole,
    /// A 200 with a body of this many bytes of JSON-ish garbage.
    Huge(usize),
    /// Answer normally after a delay.
    Delay(Duration),
    /// A `302 Found` to this location.
    Redirect(String),
}

#[derive(Clone, Debug)]
pub struct Request {
    pub at: Instant,
    /// CLOCK_MONOTONIC in ns when the request was read (comparable with
    /// other processes' monotonic clocks, e.g. Python's time.monotonic_ns).
    pub mono_ns: u128,
    pub path: String,
    pub body: serde_json::Value,
}

#[derive(Default)]
struct FakeState {
    /// Per-path scripted replies, consumed first; then `default_*`.
    script: std::collections::HashMap<String, VecDeque<Reply>>,
    default_renew: Option<Reply>,
    default_acquire: Option<Reply>,
    requests: Vec<Request>,
    token: u64,
    held_by: Option<String>,
    ttl_ms: u64,
    granted_ttl: u64,
}

/// An in-process fake lease authority on 127.0.0.1.
pub struct FakeAuthority {
    pub addr: SocketAddr,
    state: Arc<Mutex<FakeState>>,
    stop: Arc<AtomicBool>,
}

impl FakeAuthority {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(FakeState {
            token: 100,
            ..Default::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || serve_conn(conn, st));
            }
        });
        FakeAuthority { addr, state, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues replies for a path (`/v1/renew`...), used before the default.
    pub fn script(&self, path: &str, replies: Vec<Reply>) {
        self.state
            .lock()
            .unwrap()
            .script
            .entry(path.to_string())
            .or_default()
            .extend(replies);
    }

    pub fn set_renew(&self, r: Reply) {
        self.state.lock().unwrap().default_renew = Some(r);
    }

    pub fn set_acquire(&self, r: Reply) {
        self.state.lock().unwrap().default_acquire = Some(r);
    }

    /// Grants at most this ttl.
    pub fn set_ttl_cap(&self, ms: u64) {
        self.state.lock().unwrap().ttl_ms = ms;
    }

    /// Makes acquire answer 409 held until `release` is called.
    pub fn hold(&self, holder: &str) {
        self.state.lock().unwrap().held_by = Some(holder.to_string());
    }

    pub fn unhold(&self) {
        self.state.lock().unwrap().held_by = None;
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn requests_to(&self, path: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    pub fn token(&self) -> u64 {
        self.state.lock().unwrap().token
    }
}

impl Drop for FakeAuthority {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn read_request(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some((path, body))
}

fn respond(w: &mut TcpStream, status: u16, body: &[u8]) -> std::io::Result<()> {
    write!(
        w,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )?;
    w.write_all(body)?;
    w.flush()
}

fn serve_conn(conn: TcpStream, state: Arc<Mutex<FakeState>>) {
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    while let Some((path, body)) = read_request(&mut r) {
        let json: serde_json::Value =
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        let reply = {
            let mut s = state.lock().unwrap();
            s.requests.push(Request {
                at: Instant::now(),
                mono_ns: mono_ns(),
                path: path.clone(),
                body: json.clone(),
            });
            let scripted = s.script.get_mut(&path).and_then(|q| q.pop_front());
            scripted.unwrap_or_else(|| match path.as_str() {
                "/v1/renew" => s.default_renew.clone().unwrap_or(Reply::Ok),
                "/v1/acquire" => s.default_acquire.clone().unwrap_or(Reply::Ok),
                _ => Reply::Ok,
            })
        };
        let reply = match reply {
            Reply::Delay(d) => {
                std::thread::sleep(d);
                Reply::Ok
            }
            r => r,
        };
        let res = match reply {
            Reply::Ok => {
                let (status, out) = normal(&path, &json, &state);
                respond(&mut w, status, out.to_string().as_bytes())
            }
            Reply::Raw(status, body) => respond(&mut w, status, body.as_bytes()),
            Reply::Redirect(to) => write!(
                w,
                "HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\n\r\n"
            )
            .and_then(|()| w.flush()),
            Reply::Refuse(code) => respond(
                &mut w,
                409,
                serde_json::json!({"error": code, "message": "scripted"})
                    .to_string()
                    .as_bytes(),
            ),
            Reply::Blackhole => {
                // Hold the connection open, answer nothing, until the client gives up.
                let mut buf = [0u8; 1];
                let _ = r.get_mut().set_read_timeout(Some(Duration::from_secs(120)));
                let _ = r.read(&mut buf);
                return;
            }
            Reply::Huge(n) => {
                let mut body = String::from("{\"ttl_ms\": 30000, \"pad\": \"");
                body.push_str(&"x".repeat(n));
                body.push_str("\"}");
                respond(&mut w, 200, body.as_bytes())
            }
            Reply::Delay(_) => unreachable!(),
        };
        if res.is_err() {
            return;
        }
    }
}

fn normal(
    path: &str,
    req: &serde_json::Value,
    state: &Arc<Mutex<FakeState>>,
) -> (u16, serde_json::Value) {
    let mut s = state.lock().unwrap();
    match path {
        "/v1/acquire" => {
            if let Some(h) = &s.held_by {
                return (
                    409,
                    serde_json::json!({"error": "held", "message": "held", "holder": h, "retry_after_ms": 60000}),
                );
            }
            s.token += 1;
            let mut ttl = req["ttl_ms"].as_u64().unwrap_or(30000);
            if s.ttl_ms > 0 {
                ttl = ttl.min(s.ttl_ms);
            }
            let holder = req["holder"].as_str().unwrap_or("?").to_string();
            s.held_by = Some(holder);
            s.granted_ttl = ttl;
            (
                200,
                serde_json::json!({"lease_id": format!("L{}", s.token), "task": req["task"], "token": s.token, "ttl_ms": ttl}),
            )
        }
        "/v1/renew" => {
            // Renewals give the ttl of the grant.
            let ttl = if s.granted_ttl > 0 {
                s.granted_ttl
            } else {
                30000
            };
            (200, serde_json::json!({"ttl_ms": ttl}))
        }
        "/v1/release" => {
            s.held_by = None;
            (200, serde_json::json!({}))
        }
        _ => (
            404,
            serde_json::json!({"error": "not_found", "message": "no such path"}),
        ),
    }
}

// ---------------------------------------------------------------- TCP proxy

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Pass,
    /// Accepted connections are closed at once (the client sees a reset/EOF).
    Refuse,
    /// Accepted connections get nothing forwarded and no answer.
    Blackhole,
}

/// A loopback TCP proxy in front of an upstream address.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<Mutex<ProxyMode>>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(ProxyMode::Pass));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (m, c) = (mode.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let mode = *m.lock().unwrap();
                match mode {
                    ProxyMode::Refuse => {
                        let _ = client.shutdown(Shutdown::Both);
                    }
                    ProxyMode::Blackhole => {
                        c.lock().unwrap().push(client);
                    }
                    ProxyMode::Pass => {
                        let Ok(up) = TcpStream::connect(upstream) else {
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        };
                        {
                            let mut g = c.lock().unwrap();
                            g.push(client.try_clone().unwrap());
                            g.push(up.try_clone().unwrap());
                        }
                        let m2 = m.clone();
                        pipe(
                            client.try_clone().unwrap(),
                            up.try_clone().unwrap(),
                            m2.clone(),
                        );
                        pipe(up, client, m2);
                    }
                }
            }
        });
        Proxy { addr, mode, conns }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, mode: ProxyMode) {
        *self.mode.lock().unwrap() = mode;
        if mode != ProxyMode::Pass {
            self.cut();
        }
    }

    /// Closes every open connection.
    pub fn cut(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, mode: Arc<Mutex<ProxyMode>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if *mode.lock().unwrap() == ProxyMode::Blackhole {
                // Swallow: nothing goes through while blackholed.
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

// ---------------------------------------------------------------- running the agent

/// Output of a finished agent, with stderr for diagnostics.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

pub fn run_agent(mut c: Command, within: Duration) -> Finished {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t2 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = match wait_exit(&mut child, within) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "agent did not finish within {within:?}; stderr: {}",
                t2.join().unwrap()
            );
        }
    };
    Finished {
        status,
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    }
}

/// A TCP connection to `server` from the local address `ip` (any of
/// 127.0.0.0/8 on Linux), with a 15 s read timeout: a client from a
/// distinct loopback address, as the server sees peers.
pub fn connect_from(
    ip: [u8; 4],
    server: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpStream> {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::STREAM,
        None,
    )?;
    rustix::net::bind(&sock, &SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), 0))?;
    rustix::net::connect(&sock, &server)?;
    let s = std::net::TcpStream::from(sock);
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    Ok(s)
}

/// A connection flood: a thread opens connections from one address as
/// fast as the server takes them and holds up to `hold` of them (the
/// oldest are closed first) without sending a byte (so, over TLS, without
/// starting a handshake), until dropped.
pub struct Flood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    opened: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    pub fn start(from: [u8; 4], server: std::net::SocketAddr, hold: usize) -> Flood {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (st, op) = (stop.clone(), opened.clone());
        let thread = std::thread::spawn(move || {
            let mut held = std::collections::VecDeque::new();
            while !st.load(Ordering::Relaxed) {
                if let Ok(c) = connect_from(from, server) {
                    held.push_back(c);
                    op.fetch_add(1, Ordering::Relaxed);
                }
                if held.len() > hold {
                    held.pop_front();
                }
            }
        });
        Flood {
            stop,
            opened,
            thread: Some(thread),
        }
    }

    /// Connections opened so far.
    pub fn opened(&self) -> usize {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits (at most `within`) until `n` connections were opened.
    pub fn past(&self, n: usize, within: Duration) -> bool {
        wait_for(within, || (self.opened() >= n).then_some(())).is_some()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The benchmarks' agent binary: `LEASEAGENT_BIN` when set (another build,
/// to compare two builds on equal terms), else `built` (the bench's own
/// `env!("CARGO_BIN_EXE_leaseagent")`, which only the bench crate knows).
pub fn bench_bin(built: &str) -> std::path::PathBuf {
    std::env::var_os("LEASEAGENT_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(built))
}

/// The `p` quantile (0..=1, nearest rank) of sorted figures; NaN if none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The renewal figures of the load benchmarks (`serve_load`,
/// `etcd_load`), as one line in the same words, so that the two compare
/// line for line: joins the `clients` (each returns the latency of every
/// renewal it made), then prints how many renewals there were, in the time
/// from `start` to the last join, the rate, and the latency's p50, p99,
/// p99.9 (nearest rank, rounded down) and max. Panics if a client
/// panicked or none made a renewal.
pub fn report_renewals(clients: Vec<std::thread::JoinHandle<Vec<Duration>>>, start: Instant) {
    let mut lat: Vec<Duration> = clients
        .into_iter()
        .flat_map(|h| h.join().expect("a renewal client panicked"))
        .collect();
    let el = start.elapsed();
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "renewals: {} in {:.2}s = {:.0} renewals/s; latency p50 {:?} p99 {:?} p99.9 {:?} max {:?}",
        lat.len(),
        el.as_secs_f64(),
        lat.len() as f64 / el.as_secs_f64(),
        q(0.5),
        q(0.99),
        q(0.999),
        lat[lat.len() - 1]
    );
}

/// A process's peak resident set (`VmHWM` of `/proc/PID/status`), in KiB.
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
