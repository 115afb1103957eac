//! Benchmark (not a test): how long before (or after) the authority's
//! expiry a big job is dead when the authority falls silent (issue #31,
//! "dead by the deadline, whatever the tree's size").
//!
//! `cargo bench --bench stop_tree`. Each case runs the agent against the
//! in-process fake authority behind a proxy; once the job's tree is up the
//! proxy black-holes every request, so the agent's own deadline stops the
//! job. The authority's expiry is the instant it read the last renewal that
//! reached it (or the grant) + the ttl; the bench polls `/proc` for every
//! process of the tree (found by a marker in its command line, so the same
//! in every containment mode) and reports the margin: expiry - the instant
//! the last one was gone from `/proc` (reaped), positive = dead before.
//!
//! Cases: trees of 10, 100, 1,000, 2,000 `sleep`s, each in its own session
//! (`setsid`) ignoring SIGTERM; one process with 0.5, 2, 4 GiB of touched
//! anonymous memory. Each with the PID namespace (the default) and with
//! `--no-pid-namespace` (a cgroup when root, the tree walk otherwise).
//!
//! Knobs: `STOP_ROUNDS` (3), `STOP_TTL_MS` (4000), `STOP_SIZES`
//! (`10,100,1000,2000`), `STOP_MEM_MIB` (`512,2048,4096`), `STOP_MODES`
//! (`pidns,nopidns`); `LEASEAGENT_BIN=PATH` runs another build. Whatever a
//! case started is killed by SIGKILL if it outlives the case.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leaseagent_testkit::*;

fn bin() -> std::path::PathBuf {
    leaseagent_testkit::bench_bin(env!("CARGO_BIN_EXE_leaseagent"))
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Host pids whose command line contains `marker`.
fn marked(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).split('\0').any(|a| a == marker))
                .unwrap_or(false)
        })
        .collect()
}

enum Job {
    Tree(usize),
    MemMib(u64),
}

struct Outcome {
    margin_ms: f64,
    processes: usize,
    containment: String,
    status: Option<i32>,
}

fn run_case(job: &Job, nopidns: bool, ttl_ms: u64, round: u64) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ready = dir.path().join("ready");
    // A marker unique to this case: the tree's processes carry it.
    let marker = format!("{}.{}{:03}", 86400, std::process::id() % 1000, round);
    let (script, want) = match job {
        Job::Tree(n) => (
            format!(
                "trap '' TERM\nfor i in $(seq {n}); do setsid sleep {marker} & done\n: > {}\nwait\n",
                ready.display()
            ),
            *n,
        ),
        Job::MemMib(m) => (
            format!(
                "trap '' TERM\nexec python3 -c 'import signal,sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nb = b\"\\x01\" * ({m} << 20)\nopen(sys.argv[1], \"w\").close()\nwhile True: signal.pause()' {} {marker}\n",
                ready.display()
            ),
            1,
        ),
    };
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let mut c = Command::new(bin());
    c.args(["--authority", &proxy.url(), "--task", "bench-stop"])
        .args(["--ttl", &format!("{ttl_ms}ms")])
        .args(["--heartbeat", &format!("{}ms", ttl_ms / 4)]);
    if nopidns {
        c.arg("--no-pid-namespace");
    }
    c.args(["--", "bash", "-c", &script])
        .env("RUST_LOG", "info")
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| e.to_string())?;
    let cleanup = |child: &mut std::process::Child| {
        for p in marked(&marker) {
            kill(p, 9);
        }
        let _ = child.kill();
        let _ = child.wait();
    };
    // The tree up, and counted, with renewals flowing.
    let pids = wait_for(Duration::from_secs(120), || {
        if !ready.exists() {
            return None;
        }
        let p = marked(&marker);
        (p.len() >= want).then_some(p)
    });
    let Some(pids) = pids else {
        cleanup(&mut child);
        return Err("the tree did not come up within 120 s".into());
    };
    let renewed = fake.requests_to("/v1/renew").len();
    let flowing = wait_for(Duration::from_secs(30), || {
        (fake.requests_to("/v1/renew").len() > renewed).then_some(())
    });
    if flowing.is_none() {
        cleanup(&mut child);
        return Err("no renewal after the tree came up".into());
    }
    proxy.set(ProxyMode::Blackhole);
    // Poll until every process is gone from /proc, noting when the last went.
    let mut left = pids.clone();
    let mut last_gone = 0u128;
    let until = Instant::now() + Duration::from_millis(ttl_ms + 30_000);
    while !left.is_empty() && Instant::now() < until {
        left.retain(|&p| exists(p));
        if left.is_empty() {
            last_gone = mono_ns();
        } else {
            // A short pause: the poller must not take a core from the kill.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let survived = !left.is_empty();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    if status.is_none() || survived {
        cleanup(&mut child);
        return Err(format!("{} processes outlived the case", left.len()));
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    let containment = err
        .split("LEASE_CONTAINMENT=")
        .nth(1)
        .map(|s| s.chars().take_while(|c| c.is_ascii_alphabetic()).collect())
        .unwrap_or_else(|| "?".into());
    let last = fake
        .requests_to("/v1/renew")
        .last()
        .or(fake.requests_to("/v1/acquire").last())
        .map(|r| r.mono_ns)
        .ok_or("no grant")?;
    let expiry = last + u128::from(ttl_ms) * 1_000_000;
    Ok(Outcome {
        margin_ms: (expiry as f64 - last_gone as f64) / 1e6,
        processes: pids.len(),
        containment,
        status: status.and_then(|s| s.code()),
    })
}

fn main() {
    let rounds = env_u64("STOP_ROUNDS", 3);
    let ttl_ms = env_u64("STOP_TTL_MS", 4000);
    let mut jobs: Vec<Job> = env_list("STOP_SIZES", "10,100,1000,2000")
        .iter()
        .filter_map(|s| s.parse().ok())
        .map(Job::Tree)
        .collect();
    jobs.extend(
        env_list("STOP_MEM_MIB", "512,2048,4096")
            .iter()
            .filter_map(|s| s.parse().ok())
            .map(Job::MemMib),
    );
    let modes = env_list("STOP_MODES", "pidns,nopidns");
    println!(
        "ttl {ttl_ms} ms, {rounds} rounds; margin = authority's expiry - last process reaped (positive: dead before)"
    );
    for job in &jobs {
        for mode in &modes {
            let what = match job {
                Job::Tree(n) => format!("{n} setsid processes"),
                Job::MemMib(m) => format!("{m} MiB resident"),
            };
            let mut margins = Vec::new();
            let mut seen = String::new();
            for r in 0..rounds {
                match run_case(job, mode == "nopidns", ttl_ms, r) {
                    Ok(o) => {
                        println!(
                            "  {what}, {mode} (LEASE_CONTAINMENT={}), round {}: {} processes, margin {:+.1} ms, exit {:?}",
                            o.containment,
                            r + 1,
                            o.processes,
                            o.margin_ms,
                            o.status
                        );
                        seen = o.containment;
                        margins.push(o.margin_ms);
                    }
                    Err(e) => println!("  {what}, {mode}, round {}: not measured: {e}", r + 1),
                }
            }
            margins.sort_by(|a, b| a.total_cmp(b));
            if let (Some(lo), Some(hi)) = (margins.first(), margins.last()) {
                println!(
                    "{what}, {mode} ({seen}): margin min {lo:+.1} ms, max {hi:+.1} ms over {} rounds",
                    margins.len()
                );
            }
        }
    }
}
