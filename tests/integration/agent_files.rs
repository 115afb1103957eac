//! Another local user cannot fool the agent's files, and the job's
//! environment carries nothing inherited that is not its own. Directories
//! and links are made by `nobody` (or planted by the test), then the agent
//! runs as root against them: nothing may be written through them.

use crate::support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::fence::{publish, read_opt, stderr};
use support::*;

const T: Duration = Duration::from_secs(60);

/// Runs `args` as the user `nobody`; the test fails if that is impossible.
fn as_nobody(args: &[&str]) {
    run_ok(
        Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .args(args),
        "runuser (util-linux) is needed: tests run as root with a user `nobody`",
        format_args!("as nobody: {args:?}"),
    );
}

/// A temp dir others may create entries in (sticky, like /tmp).
fn shared_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

/// The agent on its embedded default authority in `state_dir`.
fn agent_default(state_dir: &Path) -> Command {
    let mut c = Command::new(bin());
    c.env("LEASEAGENT_STATE_DIR", state_dir)
        .env_remove("LEASEAGENT_AUTHORITY")
        .env("RUST_LOG", "leaseagent=debug")
        .stdin(std::process::Stdio::null());
    c
}

fn no_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|r| r.count() == 0)
        .unwrap_or(true)
}

#[test]
fn a_runtime_dir_made_by_another_user_is_refused_and_never_written() {
    let fake = FakeAuthority::start();
    let shared = shared_dir();
    let planted = shared.path().join("leaseagent");
    as_nobody(&["mkdir", "-m", "0777", planted.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&planted).unwrap().uid(), 65534);
    let mut c = agent(&fake.url(), "files-rt-owner");
    c.env("XDG_RUNTIME_DIR", shared.path())
        .env("LEASEAGENT_STATE_FILE", "/etc/passwd")
        .args(["--", &helper("env.sh")]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("refusing directory"), "{}", out.stderr);
    assert!(
        out.stderr.contains(planted.to_str().unwrap()),
        "{}",
        out.stderr
    );
    assert!(no_entries(&planted), "nothing written into the planted dir");
    // The inherited variable is not passed on when no file was made.
    assert!(out.stdout.contains("STATE=unset"), "{}", out.stdout);
}

