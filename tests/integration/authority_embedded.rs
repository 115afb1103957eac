//! The embedded default authority with several OS processes on one
//! database: each child process is this test binary re-run with
//! `LA_EMBEDDED_CHILD` set, using `EmbeddedAuthority` like an agent would.

use crate::support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leaseagent::testing::EmbeddedAuthority;
use leaseagent::testing::{
    AcquireError, AcquireRequest, ExpiryPolicy, LeaseClient, Operator, Outcome, RefusalReason,
    RenewError,
};
use support::authority::poll;

const T: Duration = Duration::from_secs(10);

fn req(
    task: &str,
    holder: &str,
    ttl_ms: u64,
    policy: ExpiryPolicy,
    grace_ms: u64,
) -> AcquireRequest {
    AcquireRequest {
        task: task.into(),
        holder: holder.into(),
        ttl: Duration::from_millis(ttl_ms),
        on_expiry: policy,
        grace: Duration::from_millis(grace_ms),
    }
}

/// Starts a child process running `op` against the database at `db`.
fn child(db: &Path, op: &str, args: &[&str]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "authority_embedded::child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LA_EMBEDDED_CHILD", op)
        .env("LA_DB", db)
        .env("LA_ARGS", args.join(" "))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The result in a line the child printed (after `@`; the test harness
/// may have printed its own text before it on the same line).
fn at(l: &str) -> Option<&str> {
    l.find('@').map(|i| &l[i + 1..])
}

/// A token a churn child printed; anything else (its error) fails the test.
fn token(l: &str) -> u64 {
    l.parse()
        .unwrap_or_else(|_| panic!("a churn child failed: {l}"))
}

/// Lines the child printed with the prefix `@`.
fn results(c: Child) -> Vec<String> {
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| at(l).map(str::to_string))
        .collect()
}

/// The child side. Without `LA_EMBEDDED_CHILD` it checks that a malformed
/// task is rejected without touching any database.
#[test]
fn child_process_entry() {
    let Ok(op) = std::env::var("LA_EMBEDDED_CHILD") else {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        let mut a = EmbeddedAuthority::new(db.clone());
        assert!(matches!(
            a.acquire(&req("a b", "h", 1000, ExpiryPolicy::Redispatch, 0), T),
            Err(AcquireError::Rejected(_))
        ));
        assert!(!db.exists());
        return;
    };
    let db = std::env::var("LA_DB").unwrap();
    let args: Vec<String> = std::env::var("LA_ARGS")
        .unwrap()
        .split(' ')
        .map(str::to_string)
        .collect();
    let pid = std::process::id();
    match op.as_str() {
        // Several threads, each with its own handle, wait for a start file
        // and race for one task.
        "race" => {
            let (task, threads, start) = (
                args[0].clone(),
                args[1].parse::<usize>().unwrap(),
                args[2].clone(),
            );
            let hs: Vec<_> = (0..threads)
                .map(|i| {
                    let (db, task, start) = (db.clone(), task.clone(), start.clone());
                    std::thread::spawn(move || {
                        let mut a = EmbeddedAuthority::new(db.into());
                        poll("start", Duration::from_secs(30), || {
                            Path::new(&start).exists().then_some(())
                        });
                        match a.acquire(
                            &req(
                                &task,
                                &format!("{pid}/{i}"),
                                30000,
                                ExpiryPolicy::Redispatch,
                                0,
                            ),
                            T,
                        ) {
                            Ok(g) => format!("GRANT {}", g.token),
                            Err(AcquireError::Held { .. }) => "HELD".to_string(),
                            Err(e) => format!("ERROR {e}"),
                        }
                    })
                })
                .collect();
            for h in hs {
                println!("@{}", h.join().unwrap());
            }
        }
        // Acquire and release N times (retrying while held), printing tokens.
        "churn" => {
            let (task, n) = (args[0].clone(), args[1].parse::<usize>().unwrap());
            let mut a = EmbeddedAuthority::new(db.into());
            let mut done = 0;
            while done < n {
                let sent = std::time::Instant::now();
                match a.acquire(
                    &req(&task, &format!("{pid}"), 1000, ExpiryPolicy::Redispatch, 0),
                    T,
                ) {
                    Ok(g) => {
                        println!("@{}", g.token);
                        // On a loaded machine the lease may expire first: that is fine.
                        let _ = a.renew(&g.lease_ref(), T);
                        let _ = a.release(&g.lease_ref(), Outcome::Succeeded, Some(0), T);
                        done += 1;
                    }
                    Err(AcquireError::Held { .. }) => std::thread::sleep(Duration::from_millis(5)),
                    Err(e) => {
                        // The parent fails on this line and shows it.
                        println!("@ERROR after {:?}: {e:?}", sent.elapsed());
                        panic!("{e}");
                    }
                }
            }
        }
        // Acquire (ttl an hour), release, print the token, then wait to be
        // killed.
        "release-then-stay" => {
            let mut a = EmbeddedAuthority::new(db.into());
            let g = a
                .acquire(&req(&args[0], "stay", 3_600_000, ExpiryPolicy::Hold, 0), T)
                .unwrap();
            a.release(&g.lease_ref(), Outcome::Succeeded, Some(0), T)
                .unwrap();
            println!("@{}", g.token);
            std::thread::sleep(Duration::from_secs(600));
        }
        _ => panic!("unknown child op {op}"),
    }
}

