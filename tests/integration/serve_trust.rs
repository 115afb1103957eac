//! `leaseagent serve` hardened for a fleet, as real processes over real
//! sockets: TLS and mutual TLS (a test CA made with rcgen), the auth file's
//! roles and scopes (401/403), SIGHUP reload, the listen rule, `token new`,
//! strict framing with real bad bytes, per-peer connection limits, and
//! `/healthz` under load.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::support::authority::{bin, poll, raw_request, spawn_serve};
use serde_json::{Value, json};
use sha2::Digest;

const T: Duration = Duration::from_secs(10);

/// A `leaseagent serve` started with extra flags.
pub(crate) struct Serve {
    pub(crate) child: Child,
    pub(crate) addr: String,
    stderr: Receiver<String>,
    _dir: tempfile::TempDir,
}

impl Serve {
    pub(crate) fn start(extra: &[&str]) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<std::ffi::OsString> = extra.iter().map(Into::into).collect();
        let s = spawn_serve(&dir.path().join("leases.db"), &args);
        Serve {
            child: s.child,
            addr: s.addr,
            stderr: s.stderr,
            _dir: dir,
        }
    }

    /// A serve on loopback that takes its principals from `auth`.
    pub(crate) fn with_auth_file(auth: &Path) -> Serve {
        Serve::start(&[
            "--listen",
            "127.0.0.1:0",
            "--auth-file",
            auth.to_str().unwrap(),
        ])
    }

    /// A TLS serve on loopback.
    pub(crate) fn tls(cert: &Path, key: &Path) -> Serve {
        Serve::tls_with(cert, key, &[])
    }

    /// A TLS serve on loopback that requires client certificates from `ca`
    /// and takes its principals from `auth`.
    pub(crate) fn mtls(cert: &Path, key: &Path, ca: &Path, auth: &Path) -> Serve {
        let extra = [
            "--client-ca",
            ca.to_str().unwrap(),
            "--auth-file",
            auth.to_str().unwrap(),
        ];
        Serve::tls_with(cert, key, &extra)
    }

    fn tls_with(cert: &Path, key: &Path, extra: &[&str]) -> Serve {
        let mut args = vec![
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ];
        args.extend(extra);
        Serve::start(&args)
    }

    /// Waits for a stderr line containing `needle`.
    pub(crate) fn stderr_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .stderr
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no stderr line with {needle:?}"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    pub(crate) fn hup(&self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn write_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

pub(crate) fn sha(token: &str) -> String {
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A parsed HTTP answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: Value,
}

pub(crate) fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let end = text
        .find("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {text:?}"));
    let head = text[..end].to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = serde_json::from_str(&text[end + 4..]).unwrap_or(Value::Null);
    Answer { status, head, body }
}

pub(crate) fn http_req(method: &str, path: &str, token: Option<&str>, body: &str) -> Vec<u8> {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Plain HTTP: one request on a fresh connection.
pub(crate) fn call(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&http_req(method, path, token, body)).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    parse_answer(&out)
}

// ---- a test PKI ----

pub(crate) struct Pki {
    pub(crate) dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub(crate) fn new(name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = p.self_signed(&ca_key).unwrap();
        Pki {
            dir: tempfile::tempdir().unwrap(),
            ca,
            ca_key,
        }
    }

    pub(crate) fn ca_pem(&self) -> PathBuf {
        write_file(self.dir.path(), "ca.pem", &self.ca.pem(), 0o644)
    }

