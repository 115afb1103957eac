//! The shipped units under a real systemd (booted in private namespaces by
//! `support::sysns`): what only a service manager shows. Each test boots its
//! own systemd, starts `leaseagent-serve.service` as the authority on the
//! namespace's loopback, and runs `leaseagent@TASK.service` instances with
//! a drop-in for short timings, the way a user would shorten them. The
//! authority's auth file and tokens are staged where the package's postinst
//! generates them (`/etc/leaseagent/serve-auth.toml`, `serve-agent.token`,
//! `serve-operator.token`, root's, 0600): the unit refuses to start without
//! them, and serve sees them as a credential of its dynamic user.

use crate::support::{alive, sysns};

use std::time::Duration;

use sysns::{Stage, Systemd};

const LONG: Duration = Duration::from_secs(60);
const SERVE: &str = "leaseagent-serve.service";

/// The drop-in a user would write with `systemctl edit leaseagent@.service`:
/// short timings, and a directory the jobs may write to.
const DROPIN: &str =
    "[Service]\nWatchdogSec=10s\nRestartSec=1s\nTimeoutStopSec=30s\nReadWritePaths=/srv/out\n";

/// An env file for `leaseagent@NAME.service` running `sleeper.sh` on TASK.
fn env_file(name: &str, task: &str) -> String {
    format!(
        "LEASEAGENT_COMMAND=/srv/sleeper.sh\nLEASEAGENT_AUTHORITY=http://127.0.0.1:7878\n\
         LEASEAGENT_AUTH_TOKEN_FILE={AGENT_TOKEN}\n\
         LEASEAGENT_TASK={task}\nLEASEAGENT_OPTS=--ttl 6s --grace 2s\n\
         OUT=/srv/out/{name}.out\nPIDS=/srv/out/{name}.pids\n"
    )
}

const AUTH_FILE: &str = "/etc/leaseagent/serve-auth.toml";
const AGENT_TOKEN: &str = "/etc/leaseagent/serve-agent.token";
const OPERATOR_TOKEN: &str = "/etc/leaseagent/serve-operator.token";

/// `leaseagent token new`: a fresh token and its `token_sha256 = "…"` line.
fn token_new() -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaseagent"))
        .args(["token", "new"])
        .output()
        .unwrap();
    assert!(out.status.success(), "token new: {}", out.status);
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// An auth file in the postinst's format: one operator, one agent, every task.
fn auth_file(principals: &[(&str, &str, &str)]) -> String {
    principals
        .iter()
        .map(|(name, role, sha)| {
            format!("[[principal]]\nname = \"{name}\"\nrole = \"{role}\"\n{sha}tasks = [\"*\"]\n\n")
        })
        .collect()
}

/// The stage with the authority's credentials, as the package generates them.
fn with_serve_auth(stage: &Stage) -> Stage {
    let (agent, agent_sha) = token_new();
    let (operator, operator_sha) = token_new();
    stage
        .clone()
        .secret(
            AUTH_FILE,
            &auth_file(&[
                ("local-operator", "operator", &operator_sha),
                ("local-agent", "agent", &agent_sha),
            ]),
        )
        .secret(AGENT_TOKEN, &agent)
        .secret(OPERATOR_TOKEN, &operator)
}

fn stage() -> Stage {
    Stage::new()
        .helper("sleeper.sh")
        .file(
            "/etc/systemd/system/leaseagent@.service.d/test.conf",
            DROPIN,
        )
        .file("/etc/leaseagent/demo.env", &env_file("demo", "demo"))
}

