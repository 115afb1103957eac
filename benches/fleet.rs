//! Fleet benchmark of `leaseagent serve` (not a test; run it yourself):
//!
//!     cargo bench --bench fleet                      # 10,000 agents, 10 s heartbeat, 20 s
//!     FLEET_AGENTS=10000 FLEET_SECS=10 FLEET_HEARTBEAT_MS=1000 cargo bench --bench fleet
//!     LEASEAGENT_BIN=target/x86_64-unknown-linux-gnu/release/leaseagent cargo bench --bench fleet
//!     FLEET_AGENTS=16 FLEET_IPS=1 FLEET_SECS=5 FLEET_HEARTBEAT_MS=0 cargo bench --bench fleet
//!
//! The last line is the closed-loop renewal benchmark (what `wrk -c16`
//! does): with FLEET_HEARTBEAT_MS=0 every agent sends its next renewal as
//! soon as the answer is in. Unlike wrk, this client's two threads share
//! the connections (tokio's work-stealing runtime), so when the host
//! freezes one vCPU for a while the other thread carries on with its
//! connections; and its latencies are checked against elapsed time (the
//! "time spent in renewals" line cannot exceed 100%).
//!
//! FLEET_AGENTS simulated agents each open one keep-alive connection
//! (spread over FLEET_IPS loopback source addresses 127.0.0.2.., as a fleet
//! comes from many hosts; the server's per-peer limit is 1024), acquire
//! their own task, then renew it every FLEET_HEARTBEAT_MS (start times
//! spread over one heartbeat) for FLEET_SECS seconds. A separate client
//! polls `/healthz` meanwhile. Reported: connections refused or lost,
//! renewals not answered 200, renew latency percentiles (client-side, from
//! writing the request to reading the whole answer), `/healthz` latency,
//! and the server's peak RSS.
//!
//! The load generator shares the machine's CPUs with the server, so the
//! figures are for both together.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn raise_nofile() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    let _ = setrlimit(Resource::Nofile, l);
}

/// One keep-alive connection with a minimal HTTP/1.1 client.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(src: IpAddr, dst: SocketAddr) -> std::io::Result<Conn> {
        let sock = TcpSocket::new_v4()?;
        sock.bind(SocketAddr::new(src, 0))?;
        let s = tokio::time::timeout(Duration::from_secs(30), sock.connect(dst))
            .await
            .map_err(|_| std::io::Error::other("connect timed out"))??;
        s.set_nodelay(true)?;
        Ok(Conn {
            s,
            buf: Vec::with_capacity(512),
        })
    }

    /// One request; returns (status, body).
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> std::io::Result<(u16, String)> {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.s.write_all(req.as_bytes()).await?;
        self.buf.clear();
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                let status: u16 = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                let total = end + 4 + len;
                while self.buf.len() < total {
                    let n = self.s.read(&mut chunk).await?;
                    if n == 0 {
                        return Err(std::io::Error::other("closed mid-answer"));
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                let body = String::from_utf8_lossy(&self.buf[end + 4..total]).to_string();
                return Ok((status, body));
            }
            let n = tokio::time::timeout(Duration::from_secs(30), self.s.read(&mut chunk))
                .await
                .map_err(|_| std::io::Error::other("answer timed out"))??;
            if n == 0 {
                return Err(std::io::Error::other("closed by the server"));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn field<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\":");
    let start = body.find(&key)? + key.len();
    let rest = &body[start..];
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim_matches('"'))
}