#[test]
fn a_runtime_dir_that_is_a_symlink_is_refused_and_never_written_through() {
    let fake = FakeAuthority::start();
    let shared = shared_dir();
    let victim = tempfile::tempdir().unwrap();
    std::fs::set_permissions(victim.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    // `nobody` plants the link: a link root made in a sticky directory
    // only root could have put there, and the kernel would follow it.
    let link = shared.path().join("leaseagent");
    as_nobody(&[
        "ln",
        "-s",
        victim.path().to_str().unwrap(),
        link.to_str().unwrap(),
    ]);
    let mut c = agent(&fake.url(), "files-rt-link");
    c.env("XDG_RUNTIME_DIR", shared.path())
        .args(["--", &helper("env.sh")]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("symlink"), "{}", out.stderr);
    assert!(
        no_entries(victim.path()),
        "nothing written through the link"
    );
}

#[test]
fn a_good_runtime_dir_gets_the_state_file_and_the_job_its_own_variable() {
    let fake = FakeAuthority::start();
    let rt = tempfile::tempdir().unwrap();
    let mut c = agent(&fake.url(), "files-rt-good");
    c.env("XDG_RUNTIME_DIR", rt.path())
        .env("LEASEAGENT_STATE_FILE", "/etc/passwd")
        .args(["--", &helper("env.sh")]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let dir = rt.path().join("leaseagent");
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let want = format!("STATE={}/lease-", dir.display());
    assert!(out.stdout.contains(&want), "{}", out.stdout);
}

#[test]
fn a_state_dir_of_another_user_or_writable_by_others_ends_in_125() {
    let shared = shared_dir();
    let theirs = shared.path().join("state");
    as_nobody(&["mkdir", "-m", "0700", theirs.to_str().unwrap()]);
    let open = shared.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for dir in [&theirs, &open] {
        let mut c = agent_default(dir);
        c.args(["--task", "files-state", "--", "true"]);
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(125), "{}", out.stderr);
        assert!(out.stderr.contains(dir.to_str().unwrap()), "{}", out.stderr);
    }
    // As nobody, nothing could be read: as root, nothing was created.
    assert!(no_entries(&open));
}

#[test]
fn a_database_file_planted_as_a_symlink_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, state.join("leases.sqlite3")).unwrap();
    let mut c = agent_default(&state);
    c.args(["--task", "files-db-link", "--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(125), "{}", out.stderr);
    assert!(out.stderr.contains("symlink"), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

#[test]
fn a_fresh_state_dir_and_database_are_private() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("new/state");
    let mut c = agent_default(&state);
    c.args(["--task", "files-db-new", "--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("leases.sqlite3")), 0o600);
}

#[test]
fn publish_never_follows_a_planted_lock_or_temp_link() {
    let d = tempfile::tempdir().unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let (src, dest) = (d.path().join("tmp"), d.path().join("out"));
    std::fs::write(&src, "data").unwrap();
    // The old fixed temp name: now random, so the link is simply unused.
    std::os::unix::fs::symlink(&victim, d.path().join(".out.leaseagent-fence.tmp")).unwrap();
    let r = publish(Some("5"), &[src.as_os_str(), dest.as_os_str()]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert_eq!(read_opt(&dest).as_deref(), Some("data"));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(
        std::fs::symlink_metadata(d.path().join(".out.leaseagent-fence"))
            .unwrap()
            .is_file()
    );

    // A link as the lock file: refused, nothing touched.
    let dest2 = d.path().join("out2");
    std::os::unix::fs::symlink(&victim, d.path().join(".out2.leaseagent-fence.lock")).unwrap();
    std::fs::write(&src, "data2").unwrap();
    let r = publish(Some("5"), &[src.as_os_str(), dest2.as_os_str()]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("symlink"), "{}", stderr(&r));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!dest2.exists());

    // A link as the record: refused too (never read or replaced through).
    let dest3 = d.path().join("out3");
    std::os::unix::fs::symlink(&victim, d.path().join(".out3.leaseagent-fence")).unwrap();
    let r = publish(Some("5"), &[src.as_os_str(), dest3.as_os_str()]);
    assert_ne!(r.status.code(), Some(0), "{}", stderr(&r));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

#[test]
fn the_job_loses_watchdog_listen_and_inherited_state_variables() {
    let fake = FakeAuthority::start();
    let mut c = agent(&fake.url(), "files-env");
    c.env("WATCHDOG_USEC", "1000000")
        .env("WATCHDOG_PID", "1")
        .env("WATCHDOG_FOO", "x")
        .env("LISTEN_FDS", "2")
        .env("LISTEN_PID", "1")
        .env("LISTEN_FDNAMES", "a:b")
        .env("LEASEAGENT_STATE_FILE", "/etc/passwd")
        .env("KEEP_ME", "yes")
        .args(["--", &helper("env-all.sh")]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    for line in out.stdout.lines() {
        assert!(
            !line.starts_with("WATCHDOG_") && !line.starts_with("LISTEN_"),
            "leaked: {line}"
        );
        assert_ne!(line, "LEASEAGENT_STATE_FILE=/etc/passwd");
    }
    assert!(
        out.stdout.lines().any(|l| l == "KEEP_ME=yes"),
        "{}",
        out.stdout
    );
}

/// Makes `p` a directory only root may use (0700).
fn private_dir(p: &Path) {
    std::fs::create_dir(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn a_state_dir_link_nobody_can_repoint_never_chooses_roots_database() {
    // The review's case: nobody plants `/tmp/x -> A` (A root's), root runs
    // a task through it, nobody re-points the link to root's B, and root's
    // next run of the same task got token 1 from B while the first ran.
    let shared = shared_dir();
    let roots = tempfile::tempdir().unwrap();
    let (a, b) = (roots.path().join("a"), roots.path().join("b"));
    private_dir(&a);
    private_dir(&b);
    let link = shared.path().join("x");
    as_nobody(&["ln", "-s", a.to_str().unwrap(), link.to_str().unwrap()]);
    assert_eq!(std::fs::symlink_metadata(&link).unwrap().uid(), 65534);

    // Root's first run holds the task in A (named directly).
    let ready = roots.path().join("ready");
    let mut first = agent_default(&a);
    first
        .env("OUT", &ready)
        .args(["--task", "files-repoint", "--", &helper("sleeper.sh")]);
    let mut first = spawn(first);
    poll_every("the first job", T, Duration::from_millis(20), || {
        std::fs::read_to_string(&ready)
            .ok()
            .filter(|s| s.contains("ready"))
    });

    // Through nobody's link (as the state dir and as a directory above
    // it), to A and then re-pointed to B: refused each time, nothing made.
    for then in [&b, &a] {
        for state in [link.clone(), link.join("sub")] {
            let mut c = agent_default(&state);
            c.args(["--task", "files-repoint", "--", "true"]);
            let out = run_agent(c, T);
            assert_eq!(out.status.code(), Some(125), "{}", out.stderr);
            assert!(
                out.stderr.contains("a symlink owned by uid 65534"),
                "{}",
                out.stderr
            );
            assert!(
                out.stderr.contains(link.to_str().unwrap()),
                "{}",
                out.stderr
            );
        }
        as_nobody(&["ln", "-sfn", then.to_str().unwrap(), link.to_str().unwrap()]);
    }
    assert!(no_entries(&b), "nothing made in B");
    let in_a: Vec<_> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        in_a.iter()
            .all(|n| n.starts_with("leases.sqlite3") || n == "run"),
        "only the first run's files in A: {in_a:?}"
    );

    // The first run still holds the task, alone.
    assert_eq!(first.try_wait().unwrap(), None, "the first run ended");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let (status, err) = wait_agent(&mut first, T);
    assert!(status.code().is_some(), "{err}");

    // Root's own link in a sticky directory is one the kernel follows (only
    // root could have made or replaced it): the run goes through it.
    let own = shared.path().join("roots");
    std::os::unix::fs::symlink(&b, &own).unwrap();
    let mut c = agent_default(&own);
    c.args(["--task", "files-repoint", "--", "true"]);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(b.join("leases.sqlite3").exists());
}

#[test]
fn roots_default_state_dir_taken_by_the_units_user_is_refused_with_what_to_do() {
    // What an older leaseagent@.service left: systemd gave its
    // StateDirectory=, root's default /var/lib/leaseagent, to the unit's
    // user (here nobody), whose jobs could then rewrite root's leases. In a
    // mount namespace of its own, a fake /var/lib shows root's agent that.
    let fake = tempfile::tempdir().unwrap();
    let taken = fake.path().join("leaseagent");
    std::fs::create_dir(&taken).unwrap();
    std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::chown(&taken, Some(65534), Some(65534)).unwrap();
    let marker = fake.path().join("ran");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount --bind \"$0\" /var/lib && exec \"$@\"")
        .arg(fake.path())
        .arg(bin())
        .args(["--task", "files-units", "--", "touch"])
        .arg(&marker)
        .env_remove("LEASEAGENT_STATE_DIR")
        .env_remove("LEASEAGENT_AUTHORITY")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("unshare (util-linux) is needed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("/var/lib/leaseagent: it belongs to uid 65534")
            && err.contains("chown -R root: /var/lib/leaseagent"),
        "{err}"
    );
    assert!(!marker.exists(), "the job never ran");
    assert!(no_entries(&taken), "nothing adopted or written");
}

#[test]
fn a_state_dir_on_a_fuse_filesystem_is_refused() {
    // SQLite's locks and the engine's page-cache reasoning are one host's;
    // on FUSE (or NFS, SMB...) they are not. A real FUSE mount (bindfs).
    let d = tempfile::tempdir().unwrap();
    let (real, mnt) = (d.path().join("real"), d.path().join("mnt"));
    for p in [&real, &mnt] {
        std::fs::create_dir(p).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    run_ok(
        Command::new("bindfs").arg(&real).arg(&mnt),
        "bindfs (a FUSE filesystem) is needed: apt-get install bindfs",
        "bindfs",
    );
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("fusermount").arg("-u").arg(self.0).status();
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _mounted = Unmount(&mnt);
    let marker = d.path().join("ran");
    let mut c = agent_default(&mnt.join("state"));
    c.args(["--task", "files-fuse", "--", "touch"]).arg(&marker);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(125), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("network or user-space filesystem (FUSE)"),
        "{}",
        out.stderr
    );
    assert!(!marker.exists(), "the job never ran");
    assert!(
        !real.join("state/leases.sqlite3").exists(),
        "no database made on it"
    );
}
