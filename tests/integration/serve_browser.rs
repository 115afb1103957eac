//! `leaseagent serve` against a browser and the other users of its host
//! (#33): every attack of the probe replayed on real sockets, each refused
//! or bounded, while agents and the CLI keep working.
//!
//! - a web page's cross-site "simple" request (`text/plain`, `Origin`,
//!   `Sec-Fetch-Site: cross-site`) and a DNS-rebinding page's requests
//!   (`Host: attacker.example`) on both listeners: refused, nothing changed;
//! - the status page cannot be framed;
//! - a certificate whose DNS SANs webpki would drop, or that has only IP,
//!   URI or email SANs, is nobody (never its CN);
//! - two `Authorization` headers: 400;
//! - unauthenticated keep-alives (`/healthz`) from many addresses cannot
//!   hold the slots agents need.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::serve_trust::{
    Answer, Pki, Serve, agent_principal, keep_alive_answer, parse_answer, roles_file, tls_call,
    tls_client, write_file,
};
use crate::support::authority::bin;
use crate::support::{agent, wait_agent};
use leaseagent_testkit::connect_from;

const T: Duration = Duration::from_secs(10);

/// One raw request (`head` lines without the request line's CRLF ending
/// are completed here) on a fresh connection; the whole answer.
fn send(addr: &str, method: &str, path: &str, headers: &[&str], body: &str) -> Answer {
    let mut raw = format!("{method} {path} HTTP/1.1\r\n");
    for h in headers {
        raw.push_str(h);
        raw.push_str("\r\n");
    }
    raw.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    parse_answer(&out)
}

/// A serve on loopback with `roles_file`'s principals plus `fleet` (an
/// agent for every task, token `fleet-token`), and `extra` flags.
fn fleet_serve(extra: &[&str]) -> (tempfile::TempDir, Serve) {
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), &agent_principal("fleet", "fleet-token"));
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--auth-file",
        auth.to_str().unwrap(),
    ];
    args.extend(extra);
    let s = Serve::start(&args);
    (dir, s)
}

const JSON: &str = "Content-Type: application/json";
const HOST: &str = "Host: localhost";