    /// A leaf: (cert path, key path).
    pub(crate) fn leaf(
        &self,
        file: &str,
        dns: &[&str],
        cn: &str,
        server: bool,
    ) -> (PathBuf, PathBuf) {
        let mut p =
            rcgen::CertificateParams::new(dns.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        if server {
            p.subject_alt_names
                .push(rcgen::SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        }
        self.sign(file, p, cn, server)
    }

    /// A client leaf with exactly these subjectAltNames (any kind, any
    /// text) and CN: (cert path, key path).
    pub(crate) fn leaf_sans(
        &self,
        file: &str,
        sans: Vec<rcgen::SanType>,
        cn: &str,
    ) -> (PathBuf, PathBuf) {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = sans;
        self.sign(file, p, cn, false)
    }

    fn sign(
        &self,
        file: &str,
        mut p: rcgen::CertificateParams,
        cn: &str,
        server: bool,
    ) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = p.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let c = write_file(self.dir.path(), &format!("{file}.pem"), &cert.pem(), 0o644);
        let k = write_file(
            self.dir.path(),
            &format!("{file}.key"),
            &key.serialize_pem(),
            0o600,
        );
        (c, k)
    }
}

pub(crate) fn tls_client(ca: &Path, client: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let cfg = match client {
        None => b.with_no_client_auth(),
        Some((c, k)) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(c)
                .unwrap()
                .map(|c| c.unwrap())
                .collect();
            b.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(k).unwrap())
                .unwrap()
        }
    };
    Arc::new(cfg)
}

/// HTTPS: one request; `Err` is the TLS/IO failure.
pub(crate) fn tls_call(
    addr: &str,
    cfg: &Arc<rustls::ClientConfig>,
    raw: &[u8],
) -> Result<Answer, String> {
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(cfg.clone(), name).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(T)).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(raw).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if !out.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(e) => return Err(e.to_string()),
    }
    if out.is_empty() {
        return Err("no answer".into());
    }
    Ok(parse_answer(&out))
}

// ---- TLS ----