/// Boots with the stage and starts the authority unit.
fn boot(stage: &Stage) -> Systemd {
    let sd = Systemd::boot(&with_serve_auth(stage));
    sd.systemctl(&["start", SERVE]);
    // Type=exec: started once exec'd; wait until it answers.
    let until = std::time::Instant::now() + LONG;
    while !String::from_utf8_lossy(&sd.http_get(7878, "/healthz").stdout).contains("200") {
        assert!(
            std::time::Instant::now() < until,
            "serve does not answer\n{}",
            sd.journal(SERVE)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sd
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn environ(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The machine pid of the job (`sleeper.sh`) in a unit's cgroup.
fn job_pid(sd: &Systemd, unit: &str) -> Option<i32> {
    sd.cgroup_pids(unit)
        .into_iter()
        .find(|p| cmdline(*p).contains("/srv/sleeper.sh") && !cmdline(*p).contains("leaseagent"))
}

/// The token in a `STATUS=` text ("holding token 7" and the like).
fn status_token(status: &str) -> Option<u64> {
    let i = status.find("token ")?;
    status[i + 6..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + within;
    while !f() {
        assert!(
            std::time::Instant::now() < until,
            "{what}: not after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `unit` (an instance of leaseagent@) and waits until its job wrote
/// "ready" to /srv/out/INSTANCE.out.
fn start_until_ready(sd: &Systemd, unit: &str) {
    let instance = unit
        .trim_start_matches("leaseagent@")
        .trim_end_matches(".service");
    sd.systemctl(&["start", unit]);
    wait_until(LONG, "job ready", || {
        sd.read(&format!("/srv/out/{instance}.out"))
            .contains("ready")
    });
}

/// `leaseagent leases --json` against the staged serve.
fn leases_json(sd: &Systemd) -> String {
    sd.text(&[
        "leaseagent",
        "leases",
        "--json",
        "--authority",
        "http://127.0.0.1:7878",
        "--auth-token-file",
        OPERATOR_TOKEN,
    ])
}

#[test]
fn start_returns_once_the_job_runs_with_the_token_in_the_status() {
    let sd = boot(&stage());
    sd.systemctl(&["start", "leaseagent@demo.service"]);
    // No polling: Type=notify means start returned after READY=1.
    let unit = "leaseagent@demo.service";
    assert_eq!(sd.prop(unit, "ActiveState"), "active");
    assert_eq!(sd.prop(unit, "SubState"), "running");
    let status = sd.prop(unit, "StatusText");
    let token = status_token(&status)
        .unwrap_or_else(|| panic!("no token in status {status:?}\n{}", sd.journal(unit)));
    let job = job_pid(&sd, unit).unwrap_or_else(|| {
        panic!(
            "job not in the cgroup when start returned: {:?}\n{}",
            sd.cgroup_pids(unit),
            sd.journal(unit)
        )
    });
    assert!(
        environ(job).contains(&format!("LEASE_TOKEN={token}")),
        "job env {:?} lacks token {token}",
        environ(job)
    );
    // The authority agrees.
    let leases = leases_json(&sd);
    assert!(leases.contains("\"demo\""), "{leases}");
    assert!(leases.contains(&format!("{token}")), "{leases}");
    // `systemctl status` shows it too.
    let st = sd.text(&["systemctl", "status", "--no-pager", unit]);
    assert!(st.contains(&format!("Status: \"{status}\"")), "{st}");
}

#[test]
fn stop_gives_the_job_sigterm_and_ends_inactive_success() {
    let sd = boot(&stage());
    let unit = "leaseagent@demo.service";
    start_until_ready(&sd, unit);
    let before = sd.cgroup_pids(unit);
    assert!(before.len() >= 3, "agent, keeper, job: {before:?}");
    sd.systemctl(&["stop", unit]);
    assert!(
        sd.read("/srv/out/demo.out").contains("got TERM"),
        "job did not get SIGTERM: {:?}\n{}",
        sd.read("/srv/out/demo.out"),
        sd.journal(unit)
    );
    assert_eq!(
        sd.prop(unit, "ActiveState"),
        "inactive",
        "{}",
        sd.journal(unit)
    );
    assert_eq!(sd.prop(unit, "Result"), "success", "{}", sd.journal(unit));
    assert!(sd.cgroup_pids(unit).is_empty());
    for p in before {
        assert!(!alive(p), "{p} ({}) outlived the stop", cmdline(p));
    }
    // The lease was released: the task is free for anyone at once.
    let leases = leases_json(&sd);
    assert!(!leases.contains("\"demo\""), "lease left behind: {leases}");
}

#[test]
fn exit_75_is_not_restarted_but_a_lost_lease_is() {
    let sd = boot(&stage().file("/etc/leaseagent/second.env", &env_file("second", "demo")));
    let unit = "leaseagent@demo.service";
    sd.systemctl(&["start", unit]);
    let first_token = status_token(&sd.prop(unit, "StatusText")).unwrap();
    let first_main = sd.prop(unit, "MainPID");

    // A second instance on the same task: held elsewhere, 75, no restart.
    let second = "leaseagent@second.service";
    let out = sd.run(&["systemctl", "start", second]);
    assert!(!out.status.success(), "start of a held task succeeded");
    let state = sd.wait_prop(second, "ActiveState", LONG, |s| s != "activating");
    assert_eq!(state, "failed", "{}", sd.journal(second));
    assert_eq!(sd.prop(second, "ExecMainStatus"), "75");
    assert_eq!(sd.prop(second, "Result"), "exit-code");
    // Well past RestartSec=1s, still no restart.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(sd.prop(second, "NRestarts"), "0", "{}", sd.journal(second));
    assert_eq!(sd.prop(second, "ActiveState"), "failed");

    // The lease is revoked (and freed): the agent exits 124, systemd restarts it.
    let out = sd.text(&[
        "leaseagent",
        "revoke",
        "--force",
        "--authority",
        "http://127.0.0.1:7878",
        "--auth-token-file",
        OPERATOR_TOKEN,
        "demo",
    ]);
    sd.wait_prop(unit, "NRestarts", LONG, |n| n == "1");
    sd.wait_prop(unit, "ActiveState", LONG, |s| s == "active");
    let journal = sd.journal(unit);
    assert!(
        journal.contains("status=124"),
        "no exit 124 before the restart (revoke said {out:?}):\n{journal}"
    );
    assert_ne!(sd.prop(unit, "MainPID"), first_main);
    let token = status_token(&sd.prop(unit, "StatusText")).unwrap();
    assert!(token > first_token, "token {token} after {first_token}");
}

#[test]
fn a_stopped_agent_is_killed_by_the_watchdog_with_its_job() {
    let sd = boot(&stage());
    let unit = "leaseagent@demo.service";
    start_until_ready(&sd, unit);
    let agent = sd.main_pid(unit);
    let old = sd.cgroup_pids(unit);
    let job = job_pid(&sd, unit).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(agent).unwrap(),
        rustix::process::Signal::STOP,
    )
    .unwrap();
    // WatchdogSec=10s (pings every 5 s, so a busy machine never trips it elsewhere): the agent is aborted, the keeper kills the job's group.
    wait_until(LONG, "old attempt gone", || old.iter().all(|p| !alive(*p)));
    assert!(!alive(job));
    let journal = sd.journal(unit);
    assert!(journal.contains("Watchdog timeout"), "{journal}");
    // And Restart=on-failure brings the task back.
    sd.wait_prop(unit, "NRestarts", LONG, |n| n != "0");
    sd.wait_prop(unit, "ActiveState", LONG, |s| s == "active");
}

#[test]
fn sigkill_of_the_agent_leaves_nothing_in_the_cgroup() {
    // A slow restart, so the emptied cgroup can be looked at.
    let sd = boot(&stage().file(
        "/etc/systemd/system/leaseagent@demo.service.d/slow-restart.conf",
        "[Service]\nRestartSec=10min\n",
    ));
    let unit = "leaseagent@demo.service";
    start_until_ready(&sd, unit);
    let agent = sd.main_pid(unit);
    let old = sd.cgroup_pids(unit);
    assert!(old.len() >= 4, "agent, keeper, job, grandchild: {old:?}");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(agent).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    sd.wait_prop(unit, "SubState", LONG, |s| s == "auto-restart");
    wait_until(LONG, "cgroup empty", || sd.cgroup_pids(unit).is_empty());
    for p in old {
        assert!(!alive(p), "{p} ({}) outlived the agent", cmdline(p));
    }
    assert_eq!(sd.prop(unit, "Result"), "signal");
}

#[test]
fn the_serve_unit_answers_healthz() {
    let sd = boot(&Stage::new());
    let out = sd.http_get(7878, "/healthz");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"ok\":true"), "{text}");
    assert_eq!(sd.prop(SERVE, "ActiveState"), "active");
    // It runs as a dynamic user, not root.
    let main = sd.main_pid(SERVE);
    let status = std::fs::read_to_string(format!("/proc/{main}/status")).unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    assert_ne!(uid, "0", "serve runs as root");
}

#[test]
fn the_nightly_timer_is_scheduled() {
    let sd = Systemd::boot(&Stage::new().file(
        "/etc/leaseagent/nightly-export.env",
        "LEASEAGENT_COMMAND=/bin/true\n",
    ));
    let timer = "leaseagent@nightly-export.timer";
    sd.systemctl(&["start", timer]);
    assert_eq!(sd.prop(timer, "ActiveState"), "active");
    assert_eq!(
        sd.prop(timer, "Triggers"),
        "leaseagent@nightly-export.service"
    );
    let shown = sd.prop(timer, "NextElapseUSecRealtime");
    // `date` inside reads the timestamp in the system's own time zone.
    let next = sd.text(&["date", "-d", &shown, "+%s"]);
    let next: u64 = next
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no next elapse: {shown:?} -> {next:?}"));
    // 02:00 local time plus at most RandomizedDelaySec=60s (and AccuracySec=1s), within a day.
    let offset = sd.text(&["date", "+%z"]);
    let offset = offset.trim();
    let sign = if offset.starts_with('-') { -1i64 } else { 1 };
    let hh: i64 = offset[1..3].parse().unwrap();
    let mm: i64 = offset[3..5].parse().unwrap();
    let local = next as i64 + sign * (hh * 3600 + mm * 60);
    let in_day = local.rem_euclid(86_400);
    assert!(
        (7200..=7262).contains(&in_day),
        "next elapse {next} is {in_day}s into the local day"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        next > now && next <= now + 86_400 + 60,
        "next {next}, now {now}"
    );
    let listed = sd.text(&["systemctl", "list-timers", "--no-pager", "--all"]);
    assert!(listed.contains(timer), "{listed}");
}

#[test]
fn teardown_leaves_no_process_cgroup_or_directory() {
    let sd = boot(&stage());
    sd.systemctl(&["start", "leaseagent@demo.service"]);
    let pids = sd.cgroup_pids("leaseagent@demo.service");
    let (name, work, pid) = (sd.name.clone(), sd.work.clone(), sd.pid);
    assert!(Systemd::leftovers(&name, &work, pid).len() >= 2);
    drop(sd);
    assert_eq!(Systemd::leftovers(&name, &work, pid), Vec::<String>::new());
    for p in pids {
        assert!(!alive(p), "{p} ({}) left behind", cmdline(p));
    }
}

#[test]
fn booting_changes_nothing_on_the_machine() {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let watched = [
        "/proc/sys/kernel/hostname",
        "/proc/sys/kernel/pid_max",
        "/proc/sys/fs/nr_open",
        "/proc/sys/net/unix/max_dgram_qlen",
        "/etc/passwd",
        "/etc/machine-id",
    ];
    let before: Vec<String> = watched.iter().map(|p| read(p)).collect();
    let canary = tempfile::Builder::new()
        .prefix("leaseagent-canary")
        .tempfile_in("/tmp")
        .unwrap();
    let sd = boot(&stage());
    sd.systemctl(&["start", "leaseagent@demo.service"]);
    // Inside, /tmp is another one, and sysusers added a user to the copy of /etc.
    assert!(!sd.path(canary.path().to_str().unwrap()).exists());
    assert!(sd.read("/etc/passwd").contains("leaseagent:"));
    drop(sd);
    assert!(canary.path().exists(), "the machine's /tmp was touched");
    let after: Vec<String> = watched.iter().map(|p| read(p)).collect();
    assert_eq!(before, after, "{watched:?} changed");
}

/// A job that says who it runs as and what `leaseagent check` answers it,
/// then sleeps as `sleeper.sh`.
const CHECK_JOB: &str = "#!/bin/sh\n\
    id -u > /srv/out/asuser.id\n\
    leaseagent check --json > /srv/out/asuser.check 2>&1; echo \"rc=$?\" >> /srv/out/asuser.check\n\
    exec /srv/sleeper.sh\n";

/// The uid of `name` in the booted system's /etc/passwd.
fn uid_of(sd: &Systemd, name: &str) -> u32 {
    sd.read("/etc/passwd")
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name)).then(|| f[2].parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} in /etc/passwd"))
}

fn uid(pid: i32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no uid for {pid}"))
}

#[test]
fn the_job_runs_as_leaseagent_under_a_root_agent_and_stop_still_stops_it() {
    let env = env_file("asuser", "asuser").replace(
        "LEASEAGENT_COMMAND=/srv/sleeper.sh",
        "LEASEAGENT_COMMAND=/srv/check-job.sh",
    );
    let sd = boot(
        &stage()
            .file("/srv/check-job.sh", CHECK_JOB)
            .file("/etc/leaseagent/asuser.env", &env),
    );
    let unit = "leaseagent@asuser.service";
    start_until_ready(&sd, unit);
    let leaseagent = uid_of(&sd, "leaseagent");
    assert_ne!(leaseagent, 0);
    let job = job_pid(&sd, unit).unwrap();
    assert_eq!(uid(job), leaseagent, "{}", sd.journal(unit));
    assert_eq!(sd.read("/srv/out/asuser.id").trim(), leaseagent.to_string());
    let agent = sd.main_pid(unit);
    assert_eq!(uid(agent), 0, "the agent runs as root");
    let pids = sd.cgroup_pids(unit);
    let keeper = pids
        .iter()
        .copied()
        .find(|p| cmdline(*p).starts_with("leaseagent-keeper"))
        .unwrap_or_else(|| panic!("no keeper in {pids:?}"));
    assert_eq!(uid(keeper), 0, "the keeper runs as root");
    // The job reached its state file, as the other user.
    let check = sd.read("/srv/out/asuser.check");
    assert!(
        check.contains("\"ok\":true") && check.ends_with("rc=0\n"),
        "{check}\n{}",
        sd.journal(unit)
    );
    // `systemctl stop` still stops the whole tree and releases the lease.
    sd.systemctl(&["stop", unit]);
    assert!(sd.read("/srv/out/asuser.out").contains("got TERM"));
    assert_eq!(sd.prop(unit, "Result"), "success", "{}", sd.journal(unit));
    for p in pids {
        assert!(!alive(p), "{p} ({}) outlived the stop", cmdline(p));
    }
    let leases = leases_json(&sd);
    assert!(
        !leases.contains("\"asuser\""),
        "lease left behind: {leases}"
    );
}

/// The HTTP status of `GET PATH` on the unit's serve.
fn status_of(sd: &Systemd, path: &str, token_file: Option<&str>) -> String {
    sd.http_status(7878, path, token_file)
}

/// The packaged serve unit has no credential-less default (issue #33): a
/// request without a token gets 401, the generated agent token acquires a
/// lease and may not revoke, the generated operator token lists and
/// revokes. An edit of the auth file reaches serve on restart (the
/// credential is a copy taken at start), not on `systemctl reload`.
#[test]
fn the_serve_unit_refuses_no_token_and_takes_the_generated_ones() {
    let sd = boot(&stage());
    // No token: 401, on a listing and on an acquire through the CLI.
    assert_eq!(status_of(&sd, "/v1/leases", None), "401");
    let out = sd.run(&[
        "leaseagent",
        "--authority",
        "http://127.0.0.1:7878",
        "--task",
        "probe",
        "--",
        "/bin/true",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("unauthenticated"), "{err}");
    // The agent token: an acquire (the instance holds its lease with it),
    // but no operator call.
    start_until_ready(&sd, "leaseagent@demo.service");
    // Known, but an agent may not list: 403, not 401.
    assert_eq!(status_of(&sd, "/v1/leases", Some(AGENT_TOKEN)), "403");
    let revoke = |token: &str| sd.revoke("http://127.0.0.1:7878", token, "demo");
    let out = revoke(AGENT_TOKEN);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the agent token revoked: {err}");
    assert!(err.contains("forbidden"), "{err}");
    // The operator token: the listing shows the instance's lease, and the
    // revoke goes through (the instance's next renewal is told so).
    let leases = leases_json(&sd);
    assert!(leases.contains("\"demo\""), "{leases}");
    let out = revoke(OPERATOR_TOKEN);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    sd.systemctl(&["stop", "leaseagent@demo.service"]);

    // A third principal added to the auth file.
    let (reader, reader_sha) = token_new();
    let mut auth = sd.read(AUTH_FILE);
    auth.push_str(&auth_file(&[("added", "reader", &reader_sha)]));
    std::fs::write(sd.path(AUTH_FILE), auth).unwrap();
    std::fs::write(sd.path("/etc/leaseagent/reader.token"), reader).unwrap();
    std::fs::set_permissions(
        sd.path("/etc/leaseagent/reader.token"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let reader_file = Some("/etc/leaseagent/reader.token");
    sd.systemctl(&["reload", SERVE]);
    // serve re-read its auth file (the credential's copy) ...
    wait_until(LONG, "serve re-reads its auth file", || {
        sd.journal(SERVE)
            .contains("auth file reloaded: 2 principal(s)")
    });
    // ... which systemd did not refresh: the added token is unknown.
    let after_reload = status_of(&sd, "/v1/leases", reader_file);
    eprintln!("after reload: {after_reload}");
    assert_eq!(
        after_reload, "401",
        "reload now sees the edited auth file: say so in the unit and docs/systemd.md"
    );
    sd.systemctl(&["restart", SERVE]);
    let until = std::time::Instant::now() + LONG;
    loop {
        let st = status_of(&sd, "/v1/leases", reader_file);
        if st == "200" {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the added token after a restart: {st}\n{}",
            sd.journal(SERVE)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The generated ones still work.
    assert_eq!(status_of(&sd, "/v1/leases", Some(OPERATOR_TOKEN)), "200");
}

/// Writes a root 0600 file inside.
fn write_secret(sd: &Systemd, path: &str, content: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(sd.path(path), content).unwrap();
    std::fs::set_permissions(sd.path(path), std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `leaseagent-serve@.service` (issue #35): two instances, replicas `a`
/// and `b`, on one PostgreSQL 15 (run by `nobody` on the namespace's
/// loopback), configured the documented way (`serve-NAME.env`, the
/// password in `serve-NAME.store-password`, the package's auth file):
/// exactly one leads and the other says standby; an agent given both URLs
/// and the agent token holds a lease through them; the leader's stop hands
/// leadership to the other.
#[test]
fn two_replica_instances_share_a_postgresql_store_and_one_leads() {
    let sd = boot(&stage());
    let pg = crate::support::postgres::Postgres::start_in_netns(sd.pid);
    let password = std::fs::read_to_string(&pg.password_file).unwrap();
    let ports = [("a", 7881u16), ("b", 7882u16)];
    for (name, port) in ports {
        std::fs::write(
            sd.path(&format!("/etc/leaseagent/serve-{name}.env")),
            format!(
                "LEASEAGENT_STORE={}\nLEASEAGENT_ADVERTISE=http://127.0.0.1:{port}\n\
                 LEASEAGENT_LISTEN=127.0.0.1:{port}\nLEASEAGENT_SERVE_OPTS=--leader-ttl 3s\n",
                pg.url("postgres")
            ),
        )
        .unwrap();
        write_secret(
            &sd,
            &format!("/etc/leaseagent/serve-{name}.store-password"),
            &password,
        );
    }
    sd.systemctl(&[
        "start",
        "leaseagent-serve@a.service",
        "leaseagent-serve@b.service",
    ]);
    // Each replica's /healthz: 200 from the leader, 503 from a standby.
    let health = |port: u16| sd.http_status(port, "/healthz", None);
    let leader = |within: Duration| {
        let until = std::time::Instant::now() + within;
        loop {
            let seen = (health(7881), health(7882));
            match (seen.0.as_str(), seen.1.as_str()) {
                ("200", "503") => return "a",
                ("503", "200") => return "b",
                _ => {}
            }
            assert!(
                std::time::Instant::now() < until,
                "no single leader: {seen:?}\n{}\n{}",
                sd.journal("leaseagent-serve@a.service"),
                sd.journal("leaseagent-serve@b.service")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let first = leader(LONG);
    for (name, _) in ports {
        let unit = format!("leaseagent-serve@{name}.service");
        assert_eq!(sd.prop(&unit, "ActiveState"), "active");
        let cmd = cmdline(sd.main_pid(&unit));
        assert!(
            cmd.contains(&format!(
                "--store-password-file /run/credentials/{unit}/store-password"
            )) && cmd.contains(&format!("--auth-file /run/credentials/{unit}/auth.toml")),
            "{cmd}"
        );
        // Not root: a dynamic user.
        assert_ne!(uid(sd.main_pid(&unit)), 0);
    }
    // No token: 401 on the leader too.
    let leader_port = if first == "a" { 7881 } else { 7882 };
    assert_eq!(sd.http_status(leader_port, "/v1/leases", None), "401");
    // An agent with both URLs and the agent token.
    let run = |task: &str| {
        sd.run(&[
            "leaseagent",
            "--authority",
            "http://127.0.0.1:7881,http://127.0.0.1:7882",
            "--auth-token-file",
            AGENT_TOKEN,
            "--task",
            task,
            "--",
            "/bin/true",
        ])
    };
    let out = run("replicated");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The leader stops: the other replica leads, and the agent gets its
    // lease from it.
    sd.systemctl(&["stop", &format!("leaseagent-serve@{first}.service")]);
    let other = if first == "a" { "b" } else { "a" };
    let other_port = if other == "a" { 7881 } else { 7882 };
    let until = std::time::Instant::now() + LONG;
    while health(other_port) != "200" {
        assert!(
            std::time::Instant::now() < until,
            "{other} did not take over\n{}",
            sd.journal(&format!("leaseagent-serve@{other}.service"))
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = run("replicated");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sd.systemctl(&["stop", &format!("leaseagent-serve@{other}.service")]);
    drop(sd);
    drop(pg);
}
