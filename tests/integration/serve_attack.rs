//! `leaseagent serve` under attack, each as a real hostile client or a real
//! hostile local user would try it: a connection flood from one loopback
//! address while others work (plain and TLS), certificates whose SAN and
//! CN name different principals, forged lease ids, a reload that narrows a
//! scope, one principal filling the lease table, an auth file and a
//! database planted by `nobody`, and secrets on the way out of the agent.
//! Every wait is a poll with a deadline; no timing figures are asserted
//! (the flood's latency figure is a benchmark: `benches/serve_flood.rs`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::serve_trust::{
    Pki, Serve, agent_principal, call, http_req, parse_answer, roles_file, sha, tls_call,
    tls_client, write_file,
};
use crate::support::authority::{bin, poll};
use crate::support::{agent, wait_agent};
use leaseagent_testkit::{Flood, connect_from};

const T: Duration = Duration::from_secs(10);

/// A metric's value from a `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

fn acquire_body(task: &str) -> String {
    format!(r#"{{"task":"{task}","holder":"h","ttl_ms":60000}}"#)
}

// ---- no lockout ----

/// The flood runs from 127.0.0.2 with the limits of the report (300 in
/// all, 100 per peer), holding up to 400 connections (more than the 300:
/// before, its refused ones counted against everyone's budget); meanwhile 127.0.0.3 acquires on fresh connections,
/// `/healthz` answers, and a real agent on 127.0.0.1 renews every 300 ms
/// through a whole job, never told `overloaded`.
fn flood_locks_nobody_out(tls: bool) {
    let pki = Pki::new("flood ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    let mut flags = vec![
        "--listen",
        "127.0.0.1:0",
        "--max-connections",
        "300",
        "--max-connections-per-peer",
        "100",
    ];
    if tls {
        flags.extend(["--tls-cert", cert.to_str().unwrap()]);
        flags.extend(["--tls-key", key.to_str().unwrap()]);
    }
    let s = Serve::start(&flags);
    let server: SocketAddr = s.addr.parse().unwrap();
    let ca = pki.ca_pem();
    let client = tls_client(&ca, None);
    // One request from `ip` on a fresh connection: the raw answer.
    let exchange = |ip: [u8; 4], raw: &[u8]| -> Result<Vec<u8>, String> {
        let sock = connect_from(ip, server).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        if tls {
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let conn =
                rustls::ClientConnection::new(client.clone(), name).map_err(|e| e.to_string())?;
            let mut t = rustls::StreamOwned::new(conn, sock);
            t.write_all(raw).map_err(|e| e.to_string())?;
            match t.read_to_end(&mut out) {
                Ok(_) => {}
                Err(e) if !out.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => {}
                Err(e) => return Err(e.to_string()),
            }
        } else {
            let mut sock = sock;
            sock.write_all(raw).map_err(|e| e.to_string())?;
            sock.read_to_end(&mut out).map_err(|e| e.to_string())?;
        }
        if out.is_empty() {
            return Err("closed without an answer".into());
        }
        Ok(out)
    };
    let ask = |ip: [u8; 4], raw: &[u8]| -> Result<(u16, Value), String> {
        let a = parse_answer(&exchange(ip, raw)?);
        Ok((a.status, a.body))
    };
    let ask_raw = |ip: [u8; 4], raw: &[u8]| -> String {
        String::from_utf8_lossy(&exchange(ip, raw).unwrap()).into_owned()
    };
    let scheme = if tls { "https" } else { "http" };
    let mut a = agent(&format!("{scheme}://{}", s.addr), "flood-agent");
    a.args(["--ttl", "3s", "--heartbeat", "300ms"]);
    if tls {
        a.arg("--ca-file").arg(&ca);
    }
    a.args(["--", "sleep", "6"]);
    a.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut running = a.spawn().unwrap();
    // The agent holds its lease before the flood starts.
    poll("the agent's lease", T, || {
        let (st, body) = ask([127, 0, 0, 3], &http_req("GET", "/v1/leases", None, "")).ok()?;
        (st == 200 && body["leases"].as_array()?.len() == 1).then_some(())
    });

    let flood = Flood::start([127, 0, 0, 2], server, 400);
    assert!(flood.past(1000, T), "the flood did not get going");
    for i in 0..20 {
        let (st, body) = ask(
            [127, 0, 0, 3],
            &http_req(
                "POST",
                "/v1/acquire",
                None,
                &acquire_body(&format!("f-{i}")),
            ),
        )
        .unwrap_or_else(|e| panic!("acquire {i} from 127.0.0.3 during the flood: {e}"));
        assert_eq!(st, 200, "acquire {i} during the flood: {body}");
        let (st, _) = ask([127, 0, 0, 3], &http_req("GET", "/healthz", None, "")).unwrap();
        assert_eq!(st, 200, "/healthz during the flood");
    }
    let (status, err) = wait_agent(&mut running, Duration::from_secs(60));
    assert!(status.success(), "the agent failed during the flood: {err}");
    for word in ["overloaded", "503"] {
        assert!(!err.contains(word), "a renewal was refused ({word}): {err}");
    }
    let m = ask_raw([127, 0, 0, 3], &http_req("GET", "/metrics", None, ""));
    assert!(
        metric(&m, "leaseagent_connections_refused_total") > 0.0,
        "the flood never reached its peer limit: {m}"
    );
    assert!(
        metric(&m, "leaseagent_connections") <= 300.0,
        "more open than --max-connections: {m}"
    );
    drop(flood);
}

#[test]
fn a_connection_flood_from_one_address_locks_nobody_out() {
    flood_locks_nobody_out(false);
}

#[test]
fn a_connection_flood_from_one_address_locks_nobody_out_over_tls() {
    flood_locks_nobody_out(true);
}

#[test]
fn an_unfinished_tls_handshake_is_dropped_within_seconds() {
    let pki = Pki::new("handshake ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    let s = Serve::tls(&cert, &key);
    let server: SocketAddr = s.addr.parse().unwrap();
    let mut silent = connect_from([127, 0, 0, 2], server).unwrap();
    let started = Instant::now();
    let mut b = [0u8; 16];
    // The server closes it (EOF or reset) well before the 10 s request
    // timeout that used to apply; the read timeout is that old 10 s.
    silent
        .set_read_timeout(Some(Duration::from_secs(9)))
        .unwrap();
    match silent.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {}
        other => panic!("still open after {:?}: {other:?}", started.elapsed()),
    }
}

// ---- the right principal ----

#[test]
fn a_certificate_is_its_sans_before_its_cn_and_ambiguity_is_refused() {
    let pki = Pki::new("principal ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    // SAN says reader, CN says operator: the SAN wins.
    let (sc, sk) = pki.leaf("san-reader", &["reader-host"], "ops", false);
    // CN only: the CN counts.
    let (cc, ck) = pki.leaf("cn-only", &[], "cn-agent", false);
    // Two SANs that two principals claim: refused.
    let (tc, tk) = pki.leaf("two", &["agent-a", "agent-b"], "two", false);
    let dir = tempfile::tempdir().unwrap();
    let auth = write_file(
        dir.path(),
        "auth.toml",
        "[[principal]]\nname = \"ops\"\nrole = \"operator\"\ncert_name = \"ops\"\ntasks = [\"*\"]\n\
         [[principal]]\nname = \"reader\"\nrole = \"reader\"\ncert_name = \"reader-host\"\ntasks = [\"*\"]\n\
         [[principal]]\nname = \"cn\"\nrole = \"agent\"\ncert_name = \"cn-agent\"\ntasks = [\"*\"]\n\
         [[principal]]\nname = \"a\"\nrole = \"operator\"\ncert_name = \"agent-a\"\ntasks = [\"*\"]\n\
         [[principal]]\nname = \"b\"\nrole = \"agent\"\ncert_name = \"agent-b\"\ntasks = [\"*\"]\n",
        0o600,
    );
    let ca = pki.ca_pem();
    let s = Serve::mtls(&cert, &key, &ca, &auth);
    let as_cert = |c: &Path, k: &Path, raw: &[u8]| {
        tls_call(&s.addr, &tls_client(&ca, Some((c, k))), raw).unwrap()
    };
    // The CN-only agent takes a lease.
    let a = as_cert(
        &cc,
        &ck,
        &http_req("POST", "/v1/acquire", None, &acquire_body("victim")),
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body["task"], "victim");
    // SAN reader + CN ops: a reader. It lists, it may not force-revoke.
    let revoke = http_req(
        "POST",
        "/v1/revoke",
        None,
        r#"{"task":"victim","force":true}"#,
    );
    let r = as_cert(&sc, &sk, &revoke);
    assert_eq!(
        (r.status, r.body.clone()),
        (403, json!({"error": "forbidden"}))
    );
    let l = as_cert(&sc, &sk, &http_req("GET", "/v1/leases", None, ""));
    assert_eq!(l.status, 200, "{l:?}");
    assert_eq!(l.body["leases"][0]["principal"], "cn");
    // Two principals match: 401, whichever comes first in the file.
    let t = as_cert(&tc, &tk, &revoke);
    assert_eq!(t.status, 401, "{t:?}");
    assert_eq!(t.body, json!({"error": "unauthenticated"}));
    let t = as_cert(&tc, &tk, &http_req("GET", "/v1/leases", None, ""));
    assert_eq!(t.status, 401, "{t:?}");
    // The lease is untouched.
    let l = as_cert(&sc, &sk, &http_req("GET", "/v1/leases", None, ""));
    assert_eq!(l.body["leases"][0]["state"], "active", "{l:?}");
}

// ---- scope and ownership on every call ----

#[test]
fn scope_is_checked_on_renew_and_release_and_forged_ids_learn_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), &agent_principal("other", "other-token"));
    let s = Serve::with_auth_file(&auth);
    let g = call(
        &s.addr,
        "POST",
        "/v1/acquire",
        Some("agent-token"),
        &acquire_body("nightly-x"),
    );
    assert_eq!(g.status, 200, "{g:?}");
    let (id, token) = (
        g.body["lease_id"].as_str().unwrap().to_string(),
        g.body["token"].as_u64().unwrap(),
    );
    // Forged ids from another principal whose scope covers the task: one
    // answer whatever the token, the same as for a task that never existed.
    let forged_key = "0123456789abcdef0123456789abcdef";
    let unknown = json!({"error": "unknown_lease"});
    let mut answers = Vec::new();
    for (task, tok) in [
        ("nightly-x", token - 1),
        ("nightly-x", token),
        ("nightly-x", token + 1),
        ("nightly-never", token - 1),
    ] {
        let body = json!({"lease_id": format!("{forged_key}.{task}"), "token": tok}).to_string();
        let a = call(&s.addr, "POST", "/v1/renew", Some("other-token"), &body);
        answers.push((a.status, a.body["error"].clone()));
    }
    assert!(
        answers
            .iter()
            .all(|(st, e)| *st == 409 && *e == unknown["error"]),
        "{answers:?}"
    );
    // The owner is still told the truth about its own old token.
    let stale = json!({"lease_id": format!("{forged_key}.nightly-x"), "token": token - 1});
    let a = call(
        &s.addr,
        "POST",
        "/v1/renew",
        Some("agent-token"),
        &stale.to_string(),
    );
    assert_eq!(a.status, 409, "{a:?}");

    // A reload narrows `batch` to etl/*: its renewal and release of
    // nightly-x are now 403, though it owns the lease.
    let text = std::fs::read_to_string(&auth)
        .unwrap()
        .replace("tasks = [\"nightly-*\", \"etl/*\"]", "tasks = [\"etl/*\"]");
    std::fs::write(&auth, text).unwrap();
    s.hup();
    s.stderr_line("auth file reloaded");
    let lref = json!({"lease_id": id, "token": token}).to_string();
    let a = call(&s.addr, "POST", "/v1/renew", Some("agent-token"), &lref);
    assert_eq!(
        (a.status, a.body.clone()),
        (403, json!({"error": "forbidden"}))
    );
    let rel = json!({"lease_id": id, "token": token, "outcome": "succeeded"}).to_string();
    let a = call(&s.addr, "POST", "/v1/release", Some("agent-token"), &rel);
    assert_eq!(a.status, 403, "{a:?}");
}