#[test]
fn tls_serves_https_and_refuses_plain_http_and_unknown_cas() {
    let pki = Pki::new("test ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    let s = Serve::tls(&cert, &key);
    let good = tls_client(&pki.ca_pem(), None);
    let a = tls_call(&s.addr, &good, &http_req("GET", "/healthz", None, "")).unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    let body = r#"{"task":"t","holder":"h","ttl_ms":5000}"#;
    let a = tls_call(&s.addr, &good, &http_req("POST", "/v1/acquire", None, body)).unwrap();
    assert_eq!(a.status, 200, "{a:?}");

    // Plain HTTP to the TLS port: no HTTP answer, the connection is closed.
    let mut p = TcpStream::connect(&s.addr).unwrap();
    p.set_read_timeout(Some(T)).unwrap();
    p.write_all(&http_req("GET", "/healthz", None, "")).unwrap();
    let mut out = Vec::new();
    let _ = p.read_to_end(&mut out);
    assert!(
        !String::from_utf8_lossy(&out).contains("HTTP/1.1 200"),
        "plain HTTP answered on the TLS port: {out:?}"
    );

    // A client that trusts another CA refuses the server.
    let other = Pki::new("other ca");
    let bad = tls_client(&other.ca_pem(), None);
    let e = tls_call(&s.addr, &bad, &http_req("GET", "/healthz", None, "")).unwrap_err();
    assert!(e.to_lowercase().contains("certificate"), "{e}");

    // Still serving.
    let a = tls_call(&s.addr, &good, &http_req("GET", "/healthz", None, "")).unwrap();
    assert_eq!(a.status, 200);
}

#[test]
fn mutual_tls_names_the_principal_by_certificate() {
    let pki = Pki::new("fleet ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    let (w1c, w1k) = pki.leaf("w1", &["worker-1.example.org"], "worker one", false);
    let (w2c, w2k) = pki.leaf("w2", &[], "worker-2", false);
    let rogue = Pki::new("rogue ca");
    let (rc, rk) = rogue.leaf("rogue", &["worker-1.example.org"], "worker-1", false);
    let dir = tempfile::tempdir().unwrap();
    let auth = write_file(
        dir.path(),
        "auth.toml",
        "[[principal]]\nname = \"w1\"\nrole = \"agent\"\ncert_name = \"worker-1.example.org\"\ntasks = [\"w1-*\"]\n\
         [[principal]]\nname = \"w2\"\nrole = \"reader\"\ncert_name = \"worker-2\"\ntasks = [\"*\"]\n",
        0o640,
    );
    let ca = pki.ca_pem();
    let s = Serve::mtls(&cert, &key, &ca, &auth);
    let w1 = tls_client(&ca, Some((&w1c, &w1k)));
    let acq = |task: &str| {
        let body = format!(r#"{{"task":"{task}","holder":"h","ttl_ms":5000}}"#);
        http_req("POST", "/v1/acquire", None, &body)
    };
    assert_eq!(tls_call(&s.addr, &w1, &acq("w1-a")).unwrap().status, 200);
    // An unknown bearer token is not excused by a good certificate.
    let body = r#"{"task":"w1-b","holder":"h","ttl_ms":5000}"#;
    let a = tls_call(
        &s.addr,
        &w1,
        &http_req("POST", "/v1/acquire", Some("bogus"), body),
    )
    .unwrap();
    assert_eq!(a.status, 401, "{a:?}");
    let a = tls_call(&s.addr, &w1, &acq("other")).unwrap();
    assert_eq!(
        (a.status, a.body["error"].as_str()),
        (403, Some("forbidden"))
    );
    // w2 is found by its CN, and is a reader.
    let w2 = tls_client(&ca, Some((&w2c, &w2k)));
    let a = tls_call(&s.addr, &w2, &acq("w2-a")).unwrap();
    assert_eq!(a.status, 403, "{a:?}");
    let a = tls_call(&s.addr, &w2, &http_req("GET", "/v1/leases", None, "")).unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body["leases"][0]["task"], "w1-a");
    assert!(a.body["leases"][0].get("lease_id").is_none(), "{a:?}");
    // No client certificate, or one from another CA: the handshake fails.
    let none = tls_client(&ca, None);
    assert!(tls_call(&s.addr, &none, &acq("w1-b")).is_err());
    let r = tls_client(&ca, Some((&rc, &rk)));
    assert!(tls_call(&s.addr, &r, &acq("w1-b")).is_err());
}

// ---- the auth file ----

pub(crate) fn roles_file(dir: &Path, extra: &str) -> PathBuf {
    let text = format!(
        "[[principal]]\nname = \"readers\"\nrole = \"reader\"\ntoken_sha256 = \"{}\"\ntasks = [\"etl/*\"]\n\
         [[principal]]\nname = \"batch\"\nrole = \"agent\"\ntoken_sha256 = \"{}\"\ntasks = [\"nightly-*\", \"etl/*\"]\n\
         [[principal]]\nname = \"ops\"\nrole = \"operator\"\ntoken_sha256 = \"{}\"\ntasks = [\"*\"]\n{extra}",
        sha("reader-token"),
        sha("agent-token"),
        sha("operator-token"),
    );
    write_file(dir, "auth.toml", &text, 0o600)
}

/// One more principal for `roles_file`: an agent for every task, by token.
pub(crate) fn agent_principal(name: &str, token: &str) -> String {
    format!(
        "[[principal]]\nname = \"{name}\"\nrole = \"agent\"\ntoken_sha256 = \"{}\"\ntasks = [\"*\"]\n",
        sha(token)
    )
}

#[test]
fn auth_file_roles_answer_401_and_403_as_specified() {
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), "");
    let s = Serve::with_auth_file(&auth);
    let acq = |task: &str| format!(r#"{{"task":"{task}","holder":"h","ttl_ms":60000}}"#);
    let acquire =
        |tok: &str, task: &str| call(&s.addr, "POST", "/v1/acquire", Some(tok), &acq(task));

    // No credential, or an unknown one: 401 with WWW-Authenticate: Bearer.
    for tok in [None, Some("wrong")] {
        let a = call(&s.addr, "POST", "/v1/acquire", tok, &acq("nightly-a"));
        assert_eq!(a.status, 401, "{a:?}");
        assert_eq!(a.body, json!({"error": "unauthenticated"}));
        assert!(
            a.head.to_lowercase().contains("www-authenticate: bearer"),
            "{}",
            a.head
        );
    }
    // /healthz needs no credential.
    assert_eq!(call(&s.addr, "GET", "/healthz", None, "").status, 200);

    // agent: acquire in scope; not out of scope; no revoke, no listing.
    let a = acquire("agent-token", "nightly-a");
    assert_eq!(a.status, 200, "{a:?}");
    let a = acquire("agent-token", "etl/x/y");
    assert_eq!(a.status, 200, "{a:?}");
    let a = acquire("agent-token", "weekly");
    assert_eq!(
        (a.status, a.body.clone()),
        (403, json!({"error": "forbidden"}))
    );
    let a = call(
        &s.addr,
        "POST",
        "/v1/revoke",
        Some("agent-token"),
        r#"{"task":"nightly-a"}"#,
    );
    assert_eq!(a.status, 403);
    assert_eq!(
        call(&s.addr, "GET", "/v1/leases", Some("agent-token"), "").status,
        403
    );

    // reader: lists its scope only, /metrics, nothing else.
    let a = call(&s.addr, "GET", "/v1/leases", Some("reader-token"), "");
    assert_eq!(a.status, 200);
    let tasks: Vec<&str> = a.body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["etl/x/y"]);
    assert_eq!(
        call(&s.addr, "GET", "/metrics", Some("reader-token"), "").status,
        200
    );
    let a = acquire("reader-token", "etl/z");
    assert_eq!(a.status, 403);

    // operator: everything, and sees every lease (without lease ids).
    let a = call(&s.addr, "GET", "/v1/leases", Some("operator-token"), "");
    assert_eq!(a.body["leases"].as_array().unwrap().len(), 2, "{a:?}");
    assert!(a.body["leases"][0].get("lease_id").is_none());
    let a = call(
        &s.addr,
        "POST",
        "/v1/revoke",
        Some("operator-token"),
        r#"{"task":"nightly-a","force":true}"#,
    );
    assert_eq!(a.status, 200, "{a:?}");
}

