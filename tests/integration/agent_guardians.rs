//! The deadline's two guardians, with real processes, timed against the
//! authority's own expiry (the last successful renewal's receipt + ttl, on
//! CLOCK_BOOTTIME): a busy host, a frozen filesystem under the state file,
//! Ctrl-Z to the agent, a job that stops or kills its keeper, a process
//! that survives SIGKILL, a setuid-root helper under a non-root agent, and
//! a recycled pid after the agent was paused.
//!
//! Each test prints its margin ("... ms before the authority could expire
//! the lease") so the figures in docs/failures.md can be re-measured.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(60);
const TTL_MS: u128 = 2000;
/// ttl 2 s, renewals every 400 ms, SIGTERM 600 ms before the deadline.
const TIMING: [&str; 6] = ["--ttl", "2s", "--heartbeat", "400ms", "--grace", "600ms"];

/// The state letter of `pid` in /proc (`R`, `S`, `T`, `Z`, ...).
fn state_of(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')')
        .next()?
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// When the authority could expire the lease: the last renewal it answered
/// (or the grant) + the ttl, on the boot clock.
fn expiry_ms(fake: &FakeAuthority, renewals_ok: usize) -> u128 {
    let renewals = fake.requests_to("/v1/renew");
    let last = match renewals_ok.checked_sub(1) {
        Some(i) => renewals[i].mono_ns,
        None => fake.requests_to("/v1/acquire").last().unwrap().mono_ns,
    };
    mono_to_boot_ms(last) + TTL_MS
}

/// The clock-job recording to `out` last ran before `expiry`.
fn assert_ran_until_before(out: &Path, expiry: u128, what: &str) {
    let last = last_clock_record_ms(out).expect("the job recorded the clock");
    eprintln!(
        "{what}: gone {} ms before the authority could expire the lease",
        expiry as i128 - last as i128
    );
    assert!(
        last < expiry,
        "{what} ran {} ms past the lease's expiry",
        last - expiry
    );
}

fn wait_renewals(fake: &FakeAuthority, n: usize) -> usize {
    wait_for(T, || {
        let k = fake.requests_to("/v1/renew").len();
        (k >= n).then_some(k)
    })
    .expect("renewals flow")
}

fn wait_pids(path: &Path, n: usize) -> Vec<i32> {
    wait_for(T, || {
        let p = read_pids(path);
        (p.len() >= n).then_some(p)
    })
    .expect("the job wrote its pids")
}

/// Starts `c` with its stderr in a file: a survivor (or the keeper staying
/// with it) holds the agent's stderr open, so a pipe would never end.
fn spawn_logged(mut c: Command, dir: &Dir) -> Child {
    let log = std::fs::File::create(dir.path("agent.log")).unwrap();
    c.stdout(Stdio::null()).stderr(log);
    c.spawn().unwrap()
}

/// Waits for an agent started with [`spawn_logged`]: (status, its stderr).
fn wait_logged(child: &mut Child, dir: &Dir) -> (std::process::ExitStatus, String) {
    let status = wait_exit(child, T).expect("agent exits");
    let err = std::fs::read_to_string(dir.path("agent.log")).unwrap_or_default();
    (status, err)
}

fn must(c: &mut Command, what: &str) {
    let st = c
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(st.success(), "{what}: {st}");
}

/// A job (bash) that starts a TERM-ignoring clock-job in a new session
/// recording to `esc`, writes its pid to PIDS, then runs `then`; the
/// leader records to `out` when `then` is a clock-job.
fn escaping_job(dir: &Dir, then: &str) -> Vec<String> {
    vec![
        "bash".into(),
        "-c".into(),
        format!(
            "OUT={esc} PIDS={pids} IGNORE_TERM=1 setsid {clock} </dev/null & {then}",
            esc = dir.path("esc").display(),
            pids = dir.path("pids").display(),
            clock = helper("clock-job.sh"),
        ),
    ]
}

// ------------------------------------------------------------ busy host

/// `n` sleepers in a pids cgroup (v1 or v2) of their own, killed on drop.
struct Sleepers {
    cgroup: PathBuf,
    starter: Child,
}

