//! The Debian package, installed the way a user installs it: `apt-get
//! install ./leaseagent_….deb` into a fresh root (a copy-on-write overlay of
//! the machine's `/`, `support::sysns`) under a real systemd booted there.
//! The package must bring the binaries, units, user, man pages, completions
//! and docs; enable and start nothing; run `leaseagent@demo.service` holding
//! a lease on the embedded authority once an env file exists; and on
//! `apt-get remove` leave nothing running (the template's instances are
//! stopped, their job with them), on `purge` no state.
//!
//! The root is the test's own, whatever the machine has: it starts without
//! `/usr/sbin/policy-rc.d` (container images ship one that forbids every
//! service action), and each test writes the policy it is about: none,
//! one that allows (exit 0), one that forbids (exit 101). The machine's own
//! policy file is never written (the overlay's upper layer takes every
//! write) and each test checks it is byte for byte what it was.
//!
//! What the package does under a forbidding policy (docs/systemd.md,
//! "Removing the package"): the policy is the administrator's, so the prerm
//! stops nothing, but it names every unit still running and how to stop it;
//! the agents go on from the deleted binary, renewing their leases, with
//! their units intact (the postrm does not reload systemd while they run,
//! and purge keeps `/var/lib/leaseagent`, where their leases live); a later
//! `systemctl stop` stops the job's whole tree and releases the lease, and a
//! standby that acquires only then starts its keeper from the deleted binary
//! (`/proc/self/exe`).
//!
//! The package is `LEASEAGENT_DEB` (`scripts/test` builds it once with
//! `scripts/deb` and passes it on); without it this test runs `scripts/deb`
//! itself, which takes minutes for the release build.

use crate::support::{alive, fence::children, sysns::Systemd, wait_for};

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Where `invoke-rc.d` and `deb-systemd-invoke` look for the policy.
const POLICY: &str = "/usr/sbin/policy-rc.d";

/// The package, built once per test process (scripts/deb also takes a
/// lock, for test processes run side by side).
fn deb() -> PathBuf {
    static DEB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DEB.get_or_init(build_deb).clone()
}

fn build_deb() -> PathBuf {
    if let Some(p) = std::env::var_os("LEASEAGENT_DEB") {
        return PathBuf::from(p);
    }
    let script = format!("{}/scripts/deb", env!("CARGO_MANIFEST_DIR"));
    let mut c = Command::new(&script);
    // What cargo set for this test is not the package build's: ring's build
    // script reruns when CARGO_PKG_* or CARGO_MANIFEST_DIR differ, which
    // would relink the release build here and again in the next scripts/deb.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let set_by_cargo = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
        ]
        .iter()
        .any(|p| k.starts_with(p))
            || [
                "CARGO",
                "CARGO_TARGET_TMPDIR",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&k.as_str());
        if set_by_cargo {
            c.env_remove(&k);
        }
    }
    let out = c.output().expect("scripts/deb");
    assert!(
        out.status.success(),
        "scripts/deb: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(stdout.lines().last().expect("scripts/deb printed no path"))
}