#[test]
fn sighup_rereads_the_auth_file_and_keeps_the_old_one_if_bad() {
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), "");
    let s = Serve::with_auth_file(&auth);
    // A keep-alive connection opened before the reload.
    let mut ka = TcpStream::connect(&s.addr).unwrap();
    ka.set_read_timeout(Some(T)).unwrap();
    let mut r = BufReader::new(ka.try_clone().unwrap());
    let mut ka_get = |tok: &str| -> u16 {
        let req = format!(
            "GET /v1/leases HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {tok}\r\n\r\n"
        );
        ka.write_all(req.as_bytes()).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let st = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut len = 0;
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut b = vec![0; len];
        r.read_exact(&mut b).unwrap();
        st
    };
    assert_eq!(ka_get("operator-token"), 200);
    let g = call(
        &s.addr,
        "POST",
        "/v1/acquire",
        Some("agent-token"),
        r#"{"task":"nightly-a","holder":"h","ttl_ms":60000}"#,
    );
    assert_eq!(g.status, 200);

    // New file: a new operator token; the reader is gone.
    let text = std::fs::read_to_string(&auth)
        .unwrap()
        .replace(&sha("operator-token"), &sha("operator-2"))
        .replace(&sha("reader-token"), &sha("reader-2"));
    std::fs::write(&auth, text).unwrap();
    s.hup();
    s.stderr_line("auth file reloaded");
    assert_eq!(ka_get("operator-2"), 200, "the old connection still serves");
    assert_eq!(ka_get("operator-token"), 401);
    // The lease acquired before the reload is still there and renewable.
    let renew = json!({"lease_id": g.body["lease_id"], "token": g.body["token"]}).to_string();
    let a = call(&s.addr, "POST", "/v1/renew", Some("agent-token"), &renew);
    assert_eq!(a.status, 200, "{a:?}");

    // A bad file: logged, the previous principals stay.
    std::fs::write(&auth, "[[principal]]\nname = 5\n").unwrap();
    s.hup();
    let line = s.stderr_line("auth file not reloaded");
    assert!(line.contains("error"), "{line}");
    assert_eq!(ka_get("operator-2"), 200);
}

// ---- listen rule, token new, start-up checks ----