#[test]
fn the_listing_never_names_a_task_outside_the_readers_scope() {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[[principal]]\nname = \"jobs-reader\"\nrole = \"reader\"\ntoken_sha256 = \"{}\"\ntasks = [\"jobs/*\"]\n",
        sha("jobs-reader")
    );
    let auth = roles_file(dir.path(), &extra);
    let s = Serve::with_auth_file(&auth);
    for task in ["jobs/a", "jobs/b", "other/payroll-run-2026", "zz/secret"] {
        let a = call(
            &s.addr,
            "POST",
            "/v1/acquire",
            Some("operator-token"),
            &acquire_body(task),
        );
        assert_eq!(a.status, 200, "{a:?}");
    }
    let mut seen = Vec::new();
    let mut path = "/v1/leases?limit=1".to_string();
    for _ in 0..10 {
        let a = call(&s.addr, "GET", &path, Some("jobs-reader"), "");
        assert_eq!(a.status, 200, "{a:?}");
        let text = a.body.to_string();
        assert!(
            !text.contains("payroll") && !text.contains("secret"),
            "{text}"
        );
        for l in a.body["leases"].as_array().unwrap() {
            seen.push(l["task"].as_str().unwrap().to_string());
        }
        match a.body["next_after"].as_str() {
            Some(next) => path = format!("/v1/leases?limit=1&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["jobs/a", "jobs/b"]);
}

// ---- bounded by default ----

#[test]
fn a_principal_is_capped_by_default_and_cannot_block_another() {
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), &agent_principal("greedy", "greedy-token"));
    let s = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--auth-file",
        auth.to_str().unwrap(),
        "--max-leases",
        "8",
        "--max-leases-per-principal",
        "5",
    ]);
    let acq = |task: &str, tok: &str| {
        call(
            &s.addr,
            "POST",
            "/v1/acquire",
            Some(tok),
            &acquire_body(task),
        )
    };
    for i in 0..5 {
        assert_eq!(acq(&format!("nightly-g{i}"), "greedy-token").status, 200);
    }
    let a = acq("nightly-g5", "greedy-token");
    assert_eq!(
        (a.status, a.body["error"].as_str()),
        (429, Some("too_many_leases")),
        "{a:?}"
    );
    // The other principal still gets leases.
    for i in 0..3 {
        assert_eq!(acq(&format!("nightly-o{i}"), "agent-token").status, 200);
    }
    // The global cap still holds (5 + 3 = 8).
    assert_eq!(acq("nightly-o3", "agent-token").status, 503);
}