/// The leases the CLI lists (`leaseagent leases --json`): agents' and
/// operators' tools keep working through all of this.
fn cli_leases(addr: &str, token: Option<&str>) -> Value {
    let mut c = Command::new(bin());
    c.args(["leases", "--json", "--authority", &format!("http://{addr}")]);
    let dir = tempfile::tempdir().unwrap();
    if let Some(t) = token {
        let f = write_file(dir.path(), "token", t, 0o600);
        c.arg("--auth-token-file").arg(f);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "leaseagent leases: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The state of `task` as listed.
fn state_of(addr: &str, task: &str) -> String {
    let l = send(addr, "GET", "/v1/leases", &[HOST], "");
    assert_eq!(l.status, 200, "{l:?}");
    l.body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["task"] == task)
        .map_or_else(|| "none".into(), |x| x["state"].as_str().unwrap().into())
}

/// The probe's attack on the packaged default (loopback, no auth file): a
/// page posts `text/plain` with its Origin, cross-site, and a rebinding
/// page reads the listing under its own name. Each is refused before
/// anything changes; the agent's lease stays active and the CLI lists it.
#[test]
fn a_web_page_cannot_revoke_acquire_or_read_through_a_local_browser() {
    let s = Serve::start(&["--listen", "127.0.0.1:0"]);
    let a = send(
        &s.addr,
        "POST",
        "/v1/acquire",
        &[HOST, JSON],
        r#"{"task":"nightly-export","holder":"victim","ttl_ms":60000}"#,
    );
    assert_eq!(a.status, 200, "{a:?}");
    let revoke = r#"{"task":"nightly-export","force":true}"#;
    let page_acquire = r#"{"task":"nightly-export","holder":"page","ttl_ms":86400000}"#;
    let cases: &[(&str, &[&str], u16)] = &[
        // The CORS "simple" request exactly as the probe sent it.
        (
            "the probe's request",
            &[
                HOST,
                "Content-Type: text/plain",
                "Origin: http://evil.example",
                "Sec-Fetch-Site: cross-site",
            ],
            403,
        ),
        ("text/plain alone", &[HOST, "Content-Type: text/plain"], 415),
        (
            "a form's type",
            &[HOST, "Content-Type: application/x-www-form-urlencoded"],
            415,
        ),
        ("no Content-Type", &[HOST], 415),
        ("Origin with JSON", &[HOST, JSON, "Origin: null"], 403),
        (
            "cross-site with JSON",
            &[HOST, JSON, "Sec-Fetch-Site: cross-site"],
            403,
        ),
        (
            "same-site with JSON",
            &[HOST, JSON, "Sec-Fetch-Site: same-site"],
            403,
        ),
        (
            "a rebinding page's name",
            &[
                "Host: attacker.example:7878",
                JSON,
                "Sec-Fetch-Site: same-origin",
            ],
            421,
        ),
        ("no Host", &[JSON], 400),
    ];
    for (what, headers, want) in cases {
        for (path, body) in [("/v1/revoke", revoke), ("/v1/acquire", page_acquire)] {
            let r = send(&s.addr, "POST", path, headers, body);
            assert_eq!(r.status, *want, "{what}: POST {path}: {r:?}");
            assert!(r.body["error"].is_string(), "{what}: {r:?}");
        }
        assert_eq!(
            state_of(&s.addr, "nightly-export"),
            "active",
            "{what} changed the lease"
        );
    }
    // Reading: a rebinding page (its own Host) and cross-site requests get
    // nothing, on every endpoint.
    for path in ["/v1/leases", "/v1/history", "/metrics", "/", "/healthz"] {
        for headers in [
            &["Host: attacker.example"][..],
            &["Host: attacker.example:80", "Sec-Fetch-Site: none"],
            &[HOST, "Sec-Fetch-Site: cross-site"],
            &[HOST, "Origin: http://evil.example"],
        ] {
            let r = send(&s.addr, "GET", path, headers, "");
            assert!(
                [403, 421].contains(&r.status),
                "GET {path} {headers:?}: {r:?}"
            );
            assert!(!r.head.contains("nightly-export"), "{r:?}");
        }
    }
    // What a browser sends for a typed URL or the page's own reload passes.
    for sfs in ["none", "same-origin"] {
        let r = send(
            &s.addr,
            "GET",
            "/",
            &[HOST, &format!("Sec-Fetch-Site: {sfs}")],
            "",
        );
        assert_eq!(r.status, 200, "{sfs}: {r:?}");
    }
    let port = s.addr.rsplit(':').next().unwrap();
    for host in ["127.0.0.1", "localhost", "[::1]", "127.0.0.1:1"] {
        let host = if host.contains(':') && !host.starts_with('[') {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        let r = send(
            &s.addr,
            "GET",
            "/v1/leases",
            &[&format!("Host: {host}")],
            "",
        );
        assert_eq!(r.status, 200, "Host: {host}: {r:?}");
    }
    // The CLI and a real agent work as before.
    let l = cli_leases(&s.addr, None);
    assert_eq!(l["leases"][0]["state"], "active", "{l}");
    let mut a = agent(&format!("http://{}", s.addr), "other-task");
    a.args(["--", "true"]);
    let mut child = a.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let (st, err) = wait_agent(&mut child, Duration::from_secs(30));
    assert!(st.success(), "the agent: {err}");
    assert_eq!(state_of(&s.addr, "nightly-export"), "active");
}

/// `--server-name` adds names; the status listener checks the same; the
/// status page cannot be framed.
#[test]
fn server_names_are_the_only_other_hosts_and_the_status_listener_checks_them_too() {
    let s = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--server-name",
        "leases.internal",
        "--server-name",
        "Status.Example.",
        "--status-listen",
        "127.0.0.1:0",
    ]);
    let status = status_addr(&s);
    for addr in [s.addr.as_str(), status.as_str()] {
        for host in [
            "leases.internal",
            "leases.internal:7878",
            "status.example",
            "localhost",
        ] {
            let r = send(addr, "GET", "/", &[&format!("Host: {host}")], "");
            assert_eq!(r.status, 200, "{addr} Host: {host}: {r:?}");
            let head = r.head.to_ascii_lowercase();
            assert!(
                head.contains("frame-ancestors 'none'"),
                "no frame-ancestors: {head}"
            );
            assert!(head.contains("x-frame-options: deny"), "{head}");
        }
        for host in [
            "attacker.example",
            "leases.internal.attacker.example",
            "internal",
            "10.0.0.1",
        ] {
            let r = send(addr, "GET", "/", &[&format!("Host: {host}")], "");
            assert_eq!(r.status, 421, "{addr} Host: {host}: {r:?}");
            assert!(
                r.body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("--server-name")),
                "{r:?}"
            );
        }
        let r = send(addr, "GET", "/", &[HOST, "Sec-Fetch-Site: cross-site"], "");
        assert_eq!(r.status, 403, "{addr}: {r:?}");
        // An absolute request target naming another host.
        let r = send(addr, "GET", "http://attacker.example/", &[HOST], "");
        assert_eq!(r.status, 421, "{addr}: {r:?}");
    }
}

