//! The Debian package, installed the way a user installs it: `apt-get
//! install ./leaseagent_….deb` into a fresh root (a copy-on-write overlay of
//! the machine's `/`, `support::sysns`) under a real systemd booted there.
//! The package must bring the binaries, units, user, man pages, completions
//! and docs; enable and start nothing; run `leaseagent@demo.service` holding
//! a lease on the embedded authority once an env file exists; and on
//! `apt-get remove` leave nothing running (the template's instances are
//! stopped, their job with them), on `purge` no state.
//!
//! The package is `LEASEAGENT_DEB` (`scripts/test` builds it once with
//! `scripts/deb` and passes it on); without it this test runs `scripts/deb`
//! itself, which takes minutes for the release build.

use crate::support::{alive, sysns::Systemd};

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn deb() -> PathBuf {
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

fn apt(sd: &Systemd, args: &[&str]) -> String {
    let mut a = vec!["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y"];
    a.extend_from_slice(args);
    ok(sd, &a)
}

/// Machine pids and command lines of every process of the booted system
/// whose command line names leaseagent or the demo job.
fn leaseagent_processes(sd: &Systemd) -> Vec<(i32, String)> {
    sd.processes()
        .into_iter()
        .map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            (p, cmd)
        })
        .filter(|(p, cmd)| (cmd.contains("leaseagent") || cmd.contains("sleep 600")) && alive(*p))
        .collect()
}

const INSTALLED: &[&str] = &[
    "/usr/bin/leaseagent",
    "/usr/bin/leaseagent-serve",
    "/lib/systemd/system/leaseagent@.service",
    "/lib/systemd/system/leaseagent-serve.service",
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

#[test]
fn apt_installs_it_in_a_fresh_root_runs_a_task_and_removes_it_cleanly() {
    let deb = deb();
    assert!(deb.is_file(), "no package at {}", deb.display());
    let sd = Systemd::boot_fresh_root();

    // A fresh root: nothing of leaseagent in it yet.
    assert!(!sd.run(&["dpkg-query", "-W", "leaseagent"]).status.success());
    for p in INSTALLED
        .iter()
        .chain(&["/var/lib/leaseagent", "/etc/leaseagent"])
    {
        assert!(!sd.path(p).exists(), "{p} before the install");
    }

    std::fs::copy(&deb, sd.path("/tmp/leaseagent.deb")).unwrap();
    let started = std::time::Instant::now();
    let log = apt(&sd, &["install", "/tmp/leaseagent.deb"]);
    eprintln!("apt-get install took {:?}", started.elapsed());
    for p in INSTALLED {
        assert!(sd.path(p).exists(), "{p} not installed\n{log}");
    }
    // The units point at the packaged binaries.
    let unit = sd.read("/lib/systemd/system/leaseagent@.service");
    assert!(unit.contains("ExecStart=/usr/bin/leaseagent "), "{unit}");
    ok(&sd, &["getent", "passwd", "leaseagent"]);
    // Nothing enabled, nothing started.
    let serve = "leaseagent-serve.service";
    assert_eq!(sd.prop(serve, "UnitFileState"), "disabled");
    assert_eq!(sd.prop(serve, "ActiveState"), "inactive");
    assert_eq!(leaseagent_processes(&sd), Vec::new());
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
    // The packaged units verify, their Documentation= man pages included.
    let verify = ok(&sd, &["systemd-analyze", "verify", demo, serve]);
    assert_eq!(verify, "", "systemd-analyze verify");
    sd.systemctl(&["start", demo]);
    assert_eq!(sd.prop(demo, "ActiveState"), "active");
    let status = sd.prop(demo, "StatusText");
    assert!(
        status.contains("holding token 1"),
        "{status}\n{}",
        sd.journal(demo)
    );
    let leases = ok(
        &sd,
        &[
            "runuser",
            "-u",
            "leaseagent",
            "--",
            "env",
            "LEASEAGENT_STATE_DIR=/var/lib/leaseagent-units",
            "leaseagent",
            "leases",
            "--json",
        ],
    );
    assert!(
        leases.contains("\"task\":\"demo\"") && leases.contains("\"token\":1"),
        "{leases}"
    );
    let running = leaseagent_processes(&sd);
    assert!(
        running.iter().any(|(_, c)| c.starts_with("/bin/sleep 600")),
        "the job is not running: {running:?}"
    );

    // Remove: every instance stopped with its job, nothing left running.
    // The prerm's stop is synchronous, so this is at once, not after the
    // watchdog (without it, the daemon-reload after removal leaves the
    // agent's notify messages unheard and the watchdog aborts it 30 s
    // later, its lease not released).
    let log = apt(&sd, &["remove", "leaseagent"]);
    let gone = crate::support::wait_for(Duration::from_secs(3), || {
        running.iter().all(|(p, _)| !alive(*p)).then_some(())
    });
    assert!(
        gone.is_some(),
        "still running after remove: {:?}\n{log}",
        leaseagent_processes(&sd)
    );
    assert_eq!(leaseagent_processes(&sd), Vec::new());
    assert_ne!(sd.prop(demo, "ActiveState"), "active");
    let journal = sd.journal(demo);
    assert!(
        journal.contains("released task demo token 1"),
        "the lease was not released on remove:\n{journal}"
    );
    for p in INSTALLED.iter().filter(|p| !p.contains("/doc/")) {
        assert!(!sd.path(p).exists(), "{p} left after remove");
    }
    // remove keeps the state; purge deletes it (the administrator's env file stays).
    assert!(sd.path("/var/lib/leaseagent-units").exists());
    // Root's default state directory was never the units'.
    assert!(!sd.path("/var/lib/leaseagent").exists());
    apt(&sd, &["purge", "leaseagent"]);
    assert!(!sd.path("/var/lib/leaseagent-units").exists());
    assert!(sd.path("/etc/leaseagent/demo.env").exists());
    let left = sd.run(&["dpkg-query", "-W", "-f", "${Status}", "leaseagent"]);
    assert!(
        !left.status.success() || String::from_utf8_lossy(&left.stdout).contains("not-installed"),
        "dpkg still knows leaseagent: {}",
        String::from_utf8_lossy(&left.stdout)
    );
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
}
