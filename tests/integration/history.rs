//! Run history against real processes: `GET /v1/history` of a real `serve`
//! across a clean restart and kill -9, every way an attempt ends, scopes,
//! pagination and bounds; `leaseagent history` against serve, the embedded
//! authority (real agents running real commands) and etcd (refused, with
//! the reason).

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::Digest;
use support::authority::{Server, bin, poll, raw_request};

const T: Duration = Duration::from_secs(20);

fn db() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("leases.db");
    (d, p)
}

/// `GET /v1/history?QUERY` as JSON (asserting 200).
fn history(s: &Server, query: &str) -> Value {
    let (st, body) = s.get(&format!("/v1/history{query}"));
    assert_eq!(st, 200, "{body}");
    assert!(!body.contains("lease_id"), "a lease id is shown: {body}");
    serde_json::from_str(&body).unwrap()
}

/// The attempt with `token` in the first page of the whole history.
fn attempt(s: &Server, token: &Value) -> Value {
    history(s, "?limit=1000")["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["token"] == *token)
        .cloned()
        .unwrap_or_else(|| panic!("no attempt with token {token}"))
}

fn release_with(s: &Server, g: &Value, outcome: &str, code: Value) {
    let (st, b) = s.post(
        "/v1/release",
        &json!({"lease_id": g["lease_id"], "token": g["token"], "outcome": outcome, "exit_code": code}),
    );
    assert_eq!(st, 200, "{b}");
}

fn grant(s: &Server, task: &str, holder: &str, ttl_ms: u64, policy: &str) -> Value {
    let (st, g) = s.post(
        "/v1/acquire",
        &json!({"task": task, "holder": holder, "ttl_ms": ttl_ms, "on_expiry": policy}),
    );
    assert_eq!(st, 200, "{g}");
    g
}

fn is_rfc3339(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| humantime::parse_rfc3339(s).is_ok() && s.ends_with('Z'))
}

#[test]
fn every_way_an_attempt_ends_is_recorded_and_survives_restart_and_kill_9() {
    let (_d, p) = db();
    let mut s = Server::start(&p);
    let ok = grant(&s, "nightly", "w1/10", 30_000, "redispatch");
    release_with(&s, &ok, "succeeded", json!(0));
    let bad = grant(&s, "nightly", "w2/11", 30_000, "redispatch");
    release_with(&s, &bad, "failed", json!(3));
    let lost = grant(&s, "lost", "w3/12", 1000, "redispatch");
    let revoked = grant(&s, "revoked", "w4/13", 30_000, "redispatch");
    assert_eq!(
        s.post("/v1/revoke", &json!({"task": "revoked", "force": true}))
            .0,
        200
    );
    let held = grant(&s, "held", "w5/14", 1000, "hold");
    let running = grant(&s, "running", "w6/15", 60_000, "redispatch");

    // The expiries are seen by the sweeper without any request.
    poll("the expiries in the history", T, || {
        (attempt(&s, &lost["token"])["ended"] == "expired"
            && attempt(&s, &held["token"])["ended"] == "expired")
            .then_some(())
    });
    assert_eq!(s.post("/v1/clear", &json!({"task": "held"})).0, 200);

    let check = |s: &Server| {
        let a = attempt(s, &ok["token"]);
        assert_eq!(
            (
                &a["task"],
                &a["holder"],
                &a["ended"],
                &a["outcome"],
                &a["exit_code"]
            ),
            (
                &json!("nightly"),
                &json!("w1/10"),
                &json!("released"),
                &json!("succeeded"),
                &json!(0)
            ),
            "{a}"
        );
        assert!(
            is_rfc3339(&a["acquired_at"]) && is_rfc3339(&a["ended_at"]),
            "{a}"
        );
        assert!(a["held_ms"].as_u64().is_some(), "{a}");
        let a = attempt(s, &bad["token"]);
        assert_eq!(
            (&a["outcome"], &a["exit_code"]),
            (&json!("failed"), &json!(3))
        );
        let a = attempt(s, &lost["token"]);
        assert_eq!(
            (&a["ended"], &a["outcome"]),
            (&json!("expired"), &Value::Null)
        );
        // Held until it expired: about its ttl, never the time it took to notice.
        let held_ms = a["held_ms"].as_u64().unwrap();
        assert!((900..5000).contains(&held_ms), "{a}");
        assert_eq!(attempt(s, &revoked["token"])["ended"], "revoked");
        assert_eq!(attempt(s, &held["token"])["ended"], "cleared");
        let a = attempt(s, &running["token"]);
        assert_eq!(
            (&a["ended"], &a["ended_at"], &a["held_ms"]),
            (&Value::Null, &Value::Null, &Value::Null)
        );
        // Newest first.
        let tokens: Vec<u64> = history(s, "")["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["token"].as_u64().unwrap())
            .collect();
        assert!(tokens.windows(2).all(|w| w[0] > w[1]), "{tokens:?}");
        assert!(tokens.len() >= 6, "{tokens:?}");
    };
    check(&s);

    // A clean restart keeps all of it.
    assert!(s.terminate().success());
    s = Server::start(&p);
    check(&s);

    // kill -9 right after a release was answered: nothing of it is lost.
    let last = grant(&s, "nightly", "w7/16", 30_000, "redispatch");
    release_with(&s, &last, "cancelled", Value::Null);
    s.crash_restart();
    check(&s);
    let a = attempt(&s, &last["token"]);
    assert_eq!(
        (&a["ended"], &a["outcome"], &a["exit_code"]),
        (&json!("released"), &json!("cancelled"), &Value::Null),
        "{a}"
    );
    // Only the task asked for.
    let only: Vec<Value> = history(&s, "?task=nightly")["attempts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(only.len(), 3);
    assert!(only.iter().all(|a| a["task"] == "nightly"));
}

#[test]
fn pages_cover_every_attempt_once_and_bad_queries_are_400() {
    let (_d, p) = db();
    let s = Server::start(&p);
    for i in 0..23 {
        let g = grant(&s, &format!("t{}", i % 3), "h", 30_000, "redispatch");
        release_with(&s, &g, "succeeded", json!(0));
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &after {
            None => "?limit=5".to_string(),
            Some(c) => format!("?limit=5&after={c}"),
        };
        let v = history(&s, &q);
        let page = v["attempts"].as_array().unwrap();
        assert!(page.len() <= 5);
        pages += 1;
        seen.extend(page.iter().map(|a| a["token"].as_u64().unwrap()));
        match &v["next_after"] {
            Value::Null => break,
            Value::String(c) => after = Some(c.clone()),
            other => panic!("next_after {other}"),
        }
    }
    assert_eq!(seen.len(), 23, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] > w[1]), "{seen:?}");
    assert!((5..=6).contains(&pages), "{pages}");
    for q in [
        "?limit=0",
        "?limit=1001",
        "?after=x",
        "?task=a%20b",
        "?colour=red",
    ] {
        let (st, body) = s.get(&format!("/v1/history{q}"));
        assert_eq!(st, 400, "{q}: {body}");
        assert!(body.contains("bad_request"), "{body}");
    }
}

