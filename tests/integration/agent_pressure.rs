//! Nothing the job exhausts starves renewal (Guarantee 1), and timing flags
//! that cannot work are refused before anything is sent. Each case uses the
//! real limit: a pids cgroup the job fills, a memory cgroup the job fills,
//! a shaped veth link the job floods, an authority that accepts and never
//! answers.

use crate::support;

use std::time::Duration;

use support::netns;
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
    assert!(
        third < Duration::from_millis(2_500),
        "third renewal at {third:?}"
    );
    let released = fake.requests_to("/v1/release");
    assert_eq!(released.len(), 1, "{}", out.stderr);
    assert_eq!(released[0].body["outcome"], "succeeded");
}

/// The agent (and so its keeper and job) in the pids cgroup `cg`.
fn fork_filler(
    cg: &cgroups::Cgroup,
    fake: &FakeAuthority,
    dir: &Dir,
    hold_s: u32,
) -> std::process::Command {
    // A host name, not an IP literal: resolved once, at acquire.
    let url = format!("http://localhost:{}", fake.addr.port());
    let mut inner = agent(&url, "pids-full");
    inner
        .env("OUT", dir.path("out"))
        .args(["--ttl", "3s", "--", "python3"])
        .arg(helper("fork-fill.py"))
        .arg(hold_s.to_string());
    let mut c = cg.enter_then_exec(&inner);
    c.stdin(std::process::Stdio::null());
    c
}