#[test]
fn grants_from_several_processes_strictly_increase_and_are_unique() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("l.db");
    let kids: Vec<Child> = (0..4).map(|_| child(&db, "churn", &["seq", "5"])).collect();
    let mut all = Vec::new();
    for k in kids {
        let toks: Vec<u64> = results(k).iter().map(|l| token(l)).collect();
        assert_eq!(toks.len(), 5);
        assert!(toks.windows(2).all(|w| w[1] > w[0]), "{toks:?}");
        all.extend(toks);
    }
    all.sort_unstable();
    assert_eq!(all, (1..=20).collect::<Vec<u64>>());
}

#[test]
fn forty_racers_in_ten_processes_get_exactly_one_grant() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("l.db");
    let start = d.path().join("go");
    let s = start.to_str().unwrap();
    let kids: Vec<Child> = (0..10)
        .map(|_| child(&db, "race", &["race", "4", s]))
        .collect();
    std::fs::write(&start, b"").unwrap();
    let lines: Vec<String> = kids.into_iter().flat_map(results).collect();
    assert_eq!(lines.len(), 40, "{lines:?}");
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("GRANT")).count(),
        1,
        "{lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| *l == "HELD").count(),
        39,
        "{lines:?}"
    );
}

#[test]
fn kill_9_during_churn_never_reuses_a_token() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("l.db");
    let mut seen = HashSet::new();
    let mut last_max = 0;
    for round in 0..5 {
        let mut kids: Vec<Child> = (0..3)
            .map(|_| child(&db, "churn", &["crash", "1000000"]))
            .collect();
        // Read tokens from the first child until it has granted a few, then kill all.
        let out = kids[0].stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        let mut got = Vec::new();
        while got.len() < 10 {
            let l = lines
                .next()
                .unwrap_or_else(|| panic!("the first child ended after {got:?}"))
                .unwrap();
            if let Some(t) = at(&l) {
                got.push(token(t));
            }
        }
        for k in &mut kids {
            let _ = k.kill();
        }
        for l in lines.map_while(Result::ok) {
            if let Some(t) = at(&l) {
                got.push(token(t));
            }
        }
        for mut k in kids.drain(1..) {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(k.stdout.as_mut().unwrap(), &mut s);
            let _ = k.wait();
            got.extend(s.lines().filter_map(at).map(token));
        }
        let _ = kids[0].wait();
        for t in &got {
            assert!(seen.insert(*t), "token {t} reused (round {round})");
        }
        let min = *got.iter().min().unwrap();
        assert!(
            min > last_max,
            "round {round}: token {min} not above {last_max}"
        );
        last_max = *got.iter().max().unwrap();
    }
    // Kills landed in grants, renewals, releases and checkpoints: the file
    // is whole.
    let c = rusqlite::Connection::open(&db).unwrap();
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}

#[test]
fn renew_after_expiry_is_expired_and_another_process_sees_the_lease() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("l.db");
    let mut a = EmbeddedAuthority::new(db.clone());
    let g = a
        .acquire(&req("e", "me", 1000, ExpiryPolicy::Redispatch, 0), T)
        .unwrap();
    let lines = results(child(&db, "race", &["e", "1", d.path().to_str().unwrap()]));
    assert_eq!(
        lines,
        vec!["HELD".to_string()],
        "another process must see the live lease"
    );
    poll("expiry", Duration::from_secs(10), || {
        a.leases(T).unwrap().is_empty().then_some(())
    });
    assert!(matches!(
        a.renew(&g.lease_ref(), T),
        Err(RenewError::Refused {
            reason: RefusalReason::Expired,
            ..
        })
    ));
}

