//! The notify protocol as systemd sees it: the real agent binary, started
//! with NOTIFY_SOCKET (and WATCHDOG_*) pointing at a datagram socket the test
//! owns, against the in-process fake authority.

use crate::support;

use std::fs::File;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use support::systemd::*;
use support::{FakeAuthority, Reply, wait_exit, wait_for};

const LONG: Duration = Duration::from_secs(20);

fn log_file(dir: &Path, name: &str) -> Stdio {
    Stdio::from(File::create(dir.join(name)).unwrap())
}

fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

fn finish(child: &mut Child, within: Duration) -> i32 {
    let status = wait_exit(child, within).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("agent did not exit within {within:?}")
    });
    status.code().expect("agent killed by a signal")
}

#[test]
fn ready_only_after_the_job_started_then_watchdog_then_stopping_on_sigterm() {
    let auth = FakeAuthority::start();
    let sock = NotifySocket::bind();
    let dir = tempfile::tempdir().unwrap();
    let envdump = dir.path().join("job.env");
    let launch = Launch {
        notify: Some(sock.path.clone()),
        watchdog_usec: Some(1_000_000),
        watchdog_pid_override: None,
    };
    let url = auth.url();
    let envdump_s = envdump.to_str().unwrap();
    let mut agent = spawn_agent(
        &launch,
        &[
            "--authority",
            &url,
            "--task",
            "notify-ready",
            "--",
            "sh",
            "-c",
            "env > \"$0.tmp\" && mv \"$0.tmp\" \"$0\"; exec sleep 600",
            envdump_s,
        ],
        dir.path(),
        log_file(dir.path(), "agent.log"),
    )
    .unwrap();
    let agent_pid = agent.id() as i32;

    let ready = sock
        .wait_for(LONG, |m| m.has("READY=1"))
        .unwrap_or_else(|| panic!("no READY=1; got:\n{}", sock.dump()));
    // At READY the job already runs: agent -> keeper -> job, the job leading
    // its own process group, started no later than READY arrived.
    let keepers = children_of(agent_pid);
    assert_eq!(keepers.len(), 1, "the agent's children: {keepers:?}");
    let jobs = children_of(keepers[0]);
    assert_eq!(jobs.len(), 1, "the keeper's children: {jobs:?}");
    let job = stat_fields(jobs[0]).unwrap();
    assert_eq!(job[2], jobs[0].to_string(), "job leads its own group");
    let job_start_ticks: u128 = job[19].parse().unwrap();
    let ready_ticks = ready.boot_ns * clock_ticks_per_sec() / 1_000_000_000;
    assert!(
        job_start_ticks <= ready_ticks,
        "job started at tick {job_start_ticks}, READY read at tick {ready_ticks}"
    );
    let token = auth.token();
    let acquired = &auth.requests_to("/v1/acquire")[0];
    eprintln!(
        "READY=1 {:?} after the acquire request reached the authority",
        ready.at - acquired.at
    );
    assert_eq!(
        ready.status(),
        Some(format!("holding token {token}, command running").as_str())
    );
    let before: Vec<Msg> = sock
        .messages()
        .into_iter()
        .take_while(|m| !m.has("READY=1"))
        .collect();
    assert!(
        before
            .iter()
            .all(|m| m.text == "WATCHDOG=1\n" || m.text.starts_with("STATUS=acquiring task")),
        "only watchdog pings and the acquiring status may precede READY: {before:?}"
    );

    // The job (and the keeper) never see the notify variables.
    assert!(
        wait_for(LONG, || envdump.exists().then_some(())).is_some(),
        "the job did not dump its environment"
    );
    let env = std::fs::read_to_string(&envdump).unwrap();
    assert!(env.contains(&format!("LEASE_TOKEN={token}\n")), "{env}");
    for var in ["NOTIFY_SOCKET=", "WATCHDOG_USEC=", "WATCHDOG_PID="] {
        assert!(
            !env.lines().any(|l| l.starts_with(var)),
            "job sees {var}: {env}"
        );
        assert!(
            !environ(keepers[0]).iter().any(|l| l.starts_with(var)),
            "keeper sees {var}"
        );
    }
    assert!(
        environ(agent_pid)
            .iter()
            .any(|l| l.starts_with("NOTIFY_SOCKET=")),
        "the test did not give the agent NOTIFY_SOCKET"
    );

    // WATCHDOG=1 every WATCHDOG_USEC/2 = 500 ms: over six pings the mean
    // interval is well inside (250 ms, 1 s); 1 s is what systemd would allow.
    let pings = sock.wait_count(6, LONG, |m| m.has("WATCHDOG=1"));
    assert!(pings.len() >= 6, "pings: {}\n{}", pings.len(), sock.dump());
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1].at - w[0].at).collect();
    let mean = (pings[5].at - pings[0].at) / 5;
    eprintln!(
        "watchdog: WATCHDOG_USEC=1s, mean interval {mean:?}, max gap {:?}",
        gaps.iter().max().unwrap()
    );
    assert!(
        mean >= Duration::from_millis(250) && mean < Duration::from_secs(1),
        "mean watchdog interval {mean:?}, gaps {gaps:?}"
    );

    // SIGTERM (what systemd sends the main process on stop): STOPPING=1.
    sigterm(agent.id());
    let stopping = sock
        .wait_for(LONG, |m| m.has("STOPPING=1"))
        .unwrap_or_else(|| panic!("no STOPPING=1; got:\n{}", sock.dump()));
    assert_eq!(
        stopping.status(),
        Some("stopping the command (signal 15)"),
        "{}",
        sock.dump()
    );
    let code = finish(&mut agent, LONG);
    assert_eq!(code, 143, "{}", log_of(dir.path(), "agent.log"));
    sock.settle();
    let msgs = sock.messages();
    let ready_at = msgs.iter().position(|m| m.has("READY=1")).unwrap();
    let stop_at = msgs.iter().position(|m| m.has("STOPPING=1")).unwrap();
    assert!(ready_at < stop_at);
    assert_eq!(msgs.iter().filter(|m| m.has("READY=1")).count(), 1);
    // Every message came from the agent itself (NotifyAccess=main).
    assert!(
        msgs.iter().all(|m| m.pid == agent_pid),
        "senders other than the agent {agent_pid}:\n{}",
        sock.dump()
    );
}