#[test]
fn listening_beyond_loopback_needs_tls_and_an_auth_file_or_insecure_listen() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    // `serve` on `listen` with `flags`, run to its end.
    let serve = |listen: &str, flags: &[&str]| {
        Command::new(bin())
            .args(["serve", "--listen", listen, "--db"])
            .arg(&db)
            .args(flags)
            .args(crate::support::authority::no_auth_unless_given(flags))
            .output()
            .unwrap()
    };
    let out = serve("0.0.0.0:0", &[]);
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen"), "{err}");
    assert!(!db.exists(), "refused before opening the database");
    // TLS without an auth file is not enough.
    let pki = Pki::new("ca");
    let (cert, key) = pki.leaf("server", &["localhost"], "localhost", true);
    let tls = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let out = serve("0.0.0.0:0", &tls);
    assert_eq!(out.status.code(), Some(125));
    // With --insecure-listen, or TLS and an auth file, it serves.
    let s = Serve::start(&["--listen", "0.0.0.0:0", "--insecure-listen"]);
    let port = s.addr.rsplit(':').next().unwrap();
    assert_eq!(
        call(&format!("127.0.0.1:{port}"), "GET", "/healthz", None, "").status,
        200
    );
    let auth = roles_file(dir.path(), "");
    let mut flags = vec!["--listen", "0.0.0.0:0"];
    flags.extend(tls);
    flags.extend(["--auth-file", auth.to_str().unwrap()]);
    let _s = Serve::start(&flags);
    // --tls-cert without --tls-key, and a key readable by others: 125.
    let out = serve("127.0.0.1:0", &tls[..2]);
    assert_eq!(out.status.code(), Some(125));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = serve("127.0.0.1:0", &tls);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
}

#[test]
fn token_new_prints_a_random_token_and_its_sha256_line() {
    let run = || Command::new(bin()).args(["token", "new"]).output().unwrap();
    let (a, b) = (run(), run());
    assert!(a.status.success());
    let tok = String::from_utf8(a.stdout).unwrap().trim().to_string();
    let tok2 = String::from_utf8(b.stdout).unwrap().trim().to_string();
    assert_ne!(tok, tok2);
    // base64url without padding: 6 bits a character; at least 128 bits.
    assert!(tok.len() * 6 >= 128, "{tok}");
    assert!(
        tok.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    );
    let err = String::from_utf8(a.stderr).unwrap();
    assert_eq!(err.trim(), format!("token_sha256 = \"{}\"", sha(&tok)));
    // And the token works against an auth file with that line.
    let dir = tempfile::tempdir().unwrap();
    let auth = write_file(
        dir.path(),
        "auth.toml",
        &format!(
            "[[principal]]\nname = \"x\"\nrole = \"agent\"\n{}\ntasks = [\"*\"]\n",
            err.trim()
        ),
        0o600,
    );
    let s = Serve::with_auth_file(&auth);
    let body = r#"{"task":"t","holder":"h","ttl_ms":5000}"#;
    assert_eq!(
        call(&s.addr, "POST", "/v1/acquire", Some(&tok), body).status,
        200
    );
}

// ---- framing ----

/// Sends raw bytes, reads until the server closes: (answer, closed cleanly).
fn raw_exchange(addr: &str, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let clean = s.read_to_end(&mut out).is_ok();
    (out, clean)
}