#[test]
fn a_lease_from_another_boot_is_held_for_its_ttl_on_the_wall_clock() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("l.db");
    let mut a = EmbeddedAuthority::new(db.clone());
    let g = a
        .acquire(&req("b", "me", 3_600_000, ExpiryPolicy::Redispatch, 0), T)
        .unwrap();
    let other = || req("b", "other", 1000, ExpiryPolicy::Redispatch, 0);
    assert!(matches!(
        a.acquire(&other(), T),
        Err(AcquireError::Held { .. })
    ));
    let c = rusqlite::Connection::open(&db).unwrap();
    // Written under another boot id: its boot-clock expiry means nothing
    // here, but it was written just now with an hour's ttl: held.
    c.execute(
        "UPDATE tasks SET boot_id = '00000000-0000-0000-0000-000000000000', expires_ms = 0",
        [],
    )
    .unwrap();
    assert!(matches!(
        a.acquire(&other(), T),
        Err(AcquireError::Held { .. })
    ));
    // Last written more than an hour (and the margin) ago: free.
    c.execute("UPDATE tasks SET written_ms = written_ms - 3700000", [])
        .unwrap();
    let g2 = a.acquire(&other(), T).unwrap();
    assert!(g2.token > g.token);
    // A row from before write times were kept, of another boot: expired,
    // as every earlier version read it.
    c.execute(
        "UPDATE tasks SET boot_id = '00000000-0000-0000-0000-000000000000', written_ms = NULL",
        [],
    )
    .unwrap();
    drop(c);
    let g3 = a
        .acquire(&req("b", "third", 1000, ExpiryPolicy::Redispatch, 0), T)
        .unwrap();
    assert!(g3.token > g2.token);
}

/// A command that runs `leaseagent ARGS` on the embedded default in
/// `state`, inside `view`: the host's clocks, a time namespace whose
/// `CLOCK_BOOTTIME` is offset by `Boottime(secs)`, or a mount namespace
/// whose `/proc/sys/kernel/random/boot_id` reads `BootId(file)`'s text (the
/// agent is exec'd: its pid is the command's).
fn agent_in(state: &Path, view: &View, args: &[&str]) -> Command {
    let bin = support::authority::bin();
    let mut c = match view {
        View::Host => Command::new(&bin),
        View::Boottime(secs) => {
            let mut c = Command::new("unshare");
            c.args(["--time", "--boottime", &secs.to_string(), "--"])
                .arg(&bin);
            c
        }
        View::BootId(file) => {
            let mut c = Command::new("unshare");
            c.args(["--mount", "--propagation", "private", "--"])
                .args([
                    "sh",
                    "-c",
                    "mount --bind \"$0\" /proc/sys/kernel/random/boot_id && exec \"$@\"",
                ])
                .arg(file)
                .arg(&bin);
            c
        }
    };
    c.args(args)
        .env("LEASEAGENT_STATE_DIR", state)
        .env_remove("LEASEAGENT_AUTHORITY")
        .stdin(Stdio::null());
    c
}

/// Where an agent reads its clocks.
#[derive(Debug)]
enum View {
    Host,
    Boottime(i64),
    BootId(std::path::PathBuf),
}

