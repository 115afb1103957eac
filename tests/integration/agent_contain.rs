//! What a job does *to* its guardians (#31): it stops them, kills them,
//! traces them, writes into their descriptors through `/proc`, raises
//! their `oom_score_adj`, lowers their `RLIMIT_NOFILE` to 0. In each containment mode the machine offers, the
//! job's whole tree (its leader and a `setsid` escapee, both TERM-ignoring
//! clock-jobs) must be dead before the authority could expire the lease,
//! and nothing released while any of it lived:
//!
//! - `pidns-user`: a root agent, the keeper PID 1 of a PID namespace of its
//!   own, the job as `--user nobody`;
//! - `userns`: the agent as `nobody`, the keeper PID 1 of a user and PID
//!   namespace of its own (unprivileged user namespaces);
//! - `fallback`: the agent as `nobody` with `--no-pid-namespace` (no
//!   cgroup: the tree walk). Same-uid signals to the guardians (STOP, KILL
//!   of both) are *not* refused there (docs/failures.md says so); the rows
//!   that non-dumpable guardians and sockets refuse are tested.
//!
//! Each attack runs after the escapee started; then the authority goes
//! silent (a proxy that black-holes) and the deadline must hold.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(60);
const TTL_MS: u128 = 2000;
const TIMING: [&str; 6] = ["--ttl", "2s", "--heartbeat", "400ms", "--grace", "600ms"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    PidnsUser,
    Userns,
    Fallback,
}

/// The shell that finds the guardians from inside the job: the keeper is
/// the job's parent, the agent the keeper's parent where the job can see
/// it (without a namespace); in a namespace the keeper's parent is 0 (or
/// the keeper is not listed at all) and the agent cannot be named: both
/// attacks then go to the keeper. (The agent's pid is on no command line.)
const FIND: &str = "K=$PPID; A=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$K/status 2>/dev/null); \
                    [ \"${A:-0}\" -gt 0 ] 2>/dev/null || A=$K; \
                    echo \"$K $A\" > \"$DIR/guardians\"";

/// The attacks, as shell run by the job's leader.
fn attack(name: &str) -> String {
    match name {
        "stop" => format!("{FIND}; kill -STOP $K $A 2>/dev/null"),
        "kill" => format!("{FIND}; kill -KILL $K $A 2>/dev/null"),
        // PTRACE_SEIZE + PTRACE_INTERRUPT of both (strace attaches so).
        "ptrace" => format!(
            "{FIND}; (strace -o /dev/null -p $K -p $A 2>\"$DIR/strace.err\" &); sleep 0.3; \
             grep -q 'ptrace(PTRACE_SEIZE' \"$DIR/strace.err\" && ! grep -q attached \"$DIR/strace.err\" && echo refused > \"$DIR/ptrace\""
        ),
        // A forged Arm (deadline +1 h) and forged reports ("exit 0", tree
        // gone) into every descriptor of both.
        "procfd" => format!(
            "{FIND}; for f in /proc/$K/fd/* /proc/$A/fd/*; do \
               if printf 'X exit 0\\nG\\n' 2>/dev/null > \"$f\"; then echo \"$f\" >> \"$DIR/opened\"; fi; \
             done; echo tried > \"$DIR/procfd\""
        ),
        // The OOM killer's first choice: both guardians.
        "oom" => format!(
            "{FIND}; for p in $K $A; do \
               if echo 1000 2>/dev/null > /proc/$p/oom_score_adj; then echo $p >> \"$DIR/raised\"; fi; \
             done; echo tried > \"$DIR/oom\""
        ),
        "nofile" => format!(
            "{FIND}; prlimit --pid $K --nofile=0:0 2>/dev/null; prlimit --pid $A --nofile=0:0 2>/dev/null; \
             echo tried > \"$DIR/nofile\""
        ),
        _ => unreachable!("{name}"),
    }
}

/// The job: a TERM-ignoring clock-job in a session of its own (recording
/// to `esc`), then the attack, then the leader becomes a clock-job too
/// (recording to `out`).
fn job(dir: &Dir, name: &str) -> Vec<String> {
    vec![
        "bash".into(),
        "-c".into(),
        format!(
            "DIR={d}; OUT={d}/esc PIDS={d}/pids IGNORE_TERM=1 setsid {clock} </dev/null & \
             sleep 0.2; {attack}; echo done > {d}/attacked; IGNORE_TERM=1 OUT={d}/out exec {clock}",
            d = dir.0.path().display(),
            clock = helper("clock-job.sh"),
            attack = attack(name),
        ),
    ]
}

