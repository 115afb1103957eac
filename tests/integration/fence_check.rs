//! `leaseagent check`: under a real agent, and against state files in each
//! state the agent can write.

use crate::support;

use std::process::{Command, Output};
use std::time::Duration;

use leaseagent::testing::{BootInstant, boot_id};
use leaseagent::testing::{LeaseStateFile, LeaseView, StateWriter};
use support::fence::stderr;

fn check(state_file: Option<&std::path::Path>, token: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(support::fence::bin());
    c.arg("check").args(args);
    c.env_remove("LEASEAGENT_STATE_FILE")
        .env_remove("LEASE_TOKEN");
    if let Some(p) = state_file {
        c.env("LEASEAGENT_STATE_FILE", p);
    }
    if let Some(t) = token {
        c.env("LEASE_TOKEN", t);
    }
    c.output().expect("run leaseagent check")
}

fn state(dir: &std::path::Path, view: LeaseView, left: Duration, boot: String) -> StateWriter {
    let w = StateWriter::in_dir(dir).unwrap();
    w.write(&LeaseStateFile {
        task: "t".into(),
        lease_id: "l".into(),
        token: 41,
        state: view,
        deadline_boot_ms: (BootInstant::now() + left).since_boot().as_millis() as u64,
        boot_id: boot,
        agent_pid: std::process::id(),
        boot_offset_ns: 0,
        outcome: None,
        containment: None,
    })
    .unwrap();
    w
}

#[test]
fn outside_leaseagent_it_says_so() {
    let r = check(None, None, &[]);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        stderr(&r).contains("LEASEAGENT_STATE_FILE is not set"),
        "{}",
        stderr(&r)
    );
    let d = tempfile::tempdir().unwrap();
    let r = check(Some(&d.path().join("gone.json")), None, &[]);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        stderr(&r).contains("cannot read the lease state file"),
        "{}",
        stderr(&r)
    );
}

#[test]
fn each_state_file_answer() {
    let d = tempfile::tempdir().unwrap();
    let boot = boot_id().unwrap();
    let hour = Duration::from_secs(3600);

    let w = state(d.path(), LeaseView::Valid, hour, boot.clone());
    let r = check(
        Some(w.path()),
        Some("41"),
        &["--min-remaining", "5m", "--json"],
    );
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["token"], 41);
    assert_eq!(v["state"], "valid");
    assert!(v["remaining_ms"].as_u64().unwrap() > 3_000_000);

    let r = check(Some(w.path()), Some("41"), &["--min-remaining", "2h"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        stderr(&r).contains("left, less than --min-remaining 2h"),
        "{}",
        stderr(&r)
    );
    let r = check(
        Some(w.path()),
        Some("41"),
        &["--min-remaining", "2h", "--quiet"],
    );
    assert_eq!(r.status.code(), Some(1));
    assert!(r.stderr.is_empty());

    let r = check(Some(w.path()), Some("40"), &[]);
    assert_eq!(r.status.code(), Some(1), "another attempt's file");
    assert!(stderr(&r).contains("LEASE_TOKEN is 40"), "{}", stderr(&r));

    let w = state(d.path(), LeaseView::Renewing, hour, boot.clone());
    assert_eq!(check(Some(w.path()), None, &[]).status.code(), Some(0));

    let w = state(d.path(), LeaseView::Lost, hour, boot.clone());
    let r = check(Some(w.path()), None, &[]);
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains("lease lost"), "{}", stderr(&r));

    // A paused agent's last file: it expires by its deadline alone.
    let w = state(d.path(), LeaseView::Valid, Duration::ZERO, boot.clone());
    let r = check(Some(w.path()), None, &[]);
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains("lease expired"), "{}", stderr(&r));

    let w = state(d.path(), LeaseView::Valid, hour, "another-boot".into());
    let r = check(Some(w.path()), None, &[]);
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains("previous boot"), "{}", stderr(&r));
}

/// Under a real agent: the job sees its own token and a valid lease.
#[test]
fn under_the_agent() {
    let auth = support::FakeAuthority::start();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out.json");
    let script = format!(
        "leaseagent check --min-remaining 1s --json > {o} || exit 3; \
         leaseagent check --min-remaining 1h 2> {o}.err && exit 4; \
         test \"$(cat {o}.err)\" != '' || exit 5",
        o = out.display()
    );
    let mut c = support::agent(&auth.url(), "check-task");
    c.args(["--ttl", "5s", "--", "sh", "-c", &script])
        .env("PATH", support::fence::path_with_bin())
        .env("LEASEAGENT_STATE_DIR", d.path());
    let f = support::run_agent(c, Duration::from_secs(30));
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["token"].as_u64(), Some(auth.token()));
    let err = std::fs::read_to_string(d.path().join("out.json.err")).unwrap();
    assert!(err.contains("less than --min-remaining 1h"), "{err}");
}

/// A job that moved its boot clock (a time namespace of its own, a day
/// ahead or back by up to 1,000 s, as far as this machine's boot clock
/// allows, as `unshare --time` or a CRIU restore gives) is
/// told what its agent knows: a valid lease with no more than its ttl left,
/// neither "expired a day ago" nor 1,000 s longer than it has.
#[test]
fn a_job_in_another_time_namespace_reads_the_same_deadline() {
    // A view behind the host's reads at least 10 s more left than the
    // lease has if its boot clock were taken as the host's: outside 1..5 s.
    let behind = support::boottime_behind(1000, 10).to_string();
    for offset in ["86400", behind.as_str()] {
        let auth = support::FakeAuthority::start();
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("out.json");
        let script = format!(
            "unshare --time --boottime {offset} --fork leaseagent check --min-remaining 1s --json > {o}",
            o = out.display()
        );
        let mut c = support::agent(&auth.url(), "check-timens");
        // A root job makes no time namespace of its own without
        // CAP_SYS_ADMIN, which it runs without unless asked (`--full-root`,
        // `sys/confine.rs`): this job is one that asks.
        c.args(["--full-root", "--ttl", "5s", "--", "sh", "-c", &script])
            .env("PATH", support::fence::path_with_bin())
            .env("LEASEAGENT_STATE_DIR", d.path());
        let f = support::run_agent(c, Duration::from_secs(30));
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        assert_eq!(
            f.status.code(),
            Some(0),
            "offset {offset}: {text}\n{}",
            f.stderr
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ok"], true, "offset {offset}: {text}");
        let left = v["remaining_ms"].as_u64().unwrap();
        assert!(
            (1_000..=5_000).contains(&left),
            "offset {offset}: {left} ms left of a 5 s lease: {text}"
        );
    }
}
