//! `leaseagent serve` as a real process: tokens, races, crashes, restarts,
//! expiry policies, operator calls, malformed input and stalled clients.

use crate::support;

use std::collections::HashSet;
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::authority::{Server, Store, poll, raw_request, request};
use support::postgres::Postgres;

/// A store for one test, kept as long as the test runs: a SQLite file in a
/// temporary directory, or a PostgreSQL cluster of its own.
pub struct Backing {
    pub store: Store,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<Postgres>,
}

impl Backing {
    pub fn sqlite() -> Backing {
        let d = tempfile::tempdir().unwrap();
        Backing {
            store: Store::Sqlite(d.path().join("leases.db")),
            _dir: Some(d),
            _pg: None,
        }
    }

    pub fn postgres() -> Backing {
        let pg = Postgres::start();
        Backing {
            store: Store::Postgres {
                url: pg.url("postgres"),
                password_file: pg.password_file.clone(),
                leader_ttl: "1s",
            },
            _dir: None,
            _pg: Some(pg),
        }
    }

    /// A `serve` on this store, answering lease calls.
    pub fn start(&self) -> Server {
        Server::start_on(&self.store, &[])
    }
}

/// The protocol's conformance tests, each run against `serve` on SQLite
/// (`NAME::sqlite`) and on PostgreSQL (`NAME::postgres`): one suite, both
/// stores.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn sqlite() {
                super::$name(&super::Backing::sqlite())
            }
            #[test]
            fn postgres() {
                super::$name(&super::Backing::postgres())
            }
        }
    )*};
}

on_both_stores!(
    twenty_sequential_grants_strictly_increase,
    forty_racing_acquires_give_exactly_one_grant,
    kill_9_during_churn_never_reuses_a_token,
    renewal_after_expiry_is_refused_expired,
    restart_keeps_live_holders_and_frees_dead_ones_one_ttl_later,
    grace_policy_holds_the_task_for_grace_ms_after_expiry,
    hold_policy_waits_for_an_operator_and_shows_in_metrics,
    revoke_refuses_the_next_renewal_and_frees_after_expiry_or_at_once_with_force,
    malformed_input_gets_the_right_status_and_the_server_stays_healthy,
    sigterm_shuts_down_cleanly,
    max_leases_caps_live_leases_overall_and_a_release_makes_room,
);

fn twenty_sequential_grants_strictly_increase(b: &Backing) {
    let s = b.start();
    let mut last = 0;
    for i in 0..20 {
        let (st, g) = s.acquire("seq", &format!("h{i}"), 5000);
        assert_eq!(st, 200, "{g}");
        let t = g["token"].as_u64().unwrap();
        assert!(t > last, "token {t} after {last}");
        last = t;
        assert_eq!(g["task"], "seq");
        assert_eq!(g["ttl_ms"], 5000);
        assert_eq!(s.release(&g).0, 200);
    }
}

fn forty_racing_acquires_give_exactly_one_grant(b: &Backing) {
    let s = b.start();
    let addr = s.addr.clone();
    let threads: Vec<_> = (0..40)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                support::authority::post(
                    &addr,
                    "/v1/acquire",
                    &json!({"task": "race", "holder": format!("racer-{i}"), "ttl_ms": 30000}),
                )
            })
        })
        .collect();
    let answers: Vec<(u16, Value)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let granted = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(granted, 1, "{answers:?}");
    for (st, v) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*st, 409);
        assert_eq!(v["error"], "held");
        assert!(v["retry_after_ms"].as_u64().unwrap() <= 30000);
    }
}