/// `(st_dev, st_ino)` of `/proc/PID/ns/pid`: which PID namespace `pid` is in.
fn pid_ns(pid: i32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    Some((m.dev(), m.ino()))
}

/// The host pids of every process in the PID namespace `ns`.
fn members_of(ns: (u64, u64)) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| pid_ns(p) == Some(ns))
        .collect()
}

/// Host pids of the keeper's descendants (fallback mode: the keeper's
/// children files, down the tree).
fn descendants_of(root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        let kids =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        for k in kids.split_whitespace().filter_map(|k| k.parse().ok()) {
            out.push(k);
            queue.push(k);
        }
    }
    out
}

/// When the authority could expire the lease.
fn expiry_ms(fake: &FakeAuthority) -> u128 {
    let last = fake
        .requests_to("/v1/renew")
        .last()
        .or(fake.requests_to("/v1/acquire").last())
        .map(|r| r.mono_ns)
        .expect("granted");
    mono_to_boot_ms(last) + TTL_MS
}

fn agent_command(mode: Mode, url: &str, task: &str, dir: &Dir) -> Command {
    let mut c = match mode {
        Mode::PidnsUser => {
            let mut c = agent_in_pidns(url, task);
            c.args(["--user", "nobody"]);
            c
        }
        Mode::Userns | Mode::Fallback => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(bin())
                .args(["--authority", url, "--task", task])
                .env("RUST_LOG", "leaseagent=debug")
                .env("HOME", dir.0.path())
                .env_remove("XDG_RUNTIME_DIR")
                .stdin(Stdio::null());
            if mode == Mode::Fallback {
                c.arg("--no-pid-namespace");
            }
            c
        }
    };
    c.args(TIMING);
    c
}

fn must_have(tool: &str) {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{tool} must be installed for this test");
}