// ---- files serve opens ----

/// `nobody`'s uid and gid (the test fails loudly without that user, or
/// when not run as root: it plays root against `nobody`).
fn nobody() -> (u32, u32) {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test plays root against `nobody`: run it as root"
    );
    let out = Command::new("id")
        .args(["-u", "nobody"])
        .output()
        .expect("run id");
    let uid: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a user `nobody` (the tests need a second real user)");
    let out = Command::new("id").args(["-g", "nobody"]).output().unwrap();
    let gid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    (uid, gid)
}

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
}

/// A new directory `parent/name` owned by `nobody` (mode 0755).
fn nobodys_dir(parent: &Path, name: &str) -> PathBuf {
    let (uid, gid) = nobody();
    let d = parent.join(name);
    std::fs::create_dir(&d).unwrap();
    chown(&d, uid, gid);
    d
}

/// Runs serve to its refusal: (exit code, stderr). A serve that starts
/// instead is stopped after a while and reported as exit code `None`.
fn serve_refuses(db: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(bin())
        .arg("serve")
        .arg("--db")
        .arg(db)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .args(crate::support::authority::no_auth_unless_given(args))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + T;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (status, err)
}

#[test]
fn an_auth_file_nobody_could_write_is_refused_at_start_and_on_reload() {
    let (uid, gid) = nobody();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let nobody_ops = format!(
        "[[principal]]\nname = \"pwned\"\nrole = \"operator\"\ntoken_sha256 = \"{}\"\ntasks = [\"*\"]\n",
        sha("nobody-token")
    );
    // Owned by nobody (0644: not writable by others, but nobody owns it).
    let owned = write_file(dir.path(), "owned.toml", &nobody_ops, 0o644);
    chown(&owned, uid, gid);
    let (code, err) = serve_refuses(&db, &["--auth-file", owned.to_str().unwrap()]);
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("--auth-file") && err.contains("owned by uid"),
        "{err}"
    );
    // Reached through a symlink.
    let target = write_file(dir.path(), "real.toml", &nobody_ops, 0o600);
    let link = dir.path().join("link.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (code, err) = serve_refuses(&db, &["--auth-file", link.to_str().unwrap()]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("symlink"), "{err}");
    // In a directory nobody may write to (the file itself is root's 0600).
    let open_dir = nobodys_dir(dir.path(), "nobodys");
    let inside = write_file(&open_dir, "auth.toml", &nobody_ops, 0o600);
    let (code, err) = serve_refuses(&db, &["--auth-file", inside.to_str().unwrap()]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("another user can change"), "{err}");

    // On SIGHUP: the good file is replaced by a symlink to nobody's file.
    let auth = roles_file(dir.path(), "");
    let s = Serve::with_auth_file(&auth);
    let m = metrics_text(&s.addr, "operator-token");
    assert_eq!(
        metric(&m, "leaseagent_auth_reload_failures_total"),
        0.0,
        "{m}"
    );
    std::fs::remove_file(&auth).unwrap();
    std::os::unix::fs::symlink(&owned, &auth).unwrap();
    s.hup();
    let line = s.stderr_line("auth file not reloaded");
    assert!(line.contains("symlink"), "{line}");
    let a = call(&s.addr, "GET", "/v1/leases", Some("nobody-token"), "");
    assert_eq!(a.status, 401, "nobody's token was loaded: {a:?}");
    let m = metrics_text(&s.addr, "operator-token");
    assert_eq!(
        metric(&m, "leaseagent_auth_reload_failures_total"),
        1.0,
        "{m}"
    );
    assert!(metric(&m, "leaseagent_auth_last_good_load_timestamp_seconds") > 1.6e9);
}