/// Two `Authorization` headers: which one counts would depend on the
/// reader, so the request is refused (400) and nothing is done.
#[test]
fn two_authorization_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), "");
    let s = Serve::with_auth_file(&auth);
    let body = r#"{"task":"nightly-a","holder":"h","ttl_ms":60000}"#;
    for pair in [
        [
            "Authorization: Bearer reader-token",
            "Authorization: Bearer agent-token",
        ],
        [
            "Authorization: Bearer agent-token",
            "Authorization: Bearer reader-token",
        ],
        [
            "Authorization: Bearer agent-token",
            "Authorization: Bearer agent-token",
        ],
    ] {
        let r = send(
            &s.addr,
            "POST",
            "/v1/acquire",
            &[HOST, JSON, pair[0], pair[1]],
            body,
        );
        assert_eq!(r.status, 400, "{pair:?}: {r:?}");
    }
    let l = send(
        &s.addr,
        "GET",
        "/v1/leases",
        &[HOST, "Authorization: Bearer operator-token"],
        "",
    );
    assert_eq!(l.body["leases"], serde_json::json!([]), "{l:?}");
    let ok = send(
        &s.addr,
        "POST",
        "/v1/acquire",
        &[HOST, JSON, "Authorization: Bearer agent-token"],
        body,
    );
    assert_eq!(ok.status, 200, "{ok:?}");
}