/// Runs `name` against the guardians in `mode`, then silences the
/// authority: the tree is dead before expiry, no release while it lived.
fn attack_then_silence(mode: Mode, name: &str) {
    must_have("strace");
    must_have("prlimit");
    must_have("setpriv");
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let dir = Dir::new();
    std::fs::set_permissions(dir.0.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let task = format!("contain-{name}-{mode:?}");
    let mut c = agent_command(mode, &proxy.url(), &task, &dir);
    c.arg("--").args(job(&dir, name));
    let log = std::fs::File::create(dir.path("agent.log")).unwrap();
    c.stdout(Stdio::null()).stderr(log);
    let mut child = c.spawn().unwrap();
    // setpriv execs the agent: the same pid.
    let agent = child.id() as i32;
    let keeper = keeper_of(agent);
    let mut guard = stop::StopGuard::new();
    guard.watch(keeper);
    guard.watch(agent);
    // Where the attack succeeds in lowering the keeper's RLIMIT_NOFILE (a
    // same-uid keeper), the keeper stops the tree at once, maybe before
    // the job says it attacked, and the run ends; otherwise renewals go
    // on. Then the authority goes silent.
    let lowered = name == "nofile" && mode != Mode::PidnsUser;
    wait_for(T, || {
        let ended = lowered && child.try_wait().ok().flatten().is_some();
        (ended || dir.path("attacked").exists()).then_some(())
    })
    .unwrap_or_else(|| panic!("the job did not run its attack: {}", log_of(&dir)));
    // The tree as the host sees it, while it runs.
    let tree: Vec<i32> = match (mode, pid_ns(keeper)) {
        (Mode::Fallback, _) => descendants_of(keeper),
        (_, Some(ns)) => {
            if let Some(outside) = pid_ns(agent) {
                assert_ne!(ns, outside, "the keeper has a PID namespace of its own");
            }
            members_of(ns)
        }
        (_, None) => {
            assert!(lowered, "the keeper ended early: {}", log_of(&dir));
            Vec::new()
        }
    };
    let info = std::fs::read_to_string(dir.path("guardians")).unwrap_or_default();
    let seen: Vec<&str> = info.split_whitespace().collect();
    if mode != Mode::Fallback {
        assert_eq!(
            seen.first(),
            Some(&"1"),
            "the keeper is the job's PID 1: {info}"
        );
    }
    match name {
        "ptrace" => assert!(
            dir.path("ptrace").exists(),
            "strace attached to a guardian: {}",
            std::fs::read_to_string(dir.path("strace.err")).unwrap_or_default()
        ),
        "oom" => {
            assert!(dir.path("oom").exists(), "the attack ran");
            assert!(
                !dir.path("raised").exists(),
                "the job raised a guardian's oom_score_adj: {}",
                std::fs::read_to_string(dir.path("raised")).unwrap_or_default()
            );
        }
        "procfd" => assert!(
            !dir.path("opened").exists(),
            "the job opened a guardian's descriptor through /proc: {}",
            std::fs::read_to_string(dir.path("opened")).unwrap_or_default()
        ),
        _ => {}
    }
    if !lowered {
        wait_for(T, || {
            (fake.requests_to("/v1/renew").len() >= 2).then_some(())
        })
        .unwrap_or_else(|| panic!("renewals flow: {}", log_of(&dir)));
    }
    proxy.set(ProxyMode::Blackhole);
    let status = wait_exit(&mut child, T).expect("the agent exits");
    let err = log_of(&dir);
    let expiry = expiry_ms(&fake);
    // Every process of the tree, the setsid escapee included, is gone.
    let gone = wait_for(Duration::from_secs(5), || {
        tree.iter().all(|&p| !alive(p)).then_some(())
    });
    let left: Vec<i32> = tree.iter().copied().filter(|&p| alive(p)).collect();
    assert!(
        gone.is_some(),
        "{mode:?}/{name}: processes {left:?} of the tree outlived the agent: {err}"
    );
    let mut last_of_tree = 0;
    for (file, what) in [("out", "the leader"), ("esc", "the setsid escapee")] {
        let Some(last) = last_clock_record_ms(&dir.path(file)) else {
            // Killed before it began to record: only where the keeper
            // stopped the tree at the attack.
            assert!(lowered && file == "out", "{what} recorded nothing: {err}");
            continue;
        };
        eprintln!(
            "{mode:?}/{name}: {what} gone {} ms before the authority could expire the lease",
            expiry as i128 - last as i128
        );
        assert!(
            last < expiry,
            "{mode:?}/{name}: {what} ran {} ms past the lease's expiry: {err}",
            last - expiry
        );
        last_of_tree = last_of_tree.max(last);
    }
    // A release (the black-holed one, or one sent before) only after the
    // whole tree had stopped.
    for r in fake.requests_to("/v1/release") {
        assert!(
            mono_to_boot_ms(r.mono_ns) >= last_of_tree,
            "{mode:?}/{name}: released while the tree ran: {err}"
        );
    }
    // The lease was lost (124), or the keeper stopped the tree for a
    // resource failure before (the job's SIGKILL: 137).
    if lowered {
        assert!(err.contains("stopping the tree now"), "{err}");
        assert_eq!(status.code(), Some(137), "{mode:?}/{name}: {err}");
    } else {
        assert_eq!(status.code(), Some(124), "{mode:?}/{name}: {err}");
    }
    drop(guard);
}

fn log_of(dir: &Dir) -> String {
    std::fs::read_to_string(dir.path("agent.log")).unwrap_or_default()
}

fn containment_line(dir_log: &str, want: &str) -> bool {
    dir_log.contains(&format!("LEASE_CONTAINMENT={want}"))
}

// ---------------------------------------------------- root, --user nobody

#[test]
fn pidns_user_stop_of_both_guardians_is_refused() {
    attack_then_silence(Mode::PidnsUser, "stop");
}

#[test]
fn pidns_user_kill_of_both_guardians_is_refused() {
    attack_then_silence(Mode::PidnsUser, "kill");
}

#[test]
fn pidns_user_ptrace_of_both_guardians_is_refused() {
    attack_then_silence(Mode::PidnsUser, "ptrace");
}

#[test]
fn pidns_user_writes_into_the_guardians_fds_are_refused() {
    attack_then_silence(Mode::PidnsUser, "procfd");
}

#[test]
fn pidns_user_nofile_zero_on_the_guardians_is_refused() {
    attack_then_silence(Mode::PidnsUser, "nofile");
}

#[test]
fn pidns_user_oom_score_adj_of_the_guardians_is_refused() {
    attack_then_silence(Mode::PidnsUser, "oom");
}

// ------------------------------------- nobody, a user namespace of its own

#[test]
fn userns_oom_score_adj_of_the_guardians_is_refused() {
    attack_then_silence(Mode::Userns, "oom");
}

#[test]
fn userns_stop_of_both_guardians_is_refused() {
    attack_then_silence(Mode::Userns, "stop");
}

#[test]
fn userns_kill_of_both_guardians_is_refused() {
    attack_then_silence(Mode::Userns, "kill");
}

#[test]
fn userns_ptrace_of_both_guardians_is_refused() {
    attack_then_silence(Mode::Userns, "ptrace");
}

#[test]
fn userns_writes_into_the_guardians_fds_are_refused() {
    attack_then_silence(Mode::Userns, "procfd");
}

#[test]
fn userns_nofile_zero_on_the_keeper_stops_the_tree() {
    attack_then_silence(Mode::Userns, "nofile");
}

// ------------------------------------------- nobody, no namespace, no cgroup

#[test]
fn fallback_ptrace_of_both_guardians_is_refused() {
    attack_then_silence(Mode::Fallback, "ptrace");
}

#[test]
fn fallback_writes_into_the_guardians_fds_are_refused() {
    attack_then_silence(Mode::Fallback, "procfd");
}

#[test]
fn fallback_oom_score_adj_of_the_guardians_is_refused() {
    attack_then_silence(Mode::Fallback, "oom");
}

#[test]
fn fallback_nofile_zero_on_both_guardians_stops_the_tree() {
    attack_then_silence(Mode::Fallback, "nofile");
}

// ------------------------------------------------------ what the job sees

/// The job is told its containment, sees only its own tree in `ps`, and
/// the keeper is its PID 1 (not listed for a root job: `sys::confine`);
/// `--no-pid-namespace` gives it the host's.
#[test]
fn the_job_sees_its_containment_and_only_its_own_tree() {
    let fake = FakeAuthority::start();
    for (flags, want_ns) in [(&[][..], true), (&["--no-pid-namespace"][..], false)] {
        let dir = Dir::new();
        let mut c = agent_in_pidns(&fake.url(), "contain-ps");
        c.args(flags).arg("--").args([
            "sh",
            "-c",
            &format!(
                "echo \"$LEASE_CONTAINMENT\" > {d}/c; echo $PPID > {d}/ppid; ps -e -o pid= > {d}/ps; \
                 for i in $(seq 200); do grep -q containment \"$LEASEAGENT_STATE_FILE\" && break; sleep 0.05; done; \
                 cp \"$LEASEAGENT_STATE_FILE\" {d}/state",
                d = dir.0.path().display()
            ),
        ]);
        let mut child = spawn(c);
        let (status, err) = wait_agent(&mut child, T);
        assert_eq!(status.code(), Some(0), "{err}");
        let c = std::fs::read_to_string(dir.path("c")).unwrap();
        let ps = std::fs::read_to_string(dir.path("ps")).unwrap();
        let procs = ps.lines().count();
        // The state file says it too (`leaseagent check` reads it).
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path("state")).unwrap()).unwrap();
        assert_eq!(state["containment"].as_str(), Some(c.trim()), "{state}");
        if want_ns {
            assert_eq!(c.trim(), "pidns", "{err}");
            assert!(containment_line(&err, "pidns"), "{err}");
            // The keeper is the job's parent, PID 1; a root job (this
            // one) does not even see it listed (`hidepid=ptraceable`).
            let ppid = std::fs::read_to_string(dir.path("ppid")).unwrap();
            assert_eq!(ppid.trim(), "1", "{err}");
            assert!(!ps.lines().any(|l| l.trim() == "1"), "{ps}");
            // The shell, ps.
            assert!(procs <= 3, "the job sees more than its tree: {ps}");
        } else {
            assert!(matches!(c.trim(), "cgroup" | "tree"), "{c}: {err}");
            assert!(procs > 4, "the job sees the host's processes: {ps}");
        }
    }
}

