//! Benchmark (not a test): renewal lateness under CPU starvation, and the
//! refusal -> SIGTERM latency, against the in-process fake authority.
//!
//! `cargo bench --bench lateness` (add `-- --seconds N --trials N` to change
//! the run). Phase 1 runs a job that starts 4 x nproc busy processes for the
//! given seconds (default 30) under a 500 ms heartbeat, and reports how late
//! each renewal arrived at the authority compared with the previous one +
//! 500 ms (p50/p99/max), and the agent's peak RSS (VmHWM). Phase 2 runs
//! trials in which the authority refuses the first renewal and the job (a
//! Python process waiting in signal.pause) records CLOCK_MONOTONIC when its
//! SIGTERM handler runs; latency = that instant - the instant the authority
//! read the renewal it refused.
//!
//! `LEASEAGENT_BIN=PATH` runs another build of the agent (e.g. an older
//! release build, to compare two builds on equal terms).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use leaseagent_testkit::*;

fn bin() -> PathBuf {
    leaseagent_testkit::bench_bin(env!("CARGO_BIN_EXE_leaseagent"))
}

fn helper(name: &str) -> String {
    format!("{}/tests/helpers/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let seconds = arg("--seconds", 30);
    let trials = arg("--trials", 20);
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);

    // Phase 1: lateness under 4 x nproc busy processes.
    let fake = FakeAuthority::start();
    let mut c = std::process::Command::new(bin());
    c.args([
        "--authority",
        &fake.url(),
        "--task",
        "bench-lateness",
        "--ttl",
        "3s",
        "--heartbeat",
        "500ms",
    ])
    .arg("--")
    .arg(helper("burn.sh"))
    .arg((4 * nproc).to_string())
    .arg(seconds.to_string())
    .env("RUST_LOG", "warn")
    .stdin(Stdio::null());
    let mut child = c.spawn().expect("start agent");
    let pid = child.id();
    let mut hwm = 0;
    let status = loop {
        if let Some(h) = vm_hwm_kib(pid) {
            hwm = hwm.max(h);
        }
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "agent failed: {status:?}");
    let renewals = fake.requests_to("/v1/renew");
    let mut late: Vec<f64> = renewals
        .windows(2)
        .map(|w| (w[1].at.duration_since(w[0].at).as_secs_f64() - 0.5) * 1000.0)
        .map(|ms| ms.max(0.0))
        .collect();
    late.sort_by(|a, b| a.total_cmp(b));
    println!(
        "renewal lateness under {} busy processes for {seconds}s, heartbeat 500ms, {} renewals: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        4 * nproc,
        renewals.len(),
        leaseagent_testkit::percentile(&late, 0.5),
        leaseagent_testkit::percentile(&late, 0.99),
        late.last().copied().unwrap_or(f64::NAN)
    );
    println!("agent peak RSS (VmHWM): {:.2} MiB", hwm as f64 / 1024.0);

    // Phase 2: refusal -> SIGTERM latency.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut lat = Vec::new();
    for i in 0..trials {
        let fake = FakeAuthority::start();
        fake.script("/v1/renew", vec![Reply::Refuse("revoked")]);
        let mark = dir.path().join(format!("term-{i}"));
        let job = "import signal,time,sys\ndef h(s,f):\n    open(sys.argv[1],'w').write(str(time.monotonic_ns()))\n    sys.exit(0)\nsignal.signal(signal.SIGTERM,h)\nwhile True: signal.pause()\n";
        let mut c = std::process::Command::new(bin());
        c.args([
            "--authority",
            &fake.url(),
            "--task",
            "bench-refusal",
            "--ttl",
            "10s",
            "--heartbeat",
            "300ms",
        ])
        .args(["--", "python3", "-c", job])
        .arg(&mark)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
        let out = c.output().expect("run agent");
        assert_eq!(
            out.status.code(),
            Some(124),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t_job: u128 = std::fs::read_to_string(&mark)
            .expect("job saw SIGTERM")
            .trim()
            .parse()
            .expect("ns");
        let t_refuse = fake.requests_to("/v1/renew")[0].mono_ns;
        lat.push((t_job.saturating_sub(t_refuse)) as f64 / 1e6);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "refusal -> SIGTERM handler in the job ({trials} trials): p50 {:.2} ms, max {:.2} ms",
        leaseagent_testkit::percentile(&lat, 0.5),
        lat.last().copied().unwrap_or(f64::NAN)
    );
}