/// The probe's certificates: CN `ops` (an operator in the auth file) with
/// SANs webpki drops or that name no host. Each was the `ops` operator;
/// now each is nobody (401), while the real `worker-3` certificate and a
/// certificate without any SAN extension (CN `ops`) still work.
#[test]
fn a_certificate_with_subject_alt_names_is_never_its_cn() {
    use rcgen::SanType;
    let pki = Pki::new("san ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    let dir = tempfile::tempdir().unwrap();
    let auth = write_file(
        dir.path(),
        "auth.toml",
        "[[principal]]\nname = \"ops\"\nrole = \"operator\"\ncert_name = \"ops\"\ntasks = [\"*\"]\n\
         [[principal]]\nname = \"w3\"\nrole = \"agent\"\ncert_name = \"worker-3\"\ntasks = [\"*\"]\n",
        0o600,
    );
    let ca = pki.ca_pem();
    let s = Serve::mtls(&cert, &key, &ca, &auth);
    let ia5 = |s: &str| s.to_string().try_into().unwrap();
    let bad: Vec<(&str, Vec<SanType>)> = vec![
        ("wildcard", vec![SanType::DnsName(ia5("*.worker-3"))]),
        (
            "underscore, empty label",
            vec![SanType::DnsName(ia5("worker_3..bad"))],
        ),
        ("space", vec![SanType::DnsName(ia5("worker 3"))]),
        ("IP only", vec![SanType::IpAddress([10, 0, 0, 3].into())]),
        ("URI only", vec![SanType::URI(ia5("spiffe://x/worker-3"))]),
        (
            "email only",
            vec![SanType::Rfc822Name(ia5("worker-3@example.org"))],
        ),
    ];
    let revoke = crate::serve_trust::http_req(
        "POST",
        "/v1/revoke",
        None,
        r#"{"task":"victim","force":true}"#,
    );
    let list = crate::serve_trust::http_req("GET", "/v1/leases", None, "");
    let as_cert = |c: &Path, k: &Path, raw: &[u8]| {
        tls_call(&s.addr, &tls_client(&ca, Some((c, k))), raw).unwrap()
    };
    // The worker's own certificate takes a lease.
    let (wc, wk) = pki.leaf_sans("w3", vec![SanType::DnsName(ia5("worker-3"))], "ops");
    let a = as_cert(
        &wc,
        &wk,
        &crate::serve_trust::http_req(
            "POST",
            "/v1/acquire",
            None,
            r#"{"task":"victim","holder":"w3","ttl_ms":60000}"#,
        ),
    );
    assert_eq!(a.status, 200, "{a:?}");
    // ...and is an agent, not the operator its CN names.
    assert_eq!(as_cert(&wc, &wk, &revoke).status, 403);
    for (i, (what, sans)) in bad.into_iter().enumerate() {
        let (c, k) = pki.leaf_sans(&format!("bad{i}"), sans, "ops");
        for raw in [&revoke, &list] {
            let r = as_cert(&c, &k, raw);
            assert_eq!(r.status, 401, "{what}: {r:?}");
        }
    }
    // Untouched.
    let (oc, ok) = pki.leaf_sans("ops", Vec::new(), "ops");
    let l = as_cert(&oc, &ok, &list);
    assert_eq!(l.status, 200, "a CN-only certificate: {l:?}");
    assert_eq!(l.body["leases"][0]["state"], "active", "{l:?}");
    assert_eq!(l.body["leases"][0]["principal"], "w3", "{l:?}");
}

/// The probe held every slot with `/healthz` keep-alives from 16
/// addresses. Now unauthenticated connections have a pool of their own
/// (here at most 8 of 16): the flood's extra connections get one answer
/// and are closed, and an agent's requests (a real agent through a whole
/// job, and fresh connections with a token) are never told 503.
#[test]
fn unauthenticated_keep_alives_cannot_hold_every_slot() {
    let (_dir, s) = fleet_serve(&["--max-connections", "16"]);
    let server: SocketAddr = s.addr.parse().unwrap();
    let healthz = format!("GET /healthz HTTP/1.1\r\n{HOST}\r\n\r\n");
    // 16 addresses, two keep-alive connections each.
    let mut held = Vec::new();
    let mut closed = 0;
    for i in 0..32u8 {
        let mut c = connect_from([127, 0, 1, 10 + i / 2], server).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        c.write_all(healthz.as_bytes()).unwrap();
        assert_eq!(keep_alive_answer(&mut c).status, 200, "healthz {i}");
        // Closed after its one answer, or kept?
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        match c.read(&mut [0u8; 1]) {
            Ok(0) => closed += 1,
            Ok(_) => panic!("bytes after the answer"),
            Err(_) => held.push(c),
        }
    }
    assert_eq!(held.len(), 8, "unauthenticated connections kept open");
    assert_eq!(closed, 24);
    // The held ones still answer /healthz (they were not just dropped).
    for c in &mut held {
        c.set_read_timeout(Some(T)).unwrap();
        c.write_all(healthz.as_bytes()).unwrap();
        assert_eq!(keep_alive_answer(c).status, 200);
    }
    // An agent gets a real slot: keep-alive requests on one connection.
    let mut fleet = connect_from([127, 0, 0, 3], server).unwrap();
    for i in 0..3 {
        let body = format!(r#"{{"task":"f-{i}","holder":"h","ttl_ms":60000}}"#);
        let raw = format!(
            "POST /v1/acquire HTTP/1.1\r\n{HOST}\r\n{JSON}\r\nAuthorization: Bearer fleet-token\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        fleet.write_all(raw.as_bytes()).unwrap();
        let a = keep_alive_answer(&mut fleet);
        assert_eq!(a.status, 200, "acquire {i} while the pool is full: {a:?}");
    }
    // A real agent through a whole job, renewing.
    let tokens = tempfile::tempdir().unwrap();
    let tf = write_file(tokens.path(), "token", "fleet-token", 0o600);
    let mut a = agent(&format!("http://{}", s.addr), "fleet-job");
    a.arg("--auth-token-file").arg(&tf);
    a.args(["--ttl", "3s", "--heartbeat", "300ms", "--", "sleep", "2"]);
    let mut child = a.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let (st, err) = wait_agent(&mut child, Duration::from_secs(30));
    assert!(st.success(), "the agent while the pool is full: {err}");
    assert!(!err.contains("overloaded"), "{err}");
    drop(held);
}

/// Acquires `task` and releases it (succeeded) as `token`'s principal.
fn cycle(addr: &str, token: &str, task: &str) -> u64 {
    let auth = format!("Authorization: Bearer {token}");
    let body = format!(r#"{{"task":"{task}","holder":"h","ttl_ms":60000}}"#);
    let g = send(addr, "POST", "/v1/acquire", &[HOST, JSON, &auth], &body);
    assert_eq!(g.status, 200, "{g:?}");
    let rel = serde_json::json!({
        "lease_id": g.body["lease_id"], "token": g.body["token"], "outcome": "succeeded"
    });
    let r = send(
        addr,
        "POST",
        "/v1/release",
        &[HOST, JSON, &auth],
        &rel.to_string(),
    );
    assert_eq!(r.status, 200, "{r:?}");
    g.body["token"].as_u64().unwrap()
}

/// `GET path` as `token`'s principal: the whole answer as text (200 only).
fn text_as(addr: &str, path: &str, token: &str) -> String {
    let mut st = TcpStream::connect(addr).unwrap();
    st.set_read_timeout(Some(T)).unwrap();
    let raw = format!(
        "GET {path} HTTP/1.1\r\n{HOST}\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\n\r\n"
    );
    st.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    st.read_to_end(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "GET {path}: {text}");
    text
}

/// The address of serve's `--status-listen` listener, from its stderr.
fn status_addr(s: &Serve) -> String {
    s.stderr_line("status page on http://")
        .rsplit("http://")
        .next()
        .unwrap()
        .trim()
        .to_string()
}

/// `/v1/history` as `token`'s principal, with `query`.
fn history_as(addr: &str, token: &str, query: &str) -> Answer {
    let auth = format!("Authorization: Bearer {token}");
    send(
        addr,
        "GET",
        &format!("/v1/history{query}"),
        &[HOST, &auth],
        "",
    )
}

/// A scoped reader pages through its own attempts even when another
/// principal's churn is newer (scope before paging); its cursors say
/// nothing (the other principal's tokens were in them), work for it alone,
/// and anything else, a number past 2^63 included, is 400 (it was 503).
#[test]
fn history_cursors_are_opaque_bound_to_their_principal_and_scope_comes_first() {
    let (_dir, s) = fleet_serve(&[]);
    let mine: Vec<u64> = (0..3)
        .map(|_| cycle(&s.addr, "agent-token", "etl/x"))
        .collect();
    let theirs: Vec<u64> = (0..20)
        .map(|_| cycle(&s.addr, "fleet-token", "other"))
        .collect();
    let mut seen = Vec::new();
    let mut query = "?limit=2".to_string();
    let mut cursors = Vec::new();
    loop {
        let h = history_as(&s.addr, "reader-token", &query);
        assert_eq!(h.status, 200, "{h:?}");
        let page = h.body["attempts"].as_array().unwrap();
        assert!(!page.is_empty(), "an empty page: {h:?}");
        for a in page {
            assert_eq!(a["task"], "etl/x", "{a}");
            seen.push(a["token"].as_u64().unwrap());
        }
        match &h.body["next_after"] {
            Value::Null => break,
            Value::String(c) => {
                // Sealed: one length, no number, base64url only.
                assert!(c.parse::<u64>().is_err(), "{c}");
                assert_eq!(c.len(), 48, "{c}");
                assert!(
                    c.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                    "{c}"
                );
                cursors.push(c.clone());
                query = format!("?limit=2&after={c}");
            }
            other => panic!("next_after {other}"),
        }
        assert!(seen.len() <= 3, "{seen:?}");
    }
    let mut want = mine.clone();
    want.reverse();
    assert_eq!(seen, want);
    assert!(!cursors.is_empty());
    // Another principal's cursor, a forged or a huge one: 400, never 503.
    let c = &cursors[0];
    for (token, after) in [
        ("operator-token", c.clone()),
        ("reader-token", "9223372036854775808".to_string()),
        ("reader-token", "18446744073709551616".to_string()),
        ("reader-token", theirs[0].to_string()),
        ("reader-token", format!("{}A", &c[..c.len() - 1])),
        ("reader-token", "x".repeat(5000)),
    ] {
        let h = history_as(&s.addr, token, &format!("?after={after}"));
        assert_eq!(h.status, 400, "{token} after={after}: {h:?}");
        assert_eq!(h.body["error"], "bad_request", "{h:?}");
    }
}

/// The status page applies scope before cutting its sections: a reader
/// whose one lease sorts after 250 others is shown it (it was told "no
/// lease is held"); an operator sees 200 rows and a count of the rest.
#[test]
fn the_status_page_scopes_before_it_cuts_and_counts_what_it_leaves_out() {
    let (_dir, s) = fleet_serve(&[]);
    let fleet = "Authorization: Bearer fleet-token";
    for i in 0..250 {
        let body = format!(r#"{{"task":"aaa-{i:03}","holder":"h","ttl_ms":600000}}"#);
        let g = send(&s.addr, "POST", "/v1/acquire", &[HOST, JSON, fleet], &body);
        assert_eq!(g.status, 200, "{g:?}");
    }
    let body = r#"{"task":"etl/zz","holder":"h","ttl_ms":600000}"#;
    let auth_agent = "Authorization: Bearer agent-token";
    let g = send(
        &s.addr,
        "POST",
        "/v1/acquire",
        &[HOST, JSON, auth_agent],
        body,
    );
    assert_eq!(g.status, 200, "{g:?}");
    let page = |token: &str| text_as(&s.addr, "/", token);
    let reader = page("reader-token");
    assert!(reader.contains("<td>etl/zz</td>"), "{reader}");
    assert!(!reader.contains("no lease is held"), "{reader}");
    assert!(!reader.contains("aaa-"), "{reader}");
    assert!(!reader.contains("id=\"leases-more\""), "{reader}");
    let ops = page("operator-token");
    let table = &ops[ops.find("id=\"leases\"").unwrap()..];
    let rows = table[..table.find("</table>").unwrap()]
        .matches("<td>aaa-")
        .count();
    assert_eq!(rows, 200, "rows shown to the operator");
    assert!(
        ops.contains("id=\"leases-more\">and 51 more"),
        "no count of the rest: {}",
        &ops[ops.len().saturating_sub(600)..]
    );
}

/// The probe's third finding: one principal's acquire/release loop deleted
/// another principal's history. With a bound per principal (here 10 of
/// 40), the loop deletes only its own rows.
#[test]
fn one_principal_s_churn_does_not_erase_another_s_history() {
    let (_dir, s) = fleet_serve(&CHURN_BOUNDS);
    churn_leaves_the_quiet_principal_s_history(&s.addr);
}

/// The same on a PostgreSQL store (`serve --store`): the bound is the
/// engine's, the pruning the store's own SQL.
#[test]
fn one_principal_s_churn_does_not_erase_another_s_history_on_postgres() {
    use crate::support::authority::{Server, Store};
    let pg = crate::support::postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), &agent_principal("fleet", "fleet-token"));
    let store = Store::Postgres {
        url: pg.url("postgres"),
        password_file: pg.password_file.clone(),
        leader_ttl: "1s",
    };
    let mut flags = vec!["--auth-file", auth.to_str().unwrap()];
    flags.extend(CHURN_BOUNDS);
    let s = Server::start_on(&store, &flags);
    churn_leaves_the_quiet_principal_s_history(&s.addr);
}

/// History bounds of the churn tests: 40 rows in all, 10 per principal.
const CHURN_BOUNDS: [&str; 4] = [
    "--history-max-rows",
    "40",
    "--history-max-rows-per-principal",
    "10",
];

fn churn_leaves_the_quiet_principal_s_history(addr: &str) {
    let mine: Vec<u64> = (0..3)
        .map(|_| cycle(addr, "agent-token", "etl/kept"))
        .collect();
    for _ in 0..60 {
        cycle(addr, "fleet-token", "churn");
    }
    let h = history_as(addr, "operator-token", "?limit=1000");
    assert_eq!(h.status, 200, "{h:?}");
    let rows = h.body["attempts"].as_array().unwrap();
    let of = |task: &str| -> Vec<u64> {
        rows.iter()
            .filter(|a| a["task"] == task)
            .map(|a| a["token"].as_u64().unwrap())
            .collect()
    };
    let mut want = mine.clone();
    want.reverse();
    assert_eq!(of("etl/kept"), want, "the quiet principal's history");
    assert_eq!(of("churn").len(), 10, "the churning principal's own bound");
}

/// `/metrics` grew with every task name a client made up (1.05 MB in the
/// report). Now each per-task family names at most `--metrics-max-tasks`
/// tasks and sums up the rest in one `task="(other)"` series.
#[test]
fn metrics_name_a_bounded_number_of_tasks() {
    let (_dir, s) = fleet_serve(&["--metrics-max-tasks", "5"]);
    for i in 0..20 {
        cycle(&s.addr, "fleet-token", &format!("made-up-{i:02}"));
    }
    let m = text_as(&s.addr, "/metrics", "operator-token");
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("leaseagent_task_last_success_timestamp_seconds{"))
        .collect();
    assert_eq!(series.len(), 6, "{series:?}");
    // The oldest successes are named; the (other) series carries the
    // oldest of the rest.
    for (i, l) in series[..5].iter().enumerate() {
        assert!(l.contains(&format!("task=\"made-up-{i:02}\"")), "{l}");
    }
    assert!(series[5].contains("task=\"(other)\""), "{}", series[5]);
}

/// A hostile authority made `leaseagent leases` take 1.5 GB with page after
/// page. The CLI now stops at 64 MiB of answers in all, with a clear error.
#[test]
fn the_operator_cli_caps_what_it_reads_from_an_authority() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, stop2) = (served.clone(), stop.clone());
    let server = std::thread::spawn(move || {
        let mut page = 0u64;
        for conn in listener.incoming() {
            if stop2.load(Ordering::Relaxed) {
                break;
            }
            let Ok(mut c) = conn else { continue };
            c.set_read_timeout(Some(T)).unwrap();
            // Endless pages of 1 MiB each (whitespace is valid JSON), each
            // answered on its own connection.
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match c.read(&mut b) {
                    Ok(1) => head.push(b[0]),
                    _ => break,
                }
            }
            page += 1;
            let body = format!(
                "{{\"leases\":[],\"next_after\":\"t{page:08}\"{}}}",
                " ".repeat(1 << 20)
            );
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            if c.write_all(answer.as_bytes()).is_ok() {
                s2.fetch_add(body.len() as u64, Ordering::Relaxed);
            }
        }
    });
    let out = Command::new(bin())
        .args(["leases", "--authority", &format!("http://{addr}")])
        .output()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let _ = TcpStream::connect(addr);
    server.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("more than 67108864 bytes in all"),
        "no clear error: {err}"
    );
    let total = served.load(Ordering::Relaxed);
    assert!(total <= (64 << 20) + (2 << 20), "read {total} bytes");
}