impl Sleepers {
    fn start(n: usize) -> Sleepers {
        let base = [
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
        ]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists())
        .expect("a pids or cgroup2 hierarchy under /sys/fs/cgroup");
        let cgroup = base.join(format!("leaseagent-busy-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup).expect("creating a cgroup needs root");
        let starter = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs; for i in $(seq {n}); do sleep 600 & done; exec sleep 600",
                cgroup.display()
            ))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let s = Sleepers { cgroup, starter };
        wait_for(Duration::from_secs(120), || (s.count() > n).then_some(()))
            .expect("the sleepers started");
        s
    }
    fn count(&self) -> usize {
        std::fs::read_to_string(self.cgroup.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .count()
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for _ in 0..100 {
            let procs =
                std::fs::read_to_string(self.cgroup.join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() {
                break;
            }
            for p in procs.lines() {
                kill(p.trim().parse().unwrap_or(0), 9);
            }
        }
        let _ = self.starter.wait();
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[test]
fn on_a_busy_host_a_setsid_descendant_is_dead_before_expiry() {
    let sleepers = Sleepers::start(3000);
    let on_host = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .count();
    eprintln!("{on_host} processes on the host");
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let dir = Dir::new();
    let mut c = agent(&proxy.url(), "busy-host");
    c.args(TIMING).arg("--").args(escaping_job(
        &dir,
        &format!(
            "OUT={} exec {}",
            dir.path("out").display(),
            helper("clock-job.sh")
        ),
    ));
    let mut child = spawn(c);
    wait_pids(&dir.path("pids"), 1);
    let n = wait_renewals(&fake, 2);
    proxy.set(ProxyMode::Blackhole);
    let (status, err) = wait_agent(&mut child, T);
    drop(sleepers);
    assert_eq!(status.code(), Some(124), "{err}");
    let expiry = expiry_ms(&fake, fake.requests_to("/v1/renew").len().max(n));
    assert_ran_until_before(&dir.path("out"), expiry, "the leader");
    assert_ran_until_before(&dir.path("esc"), expiry, "the setsid descendant");
}

// ------------------------------------------------------------ frozen filesystem

/// An ext4 filesystem on a loop device, mounted at `dir`; frozen with
/// `fsfreeze -f`, thawed, unmounted and detached on drop.
struct LoopFs {
    image: PathBuf,
    mnt: PathBuf,
    frozen: bool,
    mounted: bool,
}

impl LoopFs {
    fn mount(dir: &Dir) -> LoopFs {
        let image = dir.path("fs.img");
        let mnt = dir.path("mnt");
        std::fs::create_dir(&mnt).unwrap();
        must(
            Command::new("truncate").args(["-s", "16M"]).arg(&image),
            "truncate",
        );
        must(
            Command::new("mkfs.ext4")
                .args(["-q", "-F"])
                .arg(&image)
                .stdout(Stdio::null()),
            "mkfs.ext4 (e2fsprogs) must be installed",
        );
        must(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(&mnt),
            "mount -o loop needs root and a loop device",
        );
        let run = mnt.join("run");
        std::fs::create_dir(&run).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        LoopFs {
            image,
            mnt,
            frozen: false,
            mounted: true,
        }
    }
    fn runtime_dir(&self) -> PathBuf {
        self.mnt.join("run")
    }
    fn freeze(&mut self) {
        must(
            Command::new("fsfreeze").arg("-f").arg(&self.mnt),
            "fsfreeze (util-linux) must be installed",
        );
        self.frozen = true;
    }
    fn thaw(&mut self) {
        if self.frozen {
            let _ = Command::new("fsfreeze").arg("-u").arg(&self.mnt).status();
            self.frozen = false;
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        self.thaw();
        // A keeper's mount namespace holds a copy of this mount; when the
        // namespace dies its reference is dropped on a kernel workqueue,
        // after the processes were reaped: umount says "target is busy"
        // for a moment (seen in a full run, which left the mount behind).
        // Asked again, with a deadline; the test's own check then tells.
        let _ = wait_for(Duration::from_secs(20), || {
            if !self.mounted {
                return Some(());
            }
            Command::new("umount")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status()
                .ok()?
                .success()
                .then_some(())
        });
        let _ = std::fs::remove_file(&self.image);
    }
}

#[test]
fn a_refusal_is_acted_on_while_the_state_files_filesystem_is_frozen() {
    let dir = Dir::new();
    let mut fs = LoopFs::mount(&dir);
    let fake = FakeAuthority::start();
    let mut c = agent(&fake.url(), "frozen-fs");
    c.env("XDG_RUNTIME_DIR", fs.runtime_dir())
        .env("OUT", dir.path("out"))
        .env("PIDS", dir.path("pids"));
    c.args(TIMING).arg("--").arg(helper("clock-job.sh"));
    let mut child = spawn(c);
    let state = fs
        .runtime_dir()
        .join("leaseagent")
        .join(format!("lease-{}.json", child.id()));
    let pids = wait_pids(&dir.path("pids"), 1);
    wait_renewals(&fake, 2);
    assert!(state.exists(), "the state file is on the loop filesystem");
    fs.freeze();
    // Every write to the state file now blocks in D state: one more
    // successful renewal makes the agent publish (and, written on the
    // decision loop, block), then the authority refuses.
    let n = fake.requests_to("/v1/renew").len();
    wait_renewals(&fake, n + 1);
    let ok = fake.requests_to("/v1/renew").len();
    fake.set_renew(Reply::Refuse("superseded"));
    let gone = wait_for(Duration::from_secs(10), || (!alive(pids[0])).then_some(()));
    let expiry = expiry_ms(&fake, ok);
    // The agent's own exit does not wait for the thaw either (its state
    // file's removal is given up on after a bounded wait).
    // Its state file is the scribe's, which is not a thread of the
    // agent: the agent is reaped with the filesystem still frozen.
    let refused_at = boot_ms();
    let reaped = wait_exit(&mut child, Duration::from_secs(10));
    let exited = reaped.is_some().then(boot_ms);
    let still_frozen = fs.frozen;
    fs.thaw();
    let (status, err) = wait_agent(&mut child, T);
    assert!(
        gone.is_some() && still_frozen,
        "the job outlived the refusal: {err}"
    );
    assert_ran_until_before(&dir.path("out"), expiry, "the job");
    assert_eq!(status.code(), Some(124), "{err}");
    let exited = exited.expect("the agent was reaped with the filesystem frozen");
    eprintln!(
        "the agent was reaped {} ms after the job was gone",
        exited - refused_at
    );
    // Its bounded exit: the state file's removal (500 ms) and the wait
    // for the scribe to be gone (1 s), never the thaw (10 s on).
    assert!(
        exited < refused_at + 5_000,
        "the agent's exit waited {} ms on the frozen filesystem",
        exited - refused_at
    );
}

/// The agent's files are closed when its exit is seen: its scribe (which
/// holds the database and the state directory) is gone by then, so the
/// filesystem under them unmounts at the first try (a script that
/// unmounts right after `leaseagent` returns). Without a PID namespace:
/// a keeper's mount namespace keeps a copy of the mount a moment longer
/// (see [`LoopFs`]'s drop), which is not the agent's doing.
#[test]
fn the_state_filesystem_unmounts_as_soon_as_the_agent_exits() {
    for round in 0..3 {
        let dir = Dir::new();
        let mut fs = LoopFs::mount(&dir);
        let db = fs.mnt.join("leases.sqlite3");
        let mut c = agent(&format!("sqlite:{}", db.display()), "unmount-after");
        c.env("XDG_RUNTIME_DIR", fs.runtime_dir());
        c.args(["--no-pid-namespace", "--", "sleep", "0.3"]);
        let mut child = spawn_logged(c, &dir);
        let agent_pid = child.id() as i32;
        let scribe = wait_for(T, || scribe_of(agent_pid)).expect("the agent's scribe runs");
        let (status, log) = wait_logged(&mut child, &dir);
        // At once: the scribe ended before the agent did (a zombie left to
        // init counts as ended: its files are closed).
        assert!(
            !alive(scribe),
            "round {round}: the scribe still ran when the agent was reaped: {log}"
        );
        assert_eq!(status.code(), Some(0), "{log}");
        let out = Command::new("umount").arg(&fs.mnt).output().unwrap();
        fs.mounted = !out.status.success();
        assert!(
            out.status.success(),
            "round {round}: umount right after the agent's exit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ------------------------------------------------------------ the exit on a frozen filesystem

/// Threads of `pid`: their names and state letters (`D`: uninterruptible
/// sleep).
fn thread_states(pid: i32) -> Vec<(String, char)> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let tid: i32 = e.file_name().to_string_lossy().parse().ok()?;
            let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
            let state = s
                .rsplit(')')
                .next()?
                .split_whitespace()
                .next()?
                .chars()
                .next()?;
            let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
            Some((name.trim().to_string(), state))
        })
        .collect()
}

/// What [`exit_while_frozen`] saw, on the boot clock (ms).
struct FrozenExit {
    frozen_at: u128,
    status: std::process::ExitStatus,
    log: String,
    job: i32,
    /// The job's last clock record.
    last: u128,
    expires_ms: Option<u128>,
    /// The last expiry the database held as the test froze it.
    before_freeze: u128,
}

/// The agent on the embedded authority whose database and state file are
/// on `fs`, the job a clock-job (TERM ends it) recording to `out`; `fs` is
/// frozen once the job runs and renewals were made, then `then(job)` runs.
/// The agent's main thread must be gone within `bound_ms` of the freeze;
/// the filesystem is thawed only after that (or on the way out of a
/// failure, by the drop guard).
fn exit_while_frozen(task: &str, bound_ms: u128, then: impl FnOnce(i32)) -> FrozenExit {
    let dir = Dir::new();
    let mut fs = LoopFs::mount(&dir);
    let db = fs.mnt.join("leases.sqlite3");
    let mut c = agent(&format!("sqlite:{}", db.display()), task);
    c.env("XDG_RUNTIME_DIR", fs.runtime_dir())
        .env("OUT", dir.path("out"))
        .env("PIDS", dir.path("pids"));
    c.args(TIMING).arg("--").arg(helper("clock-job.sh"));
    let mut child = spawn_logged(c, &dir);
    let agent_pid = child.id() as i32;
    let state = fs
        .runtime_dir()
        .join("leaseagent")
        .join(format!("lease-{agent_pid}.json"));
    let job = wait_pids(&dir.path("pids"), 1)[0];
    // Two renewals through the database (every 400 ms): its expiry moved
    // twice.
    let mut seen = Vec::new();
    wait_for(T, || {
        if let Some(e) = expiry_in(&db, task) {
            if seen.last() != Some(&e) {
                seen.push(e);
            }
        }
        (seen.len() >= 3).then_some(())
    })
    .expect("renewals flow through the database");
    assert!(state.exists(), "the state file is on the loop filesystem");
    let before_freeze = seen.last().copied().unwrap_or_default();
    fs.freeze();
    let frozen_at = boot_ms();
    then(job);
    let exited = wait_for(Duration::from_millis(bound_ms as u64 + 10_000), || {
        (!alive(agent_pid)).then(boot_ms)
    });
    let threads = thread_states(agent_pid);
    // No thread of the agent sleeps on the filesystem (its writes are the
    // scribe's): it is reaped with the filesystem still frozen.
    let reaped = wait_exit(&mut child, Duration::from_secs(2));
    let reaped_frozen = reaped.is_some();
    let reaped_at = boot_ms();
    fs.thaw();
    let thawed = boot_ms();
    let status = match reaped {
        Some(s) => s,
        None => wait_exit(&mut child, T).expect("the agent is reaped once the filesystem thaws"),
    };
    let reaped_after_thaw_ms = boot_ms() - thawed;
    let log = std::fs::read_to_string(dir.path("agent.log")).unwrap_or_default();
    let exited_at = exited.unwrap_or_else(|| panic!("the agent never exited while frozen: {log}"));
    if reaped_frozen {
        eprintln!(
            "{task}: main thread gone {} ms after the freeze; threads then {threads:?}; reaped \
             while frozen, by {} ms after the freeze",
            exited_at - frozen_at,
            reaped_at - frozen_at
        );
    } else {
        eprintln!(
            "{task}: main thread gone {} ms after the freeze; threads then {threads:?}; reaped \
             {reaped_after_thaw_ms} ms after the thaw",
            exited_at - frozen_at
        );
    }
    let expires_ms = expiry_in(&db, task);
    let last = last_clock_record_ms(&dir.path("out")).expect("the job recorded the clock");
    drop(fs);
    assert!(
        !std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .contains(&dir.path("mnt").display().to_string()),
        "the loop filesystem is still mounted"
    );
    assert!(
        exited_at <= frozen_at + bound_ms,
        "{task}: the agent's main thread went {} ms after the freeze (bound {bound_ms} ms): {log}",
        exited_at - frozen_at
    );
    assert!(
        reaped_frozen,
        "{task}: the agent was reaped only {reaped_after_thaw_ms} ms after the thaw, not while \
         the filesystem was frozen (its threads then: {threads:?}): {log}"
    );
    FrozenExit {
        frozen_at,
        status,
        log,
        job,
        last,
        expires_ms,
        before_freeze,
    }
}

/// The lease's expiry (boot clock, ms) as the embedded database holds it.
fn expiry_in(db: &Path, task: &str) -> Option<u128> {
    let c = rusqlite::Connection::open(db).ok()?;
    let v: Option<i64> = c
        .query_row(
            "SELECT expires_ms FROM tasks WHERE task = ?1",
            [task],
            |r| r.get(0),
        )
        .ok()?;
    v.and_then(|v| u128::try_from(v).ok())
}

/// The job ends on its own while the embedded authority's database and the
/// state file are frozen: the release blocks in the kernel, and the agent
/// still exits by the lease's deadline (plus its bounded exit), with the
/// job's status; before, its exit waited for the thaw.
#[test]
fn the_agent_exits_by_the_deadline_when_its_store_freezes_as_the_job_ends() {
    // The deadline is at most a ttl after the freeze (the last renewal was
    // sent before it); then the keeper's reaping (1 s at most), the state
    // file's removal (500 ms) and the log's flush (500 ms) are bounded.
    let bound = TTL_MS + 2_500;
    let r = exit_while_frozen("frozen-store-end", bound, |job| kill(job, 15));
    assert_eq!(r.status.code(), Some(0), "{}", r.log);
    // Given up on by the release's own wait ("no answer within …") or,
    // as the two deadlines meet, by the scribe's lane ("no answer from the
    // agent's store process within …").
    assert!(
        r.log.contains("no answer within") || r.log.contains("no answer from the agent's store"),
        "the release was not given up on: {}",
        r.log
    );
    assert!(!alive(r.job));
}

/// The job runs on while the database freezes: renewals stall in the
/// kernel, the agent stops the job before the deadline, gives up on the
/// release at the deadline and exits 124 without waiting for the thaw.
#[test]
fn the_agent_stops_the_job_and_exits_by_the_deadline_when_its_store_freezes() {
    let bound = TTL_MS + 2_500;
    let r = exit_while_frozen("frozen-store-run", bound, |_| {});
    assert_eq!(r.status.code(), Some(124), "{}", r.log);
    assert!(!alive(r.job), "the job outlived its agent");
    // The authority's expiry as the database holds it after the thaw: a
    // renewal committed before the freeze (at most a ttl past it), or one
    // the agent sent while frozen, gave up on, and the scribe committed
    // once the filesystem thawed (a lost answer: it only delays the next
    // holder). That one was begun before the agent's deadline, at most a
    // ttl after the freeze; the expiry that held while frozen was then
    // the last one before the freeze.
    let after_thaw = r.expires_ms.expect("the lease's row has its expiry");
    let expires = if after_thaw <= r.frozen_at + TTL_MS {
        after_thaw
    } else {
        assert!(
            after_thaw <= r.frozen_at + 2 * TTL_MS,
            "a renewal begun after the agent's deadline was committed ({after_thaw} > {} + 2 × \
             {TTL_MS})",
            r.frozen_at
        );
        r.before_freeze
    };
    eprintln!(
        "the job: gone {} ms before the authority could expire the lease",
        expires as i128 - r.last as i128
    );
    assert!(
        r.last < expires,
        "the job ran {} ms past the lease's expiry",
        r.last - expires
    );
}

// ------------------------------------------------------------ the scribe

/// The agent's scribe (its filesystem writes, a process of its own): the
/// process whose command line is the agent's, a session leader (it calls
/// `setsid`), not the agent itself.
fn scribe_of(agent: i32) -> Option<i32> {
    let cmdline = std::fs::read(format!("/proc/{agent}/cmdline")).ok()?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        if pid == agent || std::fs::read(format!("/proc/{pid}/cmdline")).ok()? != cmdline {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let sid: i32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(3)?
            .parse()
            .ok()?;
        (sid == pid).then_some(pid)
    })
}

/// The parent of `pid`, from `/proc/PID/stat`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A job of the agent's uid in the fallback containment can name the
/// scribe and SIGKILL it. Harmless: every renewal then fails (a transient
/// failure, never a renewal), and the job is stopped before the lease's
/// expiry in the database; the agent ends 124 and is not held up by the
/// scribe's absence. The scribe is not the agent's child: the agent's
/// tree stays agent → keeper → job.
#[test]
fn a_killed_scribe_stops_the_job_before_the_expiry() {
    let dir = Dir::new();
    let db = dir.path("leases.sqlite3");
    let task = "scribe-killed";
    let mut c = agent(&format!("sqlite:{}", db.display()), task);
    c.env("XDG_RUNTIME_DIR", dir.0.path())
        .env("OUT", dir.path("out"))
        .env("PIDS", dir.path("pids"));
    c.args(TIMING)
        .arg("--no-pid-namespace")
        .arg("--")
        .arg(helper("clock-job.sh"));
    let mut child = spawn_logged(c, &dir);
    let agent_pid = child.id() as i32;
    // A failed assertion below must not leave the agent renewing forever.
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if alive(self.0) {
                kill(self.0, 9);
            }
        }
    }
    let _agent = KillOnDrop(agent_pid);
    let job = wait_pids(&dir.path("pids"), 1)[0];
    let mut seen = Vec::new();
    wait_for(T, || {
        if let Some(e) = expiry_in(&db, task) {
            if seen.last() != Some(&e) {
                seen.push(e);
            }
        }
        (seen.len() >= 2).then_some(())
    })
    .expect("renewals flow through the database");
    let scribe = scribe_of(agent_pid).expect("the agent's scribe runs");
    assert_ne!(
        parent_of(scribe),
        Some(agent_pid),
        "the scribe is the agent's child"
    );
    kill(scribe, 9);
    let (status, log) = wait_logged(&mut child, &dir);
    let expires = expiry_in(&db, task).expect("the lease's row has its expiry");
    let last = last_clock_record_ms(&dir.path("out")).expect("the job recorded the clock");
    assert!(!alive(job), "the job outlived its agent: {log}");
    assert!(
        last < expires,
        "the job ran {} ms past the lease's expiry: {log}",
        last - expires
    );
    eprintln!(
        "the job: gone {} ms before the lease's expiry",
        expires - last
    );
    assert_eq!(status.code(), Some(124), "{log}");
    assert!(
        log.contains("store process is gone"),
        "the renewals' failure names the scribe: {log}"
    );
}

// ------------------------------------------------------------ Ctrl-Z

#[test]
fn sigtstp_pauses_the_job_not_the_agent_and_renewals_go_on() {
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let dir = Dir::new();
    let mut c = agent(&proxy.url(), "ctrl-z");
    c.env("OUT", dir.path("out")).env("PIDS", dir.path("pids"));
    c.args(TIMING).arg("--").arg(helper("clock-job.sh"));
    let mut child = spawn(c);
    let agent_pid = child.id() as i32;
    let job = wait_pids(&dir.path("pids"), 1)[0];
    wait_renewals(&fake, 1);
    // The job is stopped by the agent's relay; watched from now on.
    let mut stopped = stop::StopGuard::new();
    stopped.watch(job);
    kill(agent_pid, 20); // SIGTSTP
    wait_for(T, || (state_of(job) == Some('T')).then_some(())).expect("the job is paused");
    // Longer than a ttl: the lease is held all along.
    let before = fake.requests_to("/v1/renew").len();
    wait_renewals(&fake, before + 6);
    assert_ne!(
        state_of(agent_pid),
        Some('T'),
        "the agent itself never stops"
    );
    assert_eq!(state_of(job), Some('T'), "the job stays paused");
    kill(agent_pid, 18); // SIGCONT
    wait_for(T, || (state_of(job) != Some('T')).then_some(())).expect("the job resumes");
    let rec = last_clock_record_ms(&dir.path("out")).unwrap();
    wait_for(T, || {
        (last_clock_record_ms(&dir.path("out")).unwrap() > rec).then_some(())
    })
    .expect("the job runs again");
    // Paused again, then the authority goes silent: a stopped job dies too.
    kill(agent_pid, 20);
    wait_for(T, || (state_of(job) == Some('T')).then_some(())).expect("paused again");
    proxy.set(ProxyMode::Blackhole);
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(124), "{err}");
    assert!(!alive(job), "{err}");
    assert_ran_until_before(
        &dir.path("out"),
        expiry_ms(&fake, fake.requests_to("/v1/renew").len()),
        "the job",
    );
}

