//! A hostile or broken authority cannot bend the agent: a ttl above the ask
//! is capped, out-of-range tokens and odd lease ids are malformed answers,
//! redirects are never followed, and its strings reach the log escaped.

use crate::support;

use std::time::{Duration, Instant};

use support::*;

const T: Duration = Duration::from_secs(60);

/// A 3 s lease renewed every second, with 500 ms of grace.
const SHORT_LEASE: [&str; 6] = ["--ttl", "3s", "--heartbeat", "1s", "--grace", "500ms"];

fn grant_body(token: &str, lease_id: &str, ttl_ms: u64) -> String {
    format!(
        r#"{{"lease_id": {}, "task": "{}", "token": {token}, "ttl_ms": {ttl_ms}}}"#,
        serde_json::Value::String(lease_id.into()),
        "distrust"
    )
}

#[test]
fn a_ttl_above_the_ask_is_capped_at_the_ask() {
    let fake = FakeAuthority::start();
    fake.set_acquire(Reply::Raw(200, grant_body("5", "lease-5", 3_600_000)));
    // One renewal that also claims an hour, then silence.
    fake.script(
        "/v1/renew",
        vec![Reply::Raw(200, r#"{"ttl_ms": 3600000}"#.into())],
    );
    fake.set_renew(Reply::Blackhole);
    let mut c = agent(&fake.url(), "distrust");
    c.args(SHORT_LEASE).args(["--", "sleep", "1000"]);
    let started = Instant::now();
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(124), "{}", out.stderr);
    // Uncapped, the job would run for an hour. Capped: the last renewal
    // (~1 s) + 3 s; 20 s leaves room for a busy machine.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("ttl 3s"), "{}", out.stderr);
}

#[test]
fn a_redirect_at_acquire_is_not_followed() {
    let elsewhere = FakeAuthority::start();
    let fake = FakeAuthority::start();
    fake.set_acquire(Reply::Redirect(format!("{}/v1/acquire", elsewhere.url())));
    let mut c = agent(&fake.url(), "distrust");
    c.args(["--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(125), "{}", out.stderr);
    assert!(out.stderr.contains("302"), "{}", out.stderr);
    assert!(elsewhere.requests().is_empty(), "the redirect was followed");
}

#[test]
fn a_holder_with_newline_and_escape_is_printed_escaped() {
    let fake = FakeAuthority::start();
    let body = serde_json::json!({
        "error": "held",
        "holder": "evil\nleaseagent: info: released task distrust\u{1b}[2J\u{7}",
    });
    fake.set_acquire(Reply::Raw(409, body.to_string()));
    let mut c = agent(&fake.url(), "distrust");
    c.args(["--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(75), "{}", out.stderr);
    assert!(!out.stderr.contains('\u{1b}'), "{:?}", out.stderr);
    assert!(!out.stderr.contains('\u{7}'), "{:?}", out.stderr);
    assert!(
        !out.stderr
            .lines()
            .any(|l| l.starts_with("leaseagent: info: released")),
        "forged line: {:?}",
        out.stderr
    );
    assert!(out.stderr.contains("evil\\nleaseagent"), "{:?}", out.stderr);
}

#[test]
fn out_of_range_tokens_and_odd_lease_ids_are_malformed() {
    let cases = [
        grant_body("18446744073709551615", "lease-1", 3000),
        grant_body("9223372036854775808", "lease-1", 3000),
        grant_body("0", "lease-1", 3000),
        grant_body("7", "lease\n1", 3000),
        grant_body("7", &"x".repeat(300), 3000),
    ];
    for body in cases {
        let fake = FakeAuthority::start();
        fake.set_acquire(Reply::Raw(200, body.clone()));
        let mut c = agent(&fake.url(), "distrust");
        c.args(["--", "true"]);
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(125), "{body}: {}", out.stderr);
        assert!(out.stderr.contains("malformed"), "{body}: {}", out.stderr);
        assert!(fake.requests_to("/v1/renew").is_empty());
    }
    // The largest token SQLite and `serve` can store is fine.
    let fake = FakeAuthority::start();
    fake.set_acquire(Reply::Raw(
        200,
        grant_body("9223372036854775807", "lease-1", 3000),
    ));
    let mut c = agent(&fake.url(), "distrust");
    c.args(["--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
}

#[test]
fn a_lease_lost_to_silence_ends_the_agent_without_waiting_on_a_release() {
    let fake = FakeAuthority::start();
    fake.set_renew(Reply::Blackhole);
    fake.script("/v1/release", vec![Reply::Blackhole]);
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let mut c = agent(&fake.url(), "distrust-silence");
    c.args(SHORT_LEASE)
        .args(["--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 1000", pids.display()));
    let mut child = spawn(c);
    let job = wait_for(T, || read_pids(&pids).first().copied()).expect("job started");
    wait_for(T, || (!alive(job)).then_some(())).expect("job killed at the deadline");
    let died = Instant::now();
    let status = wait_exit(&mut child, T).expect("agent exits");
    let lingered = died.elapsed();
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(124), "{err}");
    // A release can only matter before the deadline: the agent waits on
    // one no longer than that (a blackholed release used to hold it for
    // its whole 3 s timeout after the job was dead).
    assert!(
        lingered < Duration::from_millis(2500),
        "{lingered:?}; {err}"
    );
}