/// No credential-less default: serve without `--auth-file` starts only
/// when told `--no-auth`; both together are refused too.
#[test]
fn serve_without_an_auth_file_needs_no_auth_said_explicitly() {
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), "");
    let run = |extra: &[&str]| {
        Command::new(bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("l.db"))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("--auth-file") && err.contains("--no-auth"),
        "{err}"
    );
    assert!(!dir.path().join("l.db").exists(), "a database was made");
    let out = run(&["--no-auth", "--auth-file", auth.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("give one of them"), "{err}");
    // Either one alone starts (spawn_serve adds --no-auth without an auth file).
    let open = Serve::start(&["--listen", "127.0.0.1:0"]);
    assert_eq!(
        send(&open.addr, "GET", "/v1/leases", &[HOST], "").status,
        200
    );
    let (_d, closed) = fleet_serve(&[]);
    assert_eq!(
        send(&closed.addr, "GET", "/v1/leases", &[HOST], "").status,
        401
    );
}

/// Made-up task names grew the tables, the page and `/metrics`; now one
/// principal creates at most `--max-new-tasks-per-hour` distinct tasks
/// (429, like its lease cap), re-taking its own tasks is not creating, and
/// other principals are not affected.
#[test]
fn a_principal_creates_a_bounded_number_of_new_tasks_an_hour() {
    let (_dir, s) = fleet_serve(&["--max-new-tasks-per-hour", "5"]);
    for i in 0..5 {
        cycle(&s.addr, "fleet-token", &format!("made-up-{i}"));
    }
    // Its own tasks again: fine.
    cycle(&s.addr, "fleet-token", "made-up-0");
    let body = r#"{"task":"made-up-5","holder":"h","ttl_ms":60000}"#;
    let fleet = "Authorization: Bearer fleet-token";
    let r = send(&s.addr, "POST", "/v1/acquire", &[HOST, JSON, fleet], body);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.body["error"], "too_many_leases", "{r:?}");
    assert!(
        r.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("new tasks")),
        "{r:?}"
    );
    // Another principal still creates tasks.
    cycle(&s.addr, "agent-token", "nightly-new");
}

