//! The agent in an operator's hands: run the way cron runs it (`env -i`
//! with a bare PATH, stdin `/dev/null`, stdout and stderr to a file that
//! would be mailed), against the embedded per-host authority; and under a
//! real systemd, where its lines go to the journal with their priorities
//! and fields. What is checked is what a person would see: the mail is
//! empty on a normal night (a success, or the task held by another host
//! with `-q --held-exit 0`), an error is never hidden by a `RUST_LOG` meant
//! for another program, and a level typed wrong is refused.

use crate::support::{self, Dir, sysns, wait_exit, wait_for};

use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// A cron-like environment: nothing inherited but what cron sets, the
/// test's own state and runtime directories.
fn cron(dir: &Dir, args: &[&str]) -> Command {
    let runtime = dir.path("run");
    let state = dir.path("state");
    for d in [&runtime, &state] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    let mut c = Command::new(support::bin());
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/root")
        .env("SHELL", "/bin/sh")
        .env("LOGNAME", "root")
        .env("LEASEAGENT_STATE_DIR", &state)
        .env("XDG_RUNTIME_DIR", &runtime)
        .args(args)
        .stdin(Stdio::null());
    c
}

/// Runs `c` with stdout and stderr to one file, as cron collects a job's
/// output for its mail: (status, the mail).
fn mailed(mut c: Command, dir: &Dir, name: &str) -> (ExitStatus, String) {
    let path = dir.path(name);
    let f = std::fs::File::create(&path).unwrap();
    c.stdout(f.try_clone().unwrap()).stderr(f);
    let mut child = c.spawn().unwrap();
    let status = wait_exit(&mut child, T).expect("the agent exits");
    (status, std::fs::read_to_string(&path).unwrap())
}

/// Starts an agent holding `task` with a job that sleeps; returns once the
/// job runs.
fn holder(dir: &Dir, task: &str) -> std::process::Child {
    let started = dir.path("holder-started");
    let script = format!("touch {}; exec sleep 300", started.display());
    let mut c = cron(dir, &["--task", task, "--", "sh", "-c", &script]);
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let child = c.spawn().unwrap();
    wait_for(T, || started.exists().then_some(())).expect("the holder's job starts");
    child
}

fn stop(mut child: std::process::Child) {
    support::kill(child.id() as i32, 15);
    wait_exit(&mut child, T).expect("the holder exits on SIGTERM");
}

#[test]
fn quiet_success_mails_nothing() {
    let dir = Dir::new();
    let out = dir.path("out");
    let script = format!("echo done > {}", out.display());
    let (status, mail) = mailed(
        cron(
            &dir,
            &["-q", "--task", "nightly", "--", "sh", "-c", &script],
        ),
        &dir,
        "mail",
    );
    assert!(status.success(), "{status}: {mail}");
    assert_eq!(mail, "", "a quiet success printed something");
    assert_eq!(std::fs::read_to_string(out).unwrap(), "done\n");
}

#[test]
fn held_elsewhere_is_quiet_and_held_exit_makes_it_a_success() {
    let dir = Dir::new();
    let h = holder(&dir, "nightly");
    let (status, mail) = mailed(
        cron(
            &dir,
            &["-q", "--held-exit", "0", "--task", "nightly", "--", "true"],
        ),
        &dir,
        "mail-0",
    );
    assert_eq!(status.code(), Some(0), "{mail}");
    assert_eq!(mail, "", "held with -q printed something");
    // Without --held-exit: still quiet, the documented status 75.
    let (status, mail) = mailed(
        cron(&dir, &["-q", "--task", "nightly", "--", "true"]),
        &dir,
        "mail-75",
    );
    assert_eq!(status.code(), Some(75), "{mail}");
    assert_eq!(mail, "");
    // Not quiet: the one line says who holds it, at info.
    let (status, mail) = mailed(
        cron(
            &dir,
            &["--held-exit", "3", "--task", "nightly", "--", "true"],
        ),
        &dir,
        "mail-3",
    );
    assert_eq!(status.code(), Some(3), "{mail}");
    assert!(
        mail.contains("leaseagent: info: task nightly is held by"),
        "{mail}"
    );
    stop(h);
}

