//! The agent's guarantees under failure, with real processes: refusal,
//! partition, flaky and malformed authorities, a paused or killed agent,
//! signals. Assertions on processes go through /proc.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::*;

const T: Duration = Duration::from_secs(60);

struct Job {
    dir: tempfile::TempDir,
}

impl Job {
    fn new() -> Self {
        Job {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn out(&self) -> std::path::PathBuf {
        self.dir.path().join("out")
    }
    fn pids_file(&self) -> std::path::PathBuf {
        self.dir.path().join("pids")
    }
    fn pids(&self) -> Vec<i32> {
        read_pids(&self.pids_file())
    }
    fn out_text(&self) -> String {
        std::fs::read_to_string(self.out()).unwrap_or_default()
    }
    /// Configures the command to run `script` with OUT and PIDS set.
    fn command(
        &self,
        authority: &str,
        task: &str,
        flags: &[&str],
        script: &str,
    ) -> std::process::Command {
        let mut c = agent(authority, task);
        c.env("OUT", self.out()).env("PIDS", self.pids_file());
        c.args(flags).arg("--").arg(helper(script));
        c
    }
    /// Waits until the job wrote `ready` and both its pids.
    fn wait_ready(&self) -> Vec<i32> {
        wait_for(T, || {
            (self.out_text().contains("ready") && self.pids().len() >= 2).then(|| self.pids())
        })
        .expect("job did not start")
    }
}

fn assert_all_gone(pids: &[i32], within: Duration) {
    let gone = wait_for(within, || pids.iter().all(|p| !exists(*p)).then_some(()));
    assert!(
        gone.is_some(),
        "still present: {:?}",
        pids.iter().filter(|p| exists(**p)).collect::<Vec<_>>()
    );
}

#[test]
fn refusal_stops_a_job_that_traps_sigterm_with_its_grandchildren() {
    let fake = FakeAuthority::start();
    fake.script("/v1/renew", vec![Reply::Ok, Reply::Refuse("superseded")]);
    let job = Job::new();
    let mut child = spawn(job.command(
        &fake.url(),
        "refuse-trap",
        &["--ttl", "10s", "--heartbeat", "200ms", "--grace", "3s"],
        "trap-term.sh",
    ));
    let pids = job.wait_ready();
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(124), "{err}");
    assert!(
        job.out_text().contains("got TERM"),
        "the job got SIGTERM first"
    );
    assert_all_gone(&pids, Duration::from_secs(5));
    assert!(err.contains("superseded"), "{err}");
    // Refused: no release is sent for a lease the authority already dropped.
    assert!(fake.requests_to("/v1/release").is_empty());
}

#[test]
fn refusal_kills_a_job_that_ignores_sigterm_after_grace() {
    let fake = FakeAuthority::start();
    fake.script("/v1/renew", vec![Reply::Refuse("revoked")]);
    let job = Job::new();
    let grace = Duration::from_millis(700);
    let mut child = spawn(job.command(
        &fake.url(),
        "refuse-ignore",
        &["--ttl", "10s", "--heartbeat", "300ms", "--grace", "700ms"],
        "ignore-term.sh",
    ));
    let pids = job.wait_ready();
    let status = wait_exit(&mut child, T).expect("agent exits");
    let exited = Instant::now();
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(124), "{err}");
    let refused_at = fake.requests_to("/v1/renew")[0].at;
    assert!(
        exited.duration_since(refused_at) >= grace,
        "SIGKILL must wait for --grace"
    );
    assert_all_gone(&pids, Duration::from_secs(5));
    assert!(err.contains("revoked"), "{err}");
}

