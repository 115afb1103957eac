//! The client side of the trust contract over HTTP(S): TLS roots and host
//! names, TLS/plain mismatches, 401/403, loose credential files, and secrets
//! kept out of the job's environment and the logs. Against a TLS server in
//! the test process (support/tls.rs) and the scripted fake authority.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::tls::{Pki, TlsServer};
use crate::support::*;

const LIMIT: Duration = Duration::from_secs(30);

/// A job that proves it ran by creating `marker`.
fn touch(c: &mut Command, marker: &std::path::Path) {
    c.arg("--").arg("touch").arg(marker);
}

fn server(pki: &Pki, client_ca: bool) -> TlsServer {
    TlsServer::start(
        &pki.path("server.pem"),
        &pki.path("server.key"),
        client_ca.then(|| pki.path("ca.pem")).as_deref(),
    )
}

/// Runs a command that must exit 125 before its job starts; returns stderr.
fn refused(mut c: Command, marker: &std::path::Path) -> String {
    touch(&mut c, marker);
    let f = run_agent(c, LIMIT);
    assert_eq!(f.status.code(), Some(125), "stderr: {}", f.stderr);
    assert!(!marker.exists(), "the job ran: {}", f.stderr);
    f.stderr
}

#[test]
fn certificates_the_agent_cannot_trust_exit_125_naming_certificate() {
    let pki = Pki::new();
    let marker = pki.path("ran");
    let good = server(&pki, false);
    // Unknown CA: the system's roots do not include the test CA.
    let e = refused(agent(&good.https_url(), "t"), &marker);
    assert!(e.contains("certificate"), "{e}");
    // A CA file of another CA.
    let mut c = agent(&good.https_url(), "t");
    c.arg("--ca-file").arg(pki.path("other-ca.pem"));
    let e = refused(c, &marker);
    assert!(e.contains("certificate"), "{e}");
    // The right CA, but the certificate names another host.
    let wrong = TlsServer::start(
        &pki.path("wrong-name.pem"),
        &pki.path("wrong-name.key"),
        None,
    );
    let mut c = agent(&wrong.https_url(), "t");
    c.arg("--ca-file").arg(pki.path("ca.pem"));
    let e = refused(c, &marker);
    assert!(e.contains("certificate"), "{e}");
    assert!(good.seen().is_empty() && wrong.seen().is_empty());
    // With the right CA the same server grants.
    let mut c = agent(&good.https_url(), "t");
    c.arg("--ca-file").arg(pki.path("ca.pem"));
    touch(&mut c, &marker);
    let f = run_agent(c, LIMIT);
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert!(marker.exists());
}