// ------------------------------------------------------------ the keeper attacked

#[test]
fn a_job_that_stops_its_keeper_still_dies_before_expiry_with_its_setsid_child() {
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let dir = Dir::new();
    let mut c = agent(&proxy.url(), "keeper-stopped-by-job");
    c.args(TIMING).arg("--").args(escaping_job(
        &dir,
        &format!(
            "kill -STOP $PPID; OUT={} exec {}",
            dir.path("out").display(),
            helper("clock-job.sh")
        ),
    ));
    let mut child = spawn(c);
    let keeper = keeper_of(child.id() as i32);
    let mut stopped = stop::StopGuard::new();
    stopped.watch(keeper);
    wait_pids(&dir.path("pids"), 1);
    wait_for(T, || (state_of(keeper) == Some('T')).then_some(()))
        .expect("the job stopped its keeper");
    wait_renewals(&fake, 2);
    proxy.set(ProxyMode::Blackhole);
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(124), "{err}");
    let expiry = expiry_ms(&fake, fake.requests_to("/v1/renew").len());
    assert_ran_until_before(&dir.path("out"), expiry, "the leader");
    assert_ran_until_before(&dir.path("esc"), expiry, "the setsid child");
}

#[test]
fn a_job_that_kills_its_keeper_is_killed_and_the_lease_is_never_released() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "keeper-killed-by-job");
    c.args(["--ttl", "30s", "--"]).args(escaping_job(
        &dir,
        "sleep 0.3; kill -KILL $PPID; exec sleep 1000",
    ));
    let mut child = spawn(c);
    let esc = wait_pids(&dir.path("pids"), 1)[0];
    let gone = wait_for(Duration::from_secs(10), || (!alive(esc)).then_some(()));
    let (status, err) = wait_agent(&mut child, T);
    assert!(
        gone.is_some(),
        "the setsid descendant outlived its keeper: {err}"
    );
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(err.contains("the keeper process died"), "{err}");
    assert!(
        fake.requests_to("/v1/release").is_empty(),
        "released while the tree could not be proven gone: {err}"
    );
}