/// Runs `clock-job.sh` under the agent through a proxy, lets renewals
/// flow, then blackholes the authority. Returns (last boot-clock ms the job
/// ran, last renewal the authority received on the boot clock, exit status,
/// stderr).
fn partition_run(task: &str, ignore_term: bool) -> (u128, u128, Option<i32>, String) {
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let job = Job::new();
    let mut c = job.command(
        &proxy.url(),
        task,
        &["--ttl", "2s", "--heartbeat", "400ms", "--grace", "600ms"],
        "clock-job.sh",
    );
    c.env("IGNORE_TERM", if ignore_term { "1" } else { "0" });
    let mut child = spawn(c);
    wait_for(T, || {
        (fake.requests_to("/v1/renew").len() >= 2).then_some(())
    })
    .expect("renewals flow");
    proxy.set(ProxyMode::Blackhole);
    let (status, err) = wait_agent(&mut child, T);
    let pids = job.pids();
    assert_all_gone(&pids, Duration::from_secs(5));
    let last_job = last_clock_record_ms(&job.out()).expect("job recorded the clock");
    let last_renewal = mono_to_boot_ms(fake.requests_to("/v1/renew").last().unwrap().mono_ns);
    (last_job, last_renewal, status.code(), err)
}

#[test]
fn partition_stops_the_job_before_last_successful_send_plus_ttl() {
    let (last_job, last_renewal, code, err) = partition_run("partition", false);
    assert_eq!(code, Some(124), "{err}");
    assert!(err.contains("renewal failing"), "{err}");
    // The last successful renewal was sent no later than the authority's
    // last receipt; the job must not have run at or after that + ttl.
    assert!(
        last_job < last_renewal + 2000,
        "job ran {} ms after the last renewal (ttl 2000 ms)",
        last_job - last_renewal
    );
}

#[test]
fn partition_sigkills_a_job_that_ignores_sigterm_by_the_deadline() {
    let (last_job, last_renewal, code, err) = partition_run("partition-kill", true);
    assert_eq!(code, Some(124), "{err}");
    assert!(
        last_job < last_renewal + 2000,
        "job ran {} ms after the last renewal (ttl 2000 ms)",
        last_job - last_renewal
    );
    // It ignored SIGTERM, so it ran on past deadline - grace until SIGKILL.
    assert!(
        last_job + 600 > last_renewal + 1000,
        "killed too early: {} ms after the last renewal",
        last_job as i128 - last_renewal as i128
    );
}

#[test]
fn refused_connections_for_less_than_ttl_minus_grace_do_not_stop_the_job() {
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let job = Job::new();
    let mut child = spawn(job.command(
        &proxy.url(),
        "refused-conn",
        &["--ttl", "6s", "--heartbeat", "300ms", "--grace", "1s"],
        "sleeper.sh",
    ));
    let pids = job.wait_ready();
    wait_for(T, || {
        (!fake.requests_to("/v1/renew").is_empty()).then_some(())
    })
    .expect("renewals flow");
    proxy.set(ProxyMode::Refuse);
    std::thread::sleep(Duration::from_millis(1500));
    proxy.set(ProxyMode::Pass);
    let n = fake.requests_to("/v1/renew").len();
    wait_for(T, || {
        (fake.requests_to("/v1/renew").len() >= n + 2).then_some(())
    })
    .expect("renewals resume");
    assert!(pids.iter().all(|p| alive(*p)), "job must still run");
    assert!(!job.out_text().contains("got TERM"));
    kill(child.id() as i32, 15);
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("renewal failing") && err.contains("recovered"),
        "{err}"
    );
}

