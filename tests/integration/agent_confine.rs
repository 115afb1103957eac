//! What a job starts without (#43, `sys::confine`), tried as a hostile job
//! would, as root:
//!
//! - a `--user nobody` job: a root-only file its caller left open on fd 9
//!   is not among its descriptors (only 0, 1, 2 are), and NoNewPrivs is
//!   set (0 with `--allow-new-privs`);
//! - a root job (root agent, no `--user`, in its PID namespace): `umount
//!   -l /proc`, `PTRACE_ATTACH` of the keeper (PID 1), `prlimit` of the
//!   keeper, a write to `/proc/1/oom_score_adj` are all refused, no
//!   command line it can read names the agent's pid, the dropped
//!   capabilities are in none of its sets while root's others are, and a
//!   second agent asking for the task on the same embedded authority is
//!   not granted while the job runs; with `--full-root` it keeps them all.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(30);

/// `leaseagent::sys::confine::DROPPED`, as bits of a capability mask.
const DROPPED: [u32; 13] = [2, 16, 17, 19, 21, 22, 23, 24, 32, 33, 38, 39, 40];

fn dropped_mask() -> u64 {
    DROPPED.iter().fold(0, |m, c| m | (1u64 << c))
}

fn must_be_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests run jobs as root and as nobody: run them as root"
    );
}