// ------------------------------------------------------------ survivors

/// A cgroup v1 freezer group of the test's own, thawed and removed on drop.
/// (A v2 freezer would not do: SIGKILL ends a process frozen there.) On a
/// hybrid machine the freezer hierarchy is mounted already; on a pure
/// cgroup v2 machine the test mounts one (below its target directory) and
/// unmounts it on drop.
struct Freezer(PathBuf, Option<PathBuf>);

/// Where a cgroup v1 hierarchy with the freezer controller is mounted.
fn freezer_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, opts) = (r.next()?, r.nth(1)?);
        (fstype == "cgroup" && opts.split(',').any(|o| o == "freezer"))
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

impl Freezer {
    fn new() -> Freezer {
        let (root, mounted) = match freezer_mount() {
            Some(m) => (m, None),
            None => {
                let m = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                    .join(format!("freezer-{}", std::process::id()));
                std::fs::create_dir_all(&m).unwrap();
                run_ok(
                    Command::new("mount")
                        .args(["-t", "cgroup", "-o", "freezer", "leaseagent-test-freezer"])
                        .arg(&m),
                    "mount (util-linux) must be installed",
                    "no cgroup v1 freezer hierarchy is mounted, and mounting one failed \
                     (as root; a kernel booted with cgroup_no_v1= has none)",
                );
                (m.clone(), Some(m))
            }
        };
        let p = root.join(format!("leaseagent-frozen-{}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create a cgroup in the v1 freezer hierarchy (as root)");
        Freezer(p, mounted)
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
        for p in std::fs::read_to_string(self.0.join("tasks"))
            .unwrap_or_default()
            .lines()
        {
            kill(p.trim().parse().unwrap_or(0), 9);
        }
        let _ = wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(self.0.join("tasks"))
                .is_ok_and(|t| t.trim().is_empty())
                .then_some(())
        });
        let _ = std::fs::remove_dir(&self.0);
        if let Some(m) = &self.1 {
            let _ = Command::new("umount").arg(m).status();
            let _ = std::fs::remove_dir(m);
        }
    }
}

