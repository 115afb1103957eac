//! `--user NAME[:GROUP]` with real processes, as root: the job runs as the
//! real `nobody` with what `runuser` gives it, the agent and keeper stay
//! root, the job reaches its state file (`leaseagent check`), cannot touch
//! its guardians, and every refusal comes before anything is acquired.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(30);

/// A directory anyone may write to (the job runs as nobody), removed with
/// the test's `Dir`.
fn open_dir(dir: &Dir, name: &str) -> std::path::PathBuf {
    let p = dir.path(name);
    std::fs::create_dir(&p).unwrap();
    std::fs::set_permissions(dir.0.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).unwrap();
    p
}

/// A line `Key:\tvalues` of /proc/PID/status, values joined by spaces.
fn status_line(pid: i32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// What `runuser -u nobody` sets: the job must see the same.
fn runuser_env() -> String {
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--", "sh", "-c"])
        .arg("echo HOME=$HOME USER=$USER LOGNAME=$LOGNAME")
        .env("USER", "root")
        .env("LOGNAME", "root")
        .output()
        .expect("runuser (util-linux) must be installed");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_job_runs_as_nobody_as_runuser_would_run_it_and_the_guardians_stay_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests switch users: run them as root"
    );
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let work = open_dir(&dir, "work");
    // A job script in its working directory, run by a relative path: the
    // job reaches its cwd as nobody.
    let script = work.join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         echo HOME=$HOME USER=$USER LOGNAME=$LOGNAME > env.out\n\
         id -u > id.out; id -g >> id.out; id -G >> id.out\n\
         touch ready; exec sleep 1000\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = agent(&fake.url(), "as-nobody");
    c.current_dir(&work)
        .env("USER", "root")
        .env("LOGNAME", "root")
        .args(["--user", "nobody", "--", "./job.sh"]);
    let mut child = spawn(c);
    let agent_pid = child.id() as i32;
    wait_for(T, || work.join("ready").exists().then_some(())).expect("the job ran");
    let keeper = keeper_of(agent_pid);
    let job = wait_for(T, || {
        let kids =
            std::fs::read_to_string(format!("/proc/{keeper}/task/{keeper}/children")).ok()?;
        kids.split_whitespace().next()?.parse::<i32>().ok()
    })
    .unwrap();
    assert_eq!(status_line(job, "Uid"), "65534 65534 65534 65534");
    assert_eq!(status_line(job, "Gid"), "65534 65534 65534 65534");
    assert_eq!(status_line(job, "Groups"), "65534");
    assert_eq!(status_line(job, "CapEff"), "0000000000000000");
    assert_eq!(status_line(job, "CapPrm"), "0000000000000000");
    for p in [agent_pid, keeper] {
        assert_eq!(status_line(p, "Uid"), "0 0 0 0", "guardian {p}");
    }
    let id = std::fs::read_to_string(work.join("id.out")).unwrap();
    assert_eq!(id, "65534\n65534\n65534\n");
    assert_eq!(
        std::fs::read_to_string(work.join("env.out")).unwrap(),
        runuser_env()
    );
    // The job cannot signal its guardians (another uid).
    let attempt = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "kill",
            "-STOP",
        ])
        .arg(keeper.to_string())
        .arg(agent_pid.to_string())
        .output()
        .unwrap();
    assert!(!attempt.status.success());
    for p in [agent_pid, keeper] {
        assert!(
            status_line(p, "State").starts_with('S') || status_line(p, "State").starts_with('R'),
            "{p} is {}",
            status_line(p, "State")
        );
    }
    // A stop still stops the job's tree and releases.
    kill(agent_pid, 15);
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(!alive(job), "{err}");
    let rel = fake.requests_to("/v1/release");
    assert_eq!(rel.len(), 1, "{err}");
    assert_eq!(rel[0].body["outcome"], "cancelled");
}

