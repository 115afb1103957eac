//! The deadline nothing can delay, with real processes: a stalled stderr, a
//! renewal that lowers the ttl, a stopped or killed keeper, a paused agent
//! whose job ended in time, signals before the job exists, the drift budget
//! and the exit-code remapping.

use crate::support;

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(60);

/// Direct children of `pid` (from /proc).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            let ppid = s
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|x| x.parse::<i32>().ok());
            if ppid == Some(pid) {
                out.push(p);
            }
        }
    }
    out
}

/// The agent's one child: the keeper.
fn keeper_of(agent: i32) -> i32 {
    wait_for(T, || children_of(agent).first().copied()).expect("the agent has a keeper")
}

fn wait_pids(path: &Path, n: usize) -> Vec<i32> {
    wait_for(T, || {
        let p = read_pids(path);
        (p.len() >= n).then_some(p)
    })
    .expect("the job wrote its pids")
}

fn all_dead(pids: &[i32], within: Duration) -> bool {
    wait_for(within, || pids.iter().all(|p| !alive(*p)).then_some(())).is_some()
}

/// The job (clock-job.sh, recording to OUT) was gone before the authority
/// could expire the lease: before its last renewal's receipt + the 2 s ttl.
fn assert_job_gone_before_expiry(fake: &FakeAuthority, dir: &Dir) {
    let last_job = last_clock_record_ms(&dir.path("out")).expect("job recorded the clock");
    let last_renewal = mono_to_boot_ms(fake.requests_to("/v1/renew").last().unwrap().mono_ns);
    eprintln!(
        "job gone {} ms before the authority could expire the lease",
        (last_renewal + 2000) as i128 - (last_job) as i128
    );
    assert!(
        last_job < last_renewal + 2000,
        "job ran {} ms after the last renewal (ttl 2000 ms)",
        last_job - last_renewal
    );
}

#[test]
fn a_stalled_stderr_does_not_delay_the_kill() {
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let dir = Dir::new();
    let mut c = agent(&proxy.url(), "stalled-stderr");
    c.env("OUT", dir.path("out"))
        .env("PIDS", dir.path("pids"))
        // The job exits on SIGTERM (deadline - grace): what is tested is
        // that the signal goes out while every write to stderr would block.
        .env("IGNORE_TERM", "0");
    c.args(["--ttl", "2s", "--heartbeat", "400ms", "--grace", "600ms"])
        .args(["--", "bash", "-c"])
        .arg(format!(
            "yes leaseagent-test-flood >&2 & echo $! >> \"$PIDS\"; exec {}",
            helper("clock-job.sh")
        ));
    // The agent's stderr and the job's are one pipe, and nobody reads it
    // until the job is dead: `yes` fills it at once.
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let stalled = child.stderr.take().unwrap();
    let pids = wait_pids(&dir.path("pids"), 2);
    wait_for(T, || {
        (fake.requests_to("/v1/renew").len() >= 2).then_some(())
    })
    .expect("renewals flow while stderr is stalled");
    proxy.set(ProxyMode::Blackhole);
    assert!(
        all_dead(&pids, T),
        "the job must die while stderr is still stalled"
    );
    assert_job_gone_before_expiry(&fake, &dir);
    // Now drain: the agent finishes and says what it could not write.
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let mut stalled = stalled;
        let _ = stalled.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let status = wait_exit(&mut child, T).expect("agent exits");
    let err = reader.join().unwrap();
    assert_eq!(status.code(), Some(124));
    // The lines it queued meanwhile come out once stderr moves again.
    assert!(
        err.contains("lease lost: task stalled-stderr"),
        "the agent's lines follow once stderr is read"
    );
}