#[test]
fn a_sigkill_survivor_means_exit_125_no_release_and_a_line_naming_it() {
    let frz = Freezer::new();
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "sigkill-survivor");
    c.args(["--ttl", "30s", "--grace", "300ms", "--", "bash", "-c"])
        .arg(format!(
            "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {pids}; echo $! > {f}/tasks; echo FROZEN > {f}/freezer.state; exit 0",
            pids = dir.path("pids").display(),
            f = frz.0.display()
        ));
    let mut child = spawn_logged(c, &dir);
    let keeper = keeper_of(child.id() as i32);
    let (status, err) = wait_logged(&mut child, &dir);
    let survivor = read_pids(&dir.path("pids"))[0];
    let alive_at_exit = alive(survivor);
    drop(frz);
    assert!(alive_at_exit, "the frozen process was the survivor");
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!("process {survivor} (")) && err.contains("frozen cgroup"),
        "{err}"
    );
    assert!(!err.contains("outcome succeeded"), "{err}");
    assert!(fake.requests_to("/v1/release").is_empty(), "{err}");
    wait_for(T, || (!exists(keeper)).then_some(())).expect("the keeper ends once thawed");
}

#[test]
fn a_setuid_root_helper_under_a_non_root_agent_is_125_and_never_released() {
    let dir = Dir::new();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.0.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.path("helper.c");
    std::fs::write(
        &src,
        "#define _GNU_SOURCE\n#include <signal.h>\n#include <unistd.h>\n\
         int main(void){ if (setresuid(0,0,0)) return 1; signal(SIGTERM, SIG_IGN); setsid(); for(;;) pause(); }\n",
    )
    .unwrap();
    let helper_bin = dir.path("root-helper");
    must(
        Command::new("cc").arg("-o").arg(&helper_bin).arg(&src),
        "a C compiler (cc) must be installed",
    );
    std::fs::set_permissions(&helper_bin, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let pids = dir.path("pids");
    std::fs::write(&pids, "").unwrap();
    std::fs::set_permissions(&pids, std::fs::Permissions::from_mode(0o666)).unwrap();
    let fake = FakeAuthority::start();
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .args(["--authority", &fake.url(), "--task", "setuid-helper"])
        // Without a namespace: in the user namespace an unprivileged agent
        // gets, a set-user-ID root file runs without gaining root (root is
        // not mapped there), which agent_contain's tests rely on instead.
        .args([
            "--no-pid-namespace",
            "--ttl",
            "30s",
            "--grace",
            "300ms",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "{} </dev/null >/dev/null 2>&1 & echo $! >> {}; sleep 0.2; exit 0",
            helper_bin.display(),
            pids.display()
        ))
        .env("RUST_LOG", "leaseagent=debug")
        .env("HOME", dir.0.path())
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::null());
    let mut child = spawn_logged(c, &dir);
    let keeper = keeper_of(child.id() as i32);
    let (status, err) = wait_logged(&mut child, &dir);
    let helper_pid = read_pids(&pids)[0];
    // The keeper, left behind, no longer busy-loops on what it cannot kill.
    let cpu = |p: i32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let f: Vec<&str> = s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0)
            + f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0)
    };
    let keeper_alive = alive(keeper);
    let t0 = cpu(keeper);
    std::thread::sleep(Duration::from_secs(3));
    let ticks = cpu(keeper) - t0;
    let helper_alive = alive(helper_pid);
    kill(helper_pid, 9);
    eprintln!("the keeper used {ticks} clock ticks in 3 s beside a process it cannot kill");
    assert!(
        helper_alive,
        "the setuid helper could not be killed by nobody"
    );
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!("process {helper_pid} (")) && err.contains("EPERM"),
        "{err}"
    );
    assert!(fake.requests_to("/v1/release").is_empty(), "{err}");
    assert!(
        keeper_alive,
        "the keeper stays with what it could not kill: {err}"
    );
    assert!(ticks <= 9, "the keeper burnt {ticks} ticks in 3 s");
    wait_for(T, || (!exists(keeper)).then_some(())).expect("the keeper ends with the helper");
}