#[test]
fn a_nobody_job_reaches_its_state_file_and_leaseagent_check_says_valid() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let work = open_dir(&dir, "work");
    let mut c = agent(&fake.url(), "check-as-nobody");
    c.current_dir(&work)
        .args(["--user", "nobody", "--", "sh", "-c"])
        .arg(format!(
            "ls -ld \"$(dirname \"$LEASEAGENT_STATE_FILE\")\" > dir.out; \
         {bin} check --json > check.out; echo $? >> check.out; \
         echo \"$LEASEAGENT_STATE_FILE\" > path.out",
            bin = bin().display()
        ));
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let check = std::fs::read_to_string(work.join("check.out")).unwrap();
    assert!(check.contains("\"ok\":true"), "{check}\n{}", out.stderr);
    assert!(check.ends_with("\n0\n"), "{check}");
    // Its own directory: the job's group may enter it, nobody else.
    let dir_line = std::fs::read_to_string(work.join("dir.out")).unwrap();
    assert!(dir_line.starts_with("drwxr-x--- "), "{dir_line}");
    assert!(dir_line.contains(" root nogroup "), "{dir_line}");
    // Gone with the run.
    let path = std::fs::read_to_string(work.join("path.out")).unwrap();
    let state = std::path::Path::new(path.trim());
    assert!(state.starts_with("/tmp"), "{path}");
    assert!(
        !state.exists() && !state.parent().unwrap().exists(),
        "{path}"
    );
}

#[test]
fn an_unknown_user_or_group_is_refused_before_anything_is_acquired() {
    let fake = FakeAuthority::start();
    for (spec, says) in [
        ("no-such-user-la", "--user: no such user `no-such-user-la`"),
        (
            "nobody:no-such-group-la",
            "--user: no such group `no-such-group-la`",
        ),
        ("nobody:", "--user: `nobody:` is not NAME or NAME:GROUP"),
        ("", "--user: `` is not NAME or NAME:GROUP"),
    ] {
        let mut c = agent(&fake.url(), "unknown-user");
        c.args(["--user", spec, "--", "true"]);
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(125), "{spec}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{spec}: {}", out.stderr);
    }
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());
}

#[test]
fn a_non_root_agent_asking_for_another_user_is_refused_with_the_reason() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let state = open_dir(&dir, "state");
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .args(["--authority", &fake.url(), "--task", "not-root"])
        .args(["--user", "root", "--", "true"])
        .env("LEASEAGENT_STATE_DIR", &state)
        .stdin(std::process::Stdio::null());
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(125), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "--user root: running the command as another user needs root (CAP_SETUID and CAP_SETGID); this agent runs as uid 65534"
        ),
        "{}",
        out.stderr
    );
    assert!(fake.requests().is_empty());
    // Its own user is no switch at all: allowed, with runuser's variables.
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .args(["--authority", &fake.url(), "--task", "not-root"])
        .args([
            "--user",
            "nobody",
            "--",
            "sh",
            "-c",
            "echo USER=$USER HOME=$HOME",
        ])
        .env("LEASEAGENT_STATE_DIR", &state)
        .env("USER", "someone-else")
        .stdin(std::process::Stdio::null());
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "USER=nobody HOME=/nonexistent\n");
}

/// `id -u`, `id -g` and `id -G` of a job run with `--user spec`.
fn ids_of_a_job(fake: &FakeAuthority, spec: &str) -> String {
    let mut c = agent(&fake.url(), "group");
    c.args(["--user", spec, "--", "sh", "-c", "id -u; id -g; id -G"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{spec}: {}", out.stderr);
    out.stdout
}

#[test]
fn a_group_is_taken_by_name_or_number_with_the_users_supplementary_groups() {
    let fake = FakeAuthority::start();
    // nobody is in no group of its own: the list is the primary group.
    assert_eq!(ids_of_a_job(&fake, "nobody:daemon"), "65534\n1\n1\n");
    assert_eq!(ids_of_a_job(&fake, "65534:4242"), "65534\n4242\n4242\n");
}