#[test]
fn tls_and_plain_mismatches_exit_125_promptly_naming_tls() {
    let pki = Pki::new();
    let marker = pki.path("ran");
    let tls = server(&pki, false);
    let plain = FakeAuthority::start();
    let start = Instant::now();
    // Plain HTTP to the TLS port.
    let e = refused(
        agent(&format!("http://127.0.0.1:{}", tls.port), "t"),
        &marker,
    );
    assert!(e.contains("TLS") && e.contains("https://"), "{e}");
    // TLS to the plain port.
    let mut c = agent(&format!("https://{}", plain.addr), "t");
    c.arg("--ca-file").arg(pki.path("ca.pem"));
    let e = refused(c, &marker);
    assert!(e.contains("TLS"), "{e}");
    // Never a hang: both within the acquire timeout (10 s) with room to spare.
    assert!(
        start.elapsed() < Duration::from_secs(25),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn unauthenticated_and_forbidden_at_acquire_exit_125() {
    let fake = FakeAuthority::start();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    fake.set_acquire(Reply::Raw(401, r#"{"error":"unauthenticated"}"#.into()));
    let e = refused(agent(&fake.url(), "t"), &marker);
    assert!(e.contains("unauthenticated"), "{e}");
    fake.set_acquire(Reply::Raw(403, r#"{"error":"forbidden"}"#.into()));
    let e = refused(agent(&fake.url(), "t"), &marker);
    assert!(e.contains("forbidden"), "{e}");
}

#[test]
fn forbidden_during_renewal_is_transient_and_logged_as_an_error() {
    let fake = FakeAuthority::start();
    fake.script(
        "/v1/renew",
        vec![
            Reply::Raw(403, r#"{"error":"forbidden"}"#.into()),
            Reply::Raw(401, r#"{"error":"unauthenticated"}"#.into()),
        ],
    );
    let mut c = agent(&fake.url(), "t");
    c.args(["--ttl", "6s", "--heartbeat", "500ms", "--", "sleep", "3"]);
    let f = run_agent(c, LIMIT);
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert!(
        f.stderr
            .lines()
            .any(|l| l.contains("leaseagent: error:") && l.contains("forbidden")),
        "{}",
        f.stderr
    );
    assert!(fake.requests_to("/v1/renew").len() >= 3);
}

#[test]
fn loose_credential_files_are_refused_naming_flag_and_file() {
    let pki = Pki::new();
    let marker = pki.path("ran");
    let fake = FakeAuthority::start();
    let token = pki.secret("token", "tok-3f9a\n", 0o644);
    let mut c = agent(&fake.url(), "t");
    c.arg("--auth-token-file").arg(&token);
    let e = refused(c, &marker);
    assert!(
        e.contains("--auth-token-file") && e.contains(&token.display().to_string()),
        "{e}"
    );
    assert!(!e.contains("tok-3f9a"), "{e}");
    // The same through the environment.
    let mut c = agent(&fake.url(), "t");
    c.env("LEASEAGENT_AUTH_TOKEN_FILE", &token);
    let e = refused(c, &marker);
    assert!(e.contains("--auth-token-file"), "{e}");
    // A group-readable client key.
    let key = pki.path("client.key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    let mut c = agent(&fake.url(), "t");
    c.arg("--client-cert")
        .arg(pki.path("client.pem"))
        .arg("--client-key")
        .arg(&key);
    let e = refused(c, &marker);
    assert!(
        e.contains("--client-key") && e.contains("client.key"),
        "{e}"
    );
    // An etcd password file readable by others.
    let pw = pki.secret("pw", "pw-77\n", 0o604);
    let mut c = agent("etcd://127.0.0.1:1", "t");
    c.args(["--etcd-user", "u", "--etcd-password-file"])
        .arg(&pw);
    let e = refused(c, &marker);
    assert!(
        e.contains("--etcd-password-file") && e.contains("pw"),
        "{e}"
    );
    // Half a pair.
    let mut c = agent(&fake.url(), "t");
    c.arg("--client-cert").arg(pki.path("client.pem"));
    let e = refused(c, &marker);
    assert!(e.contains("--client-key"), "{e}");
    assert!(fake.requests().is_empty());
}

#[test]
fn mutual_tls_and_token_work_and_no_secret_reaches_the_job_or_the_log() {
    let pki = Pki::new();
    let tls = server(&pki, true);
    let token = pki.secret("token", "  tok-5e1d77  \nignored\n", 0o600);
    let env_dump = pki.path("env");
    let mut c = Command::new(bin());
    c.env(
        "LEASEAGENT_AUTHORITY",
        format!("https://someone:hunter2@127.0.0.1:{}", tls.port),
    )
    .env("LEASEAGENT_CA_FILE", pki.path("ca.pem"))
    .env("LEASEAGENT_CLIENT_CERT", pki.path("client.pem"))
    .env("LEASEAGENT_CLIENT_KEY", pki.path("client.key"))
    .env("LEASEAGENT_AUTH_TOKEN_FILE", &token)
    .env("RUST_LOG", "trace")
    .args(["--task", "t", "--"])
    .arg("sh")
    .arg("-c")
    .arg(format!("env > {}", env_dump.display()));
    let f = run_agent(c, LIMIT);
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let seen = tls.seen();
    let acquire = seen
        .iter()
        .find(|s| s.path == "/v1/acquire")
        .expect("acquire seen");
    assert_eq!(acquire.authorization.as_deref(), Some("Bearer tok-5e1d77"));
    assert!(acquire.client_cert, "no client certificate presented");
    assert!(seen.iter().any(|s| s.path == "/v1/release"));
    let env = std::fs::read_to_string(&env_dump).unwrap();
    for secret in ["tok-5e1d77", "hunter2", "someone"] {
        assert!(!env.contains(secret), "{secret} in the job's env:\n{env}");
        assert!(
            !f.stderr.contains(secret),
            "{secret} in the log:\n{}",
            f.stderr
        );
    }
    for var in [
        "LEASEAGENT_CA_FILE",
        "LEASEAGENT_CLIENT_CERT",
        "LEASEAGENT_CLIENT_KEY",
        "LEASEAGENT_AUTH_TOKEN_FILE",
    ] {
        assert!(!env.contains(&format!("{var}=")), "{var} in the job's env");
    }
    let authority = format!("https://127.0.0.1:{}", tls.port);
    assert!(
        env.lines()
            .any(|l| l == format!("LEASE_AUTHORITY={authority}")),
        "{env}"
    );
}

#[test]
fn operator_commands_take_the_trust_flags() {
    let pki = Pki::new();
    let tls = server(&pki, false);
    let token = pki.secret("token", "op-token-1\n", 0o600);
    let out = Command::new(bin())
        .args([
            "leases",
            "--json",
            "--authority",
            &tls.https_url(),
            "--ca-file",
        ])
        .arg(pki.path("ca.pem"))
        .arg("--auth-token-file")
        .arg(&token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let seen = tls.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].authorization.as_deref(), Some("Bearer op-token-1"));
    // Without the CA: a certificate error, exit 125.
    let out = Command::new(bin())
        .args(["revoke", "--authority", &tls.https_url(), "t"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("certificate"));
    // A loose token file: refused before any request.
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = Command::new(bin())
        .args([
            "clear",
            "--authority",
            &tls.https_url(),
            "--auth-token-file",
        ])
        .arg(&token)
        .arg("t")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--auth-token-file"));
    assert_eq!(tls.seen().len(), 1);
}