fn kill_9_during_churn_never_reuses_a_token(b: &Backing) {
    let mut s = b.start();
    let mut rounds: Vec<Vec<u64>> = Vec::new();
    for _round in 0..5 {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (addr, seen, stop) = (s.addr.clone(), seen.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let body = json!({"task": format!("churn-{}", w % 2), "holder": format!("w{w}"), "ttl_ms": 1000});
                        let Ok((st, b)) = request(&addr, "POST", "/v1/acquire", body.to_string().as_bytes(), Duration::from_secs(5)) else { return };
                        if st != 200 { continue; }
                        let g: Value = serde_json::from_slice(&b).unwrap();
                        seen.lock().unwrap().push((g["task"].as_str().unwrap().to_string(), g["token"].as_u64().unwrap()));
                        let rel = json!({"lease_id": g["lease_id"], "token": g["token"], "outcome": "succeeded"});
                        if request(&addr, "POST", "/v1/release", rel.to_string().as_bytes(), Duration::from_secs(5)).is_err() { return; }
                    }
                })
            })
            .collect();
        poll("churn grants", Duration::from_secs(30), || {
            (seen.lock().unwrap().len() >= 30).then_some(())
        });
        s.kill9();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        for task in ["churn-0", "churn-1"] {
            let mut toks: Vec<u64> = seen
                .iter()
                .filter(|(t, _)| t == task)
                .map(|(_, k)| *k)
                .collect();
            let n = toks.len();
            toks.sort_unstable();
            toks.dedup();
            assert_eq!(
                toks.len(),
                n,
                "a token was granted twice in one run of {task}"
            );
        }
        rounds.push(
            seen.iter()
                .map(|(t, k)| if t == "churn-0" { *k } else { k + (1 << 40) })
                .collect(),
        );
        s = b.start();
    }
    let mut all = HashSet::new();
    for (i, r) in rounds.iter().enumerate() {
        for t in r {
            assert!(all.insert(*t), "token {t} reused in round {i}");
        }
    }
    // Every grant after a crash is above every grant before it.
    for w in rounds.windows(2) {
        for base in [0u64, 1 << 40] {
            let before = w[0].iter().filter(|t| (**t >= base) == (base > 0)).max();
            let after = w[1].iter().filter(|t| (**t >= base) == (base > 0)).min();
            if let (Some(b), Some(a)) = (before, after) {
                assert!(a > b, "after a crash, token {a} is not above {b}");
            }
        }
    }
}

fn renewal_after_expiry_is_refused_expired(b: &Backing) {
    let s = b.start();
    let (st, g) = s.acquire("exp", "h", 1000);
    assert_eq!(st, 200);
    assert_eq!(s.renew(&g).0, 200);
    poll("the lease to expire", Duration::from_secs(10), || {
        s.state_of("exp").is_none().then_some(())
    });
    let (st, v) = s.renew(&g);
    assert_eq!((st, v["error"].as_str()), (409, Some("expired")), "{v}");
    let (st, v) = s.release(&g);
    assert_eq!(st, 409, "{v}");
    let (st, g2) = s.acquire("exp", "h2", 1000);
    assert_eq!(st, 200);
    assert_eq!(s.renew(&g).1["error"], "superseded");
    let bogus = json!({"lease_id": "nope", "token": 1});
    assert_eq!(s.post("/v1/renew", &bogus).1["error"], "unknown_lease");
    assert!(g2["token"].as_u64() > g["token"].as_u64());
}

fn restart_keeps_live_holders_and_frees_dead_ones_one_ttl_later(b: &Backing) {
    let mut s = b.start();
    let ttl = 3000;
    let (_, live) = s.acquire("live", "alive", ttl);
    let (_, dead) = s.acquire("dead", "gone", ttl);
    let spawned = Instant::now();
    s.crash_restart();
    assert_eq!(
        s.renew(&live).0,
        200,
        "a live holder keeps its lease across a restart"
    );
    let (st, v) = s.acquire("dead", "next", ttl);
    assert_eq!((st, v["error"].as_str()), (409, Some("held")), "{v}");
    let g = poll("the dead holder's task", Duration::from_secs(20), || {
        assert_eq!(s.renew(&live).0, 200);
        let (st, v) = s.acquire("dead", "next", ttl);
        (st == 200).then_some(v)
    });
    assert!(
        spawned.elapsed() >= Duration::from_millis(ttl),
        "granted again sooner than one ttl after the restart"
    );
    assert!(g["token"].as_u64() > dead["token"].as_u64());
    assert_eq!(s.renew(&dead).1["error"], "superseded");
    assert_eq!(s.renew(&live).0, 200);
}

