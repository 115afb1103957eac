//! Support for the integration tests: the shared test kit
//! (`leaseagent-testkit`: fake authority, proxy, `/proc` checks), the path of
//! the binary under test, and one module per area.

pub mod authority;
pub mod cgroups;
pub mod etcd;
pub mod fence;
pub mod golden;
pub mod netns;
pub mod patroni;
pub mod postgres;
pub mod stop;
pub mod sysns;
pub mod systemd;
pub mod tls;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use leaseagent_testkit::*;

/// The binary under test; `LEASEAGENT_TEST_BIN` points the tests at
/// another build (to measure a figure on an older one).
pub fn bin() -> PathBuf {
    std::env::var_os("LEASEAGENT_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_leaseagent")))
}

/// Waits until every thread of `pid` is stopped (after a SIGSTOP: `kill`
/// only queues the stop, and a thread busy on another CPU could still
/// answer a request meanwhile); `None` if not within `within`.
pub fn all_threads_stopped(pid: u32, within: Duration) -> Option<()> {
    wait_for(within, || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        tasks
            .flatten()
            .all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|st| st.rsplit(')').next().map(|r| r.trim_start().to_string()))
                    .is_some_and(|r| r.starts_with('T') || r.starts_with('t'))
            })
            .then_some(())
    })
}

/// A temporary directory for one test, removed when dropped.
pub struct Dir(pub tempfile::TempDir);

impl Dir {
    pub fn new() -> Self {
        Dir(tempfile::tempdir().unwrap())
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

pub fn helper(name: &str) -> String {
    format!("{}/tests/helpers/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A `leaseagent` command against `authority` with test-friendly defaults.
///
/// With `--no-pid-namespace`: these tests read the pids the job writes
/// (`$$`), which name host processes only outside a PID namespace of the
/// job's own; they hold the fallback containment (cgroup or tree walk).
/// The namespace's own tests (`agent_contain`) use [`agent_in_pidns`].
pub fn agent(authority: &str, task: &str) -> Command {
    let mut c = agent_in_pidns(authority, task);
    c.arg("--no-pid-namespace");
    c
}

/// The agent as it runs by default: the job in a PID namespace of its own
/// where the machine allows one.
pub fn agent_in_pidns(authority: &str, task: &str) -> Command {
    let mut c = Command::new(bin());
    c.arg("--authority").arg(authority).arg("--task").arg(task);
    c.env("RUST_LOG", "leaseagent=debug");
    c.stdin(Stdio::null());
    c
}

/// Starts `c` with stdout discarded and stderr piped, for `stderr_of`.
pub fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// All that `child` wrote to its piped stderr (read to the end).
pub fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// Waits for the agent `child` to exit (it must, within `within`), then
/// reads its piped stderr: (exit status, stderr).
pub fn wait_agent(child: &mut Child, within: Duration) -> (ExitStatus, String) {
    let status = wait_exit(child, within).expect("agent exits");
    (status, stderr_of(child))
}

/// Polls `f` every `every` until it returns `Some`, or panics with `what`
/// after `timeout`.
pub fn poll_every<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(every);
    }
}

/// Runs `c` to its end: the test fails with `missing` if it cannot be
/// started, and with `what` and its stderr if it does not succeed.
pub fn run_ok(c: &mut Command, missing: &str, what: impl std::fmt::Display) {
    let out = c.output().expect(missing);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The agent's keeper (its child whose argv[0] is `leaseagent-keeper`).
pub fn keeper_of(agent: i32) -> i32 {
    wait_for(Duration::from_secs(60), || {
        let kids = std::fs::read_to_string(format!("/proc/{agent}/task/{agent}/children")).ok()?;
        kids.split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"leaseagent-keeper"))
            })
    })
    .expect("the agent has a keeper")
}

/// How far behind the host's `CLOCK_BOOTTIME` a time namespace can be set
/// on this machine now, in whole seconds (a negative offset for
/// `unshare --time --boottime`).
///
/// The kernel refuses an offset that would put a namespace's clock below
/// zero (`timens_offsets: Numerical result out of range`), and a nested
/// namespace's offsets are taken against the host's clock: a machine booted
/// a minute ago cannot have a view 1,000 s behind. So "behind" is the
/// smaller of `wanted` and the boot clock less a margin (the time the test
/// takes to reach its `unshare`, and the agents' own runs, must not bring
/// the view's clock to zero). `LEASEAGENT_TEST_UPTIME_S` stands in for the
/// boot clock to show the offsets a freshly booted machine gets (it can
/// only lower what is read, never raise it past the real clock).
///
/// Panics, naming the clock, when even the least offset that still tells a
/// view behind the host's from the host's (`least` s) cannot be had: the
/// test fails, it never skips.
pub fn boottime_behind(wanted: i64, least: i64) -> i64 {
    const MARGIN_S: i64 = 20;
    let real = rustix::time::clock_gettime(rustix::time::ClockId::Boottime).tv_sec;
    let up = match std::env::var("LEASEAGENT_TEST_UPTIME_S") {
        Ok(v) => {
            let v: i64 = v
                .parse()
                .unwrap_or_else(|_| panic!("LEASEAGENT_TEST_UPTIME_S={v:?}: whole seconds"));
            v.min(real)
        }
        Err(_) => real,
    };
    let behind = wanted.min(up - MARGIN_S);
    assert!(
        behind >= least,
        "the boot clock reads {up} s: a time namespace can be set at most {} s behind it, \
         less than the {least} s this test needs; it can run once the machine has been up \
         {} s",
        up - MARGIN_S,
        least + MARGIN_S
    );
    -behind
}

#[test]
fn boottime_behind_follows_the_boot_clock() {
    // Whatever the machine's uptime, an offset never reaches below zero.
    let real = rustix::time::clock_gettime(rustix::time::ClockId::Boottime).tv_sec;
    let b = boottime_behind(1000, 1);
    assert!(b < 0 && real + b >= 0, "{b} at {real} s");
    assert!(-b <= 1000);
}
