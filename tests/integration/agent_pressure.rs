//! Nothing the job exhausts starves renewal (Guarantee 1), and timing flags
//! that cannot work are refused before anything is sent. Each case uses the
//! real limit: a pids cgroup the job fills, a memory cgroup the job fills,
//! a shaped veth link the job floods, an authority that accepts and never
//! answers.

use crate::support;

use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(90);

/// Runs the agent with `flags` against a fake authority; it must refuse
/// with 125, name `flag` first in its message, and send nothing.
fn refused(flags: &[&str], flag: &str) -> String {
    let fake = FakeAuthority::start();
    let mut c = agent(&fake.url(), "refused-flags");
    c.args(flags).args(["--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(125), "{flags:?}: {}", out.stderr);
    let line = out.stderr.lines().last().unwrap_or_default().to_string();
    assert!(line.contains(&format!("{flag} (")), "{flags:?}: {line}");
    assert!(
        fake.requests().is_empty(),
        "{flags:?}: a request was sent: {:?}",
        fake.requests()
    );
    line
}

#[test]
fn a_heartbeat_due_after_sigterm_is_refused() {
    let m = refused(&["--ttl", "3s", "--heartbeat", "2600ms"], "--heartbeat");
    assert!(m.contains("no room to renew"), "{m}");
    assert!(m.contains("use --heartbeat 1996ms or less"), "{m}");
}

#[test]
fn a_grace_that_reaches_the_deadline_is_refused() {
    let m = refused(&["--ttl", "1s", "--grace", "999ms"], "--grace");
    assert!(m.contains("local deadline"), "{m}");
}

#[test]
fn a_ttl_outside_the_protocols_bounds_is_refused() {
    let m = refused(&["--ttl", "100ms"], "--ttl");
    assert!(m.contains("between 1s and 24h"), "{m}");
    refused(&["--ttl", "25h"], "--ttl");
}

#[test]
fn an_absurdly_small_heartbeat_is_refused() {
    let m = refused(&["--heartbeat", "1ms"], "--heartbeat");
    assert!(m.contains("below the smallest accepted, 100ms"), "{m}");
}

#[test]
fn two_hung_renewals_in_a_row_are_survived_with_default_proportions() {
    // ttl 3 s: heartbeat 1 s, grace 500 ms (the default proportions). The
    // first two renewals are accepted and never answered; the third is. The
    // command must keep running (Guarantee 3: two lost heartbeats are
    // survived) and the lease be released normally.
    let fake = FakeAuthority::start();
    fake.script("/v1/renew", vec![Reply::Blackhole, Reply::Blackhole]);
    let mut c = agent(&fake.url(), "hung-twice");
    c.args(["--ttl", "3s", "--", "sleep", "5"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(!out.stderr.contains("lease lost"), "{}", out.stderr);
    let renewals = fake.requests_to("/v1/renew");
    assert!(renewals.len() >= 3, "{renewals:?}");
    // The answered renewal came while the lease still had room: before
    // SIGTERM time (ttl - grace after the acquire).
    let acquired = fake.requests_to("/v1/acquire")[0].at;
    let third = renewals[2].at.duration_since(acquired);
    assert!(third < Duration::from_millis(2_500), "third renewal at {third:?}");
    let released = fake.requests_to("/v1/release");
    assert_eq!(released.len(), 1, "{}", out.stderr);
    assert_eq!(released[0].body["outcome"], "succeeded");
}