#[test]
fn a_rust_log_meant_for_another_program_never_hides_an_error() {
    let dir = Dir::new();
    for rust_log in ["warning", "err", "verbose", "off", "leaseagent=off"] {
        let mut c = cron(&dir, &["--task", "t", "--", "nosuchcommand-xyz"]);
        c.env("RUST_LOG", rust_log);
        let (status, mail) = mailed(c, &dir, "mail");
        assert_eq!(status.code(), Some(127), "RUST_LOG={rust_log}: {mail}");
        assert!(
            mail.contains(
                "leaseagent: error: cannot run the command: `nosuchcommand-xyz` is not found in PATH (/usr/bin:/bin)"
            ),
            "RUST_LOG={rust_log} hid the error: {mail:?}"
        );
    }
    // -q still prints the error.
    let (status, mail) = mailed(
        cron(&dir, &["-q", "--task", "t", "--", "nosuchcommand-xyz"]),
        &dir,
        "mail-q",
    );
    assert_eq!(status.code(), Some(127), "{mail}");
    assert!(mail.contains("error: cannot run the command"), "{mail}");
    // None of the six took a token: the command was looked up first.
    let tok = dir.path("token");
    let script = format!("echo $LEASE_TOKEN > {}", tok.display());
    let (status, mail) = mailed(
        cron(&dir, &["-q", "--task", "t", "--", "sh", "-c", &script]),
        &dir,
        "mail-ok",
    );
    assert!(status.success(), "{mail}");
    assert_eq!(std::fs::read_to_string(tok).unwrap(), "1\n");
}