/// A directory anyone may write to (the job may run as nobody).
fn open_dir(dir: &Dir) -> PathBuf {
    let p = dir.path("work");
    std::fs::create_dir(&p).unwrap();
    std::fs::set_permissions(dir.0.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).unwrap();
    p
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `Key:` field of a `/proc/PID/status` text, as a hexadecimal mask.
fn cap_field(status: &str, key: &str) -> u64 {
    let v = status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"));
    u64::from_str_radix(v.trim(), 16).unwrap()
}

#[test]
fn a_user_job_starts_with_stdio_alone_and_no_new_privs() {
    must_be_root();
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let work = open_dir(&dir);
    let secret = dir.path("secret");
    std::fs::write(&secret, "root-only-secret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let runs: [(&str, &[&str], &str); 2] = [
        ("pidns", &[], "1"),
        (
            "fallback",
            &["--no-pid-namespace", "--allow-new-privs"],
            "0",
        ),
    ];
    for (name, flags, nnp) in runs {
        let held = std::fs::File::open(&secret).unwrap();
        let mut c = agent_in_pidns(&fake.url(), &format!("fds-{name}"));
        c.args(["--user", "nobody"]).args(flags).args([
            "--",
            "sh",
            "-c",
            // `exec >FILE`, not `cmd > FILE`: dash keeps a saved copy of
            // a redirected descriptor (fd 10) in the shell while `cmd` runs.
            "exec > \"$0/fds\"; ls /proc/$$/fd; exec > \"$0/read\"; cat <&9 2>/dev/null; \
             exec > \"$0/nnp\"; grep NoNewPrivs /proc/$$/status",
        ]);
        c.arg(&work);
        {
            use std::os::fd::AsRawFd;
            let fd = held.as_raw_fd();
            // SAFETY (test): dup2 only, between fork and exec: the caller's
            // root-only file on fd 9, not close-on-exec, as a shell's
            // `exec 9<secret` leaves it.
            unsafe {
                c.pre_exec(move || {
                    if libc::dup2(fd, 9) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", out.stderr);
        let fds: Vec<String> = read(&work.join("fds"))
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(fds, ["0", "1", "2"], "{name}: the job's descriptors");
        assert!(
            !read(&work.join("read")).contains("root-only-secret"),
            "{name}: nobody read the caller's root-only file"
        );
        assert_eq!(
            read(&work.join("nnp"))
                .split_whitespace()
                .collect::<Vec<_>>(),
            ["NoNewPrivs:", nnp],
            "{name}"
        );
        for f in ["fds", "read", "nnp"] {
            let _ = std::fs::remove_file(work.join(f));
        }
    }
}

/// A root job that tries every door to its guardians, then waits
/// (`ready` written); `full` runs with `--full-root`.
fn root_job(work: &Path) -> Vec<String> {
    let script = "W=$0\n\
        umount -l /proc 2> \"$W/umount.err\"; echo $? > \"$W/umount\"\n\
        ls -d /proc/[0-9]* | wc -l > \"$W/procs\"\n\
        /usr/bin/python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); \
r = l.ptrace(16, 1, None, None); print(r, ctypes.get_errno())' > \"$W/ptrace\"\n\
        prlimit --pid 1 --nofile=0:0 2>/dev/null; echo $? > \"$W/prlimit\"\n\
        (echo 1000 > /proc/1/oom_score_adj) 2>/dev/null; echo $? > \"$W/oom\"\n\
        for f in /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < \"$f\"; echo; done > \"$W/cmdlines\" 2>/dev/null\n\
        cat /proc/self/status > \"$W/status\"\n\
        touch \"$W/ready\"; exec sleep 1000\n";
    vec![
        "bash".into(),
        "-c".into(),
        script.into(),
        work.display().to_string(),
    ]
}

/// The host's view of the keeper's `Max open files` soft limit and its
/// `oom_score_adj`.
fn keeper_limits(keeper: i32) -> (String, String) {
    let limits = read(Path::new(&format!("/proc/{keeper}/limits")));
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .map(|l| l.split_whitespace().nth(3).unwrap_or("").to_string())
        .unwrap_or_default();
    let oom = read(Path::new(&format!("/proc/{keeper}/oom_score_adj")));
    (nofile, oom.trim().to_string())
}

#[test]
fn a_root_job_cannot_unmount_trace_limit_or_name_its_guardians() {
    must_be_root();
    for (tool, package) in [
        ("/usr/bin/python3", "python3"),
        ("/usr/bin/prlimit", "util-linux"),
    ] {
        assert!(
            Path::new(tool).exists(),
            "{tool} ({package}) must be installed: the job tries its doors with it"
        );
    }
    let dir = Dir::new();
    let work = open_dir(&dir);
    let db = format!("sqlite:{}", dir.path("leases.sqlite3").display());
    let mut c = agent_in_pidns(&db, "root-job");
    c.arg("--").args(root_job(&work));
    let mut a = spawn(c);
    let agent_pid = a.id() as i32;
    let keeper = keeper_of(agent_pid);
    let before = keeper_limits(keeper);
    wait_for(T, || work.join("ready").exists().then_some(()))
        .unwrap_or_else(|| panic!("the job never got ready: {}", stderr_of(&mut a)));
    // Lazily: a plain umount may be refused as busy even with the power.
    assert_ne!(
        read(&work.join("umount")).trim(),
        "0",
        "umount -l /proc: {}",
        read(&work.join("umount.err"))
    );
    let procs: usize = read(&work.join("procs")).trim().parse().unwrap();
    assert!(
        procs <= 8,
        "the job sees {procs} processes: the host's /proc"
    );
    assert_eq!(
        read(&work.join("ptrace")).trim(),
        format!("-1 {}", libc::EPERM),
        "PTRACE_ATTACH of the keeper"
    );
    assert_ne!(
        read(&work.join("prlimit")).trim(),
        "0",
        "prlimit of the keeper"
    );
    assert_ne!(
        read(&work.join("oom")).trim(),
        "0",
        "the keeper's oom_score_adj"
    );
    assert_eq!(keeper_limits(keeper), before, "the keeper's limits changed");
    // No command line the job can read (nor the keeper's, seen from the
    // host) names the agent.
    let pid = agent_pid.to_string();
    let seen = read(&work.join("cmdlines"));
    assert!(
        !seen.lines().any(|arg| arg == pid),
        "the agent's pid {pid} on a command line the job reads:\n{seen}"
    );
    let keeper_cmd = std::fs::read(format!("/proc/{keeper}/cmdline")).unwrap();
    assert!(
        !keeper_cmd
            .split(|b| *b == 0)
            .any(|arg| arg == pid.as_bytes()),
        "the keeper's command line names the agent: {}",
        String::from_utf8_lossy(&keeper_cmd)
    );
    let status = read(&work.join("status"));
    for key in ["CapBnd:", "CapEff:", "CapPrm:", "CapInh:", "CapAmb:"] {
        assert_eq!(
            cap_field(&status, key) & dropped_mask(),
            0,
            "{key} still holds a dropped capability"
        );
    }
    // Root over its own work: CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_KILL,
    // CAP_SETUID, CAP_NET_ADMIN.
    let own = [0u32, 1, 5, 7, 12].iter().fold(0u64, |m, c| m | (1 << c));
    assert_eq!(cap_field(&status, "CapEff:") & own, own, "{status}");
    // A second agent on the same embedded authority is not granted.
    let mut b = agent_in_pidns(&db, "root-job");
    b.args(["--wait", "1s", "--", "true"]);
    let out = run_agent(b, T);
    assert_eq!(out.status.code(), Some(75), "B: {}", out.stderr);
    kill(agent_pid, libc::SIGTERM);
    let (status, err) = wait_agent(&mut a, T);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "A: {err}");
}

#[test]
fn with_full_root_a_root_job_keeps_every_capability() {
    must_be_root();
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let work = open_dir(&dir);
    let mut c = agent_in_pidns(&fake.url(), "full-root");
    c.args([
        "--full-root",
        "--",
        "sh",
        "-c",
        "cat /proc/self/status > \"$0/status\"; test -r /proc/1/cmdline && echo seen > \"$0/keeper\"",
    ])
    .arg(&work);
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let status = read(&work.join("status"));
    // Every dropped capability the caller itself holds (a container's root
    // may lack some, CAP_SYS_RESOURCE here) is back in every set.
    let ours = cap_field(&read(Path::new("/proc/self/status")), "CapBnd:") & dropped_mask();
    let needed = (1u64 << 19) | (1 << 21);
    assert_eq!(
        ours & needed,
        needed,
        "this test needs CAP_SYS_PTRACE and CAP_SYS_ADMIN in its own bounding set"
    );
    for key in ["CapBnd:", "CapEff:", "CapPrm:"] {
        assert_eq!(
            cap_field(&status, key) & dropped_mask(),
            ours,
            "{key}: {status}"
        );
    }
    assert_eq!(read(&work.join("keeper")).trim(), "seen");
}
