//! End to end: two `leaseagent` runs on one task. The second waits and gets
//! the task as soon as the first job ends (release, not expiry: the ttl is
//! longer than the second's --wait), with a higher token. Against
//! `leaseagent serve` and against the embedded default.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::authority::{Server, bin, poll};

fn agent(dir: &Path, authority: Option<&str>, name: &str, extra: &[&str], script: &str) -> Child {
    let mut c = Command::new(bin());
    if let Some(a) = authority {
        c.args(["--authority", a]);
    }
    c.args(["--task", "e2e", "--ttl", "60s"])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .current_dir(dir)
        .env("LEASEAGENT_STATE_DIR", dir.join("state"))
        .env_remove("LEASEAGENT_AUTHORITY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap());
    c.spawn().unwrap()
}

fn read_token(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn second_waits_then_gets_the_task_on_release(
    dir: &Path,
    authority: Option<&str>,
    server: Option<&Server>,
) {
    let mut first = agent(
        dir,
        authority,
        "first",
        &[],
        "echo $LEASE_TOKEN > first.token; while [ ! -e go ]; do sleep 0.05; done",
    );
    let t1 = poll("the first job to start", Duration::from_secs(30), || {
        read_token(&dir.join("first.token"))
    });
    let mut second = agent(
        dir,
        authority,
        "second",
        &["--wait", "40s"],
        "echo $LEASE_TOKEN > second.token",
    );
    // The second agent is refused (held) and keeps waiting.
    match server {
        Some(s) => poll(
            "the second agent to be told held",
            Duration::from_secs(30),
            || {
                let (_, m) = s.get("/metrics");
                m.lines()
                    .any(|l| {
                        l.starts_with("leaseagent_acquire_refused_total{reason=\"held\"}")
                            && !l.ends_with(" 0")
                    })
                    .then_some(())
            },
        ),
        None => poll(
            "the second agent to report it is waiting",
            Duration::from_secs(30),
            || {
                let log = std::fs::read_to_string(dir.join("second.log")).unwrap_or_default();
                log.contains("waiting (").then_some(())
            },
        ),
    }
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second agent should be waiting"
    );
    assert!(
        !dir.join("second.token").exists(),
        "the second job ran while the first held the task"
    );
    std::fs::write(dir.join("go"), b"").unwrap();
    let s1 = first.wait().unwrap();
    assert!(
        s1.success(),
        "first: {s1:?}\n{}",
        std::fs::read_to_string(dir.join("first.log")).unwrap()
    );
    let s2 = poll(
        "the second agent to finish",
        Duration::from_secs(45),
        || second.try_wait().unwrap(),
    );
    assert!(
        s2.success(),
        "second (got the task only by release, within its 40s wait < 60s ttl): {s2:?}\n{}",
        std::fs::read_to_string(dir.join("second.log")).unwrap()
    );
    let t2 = read_token(&dir.join("second.token")).unwrap();
    assert!(t2 > t1, "second token {t2} not above first {t1}");
}

#[test]
fn second_agent_gets_the_task_on_release_against_serve() {
    let d = tempfile::tempdir().unwrap();
    let s = Server::start(&d.path().join("serve.db"));
    second_waits_then_gets_the_task_on_release(d.path(), Some(&s.url()), Some(&s));
}

#[test]
fn second_agent_gets_the_task_on_release_with_the_embedded_default() {
    let d = tempfile::tempdir().unwrap();
    second_waits_then_gets_the_task_on_release(d.path(), None, None);
}

#[test]
fn waiters_keep_waiting_through_a_serve_kill_9_and_restart() {
    // The review: serve down for a second while three agents waited with
    // `--wait 60s`: two or three of them exited 125.
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("serve.db");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let mut server = Server::start_with_listen(&db, &listen);
    let url = server.url();
    let holder = agent(
        d.path(),
        Some(&url),
        "holder",
        &[],
        "echo $LEASE_TOKEN > holder.token; while [ ! -e go ]; do sleep 0.05; done",
    );
    poll("the holder's job", Duration::from_secs(30), || {
        read_token(&d.path().join("holder.token"))
    });
    let waiters: Vec<Child> = (0..3)
        .map(|i| {
            agent(
                d.path(),
                Some(&url),
                &format!("w{i}"),
                &["--wait", "60s"],
                &format!("echo $LEASE_TOKEN > w{i}.token"),
            )
        })
        .collect();
    poll(
        "the waiters to be told held",
        Duration::from_secs(30),
        || {
            (0..3)
                .all(|i| {
                    std::fs::read_to_string(d.path().join(format!("w{i}.log")))
                        .is_ok_and(|l| l.contains("waiting"))
                })
                .then_some(())
        },
    );
    server.kill9();
    // Down longer than a waiter's longest pause between asks (1.2 s):
    // every waiter asks at least once while nothing answers.
    std::thread::sleep(Duration::from_millis(2500));
    let server = Server::start_with_listen(&db, &listen);
    std::fs::write(d.path().join("go"), "").unwrap();
    let mut all = vec![holder];
    all.extend(waiters);
    for (i, mut c) in all.into_iter().enumerate() {
        let st = support::wait_exit(&mut c, Duration::from_secs(90)).expect("agent ends");
        let name = if i == 0 {
            "holder".into()
        } else {
            format!("w{}", i - 1)
        };
        let log = std::fs::read_to_string(d.path().join(format!("{name}.log"))).unwrap();
        assert_eq!(st.code(), Some(0), "{name}: {log}");
    }
    let tokens: std::collections::BTreeSet<u64> = (0..3)
        .map(|i| read_token(&d.path().join(format!("w{i}.token"))).expect("ran"))
        .collect();
    assert_eq!(tokens.len(), 3, "each waiter its own token: {tokens:?}");
    drop(server);
}

/// Four `--wait` agents arrive one after another (each waiting, in the
/// queue, before the next starts) while a holder runs and a looper re-runs
/// the task back to back without `--wait`: when the holder ends, the
/// waiters are granted in arrival order, the looper never in between.
/// The review: embedded `W2 W3 W0 W1`, serve `W3 W0 W1 W2`, and a looper
/// took 41-42 grants in 20 s while three waiters got 0-1.
fn waiters_are_granted_in_arrival_order_and_a_looper_cannot_starve_them(
    dir: &Path,
    authority: Option<&str>,
) {
    let order = dir.join("order");
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&order)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let mut holder = agent(
        dir,
        authority,
        "holder",
        &[],
        "echo H >> order; while [ ! -e go ]; do sleep 0.05; done",
    );
    poll("the holder's job", Duration::from_secs(30), || {
        (lines() == ["H"]).then_some(())
    });
    let mut waiters = Vec::new();
    for i in 0..4 {
        let name = format!("w{i}");
        waiters.push(agent(
            dir,
            authority,
            &name,
            &["--wait", "60s"],
            &format!("echo W{i} >> order; sleep 0.2"),
        ));
        // Waiting (so in the queue) before the next one arrives.
        poll("the waiter to wait", Duration::from_secs(30), || {
            std::fs::read_to_string(dir.join(format!("{name}.log")))
                .is_ok_and(|l| l.contains("waiting"))
                .then_some(())
        });
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looper = {
        let (stop, dir) = (stop.clone(), dir.to_path_buf());
        let authority = authority.map(str::to_owned);
        std::thread::spawn(move || {
            let mut codes = std::collections::BTreeMap::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut c = Command::new(bin());
                if let Some(a) = &authority {
                    c.args(["--authority", a]);
                }
                let st = c
                    .args(["--task", "e2e", "--ttl", "60s", "--", "sh", "-c"])
                    .arg("echo L >> order")
                    .current_dir(&dir)
                    .env("LEASEAGENT_STATE_DIR", dir.join("state"))
                    .env_remove("LEASEAGENT_AUTHORITY")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .unwrap();
                *codes.entry(st.code()).or_insert(0) += 1;
            }
            codes
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(dir.join("go"), "").unwrap();
    assert!(support::wait_exit(&mut holder, Duration::from_secs(30)).is_some());
    for (i, mut w) in waiters.into_iter().enumerate() {
        let st = support::wait_exit(&mut w, Duration::from_secs(60)).expect("waiter ends");
        let log = std::fs::read_to_string(dir.join(format!("w{i}.log"))).unwrap();
        assert_eq!(st.code(), Some(0), "w{i}: {log}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let codes = looper.join().unwrap();
    let got = lines();
    assert_eq!(
        got[..5],
        ["H", "W0", "W1", "W2", "W3"],
        "grants in arrival order, no looper between: {got:?} (looper exits {codes:?})"
    );
    assert!(
        codes.get(&Some(75)).copied().unwrap_or(0) > 0,
        "the looper ran meanwhile: {codes:?}"
    );
}

#[test]
fn embedded_waiters_are_granted_in_arrival_order() {
    let d = tempfile::tempdir().unwrap();
    waiters_are_granted_in_arrival_order_and_a_looper_cannot_starve_them(d.path(), None);
    let c = rusqlite::Connection::open(d.path().join("state/leases.sqlite3")).unwrap();
    let left: i64 = c
        .query_row("SELECT COUNT(*) FROM waiters", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0, "nobody left in the queue");
}

#[test]
fn serve_waiters_are_granted_in_arrival_order() {
    let d = tempfile::tempdir().unwrap();
    let s = Server::start(&d.path().join("serve.db"));
    waiters_are_granted_in_arrival_order_and_a_looper_cannot_starve_them(d.path(), Some(&s.url()));
}

#[test]
fn a_killed_waiter_is_forgotten_after_its_bound() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let mut holder = agent(
        dir,
        None,
        "holder",
        &[],
        "touch held; while [ ! -e go ]; do sleep 0.05; done",
    );
    poll("the holder's job", Duration::from_secs(30), || {
        dir.join("held").exists().then_some(())
    });
    let mut waiter = agent(dir, None, "w", &["--wait", "60s"], "true");
    let db = dir.join("state/leases.sqlite3");
    let queued = || -> i64 {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.query_row("SELECT COUNT(*) FROM waiters", [], |r| r.get(0))
            .unwrap_or(0)
    };
    poll("the waiter to queue", Duration::from_secs(30), || {
        (queued() == 1).then_some(())
    });
    // kill -9: no goodbye. Its place blocks the freed task for a while...
    waiter.kill().unwrap();
    let _ = waiter.wait();
    std::fs::write(dir.join("go"), "").unwrap();
    assert!(support::wait_exit(&mut holder, Duration::from_secs(30)).is_some());
    let killed = std::time::Instant::now();
    let once = || {
        Command::new(bin())
            .args(["--task", "e2e", "--", "true"])
            .env("LEASEAGENT_STATE_DIR", dir.join("state"))
            .env_remove("LEASEAGENT_AUTHORITY")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let first = once();
    assert_eq!(
        first.status.code(),
        Some(75),
        "the dead waiter's place holds"
    );
    assert!(String::from_utf8_lossy(&first.stderr).contains("1 earlier waiter"));
    // ...until it has not asked for 5 s: then a newcomer gets it.
    poll(
        "the dead waiter to be forgotten",
        Duration::from_secs(30),
        || once().status.success().then_some(()),
    );
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "{:?}",
        killed.elapsed()
    );
    assert_eq!(queued(), 0);
}