#[test]
fn a_renewal_that_lowers_the_ttl_moves_the_deadline_down_and_republishes_it() {
    let fake = FakeAuthority::start();
    fake.script(
        "/v1/renew",
        vec![Reply::Raw(200, "{\"ttl_ms\": 1000}".into())],
    );
    fake.set_renew(Reply::Blackhole);
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "lower-ttl");
    c.env("OUT", dir.path("out"))
        .env("PIDS", dir.path("pids"))
        .env("XDG_RUNTIME_DIR", dir.0.path());
    c.args(["--ttl", "6s", "--heartbeat", "1s", "--grace", "1s", "--"])
        .arg(helper("clock-job.sh"));
    let mut child = spawn(c);
    let state_file = dir
        .path("leaseagent")
        .join(format!("lease-{}.json", child.id()));
    let renewed =
        wait_for(T, || fake.requests_to("/v1/renew").first().cloned()).expect("a renewal was sent");
    let renewed_ms = mono_to_boot_ms(renewed.mono_ns);
    // `check` sees the lowered deadline: no later than receipt + 1 s.
    let published = wait_for(Duration::from_secs(3), || {
        let text = std::fs::read_to_string(&state_file).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let d = v["deadline_boot_ms"].as_u64()? as u128;
        (d <= renewed_ms + 1000).then_some(d)
    });
    let (status, err) = wait_agent(&mut child, T);
    assert!(
        published.is_some(),
        "state file kept the old deadline: {err}"
    );
    assert_eq!(status.code(), Some(124), "{err}");
    let last_job = last_clock_record_ms(&dir.path("out")).expect("job recorded the clock");
    eprintln!(
        "job gone {} ms before the authority could expire the lease",
        (renewed_ms + 1000) as i128 - (last_job) as i128
    );
    assert!(
        last_job < renewed_ms + 1000,
        "job ran {} ms after the renewal that granted 1000 ms",
        last_job - renewed_ms
    );
    assert!(err.contains("renewed with a ttl of 1s"), "{err}");
}

/// One run: the agent is stopped while its job ends (well before the
/// deadline) and resumed after the deadline. Returns the exit status and
/// stderr.
fn paused_across_the_deadline(i: usize) -> (Option<i32>, String) {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), &format!("paused-ended-{i}"));
    c.env("PIDS", dir.path("pids")).env("GO", dir.path("go"));
    c.args(["--ttl", "3s", "--heartbeat", "1s", "--grace", "500ms"])
        .args(["--", "sh", "-c"])
        .arg("echo $$ >> \"$PIDS\"; while [ ! -e \"$GO\" ]; do sleep 0.01; done; exit 3");
    let mut child = spawn(c);
    let agent_pid = child.id() as i32;
    let job = wait_pids(&dir.path("pids"), 1)[0];
    let granted = fake
        .requests_to("/v1/acquire")
        .iter()
        .find(|r| r.body["task"] == format!("paused-ended-{i}"))
        .map(|r| mono_to_boot_ms(r.mono_ns))
        .expect("acquired");
    let stopped = stop::StopGuard::stopping(agent_pid);
    std::fs::write(dir.path("go"), "").unwrap();
    // The keeper reaps the job while the agent is stopped.
    assert!(
        wait_for(T, || (!exists(job)).then_some(())).is_some(),
        "job ended"
    );
    assert!(
        boot_ms() < granted + 2500,
        "the job must end well before the deadline for this test to mean anything"
    );
    wait_for(T, || (boot_ms() >= granted + 3300).then_some(())).unwrap();
    stopped.resume(agent_pid);
    let (status, err) = wait_agent(&mut child, T);
    (status.code(), err)
}

#[test]
fn a_job_that_ended_before_the_deadline_is_never_reported_lost_after_a_pause() {
    // 20 runs, five at a time.
    for batch in 0..4 {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..5)
                .map(|j| s.spawn(move || paused_across_the_deadline(batch * 5 + j)))
                .collect();
            for h in handles {
                let (code, err) = h.join().unwrap();
                assert_eq!(code, Some(3), "the job's own status, never 124: {err}");
            }
        });
    }
}