#[test]
fn server_errors_and_timeouts_for_less_than_ttl_minus_grace_do_not_stop_the_job() {
    let fake = FakeAuthority::start();
    fake.script(
        "/v1/renew",
        vec![
            Reply::Ok,
            Reply::Raw(500, "{}".into()),
            Reply::Raw(503, "oops".into()),
            Reply::Raw(429, "{}".into()),
            Reply::Blackhole,
            Reply::Raw(408, "{}".into()),
            Reply::Raw(502, "{\"error\":\"expired\"}".into()),
        ],
    );
    let job = Job::new();
    // The job outlives two ttls, so it needs the renewals that follow. The
    // failures above last under a second; the ttl leaves the renewals after
    // them seconds of slack (with 3 s, two runs on a machine at load 7, with
    // load benchmarks beside them, saw renewals stall past the deadline: 124).
    let mut c = agent(&fake.url(), "flaky");
    c.args([
        "--ttl",
        "5s",
        "--heartbeat",
        "300ms",
        "--grace",
        "500ms",
        "--",
        "sh",
        "-c",
        "sleep 11; echo done > \"$OUT\"",
    ]);
    c.env("OUT", job.out());
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(job.out_text().contains("done"));
    assert!(out.stderr.contains("recovered"), "{}", out.stderr);
    // A 502 whose body looks like a refusal is still transient.
    assert!(!out.stderr.contains("lease lost"), "{}", out.stderr);
}

#[test]
fn malformed_renewal_answers_are_not_renewals() {
    let fake = FakeAuthority::start();
    fake.script(
        "/v1/renew",
        vec![
            Reply::Raw(200, "not json".into()),
            Reply::Raw(200, "{\"ttl\": 5000}".into()),
            Reply::Raw(200, "[30000]".into()),
            Reply::Raw(200, "{\"ttl_ms\": -1}".into()),
            Reply::Raw(200, "{\"ttl_ms\": \"30000\"}".into()),
            Reply::Raw(409, "{\"error\": \"nope\"}".into()),
        ],
    );
    fake.set_renew(Reply::Huge(8 << 20));
    let job = Job::new();
    let mut child = spawn(job.command(
        &fake.url(),
        "malformed",
        &["--ttl", "2s", "--heartbeat", "200ms", "--grace", "500ms"],
        "clock-job.sh",
    ));
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(124), "{err}");
    assert_all_gone(&job.pids(), Duration::from_secs(5));
    // No answer counted as a renewal: the job was gone by grant + ttl.
    let granted = mono_to_boot_ms(fake.requests_to("/v1/acquire")[0].mono_ns);
    let last_job = last_clock_record_ms(&job.out()).expect("job recorded the clock");
    assert!(
        last_job < granted + 2000,
        "malformed answers extended the lease: job ran {} ms after the grant",
        last_job - granted
    );
    assert!(fake.requests_to("/v1/renew").len() >= 7, "it kept trying");
}

#[test]
fn agent_paused_past_its_deadline_has_its_job_stopped_by_the_keeper() {
    let fake = FakeAuthority::start();
    let job = Job::new();
    let mut child = spawn(job.command(
        &fake.url(),
        "paused",
        &["--ttl", "2s", "--heartbeat", "300ms", "--grace", "500ms"],
        "ignore-term.sh",
    ));
    let pids = job.wait_ready();
    let agent_pid = child.id() as i32;
    let stopped = stop::StopGuard::stopping(agent_pid);
    // The keeper holds the deadline alone while the agent is stopped (the
    // ttl is 2 s; the agent stays stopped until after this).
    assert_all_gone(&pids, Duration::from_secs(4));
    // Any renewal now would hang: the agent must not wait for the network.
    fake.set_renew(Reply::Blackhole);
    stopped.resume(agent_pid);
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(124), "{err}");
}

#[test]
fn agent_sigkilled_leaves_no_process_of_the_group() {
    let fake = FakeAuthority::start();
    let job = Job::new();
    let mut child = spawn(job.command(&fake.url(), "sigkill", &["--ttl", "30s"], "ignore-term.sh"));
    let pids = job.wait_ready();
    let pgid = pids[0];
    assert!(group_members(pgid).len() >= 2);
    child.kill().unwrap(); // SIGKILL
    let _ = child.wait();
    assert_all_gone(&pids, Duration::from_secs(5));
    assert!(
        wait_for(Duration::from_secs(5), || group_members(pgid)
            .is_empty()
            .then_some(()))
        .is_some()
    );
}