#[test]
fn bad_framing_is_refused_and_the_connection_closed_cleanly() {
    let s = Serve::start(&["--listen", "127.0.0.1:0"]);
    let body = r#"{"task":"smuggle","holder":"h","ttl_ms":5000}"#;
    let second = format!(
        "POST /v1/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let cases: Vec<(&str, String, u16)> = vec![
        (
            "space before the colon",
            format!(
                "POST /v1/renew HTTP/1.1\r\nHost: localhost\r\nContent-Length : {}\r\n\r\n{second}",
                second.len()
            ),
            400,
        ),
        (
            "chunked",
            format!(
                "POST /v1/acquire HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                body.len()
            ),
            411,
        ),
        (
            "space before the colon of Transfer-Encoding",
            format!(
                "POST /v1/acquire HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding : chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                body.len()
            ),
            400,
        ),
        (
            "+N",
            format!(
                "POST /v1/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: +{}\r\n\r\n{body}",
                body.len()
            ),
            400,
        ),
        (
            "leading zeros",
            format!(
                "POST /v1/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0{}\r\n\r\n{body}",
                body.len()
            ),
            400,
        ),
        (
            "bare LF",
            format!(
                "POST /v1/acquire HTTP/1.1\r\nHost: localhost\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
            400,
        ),
        (
            "conflicting lengths",
            format!(
                "POST /v1/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nContent-Length: 2\r\n\r\n{body}",
                body.len()
            ),
            400,
        ),
        (
            "too large",
            "POST /v1/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000000\r\n\r\n"
                .to_string(),
            413,
        ),
        (
            "head too large",
            format!(
                "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n",
                "a".repeat(40_000)
            ),
            431,
        ),
    ];
    for (what, bytes, want) in &cases {
        let (out, clean) = raw_exchange(&s.addr, bytes.as_bytes());
        let text = String::from_utf8_lossy(&out);
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no answer: {text:?}"));
        assert_eq!(status, *want, "{what}: {text}");
        assert!(clean, "{what}: the connection was reset, not closed");
        assert_eq!(
            text.matches("HTTP/1.1 ").count(),
            1,
            "{what}: a second request was run: {text}"
        );
    }
    // Nothing smuggled was granted.
    let a = call(&s.addr, "GET", "/v1/leases", None, "");
    assert_eq!(a.body["leases"], json!([]), "{a:?}");

    // HEAD: the head of GET, no body.
    let (out, clean) = raw_exchange(
        &s.addr,
        b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    let text = String::from_utf8_lossy(&out);
    assert!(clean && text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("\r\n\r\n"), "HEAD got a body: {text:?}");
    // And the server is healthy and granting.
    let a = call(&s.addr, "POST", "/v1/acquire", None, body);
    assert_eq!(a.status, 200);
}

// ---- connection limits ----

#[test]
fn idle_connections_from_one_peer_do_not_starve_another() {
    let s = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--max-connections-per-peer",
        "64",
    ]);
    let server: SocketAddr = s.addr.parse().unwrap();
    let from = |ip: [u8; 4]| -> TcpStream {
        let sock = rustix::net::socket(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::STREAM,
            None,
        )
        .unwrap();
        let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), 0);
        rustix::net::bind(&sock, &src).unwrap();
        rustix::net::connect(&sock, &server).unwrap();
        let s = TcpStream::from(sock);
        s.set_read_timeout(Some(T)).unwrap();
        s
    };
    // 200 idle connections from 127.0.0.2 (the first 64 are "real").
    let hog: Vec<TcpStream> = (0..200).map(|_| from([127, 0, 0, 2])).collect();
    // Another peer is served normally.
    let mut other = from([127, 0, 0, 3]);
    other
        .write_all(&http_req(
            "POST",
            "/v1/acquire",
            None,
            r#"{"task":"t","holder":"h","ttl_ms":5000}"#,
        ))
        .unwrap();
    let mut out = Vec::new();
    other.read_to_end(&mut out).unwrap();
    assert_eq!(
        parse_answer(&out).status,
        200,
        "{}",
        String::from_utf8_lossy(&out)
    );
    // The hog's extra connections are closed at once, unanswered, even
    // for /healthz: past its own limit a peer gets nothing (cheaply).
    for path in ["/v1/leases", "/healthz"] {
        let mut extra = from([127, 0, 0, 2]);
        let _ = extra.write_all(&http_req("GET", path, None, ""));
        let mut out = Vec::new();
        let _ = extra.read_to_end(&mut out);
        assert!(out.is_empty(), "{path}: {}", String::from_utf8_lossy(&out));
    }
    // /metrics shows the open connections and those refused.
    let m = call(&s.addr, "GET", "/metrics", None, "");
    let text = String::from_utf8_lossy(&{
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        c.write_all(&http_req("GET", "/metrics", None, "")).unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        out
    })
    .to_string();
    assert_eq!(m.status, 200);
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert!(value("leaseagent_connections") >= 64.0, "{text}");
    assert!(
        value("leaseagent_connections_refused_total") >= 136.0,
        "{text}"
    );
    // The hog's connections past its limit were closed, not kept idle.
    let mut last = hog.into_iter().last().unwrap();
    let mut b = [0u8; 16];
    assert!(matches!(last.read(&mut b), Ok(0) | Err(_)));
    // Closing the hog frees its slots. Until serve has read the hog's
    // closes, a new connection from it is still past its limit and closed
    // unanswered (an empty read): that is "not yet", not a failure.
    poll("slots freed", T, || {
        let mut c = from([127, 0, 0, 2]);
        c.write_all(&http_req("GET", "/v1/leases", None, "")).ok()?;
        let mut out = Vec::new();
        c.read_to_end(&mut out).ok()?;
        if out.is_empty() {
            return None;
        }
        (parse_answer(&out).status == 200).then_some(())
    });
}