/// A `--user` job inside the namespace runs with the user's ids.
#[test]
fn a_user_job_in_the_namespace_has_the_users_ids() {
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    std::fs::set_permissions(dir.0.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut c = agent_in_pidns(&fake.url(), "contain-user");
    c.args(["--user", "nobody", "--"]).args([
        "sh",
        "-c",
        &format!(
            "id -u > {d}/uid; echo \"$LEASE_CONTAINMENT\" > {d}/c",
            d = dir.0.path().display()
        ),
    ]);
    let mut child = spawn(c);
    let (status, err) = wait_agent(&mut child, T);
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.path("uid")).unwrap().trim(),
        "65534"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("c")).unwrap().trim(),
        "pidns"
    );
}

// ------------------------------------------------------------ a big tree

/// `n` TERM-ignoring processes, each in a session of its own; the
/// authority goes silent. The kill lead grows with the tree (the keeper
/// samples it), so every process has died before the authority could
/// expire the lease: in a namespace, its init (the keeper) has ended,
/// which it does only once every other process of it is gone; without
/// one (the tree walk, as `nobody`), no process of the tree is left.
fn big_tree_dead_before_expiry(mode: Mode, n: usize) {
    let fake = FakeAuthority::start();
    let proxy = Proxy::start(fake.addr);
    let home = Dir::new();
    std::fs::set_permissions(home.0.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut c = match mode {
        Mode::PidnsUser => agent_in_pidns(&proxy.url(), "contain-big"),
        _ => agent_command(mode, &proxy.url(), "contain-big", &home),
    };
    c.args([
        "--ttl",
        "4s",
        "--heartbeat",
        "1s",
        "--grace",
        "500ms",
        "--",
        "bash",
        "-c",
    ])
    .arg(format!(
        "trap '' TERM; for i in $(seq {n}); do setsid sleep 1000 </dev/null & done; wait"
    ));
    let mut child = spawn(c);
    let agent = child.id() as i32;
    let keeper = keeper_of(agent);
    let mut guard = stop::StopGuard::new();
    guard.watch(keeper);
    let ns = pid_ns(keeper).expect("the keeper's namespace");
    let tree = || match mode {
        Mode::Fallback => descendants_of(keeper),
        _ => members_of(ns),
    };
    let started = wait_for(Duration::from_secs(120), || {
        let t = tree();
        (t.len() > n).then_some(t)
    })
    .expect("the tree started");
    // Samples of the full tree, and renewals that hand the keeper the lead
    // sized from them.
    let renewed = fake.requests_to("/v1/renew").len();
    wait_for(T, || {
        (fake.requests_to("/v1/renew").len() >= renewed + 2).then_some(())
    })
    .expect("renewals flow");
    proxy.set(ProxyMode::Blackhole);
    let dead = wait_for(T, || match mode {
        Mode::Fallback => started.iter().all(|&p| !alive(p)).then(boot_ms),
        _ => (!exists(keeper)).then(boot_ms),
    });
    let (status, err) = wait_agent(&mut child, T);
    let dead = dead.expect("the tree died");
    let expiry = mono_to_boot_ms(
        fake.requests_to("/v1/renew")
            .last()
            .map(|r| r.mono_ns)
            .expect("renewed"),
    ) + 4_000;
    eprintln!(
        "{mode:?}, {n} processes: the tree was gone {} ms before the authority could expire the lease",
        expiry as i128 - dead as i128
    );
    assert!(
        dead < expiry,
        "the tree lived {} ms past expiry: {err}",
        dead - expiry
    );
    assert_eq!(status.code(), Some(124), "{err}");
    drop(guard);
}

#[test]
fn a_thousand_setsid_processes_in_the_namespace_are_dead_before_expiry() {
    big_tree_dead_before_expiry(Mode::PidnsUser, 1_000);
}

#[test]
fn two_thousand_setsid_processes_of_nobody_without_a_namespace_are_dead_before_expiry() {
    big_tree_dead_before_expiry(Mode::Fallback, 2_000);
}

/// What a job in a *user* namespace can no longer do: a set-user-ID root
/// file runs without gaining root (root is not mapped there). Without the
/// namespace the same file, run by the same unprivileged agent, does.
#[test]
fn in_a_user_namespace_a_setuid_root_file_gains_nothing() {
    let dir = Dir::new();
    std::fs::set_permissions(dir.0.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.path("suid.c");
    std::fs::write(
        &src,
        "#define _GNU_SOURCE\n#include <unistd.h>\nint main(void){ return setresuid(0,0,0) ? 3 : 0; }\n",
    )
    .unwrap();
    let suid = dir.path("suid");
    let built = Command::new("cc").arg("-o").arg(&suid).arg(&src).status();
    assert!(
        built.is_ok_and(|s| s.success()),
        "a C compiler (cc) must be installed"
    );
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let fake = FakeAuthority::start();
    for (mode, want) in [(Mode::Userns, 3), (Mode::Fallback, 0)] {
        let home = Dir::new();
        std::fs::set_permissions(home.0.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut c = agent_command(mode, &fake.url(), &format!("contain-suid-{mode:?}"), &home);
        c.arg("--").arg(&suid);
        let mut child = spawn(c);
        let (status, err) = wait_agent(&mut child, T);
        assert_eq!(status.code(), Some(want), "{mode:?}: {err}");
    }
}