#[test]
fn a_stopped_keeper_does_not_keep_the_job_alive_nor_the_agent_spinning() {
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let dir = Dir::new();
    let mut c = agent(&proxy.url(), "frozen-keeper");
    c.env("OUT", dir.path("out"))
        .env("PIDS", dir.path("pids"))
        .env("IGNORE_TERM", "0");
    c.args([
        "--ttl",
        "2s",
        "--heartbeat",
        "400ms",
        "--grace",
        "600ms",
        "--",
    ])
    .arg(helper("clock-job.sh"));
    let mut child = spawn(c);
    let agent_pid = child.id() as i32;
    let pids = wait_pids(&dir.path("pids"), 1);
    wait_for(T, || {
        (fake.requests_to("/v1/renew").len() >= 2).then_some(())
    })
    .expect("renewals flow");
    let keeper = keeper_of(agent_pid);
    let stopped = stop::StopGuard::stopping(keeper); // it reports nothing any more
    proxy.set(ProxyMode::Blackhole);
    // Deadline (< 2 s) + tree-gone timeout (2 s) + keeper shutdown (1 s):
    // the agent ends on its own instead of spinning forever.
    let status = wait_exit(&mut child, T);
    // The agent woke the keeper (SIGCONT) with its SIGTERM: the keeper
    // reaps the tree, says so and ends by itself.
    let keeper_finished = wait_for(T, || (!exists(keeper)).then_some(())).is_some();
    // (If it did not, the guard kills it: the keeper shares the agent's
    // stderr, read to its end next.)
    drop(stopped);
    let err = stderr_of(&mut child);
    assert_eq!(status.and_then(|s| s.code()), Some(124), "{err}");
    assert!(all_dead(&pids, Duration::from_secs(1)), "{err}");
    assert_job_gone_before_expiry(&fake, &dir);
    // After the deadline nothing is released.
    assert!(keeper_finished, "the keeper, woken, finished: {err}");
    assert!(fake.requests_to("/v1/release").is_empty(), "{err}");
}

#[test]
fn a_killed_keeper_gets_the_group_killed_and_releases_only_an_empty_group() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "killed-keeper");
    c.env("OUT", dir.path("out")).env("PIDS", dir.path("pids"));
    c.args(["--ttl", "30s", "--"]).arg(helper("ignore-term.sh"));
    let mut child = spawn(c);
    let agent_pid = child.id() as i32;
    let pids = wait_pids(&dir.path("pids"), 2);
    let keeper = keeper_of(agent_pid);
    kill(keeper, 9);
    assert!(
        all_dead(&pids, Duration::from_secs(5)),
        "the agent kills the group when its keeper dies"
    );
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(err.contains("the keeper process died"), "{err}");
    let released = fake.requests_to("/v1/release");
    if group_members(pids[0]).is_empty() {
        // Whoever adopted the orphans reaped them: provably empty.
        assert_eq!(released.len(), 1, "{err}");
        assert_eq!(released[0].body["outcome"], "failed");
    } else {
        // Unreaped (an init that does not reap): not provably empty.
        assert!(released.is_empty(), "{err}");
        assert!(err.contains("not releasing"), "{err}");
    }
}

/// An agent on `task` whose acquire the authority answers only after 1.5 s,
/// running `script` (with OUT set) once granted, sent `sig` while the grant
/// is on its way. Returns the agent's exit status and stderr.
fn signalled_during_acquire(
    fake: &FakeAuthority,
    dir: &Dir,
    task: &str,
    script: &str,
    sig: i32,
) -> (std::process::ExitStatus, String) {
    fake.script(
        "/v1/acquire",
        vec![Reply::Delay(Duration::from_millis(1500))],
    );
    let mut c = agent(&fake.url(), task);
    c.env("OUT", dir.path("out"));
    c.args(["--ttl", "30s", "--", "sh", "-c"]).arg(script);
    let mut child = spawn(c);
    wait_for(T, || {
        (!fake.requests_to("/v1/acquire").is_empty()).then_some(())
    })
    .expect("acquire sent");
    kill(child.id() as i32, sig);
    wait_agent(&mut child, T)
}