// ------------------------------------------------------------ recycled pids

#[test]
fn after_a_pause_the_agent_never_signals_a_recycled_job_pid() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "recycled-pid");
    c.env("PIDS", dir.path("pids")).env("GO", dir.path("go"));
    c.args(TIMING)
        .args(["--", "sh", "-c"])
        .arg("echo $$ >> \"$PIDS\"; while [ ! -e \"$GO\" ]; do sleep 0.01; done; exit 0");
    let mut child = spawn(c);
    let agent_pid = child.id() as i32;
    let job = wait_pids(&dir.path("pids"), 1)[0];
    wait_renewals(&fake, 1);
    let stopped = stop::StopGuard::stopping(agent_pid); // it learns of the end only later
    std::fs::write(dir.path("go"), "").unwrap();
    wait_for(T, || (!exists(job)).then_some(())).expect("the job ended and was reaped");
    let mut decoy = crate::agent_tree::recycle_pid(job).expect("could not recycle the job's pid");
    // Past the deadline: the agent, resumed, acts on it at once.
    std::thread::sleep(Duration::from_millis(2500));
    stopped.resume(agent_pid);
    let (status, err) = wait_agent(&mut child, T);
    let decoy_alive = alive(decoy.id() as i32);
    let _ = decoy.kill();
    let _ = decoy.wait();
    assert!(
        decoy_alive,
        "a process that reused the job's pid was killed: {err}"
    );
    assert!(matches!(status.code(), Some(0) | Some(124)), "{err}");
}