#[derive(Default)]
struct Stats {
    connect_failed: AtomicU64,
    grant_failed: AtomicU64,
    renew_not_200: AtomicU64,
    conn_lost: AtomicU64,
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn peak_rss_kib(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l.trim_start_matches("VmHWM:").trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

/// CPU seconds (user + system) the process has used so far.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the comm.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds the hypervisor took from this VM so far (`steal` in
/// /proc/stat, all CPUs); 0 on bare metal. On the development VM the host
/// took a busy vCPU away for about 100 ms at a time, which stalls whatever
/// thread was running there, client or server.
fn steal_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 100.0
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    raise_nofile();
    let agents = env("FLEET_AGENTS", 10_000) as usize;
    let secs = env("FLEET_SECS", 20);
    let heartbeat = Duration::from_millis(env("FLEET_HEARTBEAT_MS", 10_000));
    let ips = env("FLEET_IPS", 16).clamp(1, 250) as u8;
    let bin = std::env::var("LEASEAGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_leaseagent").to_string());
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("fleet.db");
    let mut server = Command::new(&bin)
        .args([
            "serve",
            "--no-auth",
            "--listen",
            "127.0.0.1:0",
            "--max-connections",
            "65536",
            "--db",
        ])
        .arg(&db)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let pid = server.id();
    let err = server.stderr.take().expect("stderr");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    let addr: SocketAddr = loop {
        let line = lines.next().expect("serve exited").expect("stderr");
        if let Some(rest) = line.split("http://").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .and_then(|a| a.parse().ok())
                .expect("address");
        }
    };
    std::thread::spawn(move || for _ in lines {});
    println!(
        "server {addr} ({bin}); {agents} agents from {ips} source addresses, heartbeat {heartbeat:?}, {secs} s"
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let stats = Arc::new(Stats::default());
    rt.block_on(async {
        // Connect and acquire, at most 256 at a time (a fleet does not start in one instant).
        let t0 = Instant::now();
        let gate = Arc::new(tokio::sync::Semaphore::new(256));
        let mut setup = Vec::with_capacity(agents);
        for i in 0..agents {
            let (gate, stats) = (gate.clone(), stats.clone());
            let src = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(ips)) as u8));
            setup.push(tokio::spawn(async move {
                let _p = gate.acquire().await.ok()?;
                let mut c = match Conn::open(src, addr).await {
                    Ok(c) => c,
                    Err(_) => {
                        stats.connect_failed.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                };
                let body = format!(r#"{{"task":"fleet-{i}","holder":"agent-{i}","ttl_ms":60000}}"#);
                match c.call("POST", "/v1/acquire", &body).await {
                    Ok((200, b)) => {
                        let id = field(&b, "lease_id")?.to_string();
                        let tok = field(&b, "token")?.to_string();
                        Some((c, format!(r#"{{"lease_id":"{id}","token":{tok}}}"#)))
                    }
                    _ => {
                        stats.grant_failed.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                }
            }));
        }
        let mut conns = Vec::with_capacity(agents);
        for h in setup {
            if let Ok(Some(c)) = h.await {
                conns.push(c);
            }
        }
        let setup_el = t0.elapsed();
        println!(
            "connected and granted: {} of {agents} in {:.2}s ({:.0} grants/s incl. connect); connect failures {}, grant failures {}",
            conns.len(),
            setup_el.as_secs_f64(),
            conns.len() as f64 / setup_el.as_secs_f64(),
            stats.connect_failed.load(Ordering::Relaxed),
            stats.grant_failed.load(Ordering::Relaxed)
        );

        // Everyone renews on a heartbeat; a probe polls /healthz.
        let cpu0 = cpu_secs(pid);
        let steal0 = steal_secs();
        let start = tokio::time::Instant::now();
        let end = start + Duration::from_secs(secs);
        let n = conns.len().max(1);
        let mut tasks = Vec::with_capacity(n);
        for (k, (mut c, body)) in conns.into_iter().enumerate() {
            let stats = stats.clone();
            let offset = heartbeat.mul_f64(k as f64 / n as f64);
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut next = start + offset;
                while next < end {
                    if heartbeat.is_zero() {
                        // Closed loop: the next renewal as soon as the answer is in.
                        next = tokio::time::Instant::now();
                    } else {
                        tokio::time::sleep_until(next).await;
                    }
                    let t = Instant::now();
                    match c.call("POST", "/v1/renew", &body).await {
                        Ok((200, _)) => lat.push(t.elapsed()),
                        Ok(_) => {
                            stats.renew_not_200.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            stats.conn_lost.fetch_add(1, Ordering::Relaxed);
                            return lat;
                        }
                    }
                    next += heartbeat;
                }
                lat
            }));
        }
        let probe = tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut failed = 0u64;
            let src = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
            while tokio::time::Instant::now() < end {
                let t = Instant::now();
                match Conn::open(src, addr).await {
                    Ok(mut c) => match c.call("GET", "/healthz", "").await {
                        Ok((200, _)) => lat.push(t.elapsed()),
                        _ => failed += 1,
                    },
                    Err(_) => failed += 1,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (lat, failed)
        });
        let mut lat = Vec::new();
        for t in tasks {
            if let Ok(l) = t.await {
                lat.extend(l);
            }
        }
        let el = start.elapsed();
        let cpu = cpu_secs(pid) - cpu0;
        let steal = steal_secs() - steal0;
        let (mut hlat, hfail) = probe.await.unwrap_or_default();
        let count = lat.len();
        let max = lat.iter().max().copied().unwrap_or_default();
        println!(
            "renewals: {count} in {:.2}s = {:.0}/s; not 200: {}; connections lost: {}",
            el.as_secs_f64(),
            count as f64 / el.as_secs_f64(),
            stats.renew_not_200.load(Ordering::Relaxed),
            stats.conn_lost.load(Ordering::Relaxed)
        );
        println!(
            "server CPU during the renewals: {cpu:.2} s ({:.1} µs a renewal)",
            cpu * 1e6 / count.max(1) as f64
        );
        let slow = lat.iter().filter(|d| **d > Duration::from_millis(10)).count();
        let busy = lat.iter().map(Duration::as_secs_f64).sum::<f64>() / (n as f64 * el.as_secs_f64());
        println!(
            "renewals over 10 ms: {slow}; time spent in renewals: {:.0}% of agents x elapsed",
            busy * 100.0
        );
        println!("CPU taken by the host (steal) meanwhile: {steal:.2} s");
        println!(
            "renew latency: p50 {:?} p99 {:?} p99.9 {:?} max {:?}",
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            pct(&mut lat, 0.999),
            max
        );
        println!(
            "/healthz on a new connection (connect + answer): {} answered, {hfail} failed, p99 {:?}",
            hlat.len(),
            pct(&mut hlat, 0.99)
        );
        // The server's own view: time from a fully read request to its answer.
        if let Ok(mut c) = Conn::open(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), addr).await {
            if let Ok((_, text)) = c.call("GET", "/metrics", "").await {
                let line: Vec<String> = text
                    .lines()
                    .filter(|l| l.starts_with("leaseagent_request_duration_seconds_bucket"))
                    .map(|l| {
                        l.trim_start_matches("leaseagent_request_duration_seconds_bucket")
                            .to_string()
                    })
                    .collect();
                println!("server-side request durations (cumulative): {}", line.join(" "));
            }
        }
    });
    println!("server peak RSS: {}", peak_rss_kib(pid));
    let _ = server.kill();
    let _ = server.wait();
}