#[test]
fn healthz_is_answered_while_renewals_saturate_the_server() {
    let s = Serve::start(&["--listen", "127.0.0.1:0"]);
    let g = call(
        &s.addr,
        "POST",
        "/v1/acquire",
        None,
        r#"{"task":"load","holder":"h","ttl_ms":60000}"#,
    );
    let renew = json!({"lease_id": g.body["lease_id"], "token": g.body["token"]}).to_string();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..16)
        .map(|_| {
            let (addr, renew, stop) = (s.addr.clone(), renew.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (st, _) =
                        raw_request(&addr, &http_req("POST", "/v1/renew", None, &renew), T)
                            .unwrap();
                    assert_eq!(st, 200);
                    n += 1;
                }
                n
            })
        })
        .collect();
    for _ in 0..20 {
        let a = call(&s.addr, "GET", "/healthz", None, "");
        assert_eq!(a.status, 200);
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let renewed: u64 = load.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(renewed > 0);
}

/// Reads one answer from a keep-alive connection (head, then
/// `Content-Length` bytes of body).
pub(crate) fn keep_alive_answer(s: &mut impl Read) -> Answer {
    let mut raw = Vec::new();
    let mut b = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b).unwrap();
        assert_eq!(
            n,
            1,
            "closed in the head: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.push(b[0]);
    }
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    raw.extend_from_slice(&body);
    parse_answer(&raw)
}

