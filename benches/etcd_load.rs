//! `benches/serve_load.rs`'s figures and `serve`'s takeover time, for etcd
//! through leaseagent's own etcd client (`EtcdAuthority`: etcd's JSON
//! gateway over keep-alive HTTP/1.1, what an agent given `etcd://` uses).
//! Not a test; run it yourself:
//!
//!     cargo bench --bench etcd_load
//!     LOAD_LEASES=2000 LOAD_GRANTERS=32 LOAD_CLIENTS=8 LOAD_SECS=10 cargo bench --bench etcd_load
//!
//! 1. Durable grants/s: LOAD_GRANTERS clients (one `EtcdAuthority`, so one
//!    connection, each) acquire LOAD_LEASES distinct tasks with ttl 600 s,
//!    on one etcd member whose data is on this disk (every commit fsynced,
//!    as `serve --db`'s are).
//! 2. Renewals/s and latency: LOAD_CLIENTS clients renew those leases
//!    round-robin for LOAD_SECS seconds (a renewal is a lease keepalive).
//! 3. Takeover: a 3-member cluster on this disk; the raft leader is killed
//!    (kill -9) while a client asks for a fresh task every 10 ms through
//!    every member's address; the time from the kill to the first grant,
//!    LOAD_TAKEOVERS times (default 3), each on a new cluster.
//!
//! The members run from tests/integration/support/etcd.rs (included
//! below), as the tests start them, apart from where their data lives.

use std::time::{Duration, Instant};

use leaseagent::testing::{AcquireRequest, EtcdAuthority, ExpiryPolicy, LeaseClient, LeaseRef};

#[path = "../tests/integration/support/etcd.rs"]
#[allow(dead_code)]
mod etcd;

/// What support/etcd.rs asks of its parent module (tests/integration/support).
fn all_threads_stopped(pid: u32, within: Duration) -> Option<()> {
    let until = Instant::now() + within;
    loop {
        let stopped = std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .filter_map(Result::ok)
            .all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|s| {
                        s.rsplit_once(')')
                            .map(|(_, r)| r.trim_start().starts_with('T'))
                    })
                    .unwrap_or(true)
            });
        if stopped {
            return Some(());
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn poll_every<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let until = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(every);
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const CALL: Duration = Duration::from_secs(10);

fn request(task: String) -> AcquireRequest {
    AcquireRequest {
        task,
        holder: "bench".into(),
        ttl: Duration::from_secs(600),
        on_expiry: ExpiryPolicy::Redispatch,
        grace: Duration::ZERO,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let leases = env("LOAD_LEASES", 2_000) as usize;
    let clients = env("LOAD_CLIENTS", 8) as usize;
    let granters = env("LOAD_GRANTERS", 32) as usize;
    let secs = env("LOAD_SECS", 10);
    let takeovers = env("LOAD_TAKEOVERS", 3);

    let one = etcd::Etcd::start_on_disk(1);
    let endpoints = one.endpoints();
    println!(
        "etcd {}: one member, data on this disk; {leases} leases, {clients} renewing clients, {granters} granting clients",
        endpoints.join(",")
    );

    // 1. Durable grants.
    let start = Instant::now();
    let per = leases.div_ceil(granters);
    let hs: Vec<_> = (0..granters)
        .map(|g| {
            let endpoints = endpoints.clone();
            std::thread::spawn(move || {
                let mut c = EtcdAuthority::new(endpoints);
                ((g * per)..((g + 1) * per).min(leases))
                    .map(|i| {
                        c.acquire(&request(format!("bench-{i}")), CALL)
                            .expect("grant")
                            .lease_ref()
                    })
                    .collect::<Vec<LeaseRef>>()
            })
        })
        .collect();
    let granted: Vec<LeaseRef> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let el = start.elapsed();
    println!(
        "grants: {} in {:.2}s = {:.0} durable grants/s",
        granted.len(),
        el.as_secs_f64(),
        granted.len() as f64 / el.as_secs_f64()
    );

    // 2. Renewals.
    let granted = std::sync::Arc::new(granted);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let hs: Vec<_> = (0..clients)
        .map(|k| {
            let (endpoints, granted) = (endpoints.clone(), granted.clone());
            std::thread::spawn(move || {
                let mut c = EtcdAuthority::new(endpoints);
                let mut lat = Vec::new();
                let mut i = k;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    c.renew(&granted[i % granted.len()], CALL).expect("renewal");
                    lat.push(t.elapsed());
                    i += clients;
                }
                lat
            })
        })
        .collect();
    leaseagent_testkit::report_renewals(hs, start);
    drop(one);

    // 3. Takeover.
    for round in 1..=takeovers {
        let mut three = etcd::Etcd::start_on_disk(3);
        let mut c = EtcdAuthority::new(three.endpoints());
        c.acquire(&request("warm".into()), CALL)
            .expect("a first grant");
        let leader = three.leader();
        let killed = Instant::now();
        three.members[leader].kill();
        let mut n = 0;
        let took = loop {
            n += 1;
            let left = Duration::from_secs(60).saturating_sub(killed.elapsed());
            assert!(!left.is_zero(), "no grant within 60 s of the kill");
            match c.acquire(
                &request(format!("after-{n}")),
                Duration::from_secs(1).min(left),
            ) {
                Ok(_) => break killed.elapsed(),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        println!(
            "takeover {round}: kill -9 of the raft leader (member {leader}) to the first grant: {:.3}s ({n} tries)",
            took.as_secs_f64()
        );
    }
}