/// `/metrics` as text.
fn metrics_text(addr: &str, token: &str) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    c.write_all(&http_req("GET", "/metrics", Some(token), ""))
        .unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn serve_db_and_tls_key_are_opened_without_symlinks_and_created_0600() {
    // Created 0600 whatever the umask (serve runs with umask 022 here).
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fresh.db");
    {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("umask 022; exec \"$0\" serve --no-auth --listen 127.0.0.1:0 --db \"$1\"")
            .arg(bin())
            .arg(&db)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        poll("the database", T, || db.exists().then_some(()));
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(
        std::fs::metadata(&db).unwrap().mode() & 0o777,
        0o600,
        "new database mode"
    );
    // A symlink planted where --db points: refused, the victim untouched.
    let victim = write_file(dir.path(), "victim", "keep", 0o600);
    let planted = dir.path().join("planted.db");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let (code, err) = serve_refuses(&planted, &[]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("--db") && err.contains("symlink"), "{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    // A parent directory nobody may write to (even if the last one is root's).
    let theirs = nobodys_dir(dir.path(), "theirs");
    let mine = theirs.join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (code, err) = serve_refuses(&mine.join("l.db"), &[]);
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains(&theirs.display().to_string()) && err.contains("another user"),
        "{err}"
    );
    assert!(!mine.join("l.db").exists());
    // The TLS key through a symlink: refused.
    let pki = Pki::new("key ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    let key_link = pki.dir.path().join("key-link.pem");
    std::os::unix::fs::symlink(&key, &key_link).unwrap();
    let (code, err) = serve_refuses(
        &dir.path().join("k.db"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key_link.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("--tls-key") && err.contains("symlink"),
        "{err}"
    );
}

/// A symlink `dir/name -> target` made by `nobody`.
fn nobodys_link(dir: &Path, name: &str, target: &Path) -> PathBuf {
    nobody();
    let link = dir.join(name);
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--", "ln", "-sfn"])
        .arg(target)
        .arg(&link)
        .output()
        .expect("runuser (util-linux): tests play root against `nobody`");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    link
}

#[test]
fn serve_files_reached_through_a_link_nobody_owns_are_refused() {
    // A sticky world-writable directory, as /tmp is: nobody plants links
    // in it to root's own files and directories.
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let roots = tempfile::tempdir().unwrap();
    let dbdir = roots.path().join("db");
    std::fs::create_dir(&dbdir).unwrap();
    std::fs::set_permissions(&dbdir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = nobodys_link(shared.path(), "x", &dbdir);
    let (code, err) = serve_refuses(&link.join("l.db"), &[]);
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("--db") && err.contains("a symlink owned by uid 65534"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&dbdir).unwrap().count(),
        0,
        "no file made"
    );

    let db = roots.path().join("ok.db");
    let auth = roles_file(roots.path(), "");
    let auth_link = nobodys_link(shared.path(), "auth.toml", &auth);
    let (code, err) = serve_refuses(&db, &["--auth-file", auth_link.to_str().unwrap()]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("--auth-file"), "{err}");

    let pki = Pki::new("link ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    let key_link = nobodys_link(shared.path(), "key.pem", &key);
    let cert_link = nobodys_link(shared.path(), "cert.pem", &cert);
    let (s, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let (sl, kl) = (cert_link.to_str().unwrap(), key_link.to_str().unwrap());
    for (flags, flag) in [
        (["--tls-cert", s, "--tls-key", kl], "--tls-key"),
        (["--tls-cert", sl, "--tls-key", k], "--tls-cert"),
    ] {
        let (code, err) = serve_refuses(&db, &flags);
        assert_eq!(code, Some(125), "{err}");
        assert!(err.contains(flag) && err.contains("symlink"), "{err}");
    }
    // The certificate through root's own link (certbot's `live/` links):
    // followed, serve starts.
    let own = roots.path().join("cert-link.pem");
    std::os::unix::fs::symlink(&cert, &own).unwrap();
    let (code, err) = serve_refuses(&db, &["--tls-cert", own.to_str().unwrap(), "--tls-key", k]);
    assert_eq!(code, None, "serve started: {err}");
}

#[test]
fn an_embedded_state_dir_under_a_directory_nobody_may_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = nobodys_dir(dir.path(), "theirs");
    let state = theirs.join("state");
    let marker = dir.path().join("ran");
    let run = |state: &Path| {
        Command::new(bin())
            .args(["--task", "embedded-t", "--ttl", "5s", "--", "touch"])
            .arg(&marker)
            .env("LEASEAGENT_STATE_DIR", state)
            .env_remove("LEASEAGENT_AUTHORITY")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run(&state);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("another user"), "{err}");
    assert!(!marker.exists());
    // The same under root's sticky /tmp (the tempdir) is fine.
    let out = run(&dir.path().join("state"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(marker.exists());
}

// ---- secrets ----

fn secret_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    write_file(dir, name, text, 0o600)
}

#[test]
fn no_secret_reaches_the_log_at_trace_level() {
    let dir = tempfile::tempdir().unwrap();
    let token = "tok-7f3a9c1e5b2d8f4a";
    let text = format!(
        "[[principal]]\nname = \"batch\"\nrole = \"agent\"\ntoken_sha256 = \"{}\"\ntasks = [\"*\"]\n",
        sha(token)
    );
    let auth = write_file(dir.path(), "auth.toml", &text, 0o600);
    let s = Serve::with_auth_file(&auth);
    let tf = secret_file(dir.path(), "token", &format!("{token}\n"));
    let mut a = agent(&format!("http://{}", s.addr), "secret-t");
    a.env("RUST_LOG", "trace")
        .arg("--heartbeat")
        .arg("200ms")
        .arg("--ttl")
        .arg("2s")
        .arg("--auth-token-file")
        .arg(&tf)
        .args(["--", "sleep", "1"]);
    let out = a.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Split across lines or hex-dumped (ureq's trace prints 16 bytes a
    // line, as hex and as text): no 6 characters of the token's random
    // part may show, as text or as hex with the spaces taken out.
    let random = &token[4..];
    let squashed: String = err.chars().filter(|c| !c.is_whitespace()).collect();
    for i in 0..=random.len() - 6 {
        let text = &random[i..i + 6];
        let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
        assert!(!err.contains(text), "{text:?} in the log:\n{err}");
        assert!(
            !squashed.contains(&hex),
            "{text:?} as hex in the log:\n{err}"
        );
    }
    assert!(!err.contains("Bearer"), "the header in the log:\n{err}");
    assert!(
        err.contains("trace") || err.contains("debug"),
        "no trace output at all:\n{err}"
    );
}

#[test]
fn a_password_in_the_url_is_never_shown_whatever_it_holds() {
    for pw in ["pa/ss-9d1", "pa?ss-9d1", "pa#ss-9d1", "p@ss-9d1"] {
        let url = format!("http://user:{pw}@127.0.0.1:1");
        let out = agent(&url, "t")
            .args(["--ttl", "2s", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(!err.contains("ss-9d1"), "{pw}: {err}");
    }
}

#[test]
fn credentials_are_not_sent_in_the_clear_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let tf = secret_file(dir.path(), "token", "t0k\n");
    let pw = secret_file(dir.path(), "pw", "pw\n");
    let marker = dir.path().join("ran");
    let cases: Vec<(String, Vec<String>, &str)> = vec![
        (
            "http://192.0.2.10:7878".into(),
            vec!["--auth-token-file".into(), tf.display().to_string()],
            "--auth-token-file",
        ),
        (
            "etcd://192.0.2.10:2379".into(),
            vec![
                "--etcd-user".into(),
                "u".into(),
                "--etcd-password-file".into(),
                pw.display().to_string(),
            ],
            "--etcd-password-file",
        ),
    ];
    for (url, flags, flag) in cases {
        let out = agent(&url, "t")
            .args(&flags)
            .args(["--ttl", "2s", "--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{url}: {err}");
        assert!(
            err.contains(flag) && err.contains("in the clear") && err.contains("192.0.2.10"),
            "{url}: {err}"
        );
        assert!(!marker.exists());
    }
}
