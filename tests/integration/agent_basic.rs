//! The agent against the in-process fake authority: relay, exit codes,
//! usage errors, acquire failures.

use crate::support;

use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(30);

#[test]
fn relays_token_and_variables_and_passes_exit_code() {
    let fake = FakeAuthority::start();
    let mut c = agent(&fake.url(), "relay");
    c.env("LEASE_TOKEN", "stale-inherited-value");
    c.env("NOTIFY_SOCKET", "/nonexistent");
    c.arg("--ttl").arg("5s").arg("--").arg(helper("env.sh"));
    let out = run_agent(c, T);
    assert!(out.status.success(), "stderr: {}", out.stderr);
    let tok = fake.token();
    assert!(
        out.stdout.contains(&format!("TOKEN={tok}\n")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!("ID=L{tok}\n")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("TASK=relay\n"));
    assert!(out.stdout.contains(&format!("AUTH={}\n", fake.url())));
    assert!(out.stdout.contains("TTL=5000\n"));
    assert!(
        out.stdout.contains("NOTIFY=unset\n"),
        "NOTIFY_SOCKET leaked: {}",
        out.stdout
    );
    assert!(!out.stdout.contains("STATE=unset"));
    let rel = fake.requests_to("/v1/release");
    assert_eq!(rel.len(), 1);
    assert_eq!(rel[0].body["outcome"], "succeeded");
    assert_eq!(rel[0].body["exit_code"], 0);
    assert_eq!(rel[0].body["token"], tok);
}

#[test]
fn exit_code_and_signal_death_pass_through() {
    let fake = FakeAuthority::start();
    let mut c = agent(&fake.url(), "codes");
    c.args(["--", "sh", "-c", "exit 42"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(42), "{}", out.stderr);
    let rel = fake.requests_to("/v1/release");
    assert_eq!(rel[0].body["outcome"], "failed");
    assert_eq!(rel[0].body["exit_code"], 42);

    let mut c = agent(&fake.url(), "codes");
    c.args(["--", "sh", "-c", "kill -USR2 $$"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(128 + 12), "{}", out.stderr);
    let rel = fake.requests_to("/v1/release");
    assert_eq!(rel[1].body["exit_code"], serde_json::Value::Null);
}

#[test]
fn not_found_is_127_and_not_executable_is_126() {
    let fake = FakeAuthority::start();
    let mut c = agent(&fake.url(), "nf");
    c.args(["--", "/nonexistent/command-xyz"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(127), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("`/nonexistent/command-xyz` does not exist"),
        "{}",
        out.stderr
    );
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("noexec.sh");
    std::fs::write(&f, "#!/bin/sh\necho hi\n").unwrap();
    let mut c = agent(&fake.url(), "nx");
    c.arg("--").arg(&f);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(126), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("`{}` is not executable", f.display())),
        "{}",
        out.stderr
    );
    // Both were found out before the lease was asked for: no token spent,
    // no attempt recorded.
    assert!(fake.requests_to("/v1/acquire").is_empty());
    assert!(fake.requests_to("/v1/release").is_empty());
}

/// The keeper looks the command up along `PATH` before the grant; what
/// runs must be what `execvp` would run: the first executable regular
/// file (a directory or a file without an execute bit is passed over), a
/// script without `#!` through `/bin/sh`, with the command's own name as
/// `argv[0]`; a name found nowhere is 127.
#[test]
fn a_command_is_looked_up_along_path_as_execvp_does() {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeAuthority::start();
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    // In the first directory: `job` not executable, `dir-job` a directory.
    std::fs::write(first.path().join("job"), "echo wrong\n").unwrap();
    mode(&first.path().join("job"), 0o644);
    std::fs::create_dir(first.path().join("dir-job")).unwrap();
    std::os::unix::fs::symlink("/bin/sh", first.path().join("named-sh")).unwrap();
    // In the second: the real ones; `job` has no `#!` line.
    let job = second.path().join("job");
    std::fs::write(&job, "echo \"ran $0 $1\"\n").unwrap();
    mode(&job, 0o755);
    let dir_job = second.path().join("dir-job");
    std::fs::write(&dir_job, "#!/bin/sh\necho dir-job ran\n").unwrap();
    mode(&dir_job, 0o755);
    let path = format!(
        "{}:{}:{}",
        first.path().display(),
        second.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |args: &[&str]| {
        let mut c = agent(&fake.url(), "path-lookup");
        c.env("PATH", &path).arg("--").args(args);
        run_agent(c, T)
    };
    let out = run(&["job", "one"]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, format!("ran {} one\n", job.display()));
    let out = run(&["dir-job"]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "dir-job ran\n");
    let out = run(&["named-sh", "-c", "echo \"$0\""]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "named-sh\n");
    let out = run(&["no-such-command-anywhere"]);
    assert_eq!(out.status.code(), Some(127), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("`no-such-command-anywhere` is not found in PATH"),
        "{}",
        out.stderr
    );
}

#[test]
fn usage_errors_are_125_name_the_flag_and_send_nothing() {
    let fake = FakeAuthority::start();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--ttl", "10s", "--heartbeat", "10s", "--", "true"],
            "--heartbeat",
        ),
        (&["--ttl", "10x", "--", "true"], "--ttl"),
        (&["--grace", "1d", "--", "true"], "--grace"),
        (&["--ttl", "10s", "--grace", "20s", "--", "true"], "--grace"),
        (&["--on-expiry", "sometimes", "--", "true"], "--on-expiry"),
        (&["--wait", "forever", "--", "true"], "--wait"),
        (&[], "COMMAND"),
        (&["--", ""], "no command"),
        (&["--holder", "", "--", "true"], "--holder"),
        (&["--bogus", "--", "true"], "--bogus"),
    ];
    for (args, needle) in cases {
        let mut c = agent(&fake.url(), "usage");
        c.args(*args);
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(needle),
            "{args:?} should name {needle}: {}",
            out.stderr
        );
    }
    let mut c = agent(&fake.url(), "bad task name");
    c.args(["--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stderr.contains("--task"));
    let mut c = std::process::Command::new(bin());
    c.args(["--authority", "gopher://x", "--task", "t", "--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stderr.contains("--authority"));
    assert!(
        fake.requests().is_empty(),
        "usage errors must not send requests"
    );
}

#[test]
fn unreachable_or_malformed_authority_at_acquire_is_125_and_the_job_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let job = format!("touch {}", marker.display());
    // Nothing listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = agent(&format!("http://127.0.0.1:{port}"), "down");
    c.args(["--", "sh", "-c", &job]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(125), "{}", out.stderr);
    assert!(out.stderr.contains("unreachable"), "{}", out.stderr);

    let fake = FakeAuthority::start();
    for reply in [
        Reply::Raw(200, "not json".into()),
        Reply::Raw(200, "{\"lease_id\": 5}".into()),
        Reply::Raw(200, "[1,2]".into()),
        Reply::Raw(500, "{}".into()),
        Reply::Huge(8 << 20),
    ] {
        fake.set_acquire(reply.clone());
        let mut c = agent(&fake.url(), "malformed");
        c.args(["--", "sh", "-c", &job]);
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(125), "{reply:?}: {}", out.stderr);
    }
    assert!(!marker.exists(), "the job must never start");
}

#[test]
fn held_task_gives_75_and_wait_acquires_after_release() {
    let fake = FakeAuthority::start();
    fake.hold("other-host/99");
    let mut c = agent(&fake.url(), "held");
    c.args(["--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(75), "{}", out.stderr);
    assert!(
        out.stderr.contains("other-host/99"),
        "should name the holder: {}",
        out.stderr
    );

    let mut c = agent(&fake.url(), "held");
    c.args(["--wait", "300ms", "--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(75), "{}", out.stderr);

    let mut c = agent(&fake.url(), "held");
    c.args(["--wait", "--", "sh", "-c", "echo got $LEASE_TOKEN"]);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let before = fake.requests_to("/v1/acquire").len();
    let child = c.spawn().unwrap();
    wait_for(T, || {
        (fake.requests_to("/v1/acquire").len() >= before + 3).then_some(())
    })
    .expect("agent polls while waiting");
    fake.unhold();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("got {}", fake.token())),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("waiting"), "tells that it waits: {stderr}");
}

#[test]
fn task_and_authority_come_from_the_environment_too() {
    let fake = FakeAuthority::start();
    let mut c = std::process::Command::new(bin());
    c.env("LEASEAGENT_AUTHORITY", fake.url())
        .env("LEASEAGENT_TASK", "from-env")
        .args(["--", "sh", "-c", "echo \"$LEASE_TASK $LEASE_AUTHORITY\""]);
    let out = run_agent(c, T);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), format!("from-env {}", fake.url()));
    // The flag wins over the variable.
    let mut c = std::process::Command::new(bin());
    c.env("LEASEAGENT_AUTHORITY", "http://127.0.0.1:1")
        .env("LEASEAGENT_TASK", "from-env")
        .args([
            "--authority",
            &fake.url(),
            "--task",
            "from-flag",
            "--",
            "sh",
            "-c",
            "echo $LEASE_TASK",
        ]);
    let out = run_agent(c, T);
    assert_eq!(out.stdout.trim(), "from-flag", "{}", out.stderr);
}

#[test]
fn sigterm_while_waiting_gives_up_without_starting_the_command() {
    let fake = FakeAuthority::start();
    fake.hold("other-host/1");
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let mut c = agent(&fake.url(), "wait-cancel");
    c.args(["--wait", "--", "touch"]).arg(&marker);
    let mut child = spawn(c);
    wait_for(T, || {
        (fake.requests_to("/v1/acquire").len() >= 2).then_some(())
    })
    .expect("agent waits");
    kill(child.id() as i32, 15);
    let status = wait_exit(&mut child, T).expect("agent exits");
    assert_eq!(status.code(), Some(128 + 15));
    assert!(!marker.exists(), "the command must not start");
}