#[test]
fn a_dribbling_request_is_cut_off_but_an_idle_keep_alive_connection_stays() {
    let s = Serve::start(&["--listen", "127.0.0.1:0"]);
    let mut idle = TcpStream::connect(&s.addr).unwrap();
    idle.set_read_timeout(Some(T)).unwrap();
    // An agent's connection: one request that speaks for a principal (any
    // but /healthz without an auth file), kept open. (A connection that
    // never made one is unauthenticated and closed after a shorter idle
    // time: serve_browser.rs.)
    idle.write_all(b"GET /v1/leases HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert_eq!(keep_alive_answer(&mut idle).status, 200);
    let mut slow = TcpStream::connect(&s.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    slow.write_all(b"POST /v1/renew HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    let start = Instant::now();
    // One header byte a second: the request never completes.
    let closed_after = loop {
        let mut b = [0u8; 256];
        match slow.read(&mut b) {
            Ok(0) => break start.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break start.elapsed(),
        }
        if slow.write_all(b"X").is_err() {
            break start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "the slow request was never cut off"
        );
    };
    // The limit is 10 s from the first byte; far more would mean no limit.
    assert!(closed_after >= Duration::from_secs(5), "{closed_after:?}");
    // The idle keep-alive connection, opened before, is still served.
    idle.write_all(&http_req("GET", "/healthz", None, ""))
        .unwrap();
    let mut out = Vec::new();
    idle.read_to_end(&mut out).unwrap();
    assert_eq!(parse_answer(&out).status, 200);
}

#[test]
fn a_lease_is_renewed_and_released_only_by_the_principal_that_acquired_it() {
    let dir = tempfile::tempdir().unwrap();
    let auth = roles_file(dir.path(), &agent_principal("batch-2", "agent-2"));
    let s = Serve::with_auth_file(&auth);
    let g = call(
        &s.addr,
        "POST",
        "/v1/acquire",
        Some("agent-token"),
        r#"{"task":"nightly-own","holder":"h","ttl_ms":60000}"#,
    );
    assert_eq!(g.status, 200, "{g:?}");
    let id = g.body["lease_id"].as_str().unwrap();
    let lref = json!({"lease_id": id, "token": g.body["token"]}).to_string();
    let release =
        json!({"lease_id": id, "token": g.body["token"], "outcome": "succeeded"}).to_string();
    // Another principal, with the right lease id and token, even an operator: 403.
    for tok in ["agent-2", "operator-token"] {
        let a = call(&s.addr, "POST", "/v1/renew", Some(tok), &lref);
        assert_eq!(
            (a.status, a.body.clone()),
            (403, json!({"error": "forbidden"})),
            "{tok}"
        );
        let a = call(&s.addr, "POST", "/v1/release", Some(tok), &release);
        assert_eq!(a.status, 403, "{tok}: {a:?}");
    }
    // The owner may; the listing names it.
    assert_eq!(
        call(&s.addr, "POST", "/v1/renew", Some("agent-token"), &lref).status,
        200
    );
    let l = call(&s.addr, "GET", "/v1/leases", Some("operator-token"), "");
    assert_eq!(l.body["leases"][0]["principal"], "batch", "{l:?}");
    assert_eq!(
        call(
            &s.addr,
            "POST",
            "/v1/release",
            Some("agent-token"),
            &release
        )
        .status,
        200
    );
}

#[test]
fn the_listing_is_paged_with_limit_and_after() {
    let s = Serve::start(&["--listen", "127.0.0.1:0"]);
    for i in 0..25 {
        let body = format!(r#"{{"task":"p-{i:02}","holder":"h","ttl_ms":60000}}"#);
        assert_eq!(
            call(&s.addr, "POST", "/v1/acquire", None, &body).status,
            200
        );
    }
    let mut seen = Vec::new();
    let mut path = "/v1/leases?limit=10".to_string();
    for _ in 0..10 {
        let a = call(&s.addr, "GET", &path, None, "");
        assert_eq!(a.status, 200, "{a:?}");
        let page = a.body["leases"].as_array().unwrap();
        assert!(page.len() <= 10);
        seen.extend(page.iter().map(|l| l["task"].as_str().unwrap().to_string()));
        match a.body["next_after"].as_str() {
            Some(next) => path = format!("/v1/leases?limit=10&after={next}"),
            None => break,
        }
    }
    let want: Vec<String> = (0..25).map(|i| format!("p-{i:02}")).collect();
    assert_eq!(seen, want);
    assert_eq!(
        call(&s.addr, "GET", "/v1/leases?limit=0", None, "").status,
        400
    );
    assert_eq!(
        call(&s.addr, "GET", "/v1/leases?color=red", None, "").status,
        400
    );
}

#[test]
fn max_leases_in_the_auth_file_caps_a_principal_at_429() {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "{}max_leases = 2\n",
        agent_principal("small", "small-token")
    );
    let auth = roles_file(dir.path(), &extra);
    let s = Serve::with_auth_file(&auth);
    let acq = |task: &str, tok: &str| {
        let body = format!(r#"{{"task":"{task}","holder":"h","ttl_ms":60000}}"#);
        call(&s.addr, "POST", "/v1/acquire", Some(tok), &body)
    };
    assert_eq!(acq("c-1", "small-token").status, 200);
    assert_eq!(acq("c-2", "small-token").status, 200);
    let a = acq("c-3", "small-token");
    assert_eq!(a.status, 429, "{a:?}");
    // Another principal is not affected.
    assert_eq!(acq("nightly-c", "agent-token").status, 200);
}