#[test]
fn a_job_that_fills_the_pids_cgroup_does_not_stop_renewal_or_release() {
    // The agent, its keeper and the job share a pids cgroup of 40 tasks;
    // the job takes every one left for 6 s (six heartbeats of a 3 s ttl).
    let cg = cgroups::Cgroup::pids("pids-renew", 40);
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let out = run_agent(fork_filler(&cg, &fake, &dir, 6), T);
    let made: u32 = std::fs::read_to_string(dir.path("out"))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(made > 0, "the job forked nothing: {}", out.stderr);
    assert!(
        cg.pids_refused() > 0,
        "the limit was never hit: {}",
        out.stderr
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(!out.stderr.contains("lease lost"), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    // Renewals went on while the group was full: six heartbeats' worth.
    let renewals = fake.requests_to("/v1/renew");
    assert!(
        renewals.len() >= 5,
        "{} renewals: {}",
        renewals.len(),
        out.stderr
    );
    let released = fake.requests_to("/v1/release");
    assert_eq!(released.len(), 1, "{}", out.stderr);
    assert_eq!(released[0].body["outcome"], "succeeded");
}

#[test]
fn a_refusal_while_the_pids_cgroup_is_full_stops_the_whole_tree() {
    let cg = cgroups::Cgroup::pids("pids-refuse", 40);
    let fake = FakeAuthority::start();
    fake.script(
        "/v1/renew",
        vec![Reply::Ok, Reply::Ok, Reply::Refuse("revoked")],
    );
    let dir = Dir::new();
    let out = run_agent(fork_filler(&cg, &fake, &dir, 120), T);
    assert_eq!(out.status.code(), Some(124), "{}", out.stderr);
    // Stopped by the refusal, not by a local expiry.
    assert_eq!(fake.requests_to("/v1/renew").len(), 3, "{}", out.stderr);
    assert!(out.stderr.contains("revoked"), "{}", out.stderr);
    assert!(
        cg.pids_refused() > 0,
        "the limit was never hit: {}",
        out.stderr
    );
    // Everything the job forked is gone with it.
    let left = wait_for(Duration::from_secs(10), || {
        cg.procs().is_empty().then_some(())
    });
    assert!(left.is_some(), "left in the group: {:?}", cg.procs());
}

/// The job: fills the tmpfs at $FILL through a small process (`head`, a
/// megabyte or two of its own) writing to a file it already unlinked, so
/// the memory is the cgroup's until the job dies and is freed with it.
const TMPFS_FILL: &str = r#"exec 3>"$FILL/fill"; rm "$FILL/fill"; exec head -c 4G /dev/zero >&3"#;

/// A tmpfs mounted for the test, unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        let d = tempfile::tempdir().unwrap();
        run_ok(
            std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(d.path()),
            "`mount` must be installed (util-linux)",
            "mount a tmpfs (needs root)",
        );
        Tmpfs(d)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_job_that_fills_a_memory_cgroup_is_what_the_oom_killer_takes() {
    let cg = cgroups::Cgroup::memory("oom", 96 << 20);
    let fs = Tmpfs::new("1g");
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut inner = agent(&fake.url(), "oom");
    inner
        .env("OUT", dir.path("out"))
        .env("FILL", fs.0.path())
        .args(["--ttl", "3s", "--", "sh", "-c", TMPFS_FILL]);
    let mut c = cg.enter_then_exec(&inner);
    c.stdin(std::process::Stdio::null());
    let out = run_agent(c, T);
    assert!(cg.oom_kills() >= 1, "no OOM kill: {}", out.stderr);
    // The agent exited by itself with the job's status: killed by SIGKILL.
    assert_eq!(
        out.status.code(),
        Some(137),
        "{:?}: {}",
        out.status,
        out.stderr
    );
    assert!(out.stderr.contains("signal 9"), "{}", out.stderr);
    let released = fake.requests_to("/v1/release");
    assert_eq!(released.len(), 1, "{}", out.stderr);
    assert_eq!(released[0].body["outcome"], "failed");
}

#[test]
fn a_job_flooding_a_shaped_link_does_not_cost_the_lease() {
    use netns::{Net, Proc};
    use std::process::Stdio;
    // Host 1: the authority (`serve`) and a sink. Host 2: the agent, whose
    // job sends four TCP streams to the sink. Host 2's link is shaped to
    // 1 Mbit/s (tbf) with a priority-honouring qdisc (pfifo_fast) under it, so the
    // queue behind the shaper holds seconds of the job's traffic: a renewal
    // that waited its turn there would come too late for a 3 s ttl.
    let net = Net::new(2);
    let dir = Dir::new();
    let _serve = Proc(
        net.cmd(1, bin().to_str().unwrap())
            .args([
                "serve",
                "--no-auth",
                "--insecure-listen",
                "--listen",
                "0.0.0.0:7878",
                "--db",
            ])
            .arg(dir.path("leases.sqlite3"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://{}:7878", net.ip(1));
    poll_every(
        "serve reachable from host 2",
        T,
        Duration::from_millis(50),
        || {
            net.cmd(2, bin().to_str().unwrap())
                .args(["leases", "--authority", &url])
                .output()
                .unwrap()
                .status
                .success()
                .then_some(())
        },
    );
    let _sink = Proc(
        net.cmd(1, "python3")
            .arg(helper("sink.py"))
            .args([&net.ip(1), "9000"])
            .arg(dir.path("sunk"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 must be installed"),
    );
    for args in [
        &[
            "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "1mbit", "burst",
            "16kb", "latency", "10s",
        ][..],
        &[
            "qdisc",
            "add",
            "dev",
            "eth0",
            "parent",
            "1:1",
            "handle",
            "10:",
            "pfifo_fast",
        ][..],
    ] {
        run_ok(
            net.cmd(2, "tc").args(args),
            "`tc` (iproute2) must be installed",
            format_args!("tc {args:?}"),
        );
    }
    let seconds = 30;
    let out = run_agent(
        {
            let mut c = net.cmd(2, bin().to_str().unwrap());
            c.args(["--authority", &url, "--task", "flood", "--ttl", "3s"])
                .env("RUST_LOG", "leaseagent=debug")
                .stdin(Stdio::null())
                .args(["--", "python3"])
                .arg(helper("blast.py"))
                .args([&net.ip(1), "9000"])
                .arg(seconds.to_string());
            c
        },
        T,
    );
    let sunk: u64 = std::fs::read_to_string(dir.path("sunk"))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0);
    // The link was full: at least 70 % of 1 Mbit/s for the whole run.
    assert!(
        sunk >= seconds * 1_000_000 / 8 * 7 / 10,
        "the job sent only {sunk} bytes: {}",
        out.stderr
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(!out.stderr.contains("lease lost"), "{}", out.stderr);
}

/// A number field (`VmLck:  123 kB`) of `/proc/PID/status`.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn the_command_is_the_oom_killers_choice_and_the_agent_is_locked_in_memory() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "oom-adj");
    c.env("OUT", dir.path("out"))
        .args(["--ttl", "3s", "--", "sh", "-c"])
        .arg("cat /proc/self/oom_score_adj > \"$OUT.tmp\"; mv \"$OUT.tmp\" \"$OUT\"; sleep 2");
    let mut child = spawn(c);
    let job: i32 = poll_every(
        "the job's oom_score_adj",
        T,
        Duration::from_millis(10),
        || {
            std::fs::read_to_string(dir.path("out"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
        },
    );
    let agent_pid = child.id();
    let agent_adj: i32 = std::fs::read_to_string(format!("/proc/{agent_pid}/oom_score_adj"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let locked = status_kib(agent_pid, "VmLck:").unwrap_or(0);
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(0), "{err}");
    // 500 over a base of at least 0; the agent never raised.
    assert!(job >= 500, "job oom_score_adj {job}");
    assert!(job > agent_adj, "job {job}, agent {agent_adj}");
    // Locked, or the log says why not (no CAP_IPC_LOCK and a finite
    // RLIMIT_MEMLOCK).
    assert!(
        locked > 0 || err.contains("memory not locked"),
        "VmLck {locked} kB: {err}"
    );
}

/// glibc gives each thread that allocates an arena of its own: a 64 MiB
/// reservation, mostly `---p`. The agent caps malloc at one arena
/// (`sys/malloc.rs`), so its five threads reserve none.
#[test]
fn the_agents_threads_share_one_malloc_arena() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "one-arena");
    c.env("OUT", dir.path("out"))
        .args(["--ttl", "3s", "--heartbeat", "200ms", "--"])
        .args(["sh", "-c", "sleep 0.5; touch \"$OUT\"; sleep 1"]);
    let mut child = spawn(c);
    // Renewals have run by then: every thread has allocated.
    poll_every("the job's file", T, Duration::from_millis(10), || {
        dir.path("out").exists().then_some(())
    });
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    let threads = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .count();
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(threads >= 5, "{threads} threads");
    // An arena's reservation: an anonymous `---p` mapping of 16 MiB or more
    // (thread stacks' guards are a page).
    let reserved: Vec<&str> = maps
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let Some((a, b)) = f.first().and_then(|r| r.split_once('-')) else {
                return false;
            };
            let size =
                u64::from_str_radix(b, 16).unwrap_or(0) - u64::from_str_radix(a, 16).unwrap_or(0);
            f.get(1) == Some(&"---p") && f.len() == 5 && size >= 16 << 20
        })
        .collect();
    assert!(reserved.is_empty(), "arenas: {reserved:?}\n{maps}");
}

#[test]
fn an_unprivileged_agent_runs_unlocked_and_says_so() {
    // `nobody`: no CAP_IPC_LOCK and a finite RLIMIT_MEMLOCK, where
    // MCL_FUTURE could make a later allocation fail. The agent must not
    // lock, say so once, and run normally; the command is still raised.
    let fake = FakeAuthority::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out_file = dir.path().join("out");
    // A finite limit whatever this run's own is (root may have none).
    let mut c = std::process::Command::new("prlimit");
    c.args(["--memlock=8388608:8388608", "setpriv"])
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(bin())
        .args(["--authority", &fake.url(), "--task", "nobody-unlocked"])
        .args(["--", "sh", "-c", "cat /proc/self/oom_score_adj > \"$OUT\""])
        .env("OUT", &out_file)
        .env("HOME", dir.path())
        .env("LEASEAGENT_STATE_DIR", dir.path().join("state"))
        .env_remove("XDG_RUNTIME_DIR")
        .env("RUST_LOG", "leaseagent=info")
        .stdin(std::process::Stdio::null());
    let out = run_agent(c, T);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(
        out.stderr.matches("memory not locked").count(),
        1,
        "{}",
        out.stderr
    );
    let job: i32 = std::fs::read_to_string(&out_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(job >= 500, "job oom_score_adj {job}");
}