/// Runs a short agent of task `v` in `view`: (exit code, stderr).
fn try_task(state: &Path, view: &View) -> (Option<i32>, String) {
    let out = agent_in(state, view, &["--task", "v", "--ttl", "3s", "--", "true"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starts a long agent of task `v` in `view` and waits for its job.
fn hold_task(state: &Path, view: &View, ready: &Path) -> Child {
    let mut c = agent_in(
        state,
        view,
        &[
            "--task",
            "v",
            "--ttl",
            "3s",
            "--",
            &support::helper("sleeper.sh"),
        ],
    );
    c.env("OUT", ready)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = c.spawn().expect("unshare (util-linux) is needed");
    poll("the holder's job", T, || {
        std::fs::read_to_string(ready)
            .ok()
            .filter(|s| s.contains("ready"))
    });
    child
}

#[test]
fn agents_under_other_clocks_never_hold_one_task_at_once() {
    // The review: B under another boot id, or in a time namespace with
    // CLOCK_BOOTTIME a day ahead, or up to 1,000 s behind, was granted the task
    // every time while A's job ran (the engine compared raw boot-clock ms
    // and read another boot id as expired).
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    let fake = d.path().join("boot_id");
    std::fs::write(&fake, "11111111-2222-4333-8444-555555555555\n").unwrap();
    // Behind by up to 1,000 s, as far as this machine's boot clock allows
    // (a machine booted a minute ago has less than that to go back).
    let behind = support::boottime_behind(1000, 10);
    let others = [
        View::Boottime(86_400),
        View::Boottime(behind),
        View::BootId(fake.clone()),
    ];

    // A on the host's clocks holds the task; every other view is refused.
    let mut a = hold_task(&state, &View::Host, &d.path().join("ready-a"));
    for view in &others {
        let (code, err) = try_task(&state, view);
        assert_eq!(code, Some(75), "{view:?} while A runs: {err}");
        assert!(err.contains("is held by"), "{view:?}: {err}");
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(a.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    support::wait_exit(&mut a, T).expect("A ends");
    // Released: free at once for another view.
    let (code, err) = try_task(&state, &View::Boottime(86_400));
    assert_eq!(code, Some(0), "after A's release: {err}");

    // A under another boot id holds it; the host and a time namespace are
    // refused. Then A dies without releasing (kill -9): the lease is held
    // until its ttl has passed on the wall clock since its last renewal,
    // then free, never read as expired at once.
    let mut a = hold_task(
        &state,
        &View::BootId(fake.clone()),
        &d.path().join("ready-b"),
    );
    for view in [&View::Host, &View::Boottime(86_400)] {
        let (code, err) = try_task(&state, view);
        assert_eq!(code, Some(75), "{view:?} while A runs: {err}");
    }
    let _ = a.kill();
    let _ = a.wait();
    let killed = std::time::Instant::now();
    let (code, err) = try_task(&state, &View::Host);
    assert_eq!(code, Some(75), "right after A's death: {err}");
    let (code, err) = poll("the dead holder's lease to pass", T * 3, || {
        let (code, err) = try_task(&state, &View::Host);
        (code != Some(75)).then_some((code, err))
    });
    assert_eq!(code, Some(0), "{err}");
    // Its ttl (3 s) from its last renewal (at most 1 s before the kill).
    assert!(
        killed.elapsed() >= Duration::from_millis(1900),
        "free after {:?}",
        killed.elapsed()
    );
}

fn cli(state: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(support::authority::bin())
        .args(args)
        .env("LEASEAGENT_STATE_DIR", state)
        .env_remove("LEASEAGENT_AUTHORITY")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// What a power loss may leave of a state directory, as real agents see
/// it: grants under the durable token ceiling were answered without an
/// fsync and are gone, the synced reservation survives, and the machine
/// has a new boot id. The next agent's token is above the ceiling.
#[test]
fn after_a_simulated_power_loss_an_agent_starts_above_the_token_ceiling() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("leases.sqlite3");
    let run = || {
        let (code, out) = cli(
            state.path(),
            &["--task", "p", "--", "sh", "-c", "echo TOKEN=$LEASE_TOKEN"],
        );
        assert_eq!(code, 0, "{out}");
        let t = out.split("TOKEN=").nth(1).expect(&out);
        t.split_whitespace().next().unwrap().parse::<u64>().unwrap()
    };
    assert_eq!((run(), run(), run()), (1, 2, 3));
    let c = rusqlite::Connection::open(&db).unwrap();
    let ceiling = |c: &rusqlite::Connection| -> (String, String) {
        let get = |k: &str| -> String {
            c.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
                .unwrap()
        };
        (get("token_ceiling"), get("token_ceiling_state"))
    };
    assert_eq!(ceiling(&c), ("1024".into(), "durable".into()));
    c.execute_batch(
        "UPDATE seq SET last_token = 1;
         UPDATE meta SET value = 'pending' WHERE key = 'token_ceiling_state';
         UPDATE meta SET value = '00000000-0000-0000-0000-000000000000'
           WHERE key = 'token_ceiling_boot';",
    )
    .unwrap();
    assert_eq!(run(), 1025);
    assert_eq!(run(), 1026);
    assert_eq!(ceiling(&c), ("2048".into(), "durable".into()));
}

#[test]
fn grace_hold_clear_and_revoke_on_the_default_authority_with_the_cli() {
    let state = tempfile::tempdir().unwrap();
    // The default authority: the database under LEASEAGENT_STATE_DIR.
    let db = state.path().join("leases.sqlite3");
    let mut a = EmbeddedAuthority::new(db.clone());
    let (code, out) = cli(state.path(), &["leases"]);
    assert_eq!((code, out.trim()), (0, "no leases"));

    a.acquire(&req("grace", "g", 1000, ExpiryPolicy::Grace, 60_000), T)
        .unwrap();
    let held = a
        .acquire(&req("hold", "h", 1000, ExpiryPolicy::Hold, 0), T)
        .unwrap();
    poll("grace and held states", Duration::from_secs(10), || {
        let (_, out) = cli(state.path(), &["leases", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        let st = |t: &str| {
            v["leases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["task"] == t)
                .map(|l| l["state"].clone())
        };
        (st("grace") == Some("grace".into()) && st("hold") == Some("held_for_operator".into()))
            .then_some(())
    });
    assert!(matches!(
        a.acquire(&req("grace", "x", 1000, ExpiryPolicy::Redispatch, 0), T),
        Err(AcquireError::Held { .. })
    ));
    match a.acquire(&req("hold", "x", 1000, ExpiryPolicy::Redispatch, 0), T) {
        Err(AcquireError::HeldForOperator { holder, lease_id }) => {
            assert_eq!((holder.as_str(), lease_id), ("h", held.lease_id.clone()));
        }
        other => panic!("{other:?}"),
    }
    let (code, out) = cli(state.path(), &["leases"]);
    assert!(
        code == 0 && out.contains("TASK") && out.contains("held_for_operator"),
        "{out}"
    );
    assert_eq!(cli(state.path(), &["clear", "hold"]).0, 0);
    assert_eq!(cli(state.path(), &["clear", "hold"]).0, 1);
    let g = a
        .acquire(&req("hold", "x", 2000, ExpiryPolicy::Redispatch, 0), T)
        .unwrap();
    assert!(g.token > held.token);

    // Revoke without force: refused at renewal, free only after expiry.
    let (code, out) = cli(state.path(), &["revoke", "hold"]);
    assert_eq!(code, 0, "{out}");
    assert!(matches!(
        a.renew(&g.lease_ref(), T),
        Err(RenewError::Refused {
            reason: RefusalReason::Revoked,
            ..
        })
    ));
    assert!(
        a.acquire(&req("hold", "y", 1000, ExpiryPolicy::Redispatch, 0), T)
            .is_err()
    );
    let g2 = poll("revoked lease to expire", Duration::from_secs(10), || {
        a.acquire(&req("hold", "y", 30_000, ExpiryPolicy::Redispatch, 0), T)
            .ok()
    });
    // With force: free at once.
    let (code, out) = cli(state.path(), &["revoke", "--force", "--json", "hold"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"force\":true"), "{out}");
    let g3 = a
        .acquire(&req("hold", "z", 30_000, ExpiryPolicy::Redispatch, 0), T)
        .unwrap();
    assert!(g3.token > g2.token);
    assert!(matches!(
        a.renew(&g2.lease_ref(), T),
        Err(RenewError::Refused {
            reason: RefusalReason::Revoked,
            ..
        })
    ));
    assert_eq!(cli(state.path(), &["revoke", "nothing-here"]).0, 1);
}

/// Every file under `dir`, with its size.
fn sizes(dir: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = e.metadata().unwrap();
        if meta.is_dir() {
            out.extend(sizes(&e.path()));
        } else {
            out.push((e.path().display().to_string(), meta.len()));
        }
    }
    out
}

/// The state directory's bound: the WAL is checkpointed and truncated once
/// it passes 256 KiB (after a release) or 1 MiB (after a renewal); the
/// database holds a few task rows and the run history of these attempts
/// (about 250 KB).
const STATE_DIR_BOUND: u64 = 1536 * 1024;

#[test]
fn the_state_dir_stays_small_after_thousands_of_runs() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("leases.sqlite3");
    // 3,000 runs the way agents make them: a handle per run (its own
    // connection, the first and only one open, as in a fresh process),
    // seven tasks, a renewal now and then; without checkpoints this leaves
    // a WAL of tens of MiB.
    let mut last = 0;
    for i in 0..3000 {
        let mut a = EmbeddedAuthority::new(db.clone());
        let g = a
            .acquire(
                &req(
                    &format!("cron-{}", i % 7),
                    "h",
                    30_000,
                    ExpiryPolicy::Redispatch,
                    0,
                ),
                T,
            )
            .unwrap();
        assert!(g.token > last, "run {i}: {} after {last}", g.token);
        last = g.token;
        if i % 10 == 0 {
            a.renew(&g.lease_ref(), T).unwrap();
            a.after_renewal();
        }
        a.release(&g.lease_ref(), Outcome::Succeeded, Some(0), T)
            .unwrap();
    }
    // A long job alone: 600 renewals, each reported, nobody else releasing.
    let mut long = EmbeddedAuthority::new(db.clone());
    let g = long
        .acquire(&req("long", "h", 30_000, ExpiryPolicy::Redispatch, 0), T)
        .unwrap();
    for _ in 0..600 {
        long.renew(&g.lease_ref(), T).unwrap();
        long.after_renewal();
    }
    long.release(&g.lease_ref(), Outcome::Succeeded, Some(0), T)
        .unwrap();
    drop(long);
    // And the real agent, end to end.
    for i in 0..40 {
        let (code, out) = cli(
            state.path(),
            &["--task", &format!("cron-{}", i % 7), "--", "true"],
        );
        assert_eq!(code, 0, "{out}");
    }
    let files = sizes(state.path());
    let total: u64 = files.iter().map(|f| f.1).sum();
    assert!(
        total < STATE_DIR_BOUND,
        "the state directory holds {total} bytes after 3,640 runs: {files:?}"
    );
    let c = rusqlite::Connection::open(&db).unwrap();
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let seq: i64 = c
        .query_row("SELECT last_token FROM seq", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seq, 3041, "every grant is on record");
}

#[test]
fn kill_9_right_after_a_release_loses_nothing() {
    // A release commits without an fsync: a process killed right after it
    // loses nothing, since the page cache holds the WAL frames it wrote.
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("l.db");
    let mut k = child(&db, "release-then-stay", &["k"]);
    let mut lines = BufReader::new(k.stdout.take().unwrap()).lines();
    let released: u64 = loop {
        let l = lines.next().expect("the child ended early").unwrap();
        if let Some(t) = at(&l) {
            break token(t);
        }
    };
    k.kill().unwrap();
    k.wait().unwrap();
    let mut a = EmbeddedAuthority::new(db.clone());
    // Free at once (the lease's ttl is an hour): the release survived.
    let g = a
        .acquire(&req("k", "next", 1000, ExpiryPolicy::Hold, 0), T)
        .unwrap();
    assert!(g.token > released, "{} after {released}", g.token);
}

#[test]
fn real_agents_killed_at_any_moment_never_reuse_a_token() {
    // kill -9 lands anywhere in a run: before, inside or after the grant's
    // commit and sync, between the grant and its answer, in the release, in
    // a checkpoint. Whatever it hit, a token a job saw is never seen again
    // and the file stays whole.
    let state = tempfile::tempdir().unwrap();
    let run = |task: &str, delay: Option<Duration>| -> (Option<i32>, Vec<u64>) {
        let mut c = Command::new(support::authority::bin())
            .args(["--task", task, "--ttl", "2s", "--heartbeat", "400ms"])
            .args(["--grace", "600ms", "--", "sh", "-c", "echo @$LEASE_TOKEN"])
            .env("LEASEAGENT_STATE_DIR", state.path())
            .env_remove("LEASEAGENT_AUTHORITY")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if let Some(d) = delay {
            // The moment of the kill is the point of the test.
            std::thread::sleep(d);
            let _ = c.kill();
        }
        let out = c.wait_with_output().unwrap();
        let tokens = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(at)
            .map(token)
            .collect();
        (out.status.code(), tokens)
    };
    let mut seen: Vec<u64> = Vec::new();
    // A task of its own for each run (a killed run's lease would hold the
    // next one off), and a kill from 0 to 30 ms after the start.
    for i in 0..60u64 {
        let delay = Duration::from_micros((i * 7919) % 30_000);
        let (_, tokens) = run(&format!("k{}", i % 20), Some(delay));
        for t in tokens {
            assert!(!seen.contains(&t), "token {t} reused: {seen:?}");
            seen.push(t);
        }
    }
    // Leases of killed agents expire (ttl 2 s); then a run goes through.
    let (_, tokens) = poll("a run after the kills", Duration::from_secs(20), || {
        let (code, tokens) = run("k0", None);
        (code == Some(0)).then_some(((), tokens))
    });
    let last = tokens[0];
    assert!(
        seen.iter().all(|t| *t < last),
        "token {last} not above {seen:?}"
    );
    let c = rusqlite::Connection::open(state.path().join("leases.sqlite3")).unwrap();
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}