#[test]
fn status_lines_follow_lease_events() {
    let auth = FakeAuthority::start();
    // ttl 12s: heartbeat 4s, retry after a failure 1s, grace 2s.
    auth.script(
        "/v1/renew",
        vec![Reply::Raw(503, "{}".into()), Reply::Raw(503, "{}".into())],
    );
    let sock = NotifySocket::bind();
    let dir = tempfile::tempdir().unwrap();
    let launch = Launch {
        notify: Some(sock.path.clone()),
        watchdog_usec: None,
        watchdog_pid_override: None,
    };
    let url = auth.url();
    let mut agent = spawn_agent(
        &launch,
        &[
            "--authority",
            &url,
            "--task",
            "notify-status",
            "--ttl",
            "12s",
            "--",
            "sleep",
            "600",
        ],
        dir.path(),
        log_file(dir.path(), "agent.log"),
    )
    .unwrap();
    assert!(
        sock.wait_for(LONG, |m| m.has("READY=1")).is_some(),
        "{}",
        sock.dump()
    );
    let token = auth.token();
    let holding = format!("holding token {token}");
    let recovered = sock.wait_for(Duration::from_secs(30), |m| {
        m.status() == Some(holding.as_str())
            && auth.requests_to("/v1/renew").len() >= 3
            && m.at > auth.requests_to("/v1/renew")[2].at
    });
    assert!(
        recovered.is_some(),
        "no recovery status; got:\n{}",
        sock.dump()
    );
    // Now the authority revokes the lease at the next renewal.
    auth.set_renew(Reply::Refuse("revoked"));
    let code = finish(&mut agent, Duration::from_secs(30));
    assert_eq!(code, 124, "{}", log_of(dir.path(), "agent.log"));
    sock.settle();

    let statuses: Vec<String> = sock
        .messages()
        .iter()
        .filter_map(|m| m.status().map(str::to_string))
        .collect();
    type Check = Box<dyn Fn(&str) -> bool>;
    let expect: Vec<Check> = vec![
        Box::new(move |s| s == format!("holding token {token}, command running")),
        Box::new(move |s| s == format!("holding token {token}, renewals failing")),
        Box::new(move |s| s.starts_with(&format!("holding token {token}, renewals failing for "))),
        Box::new(move |s| s == format!("holding token {token}")),
        Box::new(move |s| s == format!("lease lost (revoked), token {token}")),
        Box::new(move |s| s == format!("stopping the command (token {token})")),
    ];
    let mut it = statuses.iter();
    for (i, want) in expect.iter().enumerate() {
        assert!(
            it.any(|s| want(s)),
            "status #{i} missing or out of order in {statuses:#?}"
        );
    }
    // STATUS= goes out on changes, not on every renewal.
    assert!(
        statuses.windows(2).all(|w| w[0] != w[1]),
        "repeated status: {statuses:#?}"
    );
    let stopping = sock.messages().into_iter().find(|m| m.has("STOPPING=1"));
    assert_eq!(
        stopping.and_then(|m| m.status().map(str::to_string)),
        Some(format!("stopping the command (token {token})"))
    );
}