#[test]
fn sigterm_is_relayed_the_job_gets_its_grace_and_the_lease_is_released_cancelled() {
    let fake = FakeAuthority::start();
    let job = Job::new();
    let mut child = spawn(job.command(
        &fake.url(),
        "cancel",
        &["--ttl", "30s", "--grace", "5s"],
        "trap-term.sh",
    ));
    let pids = job.wait_ready();
    kill(child.id() as i32, 15);
    let status = wait_exit(&mut child, T).expect("agent exits");
    assert_eq!(
        status.code(),
        Some(7),
        "the job's own exit code after its TERM trap"
    );
    assert!(job.out_text().contains("got TERM"));
    assert_all_gone(&pids, Duration::from_secs(5));
    let rel = fake.requests_to("/v1/release");
    assert_eq!(rel.len(), 1);
    assert_eq!(rel[0].body["outcome"], "cancelled");
    assert_eq!(rel[0].body["exit_code"], 7);
}

#[test]
fn sigint_to_a_job_that_ignores_it_ends_in_sigkill_after_grace() {
    let fake = FakeAuthority::start();
    let job = Job::new();
    let mut child = spawn(job.command(
        &fake.url(),
        "cancel-kill",
        &["--ttl", "30s", "--grace", "500ms"],
        "ignore-term.sh",
    ));
    let pids = job.wait_ready();
    let sent = Instant::now();
    // ignore-term.sh ignores TERM; SIGINT kills bash's background children
    // only if not ignored, so use TERM semantics via QUIT-free SIGTERM here.
    kill(child.id() as i32, 15);
    let status = wait_exit(&mut child, T).expect("agent exits");
    assert!(
        sent.elapsed() >= Duration::from_millis(500),
        "grace was given"
    );
    assert_eq!(
        status.code(),
        Some(128 + 9),
        "killed by the agent's SIGKILL after grace"
    );
    assert_all_gone(&pids, Duration::from_secs(5));
    assert_eq!(
        fake.requests_to("/v1/release")[0].body["outcome"],
        "cancelled"
    );
}

#[test]
fn usr1_and_hup_are_relayed_without_stopping() {
    let fake = FakeAuthority::start();
    let job = Job::new();
    let mut child = spawn(job.command(&fake.url(), "relay-sig", &["--ttl", "30s"], "sleeper.sh"));
    let pids = job.wait_ready();
    kill(child.id() as i32, 10); // SIGUSR1
    wait_for(T, || job.out_text().contains("got USR1").then_some(())).expect("USR1 relayed");
    kill(child.id() as i32, 1); // SIGHUP
    wait_for(T, || job.out_text().contains("got HUP").then_some(())).expect("HUP relayed");
    // The job traps both and runs on (its untrapped `sleep` grandchild died
    // of them, which shows they reached the whole group).
    assert!(alive(pids[0]));
    assert!(wait_for(T, || (!alive(pids[1])).then_some(())).is_some());
    kill(child.id() as i32, 2); // SIGINT: relayed and stops
    let status = wait_exit(&mut child, T).expect("agent exits");
    assert_all_gone(&pids, Duration::from_secs(5));
    assert!(status.code().is_some());
}

#[test]
fn leftover_processes_are_stopped_before_the_lease_is_released() {
    let fake = FakeAuthority::start();
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let mut c = agent(&fake.url(), "leftovers");
    c.args(["--grace", "300ms", "--", "sh", "-c"])
        .arg(format!("sleep 1000 & echo $! > {}; exit 0", pids.display()));
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let left = read_pids(Path::new(&pids));
    assert_eq!(left.len(), 1);
    assert!(
        !exists(left[0]),
        "background process of the job must be gone before exit"
    );
    assert_eq!(
        fake.requests_to("/v1/release")[0].body["outcome"],
        "succeeded"
    );
}