#[test]
fn history_is_bounded_by_count_and_by_age() {
    let (_d, p) = db();
    let s = Server::start_with(&p, &["--history-max-rows", "10"]);
    for _ in 0..30 {
        let g = grant(&s, "many", "h", 30_000, "redispatch");
        release_with(&s, &g, "succeeded", json!(0));
    }
    let all = history(&s, "?limit=1000")["attempts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(all.len(), 10, "{all:?}");
    let (_d2, p2) = db();
    let s2 = Server::start_with(&p2, &["--history-max-age", "1s"]);
    let old: Vec<Value> = (0..5)
        .map(|_| {
            let g = grant(&s2, "aging", "h", 30_000, "redispatch");
            release_with(&s2, &g, "succeeded", json!(0));
            g["token"].clone()
        })
        .collect();
    // Each later grant deletes the finished attempts acquired over 1 s ago.
    poll("old attempts to be pruned", T, || {
        let g = grant(&s2, "aging", "h", 30_000, "redispatch");
        release_with(&s2, &g, "succeeded", json!(0));
        let kept = history(&s2, "?limit=1000")["attempts"]
            .as_array()
            .unwrap()
            .clone();
        (!kept.iter().any(|a| old.contains(&a["token"]))).then_some(())
    });
    // Bad bounds are usage errors naming the flag.
    let out = Command::new(bin())
        .args(["serve", "--no-auth", "--listen", "127.0.0.1:0", "--db"])
        .arg(&p2)
        .args(["--history-max-rows", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--history-max-rows"),
        "{out:?}"
    );
}

fn sha(token: &str) -> String {
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn get_as(addr: &str, path: &str, token: &str) -> (u16, Value) {
    let raw = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    let (st, body) = raw_request(addr, raw.as_bytes(), Duration::from_secs(10)).unwrap();
    (st, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn post_as(addr: &str, path: &str, token: &str, body: &Value) -> (u16, Value) {
    let b = body.to_string();
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
        b.len()
    );
    let (st, body) = raw_request(addr, raw.as_bytes(), Duration::from_secs(10)).unwrap();
    (st, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[test]
fn history_is_scoped_like_the_listing() {
    let d = tempfile::tempdir().unwrap();
    let auth = d.path().join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[principal]]\nname = \"etl-readers\"\nrole = \"reader\"\ntoken_sha256 = \"{}\"\ntasks = [\"etl/*\"]\n\
             [[principal]]\nname = \"batch\"\nrole = \"agent\"\ntoken_sha256 = \"{}\"\ntasks = [\"*\"]\n",
            sha("reader-token"),
            sha("agent-token"),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = Server::start_with(
        &d.path().join("l.db"),
        &["--auth-file", auth.to_str().unwrap()],
    );
    for task in ["etl/a", "billing/b", "etl/c"] {
        let (st, g) = post_as(
            &s.addr,
            "/v1/acquire",
            "agent-token",
            &json!({"task": task, "holder": "h", "ttl_ms": 30000}),
        );
        assert_eq!(st, 200, "{g}");
        let (st, _) = post_as(
            &s.addr,
            "/v1/release",
            "agent-token",
            &json!({"lease_id": g["lease_id"], "token": g["token"], "outcome": "succeeded", "exit_code": 0}),
        );
        assert_eq!(st, 200);
    }
    let (st, v) = get_as(&s.addr, "/v1/history", "reader-token");
    assert_eq!(st, 200, "{v}");
    let tasks: Vec<&str> = v["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["etl/c", "etl/a"]);
    let (st, v) = get_as(&s.addr, "/v1/history?task=billing%2Fb", "reader-token");
    assert_eq!((st, &v["error"]), (403, &json!("forbidden")), "{v}");
    let (st, _) = get_as(&s.addr, "/v1/history", "wrong-token");
    assert_eq!(st, 401);
    let (st, v) = get_as(&s.addr, "/v1/history", "agent-token");
    assert_eq!(st, 403, "an agent is not a reader: {v}");
    // The status page on the main listener: the reader role, the same scope.
    let page = |token: &str| {
        let raw = format!(
            "GET / HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        );
        let (st, body) = raw_request(&s.addr, raw.as_bytes(), Duration::from_secs(10)).unwrap();
        (st, String::from_utf8_lossy(&body).into_owned())
    };
    let (st, html) = page("reader-token");
    assert_eq!(st, 200, "{html}");
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(html.contains("etl/a") && html.contains("etl/c"), "{html}");
    assert!(!html.contains("billing/b"), "out of scope: {html}");
    assert_eq!(page("agent-token").0, 403);
    assert_eq!(page("wrong-token").0, 401);
    // So are the per-task metrics.
    let raw = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer reader-token\r\nConnection: close\r\n\r\n";
    let (st, body) = raw_request(&s.addr, raw.as_bytes(), Duration::from_secs(10)).unwrap();
    let text = String::from_utf8_lossy(&body);
    assert_eq!(st, 200);
    assert!(
        text.contains("leaseagent_task_last_success_timestamp_seconds{task=\"etl/a\"}"),
        "{text}"
    );
    assert!(!text.contains("billing/b"), "out of scope: {text}");
}

#[test]
fn the_status_listener_is_loopback_only_and_serves_only_the_page() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args([
            "serve",
            "--no-auth",
            "--listen",
            "127.0.0.1:0",
            "--status-listen",
            "0.0.0.0:0",
            "--db",
        ])
        .arg(d.path().join("l.db"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--status-listen 0.0.0.0:0: must be a loopback address"),
        "{err}"
    );
    let served = support::authority::spawn_serve(
        &d.path().join("l.db"),
        &[
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--status-listen".into(),
            "127.0.0.1:0".into(),
        ],
    );
    let mut child = served.child;
    let status = loop {
        let line = served.stderr.recv_timeout(T).expect("the status line");
        if let Some(u) = line.strip_prefix("leaseagent serve: status page on http://") {
            break u.trim().to_string();
        }
    };
    let get = |path: &str, method: &str| {
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        raw_request(&status, raw.as_bytes(), Duration::from_secs(10)).unwrap()
    };
    let (st, body) = get("/", "GET");
    assert_eq!(st, 200);
    assert!(String::from_utf8_lossy(&body).contains("<h2>Held now</h2>"));
    assert_eq!(get("/v1/leases", "GET").0, 404);
    assert_eq!(get("/metrics", "GET").0, 404);
    assert_eq!(get("/", "POST").0, 405);
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `leaseagent ARGS` with a fresh state directory; (code, stdout, stderr).
fn leaseagent(args: &[&str], state: &Path) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env("LEASEAGENT_STATE_DIR", state)
        .env("XDG_RUNTIME_DIR", state)
        .env_remove("LEASEAGENT_AUTHORITY")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Real agents run three jobs under `authority` (succeeds, fails with 3,
/// and one on another task), then `leaseagent history` shows them.
fn agents_then_history(authority: &str, state: &Path) {
    let runs: [(&str, &[&str], i32); 3] = [
        ("nightly-export", &["true"], 0),
        ("nightly-export", &["sh", "-c", "exit 3"], 3),
        ("hourly", &["true"], 0),
    ];
    for (task, cmd, want) in runs {
        let mut args = vec![
            "--authority",
            authority,
            "--task",
            task,
            "--ttl",
            "5s",
            "--",
        ];
        args.extend_from_slice(cmd);
        let (code, _, err) = leaseagent(&args, state);
        assert_eq!(code, want, "{args:?}: {err}");
    }
    let (code, out, err) = leaseagent(&["history", "--authority", authority], state);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[0].starts_with("TASK") && lines[0].contains("OUTCOME") && lines[0].contains("EXIT"),
        "{out}"
    );
    assert!(lines[1].starts_with("hourly"), "newest first: {out}");
    let fields: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(fields[0], "nightly-export");
    assert!(
        fields[3].ends_with("ms") || fields[3].ends_with('s'),
        "{out}"
    );
    assert_eq!(fields[4], "ago", "{out}");
    assert_eq!(
        &fields[fields.len() - 3..],
        ["released", "failed", "3"],
        "{out}"
    );
    let fields: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(
        &fields[fields.len() - 3..],
        ["released", "succeeded", "0"],
        "{out}"
    );

    let (code, out, err) = leaseagent(
        &[
            "history",
            "--authority",
            authority,
            "--json",
            "--since",
            "1h",
            "nightly-export",
        ],
        state,
    );
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let a = v["attempts"].as_array().unwrap();
    assert_eq!(a.len(), 2, "{v}");
    assert_eq!(
        (&a[0]["outcome"], &a[0]["exit_code"]),
        (&json!("failed"), &json!(3))
    );
    assert!(a[0]["token"].as_u64() > a[1]["token"].as_u64());
    assert!(a.iter().all(|x| x.get("lease_id").is_none()));
    let (code, out, _) = leaseagent(&["history", "--authority", authority, "never-ran"], state);
    assert_eq!((code, out.trim()), (0, "no attempts"));
}

#[test]
fn history_command_against_serve() {
    let (d, p) = db();
    let s = Server::start(&p);
    agents_then_history(&s.url(), d.path());
}

#[test]
fn history_command_against_the_embedded_authority() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let url = format!("sqlite:{}", state.join("leases.sqlite3").display());
    agents_then_history(&url, &state);
    // The embedded default (no --authority) is the same database.
    let (code, out, err) = leaseagent(&["--task", "dflt", "--", "true"], &state);
    assert_eq!(code, 0, "{err}");
    let (code, out2, err) = leaseagent(&["history", "dflt"], &state);
    assert_eq!(code, 0, "{err} {out}");
    assert!(
        out2.lines().nth(1).is_some_and(|l| l.starts_with("dflt")),
        "{out2}"
    );
    // An attempt that expired (its agent was killed) shows as expired,
    // even before anything else touched the task.
    let db = state.join("leases.sqlite3");
    let authority = format!("sqlite:{}", db.display());
    let mut agent = Command::new(bin())
        .args(["--authority", &authority, "--task", "crash", "--ttl", "1s"])
        .args(["--", "sleep", "2"])
        .spawn()
        .unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    poll("the crash grant", T, || {
        conn.query_row("SELECT COUNT(*) FROM tasks WHERE task = 'crash'", [], |r| {
            r.get::<_, i64>(0)
        })
        .ok()
        .filter(|n| *n == 1)
    });
    let _ = agent.kill();
    let _ = agent.wait();
    let line = poll("the expiry in `leaseagent history`", T, || {
        let (code, out, err) = leaseagent(&["history", "--authority", &authority, "crash"], &state);
        assert_eq!(code, 0, "{err}");
        out.lines()
            .nth(1)
            .filter(|l| !l.contains("running"))
            .map(str::to_string)
    });
    assert!(line.contains("expired"), "{line}");
}

#[test]
fn history_on_etcd_says_it_is_not_kept_and_why() {
    let d = tempfile::tempdir().unwrap();
    let (code, out, err) = leaseagent(&["history", "--authority", "etcd://127.0.0.1:9"], d.path());
    assert_eq!(code, 125, "{out}");
    assert!(err.contains("etcd keeps no run history"), "{err}");
    assert!(err.contains("lock key is deleted"), "{err}");
}