/// A command inside that must succeed; its stdout and stderr.
fn ok(sd: &Systemd, args: &[&str]) -> String {
    let out = sd.run(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{args:?}: {}\n{text}", out.status);
    text
}

/// `apt-get -y ARGS`, which must succeed; its output, with the maintainer
/// scripts' lines as they wrote them (apt runs dpkg on a terminal, which
/// ends lines with CR LF).
fn apt(sd: &Systemd, args: &[&str]) -> String {
    let mut a = vec!["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y"];
    a.extend_from_slice(args);
    ok(sd, &a).replace("\r\n", "\n")
}

/// Machine pids and command lines of every process of the booted system
/// whose command line names leaseagent or a test job (`sleep 600`, `sleep 601`).
fn leaseagent_processes(sd: &Systemd) -> Vec<(i32, String)> {
    sd.processes()
        .into_iter()
        .map(|p| (p, cmdline(p)))
        .filter(|(p, cmd)| (cmd.contains("leaseagent") || cmd.contains("sleep 60")) && alive(*p))
        .collect()
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// What `/proc/PID/exe` points at (` (deleted)` once the file is gone).
fn exe(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

const INSTALLED: &[&str] = &[
    "/usr/bin/leaseagent",
    "/usr/bin/leaseagent-serve",
    "/lib/systemd/system/leaseagent@.service",
    "/lib/systemd/system/leaseagent-serve.service",
    "/lib/systemd/system/leaseagent-serve@.service",
    "/usr/lib/sysusers.d/leaseagent.conf",
    "/usr/share/man/man1/leaseagent.1.gz",
    "/usr/share/man/man1/leaseagent-serve.1.gz",
    "/usr/share/man/man1/leaseagent-publish.1.gz",
    "/usr/share/bash-completion/completions/leaseagent",
    "/usr/share/zsh/vendor-completions/_leaseagent",
    "/usr/share/fish/vendor_completions.d/leaseagent.fish",
    "/usr/share/doc/leaseagent/README.md",
    "/usr/share/doc/leaseagent/docs/systemd.md",
    "/usr/share/doc/leaseagent/copyright",
];

/// The machine's own `policy-rc.d`: content and mode, or `None` when it has
/// none. Taken before a test and compared after it.
fn machine_policy() -> Option<(Vec<u8>, u32)> {
    let meta = std::fs::symlink_metadata(POLICY).ok()?;
    let content = std::fs::read(POLICY).unwrap_or_default();
    Some((content, meta.permissions().mode()))
}

fn assert_machine_policy_unchanged(before: &Option<(Vec<u8>, u32)>) {
    let after = machine_policy();
    assert!(
        &after == before,
        "the machine's {POLICY} changed: before {:?}, after {:?}",
        before
            .as_ref()
            .map(|(c, m)| (String::from_utf8_lossy(c).into_owned(), format!("{m:o}"))),
        after
            .as_ref()
            .map(|(c, m)| (String::from_utf8_lossy(c).into_owned(), format!("{m:o}")))
    );
}

/// A booted fresh root with nothing of leaseagent, no policy-rc.d whatever
/// the machine has, and a running systemd (what the maintainer scripts
/// test with `[ -d /run/systemd/system ]`).
fn fresh_root() -> Systemd {
    let sd = Systemd::boot_fresh_root();
    let known = sd.run(&["dpkg-query", "-W", "leaseagent"]);
    assert!(
        !known.status.success(),
        "dpkg knows leaseagent in the fresh root: {}",
        String::from_utf8_lossy(&known.stdout)
    );
    for p in INSTALLED
        .iter()
        .chain(&["/var/lib/leaseagent", "/etc/leaseagent", POLICY])
    {
        assert!(
            !sd.path(p).exists(),
            "{p} in the fresh root before the install (the boot script hides the machine's)"
        );
    }
    assert!(sd.path("/run/systemd/system").is_dir());
    sd
}

/// Writes the fresh root's policy-rc.d: it logs each call ("UNIT ACTION")
/// to /srv/out/policy.log, then exits `exit`.
fn set_policy(sd: &Systemd, exit: u8) {
    let path = sd.path(POLICY);
    assert!(!path.exists(), "a policy-rc.d is there already");
    std::fs::write(
        &path,
        format!("#!/bin/sh\necho \"$@\" >> /srv/out/policy.log\nexit {exit}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn install(sd: &Systemd, deb: &std::path::Path) -> String {
    assert!(deb.is_file(), "no package at {}", deb.display());
    std::fs::copy(deb, sd.path("/tmp/leaseagent.deb")).unwrap();
    let started = Instant::now();
    let log = apt(sd, &["install", "/tmp/leaseagent.deb"]);
    eprintln!("apt-get install took {:?}", started.elapsed());
    for p in INSTALLED {
        assert!(sd.path(p).exists(), "{p} not installed\n{log}");
    }
    log
}

/// Starts `leaseagent@TASK.service` and waits until it holds `token`; the
/// machine pids of its running processes.
fn start_holding(sd: &Systemd, task: &str, token: u64) -> Vec<(i32, String)> {
    let unit = format!("leaseagent@{task}.service");
    sd.systemctl(&["start", &unit]);
    assert_eq!(sd.prop(&unit, "ActiveState"), "active");
    let status = sd.prop(&unit, "StatusText");
    assert!(
        status.contains(&format!("holding token {token}")),
        "{status}\n{}",
        sd.journal(&unit)
    );
    let running = leaseagent_processes(sd);
    assert!(
        running.iter().any(|(_, c)| c.starts_with("/bin/sleep 60")),
        "the job is not running: {running:?}"
    );
    running
}

/// The README quotes the package's size: it is the size of the package
/// built here, to 5 % (a figure in the README that nothing checks goes
/// stale: #47 found 2.4 MB quoted for a 2.85 MB package).
#[test]
fn the_readme_quotes_the_size_of_the_package_it_builds() {
    let readme = std::fs::read_to_string(repo_file("README.md")).unwrap();
    let quoted: f64 = readme
        .split("-1_<arch>.deb` (")
        .nth(1)
        .and_then(|rest| rest.split(" MB").next())
        .and_then(|n| n.trim().parse().ok())
        .expect("README.md names the package `leaseagent_<version>-1_<arch>.deb` (N MB ...)");
    let built = std::fs::metadata(deb()).unwrap().len() as f64 / 1e6;
    assert!(
        (quoted - built).abs() <= built * 0.05,
        "README.md quotes {quoted} MB for the package; scripts/deb built {built:.2} MB: update the figure"
    );
}

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn apt_installs_it_in_a_fresh_root_runs_a_task_and_removes_it_cleanly() {
    let policy_before = machine_policy();
    let deb = deb();
    // No policy-rc.d in the root (the machine may well have one).
    let sd = fresh_root();
    let log = install(&sd, &deb);
    // The units point at the packaged binaries.
    let unit = sd.read("/lib/systemd/system/leaseagent@.service");
    assert!(unit.contains("ExecStart=/usr/bin/leaseagent "), "{unit}");
    ok(&sd, &["getent", "passwd", "leaseagent"]);
    // Nothing enabled, nothing started.
    let serve = "leaseagent-serve.service";
    assert_eq!(sd.prop(serve, "UnitFileState"), "disabled");
    assert_eq!(sd.prop(serve, "ActiveState"), "inactive");
    assert_eq!(leaseagent_processes(&sd), Vec::new(), "{log}");
    let version = ok(&sd, &["leaseagent", "--version"]);
    assert_eq!(
        version,
        format!("leaseagent {}\n", env!("CARGO_PKG_VERSION"))
    );
    // The man page is found where man looks.
    let page = ok(&sd, &["man", "-w", "leaseagent-serve"]);
    assert!(
        page.contains("/usr/share/man/man1/leaseagent-serve.1.gz"),
        "{page}"
    );

    // One task on the embedded authority, as docs/systemd.md describes.
    std::fs::write(
        sd.path("/etc/leaseagent/demo.env"),
        "LEASEAGENT_COMMAND=/bin/sleep 600\nLEASEAGENT_OPTS=--ttl 10s --grace 2s\n",
    )
    .unwrap();
    let demo = "leaseagent@demo.service";
    // The packaged units verify, their Documentation= man pages included
    // (the replica template through an instance).
    let verify = ok(
        &sd,
        &[
            "systemd-analyze",
            "verify",
            demo,
            serve,
            "leaseagent-serve@a.service",
        ],
    );
    assert_eq!(verify, "", "systemd-analyze verify");
    let running = start_holding(&sd, "demo", 1);
    let leases = ok(
        &sd,
        &[
            // The units' agent is root (the command runs as leaseagent),
            // and so is their state directory.
            "env",
            "LEASEAGENT_STATE_DIR=/var/lib/leaseagent",
            "leaseagent",
            "leases",
            "--json",
        ],
    );
    assert!(
        leases.contains("\"task\":\"demo\"") && leases.contains("\"token\":1"),
        "{leases}"
    );

    // Remove: every instance stopped with its job, nothing left running.
    // The prerm's stop is synchronous, so this is at once, not after the
    // watchdog (without it, the daemon-reload after removal leaves the
    // agent's notify messages unheard and the watchdog aborts it 30 s
    // later, its lease not released).
    let log = apt(&sd, &["remove", "leaseagent"]);
    assert_stopped_by_remove(&sd, &running, &log);
    assert_ne!(sd.prop(demo, "ActiveState"), "active");
    let journal = sd.journal(demo);
    assert!(
        journal.contains("released task demo token 1"),
        "the lease was not released on remove:\n{journal}"
    );
    assert_forgotten_files(&sd);
    // remove keeps the state; purge deletes it (the administrator's env file stays).
    assert!(sd.path("/var/lib/leaseagent").exists());
    apt(&sd, &["purge", "leaseagent"]);
    assert!(!sd.path("/var/lib/leaseagent").exists());
    assert!(sd.path("/etc/leaseagent/demo.env").exists());
    assert_forgotten(&sd);
    assert_eq!(leaseagent_processes(&sd), Vec::new());

    // All of it happened in the overlay: the machine's own root has none of it.
    drop(sd);
    for p in [
        "/usr/bin/leaseagent",
        "/lib/systemd/system/leaseagent@.service",
        "/var/lib/dpkg/info/leaseagent.list",
        "/usr/share/man/man1/leaseagent.1.gz",
    ] {
        assert!(!std::path::Path::new(p).exists(), "{p} on the machine");
    }
    assert_machine_policy_unchanged(&policy_before);
}

fn assert_forgotten(sd: &Systemd) {
    let left = sd.run(&["dpkg-query", "-W", "-f", "${Status}", "leaseagent"]);
    assert!(
        !left.status.success() || String::from_utf8_lossy(&left.stdout).contains("not-installed"),
        "dpkg still knows leaseagent: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

/// The machine's policy-rc.d as it was, and a fresh root with a policy
/// that exits `exit` and the package installed.
fn installed_under_policy(exit: u8) -> (Option<(Vec<u8>, u32)>, Systemd) {
    let policy_before = machine_policy();
    let deb = deb();
    let sd = fresh_root();
    set_policy(&sd, exit);
    install(&sd, &deb);
    (policy_before, sd)
}

/// The root's policy was asked about the stop of the instances.
fn assert_policy_asked(sd: &Systemd, log: &str) {
    let asked = sd.read("/srv/out/policy.log");
    assert!(
        asked.contains("leaseagent@*.service stop"),
        "the root's policy was not asked: {asked:?}\n{log}"
    );
}

/// The processes of `running` all end at once after `apt-get remove`
/// (whose output is `log`), and remove said nothing was left running.
fn assert_stopped_by_remove(sd: &Systemd, running: &[(i32, String)], log: &str) {
    let gone = wait_for(Duration::from_secs(3), || {
        running.iter().all(|(p, _)| !alive(*p)).then_some(())
    });
    assert!(
        gone.is_some(),
        "still running after remove: {:?}\n{log}",
        leaseagent_processes(sd)
    );
    assert_eq!(leaseagent_processes(sd), Vec::new());
    assert!(!log.contains("were not stopped"), "{log}");
}

/// A policy that allows (exit 0): it is asked, and remove stops every
/// instance with its job and releases the lease.
#[test]
fn remove_under_a_policy_that_allows_stops_every_instance_and_releases_its_lease() {
    let (policy_before, sd) = installed_under_policy(0);
    std::fs::write(
        sd.path("/etc/leaseagent/allowed.env"),
        "LEASEAGENT_COMMAND=/bin/sleep 600\nLEASEAGENT_OPTS=--ttl 10s --grace 2s\n",
    )
    .unwrap();
    let running = start_holding(&sd, "allowed", 1);
    let log = apt(&sd, &["remove", "leaseagent"]);
    assert_policy_asked(&sd, &log);
    assert_stopped_by_remove(&sd, &running, &log);
    let unit = "leaseagent@allowed.service";
    assert_ne!(sd.prop(unit, "ActiveState"), "active");
    let journal = sd.journal(unit);
    assert!(
        journal.contains("released task allowed token 1"),
        "the lease was not released on remove:\n{journal}"
    );
    apt(&sd, &["purge", "leaseagent"]);
    assert!(!sd.path("/var/lib/leaseagent").exists());
    assert_forgotten(&sd);
    drop(sd);
    assert_machine_policy_unchanged(&policy_before);
}

/// How many times the journal of `unit` says `what`.
fn count_in_journal(sd: &Systemd, unit: &str, what: &str) -> usize {
    sd.journal(unit).matches(what).count()
}

/// A policy that forbids (exit 101), what container images ship. Decided
/// (docs/systemd.md, "Removing the package"): the policy is the
/// administrator's, so remove and purge stop nothing, but they say so,
/// naming every unit still running and the command that stops it. Those
/// agents go on from the deleted binary, renewing their leases, their units
/// intact (no reload while they run; purge keeps /var/lib/leaseagent, where
/// the leases live); `systemctl stop` later stops the job's whole tree and
/// releases the lease; a standby that acquires only then starts its keeper
/// from the deleted binary.
#[test]
fn remove_under_a_policy_that_forbids_names_what_runs_on_and_it_stays_stoppable() {
    let (policy_before, sd) = installed_under_policy(101);
    // Short timings, the way an administrator would shorten them: with
    // WatchdogSec=3s a unit whose settings systemd forgot would be aborted
    // within 3 s of the removal.
    let dropin = sd.path("/etc/systemd/system/leaseagent@.service.d");
    std::fs::create_dir_all(&dropin).unwrap();
    std::fs::write(dropin.join("test.conf"), "[Service]\nWatchdogSec=3s\n").unwrap();
    std::fs::write(
        sd.path("/etc/leaseagent/demo.env"),
        "LEASEAGENT_COMMAND=/bin/sleep 600\nLEASEAGENT_OPTS=--ttl 6s --grace 1s\n\
         RUST_LOG=leaseagent=debug\n",
    )
    .unwrap();
    // A standby for the same task: it waits, and acquires once demo stops.
    std::fs::write(
        sd.path("/etc/leaseagent/standby.env"),
        "LEASEAGENT_TASK=demo\nLEASEAGENT_COMMAND=/bin/sleep 601\n\
         LEASEAGENT_OPTS=--ttl 6s --grace 1s --wait 10m\n",
    )
    .unwrap();
    sd.systemctl(&["daemon-reload"]);
    let demo = "leaseagent@demo.service";
    let standby = "leaseagent@standby.service";
    start_holding(&sd, "demo", 1);
    sd.systemctl(&["start", "--no-block", standby]);
    sd.wait_prop(standby, "StatusText", Duration::from_secs(30), |s| {
        s.contains("waiting for task demo")
    });
    let agent = sd.main_pid(demo);
    let keeper = children(agent)[0];
    let job = children(keeper)[0];
    assert!(
        cmdline(job).starts_with("/bin/sleep 600"),
        "{}",
        cmdline(job)
    );

    let log = apt(&sd, &["remove", "leaseagent"]);
    let removed = Instant::now();
    let renewals_before = count_in_journal(&sd, demo, "renewed task demo token 1");
    assert_policy_asked(&sd, &log);
    // Not silent: each unit named, with the command that stops it.
    for unit in [demo, standby] {
        assert!(
            log.contains(&format!("  {unit}\n")) && log.contains(&format!("systemctl stop {unit}")),
            "remove did not name {unit}:\n{log}"
        );
    }
    assert!(log.contains("keeps renewing its lease"), "{log}");
    assert!(log.contains("systemd is not reloaded"), "{log}");
    // The package is gone; the agent runs on from the deleted binary.
    assert!(!sd.path("/usr/bin/leaseagent").exists());
    assert_forgotten_files(&sd);
    assert_eq!(exe(agent), "/usr/bin/leaseagent (deleted)");

    // It keeps its lease: renewals go on for longer than the ttl (6 s) and
    // than three watchdog periods, with the unit active and the job alive
    // all along.
    let renewed = wait_for(Duration::from_secs(60), || {
        assert_eq!(
            sd.prop(demo, "ActiveState"),
            "active",
            "{}",
            sd.journal(demo)
        );
        assert!(alive(agent) && alive(keeper) && alive(job));
        let n = count_in_journal(&sd, demo, "renewed task demo token 1") - renewals_before;
        (n >= 3 && removed.elapsed() > Duration::from_secs(10)).then_some(n)
    });
    assert!(
        renewed.is_some(),
        "no renewals after the removal:\n{}",
        sd.journal(demo)
    );
    assert!(!sd.journal(demo).contains("Watchdog timeout"));

    // Purge while they run: the package is forgotten, the leases' state kept.
    let log = apt(&sd, &["purge", "leaseagent"]);
    assert_forgotten(&sd);
    assert!(
        sd.path("/var/lib/leaseagent/leases.sqlite3").exists(),
        "{log}"
    );
    assert!(log.contains("/var/lib/leaseagent is kept"), "{log}");

    // Stopped later, by hand: the job's whole tree is gone, the lease released.
    sd.systemctl(&["stop", demo]);
    for (p, what) in [(agent, "agent"), (keeper, "keeper"), (job, "job")] {
        assert!(
            wait_for(Duration::from_secs(5), || (!alive(p)).then_some(())).is_some(),
            "the {what} outlived systemctl stop: {}",
            cmdline(p)
        );
    }
    assert_eq!(sd.prop(demo, "ActiveState"), "inactive");
    let journal = sd.journal(demo);
    assert!(
        journal.contains("released task demo token 1"),
        "not released:\n{journal}"
    );

    // The standby acquires now, and its keeper comes from the deleted binary.
    let status = sd.wait_prop(standby, "StatusText", Duration::from_secs(30), |s| {
        s.contains("holding token 2")
    });
    let agent2 = sd.main_pid(standby);
    assert_eq!(exe(agent2), "/usr/bin/leaseagent (deleted)", "{status}");
    let keeper2 = children(agent2)[0];
    assert_eq!(exe(keeper2), "/usr/bin/leaseagent (deleted)");
    let job2 = children(keeper2)[0];
    assert!(
        cmdline(job2).starts_with("/bin/sleep 601"),
        "{}",
        cmdline(job2)
    );
    sd.systemctl(&["stop", standby]);
    let journal = sd.journal(standby);
    assert!(
        journal.contains("released task demo token 2"),
        "not released:\n{journal}"
    );
    assert!(
        wait_for(Duration::from_secs(5), || leaseagent_processes(&sd)
            .is_empty()
            .then_some(()))
        .is_some(),
        "left running: {:?}",
        leaseagent_processes(&sd)
    );
    drop(sd);
    assert_machine_policy_unchanged(&policy_before);
}

/// The package's files are gone from the root (the docs excepted, which
/// purge removes).
fn assert_forgotten_files(sd: &Systemd) {
    for p in INSTALLED.iter().filter(|p| !p.contains("/doc/")) {
        assert!(!sd.path(p).exists(), "{p} left after remove");
    }
}

/// postinst leaves an existing /etc/leaseagent's mode alone (it reset it
/// to 0755, exposing env files an administrator had closed), and the
/// packaged serve unit starts on the auth file the postinst generated.
#[test]
fn install_keeps_the_mode_of_an_existing_config_dir_and_serve_starts() {
    let deb = deb();
    let sd = fresh_root();
    let etc = sd.path("/etc/leaseagent");
    std::fs::create_dir(&etc).unwrap();
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o750)).unwrap();
    let log = install(&sd, &deb);
    let mode = std::fs::metadata(&etc).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o750, "postinst changed the mode\n{log}");
    start_serve(&sd);
    sd.systemctl(&["stop", SERVE]);
    apt(&sd, &["purge", "leaseagent"]);
}

const SERVE: &str = "leaseagent-serve.service";
/// What the postinst generates for serve: the auth file and the two tokens.
const AUTH_FILE: &str = "/etc/leaseagent/serve-auth.toml";
const AGENT_TOKEN: &str = "/etc/leaseagent/serve-agent.token";
const OPERATOR_TOKEN: &str = "/etc/leaseagent/serve-operator.token";
const GENERATED: [&str; 3] = [AUTH_FILE, AGENT_TOKEN, OPERATOR_TOKEN];

/// Starts the packaged serve unit and waits until it listens.
fn start_serve(sd: &Systemd) {
    sd.systemctl(&["start", SERVE]);
    crate::support::authority::poll("serve listening", Duration::from_secs(30), || {
        let j = sd.journal(SERVE);
        assert_ne!(sd.prop(SERVE, "ActiveState"), "failed", "{j}");
        j.contains("leaseagent serve: listening on").then_some(())
    });
    assert_eq!(sd.prop(SERVE, "ActiveState"), "active");
}

/// Owner uid and mode bits of a file inside.
fn owner_mode(sd: &Systemd, p: &str) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(sd.path(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    (m.uid(), m.mode() & 0o7777)
}

/// The HTTP status of `GET /v1/leases` on the packaged serve.
fn leases_status(sd: &Systemd, token_file: Option<&str>) -> String {
    sd.http_status(7878, "/v1/leases", token_file)
}

/// No credential-less default (issue #33): the postinst generates serve's
/// auth file with an operator and an agent token (root's, 0600), the unit
/// serves with it (no token: 401; the agent token acquires; the operator
/// token revokes, the agent token may not), a reinstall keeps the tokens
/// and a mode the administrator changed, and purge removes them.
#[test]
fn postinst_generates_serve_tokens_the_unit_uses_keeps_them_on_upgrade_purge_removes_them() {
    let deb = deb();
    let sd = fresh_root();
    let log = install(&sd, &deb);
    for p in GENERATED {
        assert_eq!(owner_mode(&sd, p), (0, 0o600), "{p}\n{log}");
    }
    let auth = sd.read(AUTH_FILE);
    let (agent, operator) = (sd.read(AGENT_TOKEN), sd.read(OPERATOR_TOKEN));
    // Two random 256-bit tokens (43 base64url characters), not the same.
    for t in [&agent, &operator] {
        assert_eq!(t.trim().len(), 43, "{t:?}");
    }
    assert_ne!(agent, operator);
    assert_eq!(auth.matches("token_sha256").count(), 2, "{auth}");
    assert!(auth.contains("role = \"operator\"") && auth.contains("role = \"agent\""));
    assert!(!auth.contains(agent.trim()) && !auth.contains(operator.trim()));
    // Nothing left of the postinst's temporary directory.
    let left: Vec<_> = std::fs::read_dir(sd.path("/etc/leaseagent"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert_eq!(left, Vec::<String>::new());

    start_serve(&sd);
    // It runs on the credential's copy of the generated file.
    let serve_cmd = cmdline(sd.main_pid(SERVE));
    assert!(
        serve_cmd.contains("--auth-file /run/credentials/leaseagent-serve.service/auth.toml")
            && !serve_cmd.contains("--no-auth"),
        "{serve_cmd}"
    );
    assert_eq!(leases_status(&sd, None), "401");
    // An instance on the packaged serve, with the generated agent token.
    std::fs::write(
        sd.path("/etc/leaseagent/demo.env"),
        format!(
            "LEASEAGENT_COMMAND=/bin/sleep 600\nLEASEAGENT_AUTHORITY=http://127.0.0.1:7878\n\
             LEASEAGENT_AUTH_TOKEN_FILE={AGENT_TOKEN}\nLEASEAGENT_OPTS=--ttl 10s --grace 2s\n"
        ),
    )
    .unwrap();
    start_holding(&sd, "demo", 1);
    let revoke = |token: &str| sd.revoke("http://127.0.0.1:7878", token, "demo");
    let out = revoke(AGENT_TOKEN);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("forbidden"),
        "the agent token revoked: {err}"
    );
    let out = revoke(OPERATOR_TOKEN);
    assert!(
        out.status.success(),
        "the operator token: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    sd.systemctl(&["stop", "leaseagent@demo.service", SERVE]);

    // The administrator loosens the auth file to 0640; an upgrade (a
    // reinstall runs the postinst's configure again) keeps it all.
    std::fs::set_permissions(sd.path(AUTH_FILE), std::fs::Permissions::from_mode(0o640)).unwrap();
    let log = apt(&sd, &["install", "--reinstall", "/tmp/leaseagent.deb"]);
    assert_eq!(owner_mode(&sd, AUTH_FILE), (0, 0o640), "{log}");
    assert_eq!(sd.read(AUTH_FILE), auth, "{log}");
    assert_eq!(sd.read(AGENT_TOKEN), agent, "{log}");
    assert_eq!(sd.read(OPERATOR_TOKEN), operator, "{log}");
    // ... and serve still takes the same tokens.
    start_serve(&sd);
    assert_eq!(leases_status(&sd, Some(OPERATOR_TOKEN)), "200");
    // (known, and an agent may not list: 403, not 401)
    assert_eq!(leases_status(&sd, Some(AGENT_TOKEN)), "403");
    assert_eq!(leases_status(&sd, None), "401");

    // Purge removes them (the administrator's env file stays).
    let log = apt(&sd, &["purge", "leaseagent"]);
    for p in GENERATED {
        assert!(!sd.path(p).exists(), "{p} left after purge\n{log}");
    }
    assert!(sd.path("/etc/leaseagent/demo.env").exists());
    assert_eq!(sd.prop(SERVE, "ActiveState"), "inactive");
    assert_eq!(leaseagent_processes(&sd), Vec::new());
}