#[test]
fn an_unknown_log_level_is_refused_naming_the_flag_and_the_levels() {
    let dir = Dir::new();
    let ran = dir.path("ran");
    let script = format!("touch {}", ran.display());
    let refused = |mail: &str| {
        assert!(mail.contains("--log-level"), "{mail}");
        assert!(mail.contains("LEASEAGENT_LOG"), "{mail}");
        assert!(mail.contains("error, warn, info, debug or trace"), "{mail}");
    };
    let (status, mail) = mailed(
        cron(
            &dir,
            &[
                "--log-level",
                "warning",
                "--task",
                "t",
                "--",
                "sh",
                "-c",
                &script,
            ],
        ),
        &dir,
        "mail-flag",
    );
    assert_eq!(status.code(), Some(125), "{mail}");
    refused(&mail);
    assert!(mail.contains("`warning`"), "{mail}");
    let mut c = cron(&dir, &["--task", "t", "--", "sh", "-c", &script]);
    c.env("LEASEAGENT_LOG", "verbose");
    let (status, mail) = mailed(c, &dir, "mail-env");
    assert_eq!(status.code(), Some(125), "{mail}");
    refused(&mail);
    assert!(mail.contains("`verbose`"), "{mail}");
    assert!(!ran.exists(), "the command ran despite the refusal");
    // A known one, from the variable: warn hides the run's info lines.
    let mut c = cron(&dir, &["--task", "t", "--", "true"]);
    c.env("LEASEAGENT_LOG", "WARN");
    let (status, mail) = mailed(c, &dir, "mail-warn");
    assert!(status.success(), "{mail}");
    assert_eq!(mail, "");
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ leaseagent: LEVEL: ...`
fn stamped(line: &str) -> bool {
    let b = line.as_bytes();
    line.len() > 25
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[23] == b'Z'
        && line[24..].starts_with(" leaseagent: ")
        && b[..4].iter().all(u8::is_ascii_digit)
}

#[test]
fn lines_to_a_file_carry_a_time_and_json_carries_the_fields() {
    let dir = Dir::new();
    let (status, mail) = mailed(cron(&dir, &["--task", "stamp", "--", "true"]), &dir, "text");
    assert!(status.success(), "{mail}");
    assert!(mail.contains("info: finished: task stamp"), "{mail}");
    for line in mail.lines() {
        assert!(stamped(line), "no time in front: {line:?}");
    }
    let (status, log) = mailed(
        cron(
            &dir,
            &["--log-format", "json", "--task", "js", "--", "true"],
        ),
        &dir,
        "json",
    );
    assert!(status.success(), "{log}");
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    assert!(
        records
            .iter()
            .all(|r| r["task"] == "js" && r["time"].is_string())
    );
    let finished = records
        .iter()
        .find(|r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("finished:"))
        })
        .unwrap_or_else(|| panic!("no finished record: {log}"));
    assert_eq!(finished["level"], "info");
    assert_eq!(finished["outcome"], "succeeded");
    assert!(finished["token"].is_u64(), "{finished}");
    assert!(finished["lease_id"].is_string(), "{finished}");
}

/// The journal's records that match `matches` (`-u UNIT`, `FIELD=value`),
/// as `journalctl -o json` gives them.
fn journal_json(sd: &sysns::Systemd, matches: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["journalctl", "--no-pager", "-o", "json"];
    args.extend_from_slice(matches);
    sd.text(&args)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The first of those records whose MESSAGE starts with `message`, polled
/// for: journald stores what it is sent in its own time.
fn record(sd: &sysns::Systemd, matches: &[&str], message: &str) -> serde_json::Value {
    wait_for(T, || {
        journal_json(sd, matches)
            .into_iter()
            .find(|r| field(r, "MESSAGE").starts_with(message))
    })
    .unwrap_or_else(|| {
        panic!(
            "no record {message:?} for {matches:?} in the journal\n{}",
            sd.journal_all()
        )
    })
}

fn field<'a>(r: &'a serde_json::Value, name: &str) -> &'a str {
    r[name].as_str().unwrap_or("")
}

#[test]
fn under_systemd_lines_reach_the_journal_with_priorities_and_fields() {
    let sd = sysns::Systemd::boot(&sysns::Stage::new());
    let agent = "/usr/local/bin/leaseagent";
    // A run stopped by systemctl: its "signal received" line is a warning
    // (systemd-run without --wait: the booted system has no D-Bus).
    let out = sd.run(&[
        "systemd-run",
        "--unit=journal-stop",
        // As the shipped unit: SIGTERM to the agent alone, which stops its job.
        "-p",
        "KillMode=mixed",
        "--",
        agent,
        "--task",
        "jt",
        "--",
        "sleep",
        "300",
    ]);
    assert!(out.status.success(), "systemd-run: {out:?}");
    let unit = ["-u", "journal-stop.service"];
    record(&sd, &unit, "command started");
    sd.systemctl(&["stop", "journal-stop.service"]);
    let warning = record(&sd, &unit, "signal 15 received: stopping the command");
    assert_eq!(field(&warning, "PRIORITY"), "4", "{warning}");
    assert_eq!(
        field(&warning, "SYSLOG_IDENTIFIER"),
        "leaseagent",
        "{warning}"
    );
    assert_eq!(field(&warning, "LEASE_TASK"), "jt", "{warning}");
    assert_eq!(field(&warning, "LEASE_TOKEN"), "1", "{warning}");
    assert!(!field(&warning, "LEASE_ID").is_empty(), "{warning}");
    let released = record(&sd, &unit, "released task jt token 1");
    assert_eq!(field(&released, "PRIORITY"), "6", "{released}");
    assert_eq!(field(&released, "LEASE_OUTCOME"), "cancelled", "{released}");
    // One prefix: the identifier, not "leaseagent:" again in the message.
    for r in journal_json(&sd, &["SYSLOG_IDENTIFIER=leaseagent"]) {
        assert!(!field(&r, "MESSAGE").starts_with("leaseagent"), "{r}");
    }
    // A missing command: an error, priority 3, found by its task.
    let out = sd.run(&[
        "systemd-run",
        "--unit=journal-missing",
        "--",
        agent,
        "--task",
        "jm",
        "--",
        "nosuchcommand-xyz",
    ]);
    assert!(out.status.success(), "systemd-run: {out:?}");
    let error = record(&sd, &["LEASE_TASK=jm"], "cannot run the command");
    assert_eq!(field(&error, "PRIORITY"), "3", "{error}");
    // `journalctl -p warning` finds both, and nothing at info.
    let w = sd.text(&[
        "journalctl",
        "--no-pager",
        "-p",
        "warning",
        "-o",
        "cat",
        "SYSLOG_IDENTIFIER=leaseagent",
    ]);
    assert!(
        w.contains("signal 15 received: stopping the command"),
        "{w}"
    );
    assert!(w.contains("cannot run the command"), "{w}");
    assert!(!w.contains("acquired task"), "{w}");
}