#[test]
fn a_sighup_during_acquire_does_not_reach_the_job_started_afterwards() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    // SIGHUP, while the grant is on its way.
    let (status, err) = signalled_during_acquire(
        &fake,
        &dir,
        "hup-acquire",
        "echo started >> \"$OUT\"; sleep 1; echo done >> \"$OUT\"",
        1,
    );
    assert_eq!(status.code(), Some(0), "{err}");
    let out = std::fs::read_to_string(dir.path("out")).unwrap_or_default();
    assert!(out.contains("started") && out.contains("done"), "{out}");
}

#[test]
fn a_sigterm_during_acquire_releases_without_starting_the_command() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let (status, err) =
        signalled_during_acquire(&fake, &dir, "term-acquire", "echo started >> \"$OUT\"", 15);
    assert_eq!(status.code(), Some(128 + 15), "{err}");
    assert!(
        !dir.path("out").exists(),
        "the command must not have started"
    );
    let released = fake.requests_to("/v1/release");
    assert_eq!(released.len(), 1, "{err}");
    assert_eq!(released[0].body["outcome"], "cancelled");
}

#[test]
fn a_grant_that_arrives_with_less_than_grace_left_never_starts_the_command() {
    // ttl 2 s, grace 1.5 s: a grant answered 900 ms after it was asked has
    // at most 1.1 s of lease left, less than the grace the command would
    // need to stop. The command must not start.
    let fake = FakeAuthority::start();
    fake.script(
        "/v1/acquire",
        vec![Reply::Delay(Duration::from_millis(900))],
    );
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "late-grant");
    c.env("OUT", dir.path("out"));
    c.args(["--ttl", "2s", "--heartbeat", "300ms", "--grace", "1500ms"])
        .args(["--", "sh", "-c"])
        .arg("echo started >> \"$OUT\"");
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(124), "{}", out.stderr);
    assert!(
        !dir.path("out").exists(),
        "the command must not have started: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("not starting the command"),
        "{}",
        out.stderr
    );
    let released = fake.requests_to("/v1/release");
    assert_eq!(released.len(), 1, "{}", out.stderr);
    assert_eq!(released[0].body["outcome"], "lost");
}

#[test]
fn remap_exit_tells_the_jobs_own_124_from_a_lost_lease() {
    for (flags, expected) in [(&[][..], 124), (&["--remap-exit"][..], 1)] {
        let fake = FakeAuthority::start();
        let mut c = agent(&fake.url(), "remap");
        c.args(flags).args(["--", "sh", "-c", "exit 124"]);
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(expected), "{}", out.stderr);
        // The authority hears the job's real code and that the lease was
        // not lost; the last log line says so too.
        let released = fake.requests_to("/v1/release");
        assert_eq!(released[0].body["outcome"], "failed");
        assert_eq!(released[0].body["exit_code"], 124);
        assert!(out.stderr.contains("outcome failed"), "{}", out.stderr);
    }
}

#[test]
fn the_clock_drift_budget_shortens_what_check_sees() {
    for (flags, first) in [(&[][..], "a=0"), (&["--clock-drift", "100000"][..], "a=1")] {
        let fake = FakeAuthority::start();
        let dir = Dir::new();
        let mut c = agent(&fake.url(), "drift");
        c.env("OUT", dir.path("out"))
            .env("LEASEAGENT_BIN", bin())
            .env("XDG_RUNTIME_DIR", dir.0.path());
        // 20 s: 19.979 s from the send time by default, 17.999 s with 10 %
        // budgeted for drift.
        c.args(["--ttl", "20s"])
            .args(flags)
            .args(["--", "sh", "-c"])
            .arg(
                "\"$LEASEAGENT_BIN\" check -q --min-remaining 18500ms; echo a=$? >> \"$OUT\"; \
             \"$LEASEAGENT_BIN\" check -q --min-remaining 16s; echo b=$? >> \"$OUT\"",
            );
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
        let text = std::fs::read_to_string(dir.path("out")).unwrap();
        assert!(
            text.contains(first) && text.contains("b=0"),
            "{flags:?}: {text}"
        );
    }
}