/// `--status-listen` shows every principal's tasks to whoever connects,
/// without credentials (documented in history.md), and nothing else.
#[test]
fn the_status_listener_shows_every_principal_s_tasks_to_anyone_local() {
    let (_dir, s) = fleet_serve(&["--status-listen", "127.0.0.1:0"]);
    let status = status_addr(&s);
    for (token, task) in [("fleet-token", "fleet-task"), ("agent-token", "etl/mine")] {
        let body = format!(r#"{{"task":"{task}","holder":"h","ttl_ms":60000}}"#);
        let auth = format!("Authorization: Bearer {token}");
        let g = send(&s.addr, "POST", "/v1/acquire", &[HOST, JSON, &auth], &body);
        assert_eq!(g.status, 200, "{g:?}");
    }
    let mut st = TcpStream::connect(&status).unwrap();
    st.set_read_timeout(Some(T)).unwrap();
    st.write_all(format!("GET / HTTP/1.1\r\n{HOST}\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = Vec::new();
    st.read_to_end(&mut out).unwrap();
    let page = String::from_utf8(out).unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    for task in ["fleet-task", "etl/mine"] {
        assert!(page.contains(&format!("<td>{task}</td>")), "{task}: {page}");
    }
    // The main listener wants a credential for the same page.
    assert_eq!(send(&s.addr, "GET", "/", &[HOST], "").status, 401);
    // And the status listener serves nothing else.
    assert_eq!(send(&status, "GET", "/v1/leases", &[HOST], "").status, 404);
}

/// A password typed in `--authority` stayed visible in `ps` for the whole
/// run. Typed on the command line it is now refused before anything runs,
/// pointing to the `-file` flags, and never shown; from the environment
/// (visible to the same user and root only) it is still dropped with a
/// warning.
#[test]
fn a_password_in_an_authority_url_on_the_command_line_is_refused() {
    let url = "http://user:pa55-9d1@127.0.0.1:1";
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let runs: Vec<Vec<String>> = vec![
        vec![
            "--authority".into(),
            url.into(),
            "--task".into(),
            "t".into(),
            "--".into(),
            "touch".into(),
            ran.display().to_string(),
        ],
        vec!["leases".into(), "--authority".into(), url.into()],
        vec!["revoke".into(), format!("--authority={url}"), "t".into()],
    ];
    for args in runs {
        let out = Command::new(bin()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // 125: a usage error, like any flag that cannot work.
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains("--auth-token-file"), "{args:?}: {err}");
        assert!(err.contains("http://127.0.0.1:1"), "{args:?}: {err}");
        assert!(!err.contains("pa55"), "{args:?}: {err}");
    }
    assert!(!ran.exists(), "the command ran");
    // From the environment: dropped with a warning, then the (unreachable)
    // authority is tried.
    let out = Command::new(bin())
        .args(["leases"])
        .env("LEASEAGENT_AUTHORITY", url)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is ignored"), "{err}");
    assert!(!err.contains("carries a password"), "{err}");
    assert!(!err.contains("pa55"), "{err}");
}