#[test]
fn no_ready_when_the_task_is_held_or_the_command_cannot_start() {
    let auth = FakeAuthority::start();
    auth.hold("someone-else/1");
    let dir = tempfile::tempdir().unwrap();
    let url = auth.url();

    let held = NotifySocket::bind();
    let launch = Launch {
        notify: Some(held.path.clone()),
        watchdog_usec: Some(200_000),
        watchdog_pid_override: None,
    };
    let mut a = spawn_agent(
        &launch,
        &["--authority", &url, "--task", "held", "--", "true"],
        dir.path(),
        log_file(dir.path(), "held.log"),
    )
    .unwrap();
    assert_eq!(
        finish(&mut a, LONG),
        75,
        "{}",
        log_of(dir.path(), "held.log")
    );

    auth.unhold();
    let missing = NotifySocket::bind();
    let launch = Launch {
        notify: Some(missing.path.clone()),
        watchdog_usec: Some(200_000),
        watchdog_pid_override: None,
    };
    let mut b = spawn_agent(
        &launch,
        &[
            "--authority",
            &url,
            "--task",
            "missing",
            "--",
            "/nonexistent/leaseagent-test-command",
        ],
        dir.path(),
        log_file(dir.path(), "missing.log"),
    )
    .unwrap();
    assert_eq!(
        finish(&mut b, LONG),
        127,
        "{}",
        log_of(dir.path(), "missing.log")
    );
    // The agents have exited: whatever they sent is queued; read it all.
    for (name, s) in [("held", &held), ("missing", &missing)] {
        s.settle();
        assert!(
            !s.messages().iter().any(|m| m.has("READY=1")),
            "{name}: READY=1 sent:\n{}",
            s.dump()
        );
    }
}

#[test]
fn watchdog_only_when_watchdog_pid_is_the_agent() {
    // One fake authority per agent: the fake holds one lease at a time.
    let auths = [
        FakeAuthority::start(),
        FakeAuthority::start(),
        FakeAuthority::start(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    let mut run = |name: &str, launch: Launch| {
        let url = auths[n].url();
        n += 1;
        spawn_agent(
            &launch,
            &[
                "--authority",
                &url,
                "--task",
                &format!("wd-{name}"),
                "--",
                "sleep",
                "600",
            ],
            dir.path(),
            log_file(dir.path(), &format!("{name}.log")),
        )
        .unwrap()
    };
    let ours = NotifySocket::bind();
    let other = NotifySocket::bind();
    let unset = NotifySocket::bind();
    let mut a = run(
        "ours",
        Launch {
            notify: Some(ours.path.clone()),
            watchdog_usec: Some(200_000),
            watchdog_pid_override: None,
        },
    );
    let mut b = run(
        "other",
        Launch {
            notify: Some(other.path.clone()),
            watchdog_usec: Some(200_000),
            watchdog_pid_override: Some(1),
        },
    );
    let mut c = run(
        "unset",
        Launch {
            notify: Some(unset.path.clone()),
            watchdog_usec: None,
            watchdog_pid_override: None,
        },
    );
    for s in [&other, &unset] {
        assert!(
            s.wait_for(LONG, |m| m.has("READY=1")).is_some(),
            "{}",
            s.dump()
        );
    }
    // The positive control: 10 pings at 100 ms from now on take about a
    // second, during which the other two agents, running the same loop with
    // the same WATCHDOG_USEC, would have sent as many.
    let t0 = std::time::Instant::now();
    let pings = ours.wait_count(10, LONG, |m| m.has("WATCHDOG=1") && m.at > t0);
    assert!(pings.len() >= 10, "{}", ours.dump());
    for (name, s) in [("other pid", &other), ("no WATCHDOG_USEC", &unset)] {
        s.settle();
        assert!(
            !s.messages().iter().any(|m| m.has("WATCHDOG=1")),
            "{name}: watchdog pings sent:\n{}",
            s.dump()
        );
    }
    for child in [&mut a, &mut b, &mut c] {
        sigterm(child.id());
        assert_eq!(finish(child, LONG), 143);
    }
}