fn grace_policy_holds_the_task_for_grace_ms_after_expiry(b: &Backing) {
    let s = b.start();
    let req = json!({"task": "g", "holder": "a", "ttl_ms": 1000, "on_expiry": "grace", "grace_ms": 60000});
    let (st, g) = s.post("/v1/acquire", &req);
    assert_eq!(st, 200);
    poll("grace state", Duration::from_secs(10), || {
        (s.state_of("g").as_deref() == Some("grace")).then_some(())
    });
    let (st, v) = s.acquire("g", "b", 1000);
    assert_eq!((st, v["error"].as_str()), (409, Some("held")), "{v}");
    assert!(v["retry_after_ms"].as_u64().unwrap() > 1000);
    assert_eq!(s.renew(&g).1["error"], "expired");
    // A short grace ends.
    let req =
        json!({"task": "g2", "holder": "a", "ttl_ms": 1000, "on_expiry": "grace", "grace_ms": 500});
    assert_eq!(s.post("/v1/acquire", &req).0, 200);
    poll("grace to end", Duration::from_secs(10), || {
        (s.acquire("g2", "b", 1000).0 == 200).then_some(())
    });
}

fn hold_policy_waits_for_an_operator_and_shows_in_metrics(b: &Backing) {
    let s = b.start();
    let req = json!({"task": "h", "holder": "a", "ttl_ms": 1000, "on_expiry": "hold"});
    let (_, g) = s.post("/v1/acquire", &req);
    assert_eq!(s.metric("leaseagent_held_for_operator"), 0.0);
    let v = poll("held_for_operator", Duration::from_secs(10), || {
        let (st, v) = s.acquire("h", "b", 1000);
        (v["error"] == "held_for_operator").then_some((st, v))
    });
    assert_eq!(v.0, 409);
    assert_eq!(v.1["holder"], "a");
    assert_eq!(v.1["lease_id"], g["lease_id"]);
    assert_eq!(s.state_of("h").as_deref(), Some("held_for_operator"));
    assert_eq!(s.metric("leaseagent_held_for_operator"), 1.0);
    // The CLI lists and clears it.
    let out = std::process::Command::new(support::authority::bin())
        .args(["leases", "--authority", &s.url()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("held_for_operator"),
        "{text}"
    );
    let out = std::process::Command::new(support::authority::bin())
        .args(["clear", "--authority", &s.url(), "h"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(support::authority::bin())
        .args(["clear", "--authority", &s.url(), "h"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "clearing twice: nothing to clear"
    );
    assert_eq!(s.metric("leaseagent_held_for_operator"), 0.0);
    let (st, g2) = s.acquire("h", "b", 1000);
    assert_eq!(st, 200);
    assert!(g2["token"].as_u64() > g["token"].as_u64());
    assert!(s.metric("leaseagent_expiries_total") >= 1.0);
}

fn revoke_refuses_the_next_renewal_and_frees_after_expiry_or_at_once_with_force(b: &Backing) {
    let s = b.start();
    let (_, g) = s.acquire("r", "a", 1500);
    let (st, v) = s.post("/v1/revoke", &json!({"task": "r"}));
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.renew(&g);
    assert_eq!((st, v["error"].as_str()), (409, Some("revoked")));
    let (st, v) = s.acquire("r", "b", 1500);
    assert_eq!(
        (st, v["error"].as_str()),
        (409, Some("held")),
        "not free before expiry"
    );
    let g2 = poll("revoked lease to expire", Duration::from_secs(10), || {
        let (st, v) = s.acquire("r", "b", 30000);
        (st == 200).then_some(v)
    });
    assert!(g2["token"].as_u64() > g["token"].as_u64());
    // With force (through the CLI): free at once.
    let out = std::process::Command::new(support::authority::bin())
        .args(["revoke", "--authority", &s.url(), "--force", "r"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (st, g3) = s.acquire("r", "c", 30000);
    assert_eq!(st, 200, "{g3}");
    assert_eq!(s.renew(&g2).1["error"], "revoked");
    let (st, v) = s.post("/v1/revoke", &json!({"task": "never-seen"}));
    assert_eq!((st, v["error"].as_str()), (404, Some("not_found")));
}

fn malformed_input_gets_the_right_status_and_the_server_stays_healthy(b: &Backing) {
    let s = b.start();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("/v1/acquire", b"not json".to_vec(), "JSON"),
        ("/v1/acquire", b"[1,2]".to_vec(), "object"),
        ("/v1/acquire", b"".to_vec(), "JSON"),
        (
            "/v1/acquire",
            br#"{"holder":"h","ttl_ms":5000}"#.to_vec(),
            "task",
        ),
        (
            "/v1/acquire",
            br#"{"task":5,"holder":"h","ttl_ms":5000}"#.to_vec(),
            "task",
        ),
        (
            "/v1/acquire",
            br#"{"task":"a b","holder":"h","ttl_ms":5000}"#.to_vec(),
            "task",
        ),
        (
            "/v1/acquire",
            br#"{"task":"","holder":"h","ttl_ms":5000}"#.to_vec(),
            "task",
        ),
        (
            "/v1/acquire",
            format!(
                r#"{{"task":"{}","holder":"h","ttl_ms":5000}}"#,
                "x".repeat(201)
            )
            .into_bytes(),
            "task",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","ttl_ms":5000}"#.to_vec(),
            "holder",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"a\u0001","ttl_ms":5000}"#.to_vec(),
            "holder",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h"}"#.to_vec(),
            "ttl_ms",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h","ttl_ms":"5000"}"#.to_vec(),
            "ttl_ms",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h","ttl_ms":999}"#.to_vec(),
            "ttl_ms",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h","ttl_ms":86400001}"#.to_vec(),
            "ttl_ms",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h","ttl_ms":-5}"#.to_vec(),
            "ttl_ms",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h","ttl_ms":1.5e3}"#.to_vec(),
            "ttl_ms",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h","ttl_ms":99999999999999999999999}"#.to_vec(),
            "ttl_ms",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h","ttl_ms":5000,"on_expiry":"never"}"#.to_vec(),
            "on_expiry",
        ),
        (
            "/v1/acquire",
            br#"{"task":"t","holder":"h","ttl_ms":5000,"grace_ms":-1}"#.to_vec(),
            "grace_ms",
        ),
        ("/v1/renew", br#"{"token":1}"#.to_vec(), "lease_id"),
        (
            "/v1/renew",
            br#"{"lease_id":"x","token":18446744073709551616}"#.to_vec(),
            "token",
        ),
        (
            "/v1/renew",
            br#"{"lease_id":"x","token":true}"#.to_vec(),
            "token",
        ),
        (
            "/v1/release",
            br#"{"lease_id":"x","token":1,"outcome":"meh"}"#.to_vec(),
            "outcome",
        ),
        (
            "/v1/release",
            br#"{"lease_id":"x","token":1,"outcome":"failed","exit_code":"1"}"#.to_vec(),
            "exit_code",
        ),
        (
            "/v1/revoke",
            br#"{"task":"t","force":"yes"}"#.to_vec(),
            "force",
        ),
        ("/v1/clear", br#"{}"#.to_vec(), "task"),
    ];
    for (path, body, field) in &cases {
        let (st, b) = request(&s.addr, "POST", path, body, Duration::from_secs(10)).unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(st, 400, "{path} {}: {v}", String::from_utf8_lossy(body));
        assert_eq!(v["error"], "bad_request");
        assert!(
            v["message"].as_str().unwrap().contains(field),
            "message of {path} {} should name {field}: {v}",
            String::from_utf8_lossy(body)
        );
    }
    // Too large: 413, without the server reading 70 KiB first.
    let big = vec![b' '; 70 * 1024];
    let (st, b) = request(
        &s.addr,
        "POST",
        "/v1/acquire",
        &big,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(st, 413);
    assert_eq!(
        serde_json::from_slice::<Value>(&b).unwrap()["error"],
        "too_large"
    );
    // Unknown path, wrong method, garbage request line.
    let (st, _) = request(&s.addr, "GET", "/v2/nothing", b"", Duration::from_secs(10)).unwrap();
    assert_eq!(st, 404);
    let (st, b) = request(&s.addr, "GET", "/v1/acquire", b"", Duration::from_secs(10)).unwrap();
    assert_eq!(st, 405);
    assert_eq!(
        serde_json::from_slice::<Value>(&b).unwrap()["error"],
        "method_not_allowed"
    );
    let (st, _) = request(
        &s.addr,
        "DELETE",
        "/v1/leases",
        b"",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(st, 405);
    let (st, _) = raw_request(&s.addr, b"HELLO\r\n\r\n", Duration::from_secs(10)).unwrap();
    assert_eq!(st, 400);
    let (st, _) = raw_request(
        &s.addr,
        b"POST /v1/acquire HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(st, 411);
    // Still healthy and granting.
    assert_eq!(s.get("/healthz").0, 200);
    assert_eq!(s.acquire("after-garbage", "h", 5000).0, 200);
    assert_eq!(s.metric("leaseagent_up"), 1.0);
}

#[test]
fn sixty_four_stalled_connections_do_not_delay_an_acquire() {
    let b = Backing::sqlite();
    let s = b.start();
    let mut stalled = Vec::new();
    for i in 0..64 {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        match i % 3 {
            0 => {}                                             // connected, silent
            1 => c.write_all(b"POST /v1/acquire HTT").unwrap(), // half a request line
            _ => c
                .write_all(b"POST /v1/acquire HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"ta")
                .unwrap(), // half a body
        }
        stalled.push(c);
    }
    // The server gives a stalled request 10 s; an acquire blocked behind
    // them would not be answered within the 5 s client timeout below.
    let body = json!({"task": "unstalled", "holder": "h", "ttl_ms": 5000}).to_string();
    let (st, b) = request(
        &s.addr,
        "POST",
        "/v1/acquire",
        body.as_bytes(),
        Duration::from_secs(5),
    )
    .expect("acquire answered while 64 connections stall");
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&b));
    assert_eq!(s.get("/healthz").0, 200);
    drop(stalled);
}

fn sigterm_shuts_down_cleanly(b: &Backing) {
    let mut s = b.start();
    let (_, g) = s.acquire("t", "h", 30000);
    let status = s.terminate();
    assert!(status.success(), "{status:?}");
    // The grant survived: the next one is higher.
    let s2 = b.start();
    assert_eq!(s2.acquire("t", "h2", 30000).1["error"], "held");
    let g2 = s2.post(
        "/v1/release",
        &json!({"lease_id": g["lease_id"], "token": g["token"], "outcome": "succeeded"}),
    );
    assert_eq!(g2.0, 200);
    assert!(s2.acquire("t", "h2", 30000).1["token"].as_u64() > g["token"].as_u64());
}

fn max_leases_caps_live_leases_overall_and_a_release_makes_room(b: &Backing) {
    let srv = Server::start_on(&b.store, &["--max-leases", "2"]);
    let acquire = |task: &str| {
        srv.post(
            "/v1/acquire",
            &json!({"task": task, "holder": "h", "ttl_ms": 60_000}),
        )
    };
    let (s1, g1) = acquire("cap-1");
    let (s2, _) = acquire("cap-2");
    assert_eq!((s1, s2), (200, 200));
    let (s3, body) = acquire("cap-3");
    assert_eq!(s3, 503, "{body}");
    assert_eq!(body["error"], "unavailable", "{body}");
    let (s, _) = srv.post(
        "/v1/release",
        &json!({"lease_id": g1["lease_id"], "token": g1["token"], "outcome": "succeeded"}),
    );
    assert_eq!(s, 200);
    let (s3, body) = acquire("cap-3");
    assert_eq!(s3, 200, "{body}");
}

#[test]
fn serve_becomes_the_server_binary_in_the_same_process() {
    // `leaseagent serve` checks its flags and then execs `leaseagent-serve`
    // next to itself: the pid a supervisor (or systemd's MAINPID) holds is
    // the server's own.
    let b = Backing::sqlite();
    let s = b.start();
    let exe = std::fs::read_link(format!("/proc/{}/exe", s.child.id())).unwrap();
    assert_eq!(
        exe.file_name().unwrap(),
        "leaseagent-serve",
        "serve runs as {}",
        exe.display()
    );
    assert_eq!(s.acquire("exec", "h", 5000).0, 200);
}

#[test]
fn serve_without_its_server_binary_names_the_missing_file() {
    // A leaseagent copied alone: usage is still checked, then the missing
    // server binary is one clear line and exit 125, never a hang.
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("leaseagent");
    std::fs::copy(support::authority::bin(), &lone).unwrap();
    // ETXTBSY: another test thread's child, forked while the copy was open
    // for writing, holds that descriptor until its own exec (a race of
    // every multithreaded program that writes then runs a file): asked
    // again until it has let go.
    let out = support::wait_for(
        Duration::from_secs(10),
        || match std::process::Command::new(&lone)
            .args(["serve", "--no-auth", "--listen", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("l.db"))
            .output()
        {
            Err(e) if e.raw_os_error() == Some(26) => None,
            other => Some(other),
        },
    )
    .expect("the copy stays busy (ETXTBSY) for 10 s")
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    let want = format!(
        "leaseagent serve: error: cannot run the server binary {}",
        dir.path().join("leaseagent-serve").display()
    );
    assert!(err.starts_with(&want), "{err}");
    assert!(err.contains("installs both"), "{err}");
    // Help and usage errors never need the server binary.
    let help = std::process::Command::new(&lone)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert_eq!(help.status.code(), Some(0));
    let bad = std::process::Command::new(&lone)
        .args(["serve", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--bogus"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn the_server_binary_alone_takes_the_same_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaseagent-serve"))
        .arg("--help")
        .output()
        .unwrap();
    let via_agent = std::process::Command::new(support::authority::bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, via_agent.stdout);
}

#[test]
fn waiters_are_told_their_place_and_granted_in_order() {
    let b = Backing::sqlite();
    let s = b.start();
    let ask = |holder: &str, waiter: Option<&str>| -> (u16, Value) {
        let mut body = json!({"task": "q", "holder": holder, "ttl_ms": 30000});
        if let Some(w) = waiter {
            body["waiter"] = json!(w);
            body["wait_ms"] = json!(60000);
        }
        s.post("/v1/acquire", &body)
    };
    let (a, b) = ("a".repeat(16), "b-_B9".repeat(4));
    let (st, g) = ask("h", None);
    assert_eq!(st, 200, "{g}");
    for (who, w, place) in [("a", &a, 1), ("b", &b, 2), ("a", &a, 1)] {
        let (st, v) = ask(who, Some(w));
        assert_eq!((st, v["error"].as_str()), (409, Some("held")), "{v}");
        assert_eq!(v["position"], json!(place), "{who}: {v}");
    }
    // A newcomer: held, no place.
    let (st, v) = ask("n", None);
    assert_eq!(st, 409);
    assert!(v.get("position").is_none(), "{v}");
    // Freed: the first waiter's, not the second's, not a newcomer's.
    assert_eq!(s.release(&g).0, 200);
    for (who, w, ahead) in [
        ("n", None, "2 earlier waiters"),
        ("b", Some(b.as_str()), "1 earlier waiter"),
    ] {
        let (st, v) = ask(who, w);
        assert_eq!(st, 409, "{who}: {v}");
        assert!(v["message"].as_str().unwrap().contains(ahead), "{v}");
    }
    let (st, v) = ask("a", Some(&a));
    assert_eq!(st, 200, "{v}");
    // A malformed waiter id is refused, naming the field.
    let (st, v) = ask("x", Some("short"));
    assert_eq!(st, 400, "{v}");
    assert!(v["message"].as_str().unwrap().contains("`waiter`"), "{v}");
}