#[test]
fn a_keeper_resumed_after_a_long_stop_acts_on_the_newest_deadline() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "keeper-resumed");
    c.env("OUT", dir.path("out"))
        .env("PIDS", dir.path("pids"))
        .env("RESUMED", dir.path("resumed"));
    // The keeper is stopped for longer than the ttl while renewals succeed:
    // deadlines it could not read pile up in its pipe.
    c.args(TIMING).args(["--", "bash", "-c"]).arg(format!(
        "echo $$ >> \"$PIDS\"; kill -STOP $PPID; sleep 3; kill -CONT $PPID; touch \"$RESUMED\"; exec {}",
        helper("clock-job.sh")
    ));
    let mut child = spawn(c);
    // The job stops its keeper and resumes it itself; watched meanwhile.
    let mut stopped = stop::StopGuard::new();
    stopped.watch(keeper_of(child.id() as i32));
    let job = wait_pids(&dir.path("pids"), 1)[0];
    wait_for(T, || {
        (dir.path("resumed").exists() || !alive(job)).then_some(())
    })
    .expect("the job resumed its keeper, or died");
    let n = fake.requests_to("/v1/renew").len();
    wait_renewals(&fake, n + 3);
    let alive_after = alive(job);
    kill(child.id() as i32, 15);
    let (_, err) = wait_agent(&mut child, T);
    assert!(
        alive_after,
        "the keeper acted on a deadline older than the renewals it had queued: {err}"
    );
    let released = fake.requests_to("/v1/release");
    assert_eq!(released.len(), 1, "{err}");
    assert_eq!(released[0].body["outcome"], "cancelled", "{err}");
}

// ------------------------------------------- the keeper's own output

/// The agent's stderr as `how` leaves it once the job runs, then the agent
/// SIGKILLed: the keeper, now the last guardian, says `agent_died` on that
/// stderr without dying of it (EPIPE used to panic it, SIGABRT in release)
/// or blocking on it, kills the tree and removes the job's cgroup.
fn keeper_outlives_its_stderr(how: &str) {
    use std::os::fd::{AsFd, OwnedFd};
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let pids = dir.path("pids");
    let (reader, writer) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    let ours: OwnedFd = writer.try_clone().unwrap();
    let mut c = agent(&fake.url(), &format!("keeper-stderr-{how}"));
    c.env("XDG_RUNTIME_DIR", dir.0.path());
    c.stdout(Stdio::null()).stderr(Stdio::from(writer));
    c.args(["--ttl", "30s", "--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 1000", pids.display()));
    let mut child = c.spawn().unwrap();
    let agent_pid = child.id() as i32;
    let job = wait_pids(&pids, 1)[0];
    let keeper = keeper_of(agent_pid);
    let job_cgroup = support::stop::cgroup_v2_dir(keeper)
        .expect("a cgroup v2 hierarchy")
        .join(format!("leaseagent-job-{agent_pid}"));
    assert!(
        job_cgroup.is_dir(),
        "{} (no job cgroup)",
        job_cgroup.display()
    );
    let kept = match how {
        "closed" => {
            drop(reader);
            None
        }
        _ => {
            // Full: nobody reads, and every byte of room is taken.
            rustix::fs::fcntl_setfl(&ours, rustix::fs::OFlags::NONBLOCK).unwrap();
            let chunk = [b'x'; 4096];
            while rustix::io::write(ours.as_fd(), &chunk).is_ok() {}
            let one = [b'x'; 1];
            while rustix::io::write(ours.as_fd(), &one).is_ok() {}
            Some(reader)
        }
    };
    drop(ours);
    kill(agent_pid, 9);
    let _ = wait_exit(&mut child, T);
    let gone = wait_for(Duration::from_secs(10), || {
        (!alive(job) && !alive(keeper) && !job_cgroup.exists()).then_some(())
    });
    let left = (alive(job), alive(keeper), job_cgroup.exists());
    if gone.is_none() {
        // Leave nothing behind for the next test.
        kill(keeper, 9);
        kill(job, 9);
        let _ = std::fs::write(job_cgroup.join("cgroup.kill"), "1");
        let _ = wait_for(Duration::from_secs(10), || {
            std::fs::remove_dir(&job_cgroup).ok()
        });
    }
    assert!(
        gone.is_some(),
        "stderr {how}: (job alive, keeper alive, cgroup left) = {left:?}"
    );
    // The full pipe's reader is closed only now, after the keeper ended.
    drop(kept);
}

#[test]
fn a_keeper_whose_stderr_reader_is_gone_still_kills_the_tree_and_removes_its_cgroup() {
    keeper_outlives_its_stderr("closed");
}

#[test]
fn a_keeper_whose_stderr_is_full_still_kills_the_tree_and_removes_its_cgroup() {
    keeper_outlives_its_stderr("full");
}

/// The keeper's stderr, read in full: after an agent SIGKILLed it says
/// `agent_died`, where a wrapper reading the unit's log can find it.
#[test]
fn an_agent_sigkilled_is_said_agent_died_on_the_keepers_stderr() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let pids = dir.path("pids");
    let mut c = agent(&fake.url(), "agent-died-said");
    c.env("XDG_RUNTIME_DIR", dir.0.path());
    c.args(["--ttl", "30s", "--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 1000", pids.display()));
    let mut child = spawn_logged(c, &dir);
    let agent_pid = child.id() as i32;
    let job = wait_pids(&pids, 1)[0];
    let keeper = keeper_of(agent_pid);
    kill(agent_pid, 9);
    let _ = wait_exit(&mut child, T);
    let gone = wait_for(Duration::from_secs(10), || {
        (!alive(job) && !alive(keeper)).then_some(())
    });
    let err = std::fs::read_to_string(dir.path("agent.log")).unwrap_or_default();
    assert!(gone.is_some(), "job or keeper outlived the agent: {err}");
    // The agent's view of the lease goes with it: its scribe, at the end
    // of its lane, removes the state file the agent could not.
    let state = dir
        .0
        .path()
        .join("leaseagent")
        .join(format!("lease-{agent_pid}.json"));
    let removed = wait_for(Duration::from_secs(10), || (!state.exists()).then_some(()));
    assert!(
        removed.is_some(),
        "a SIGKILLed agent left its state file: {err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("agent_died"))
        .unwrap_or_else(|| panic!("no agent_died line: {err}"));
    assert!(
        line.starts_with("leaseagent: keeper: warn: agent_died"),
        "{line}"
    );
}

/// A job cgroup left by a dead run (its agent pid gone) is removed by the
/// next run; one whose agent pid is alive (another run) stays.
#[test]
fn the_next_run_removes_a_dead_runs_job_cgroup_and_keeps_a_live_ones() {
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let mut live = Command::new("sleep").arg("1000").spawn().unwrap();
    let me = std::process::id() as i32;
    let parent = support::stop::cgroup_v2_dir(me).expect("a cgroup v2 hierarchy");
    let stale = parent.join(format!("leaseagent-job-{dead_pid}"));
    let other = parent.join(format!("leaseagent-job-{}", live.id()));
    std::fs::create_dir(&stale).unwrap();
    std::fs::create_dir(&other).unwrap();
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    let mut c = agent(&fake.url(), "stale-cgroups");
    c.env("XDG_RUNTIME_DIR", dir.0.path());
    c.args(["--ttl", "30s", "--", "true"]);
    let mut child = spawn_logged(c, &dir);
    let (status, err) = wait_logged(&mut child, &dir);
    let (stale_left, other_left) = (stale.exists(), other.exists());
    let _ = std::fs::remove_dir(&stale);
    let _ = std::fs::remove_dir(&other);
    let _ = live.kill();
    let _ = live.wait();
    assert!(status.success(), "{err}");
    assert!(!stale_left, "a dead run's job cgroup stayed: {err}");
    assert!(other_left, "a live run's job cgroup was removed");
}
