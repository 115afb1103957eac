//! A legitimate client's latency while one address floods `leaseagent
//! serve` with connections (not a test; run it yourself):
//!
//!     cargo bench --bench serve_flood                    # plain HTTP
//!     FLOOD_TLS=1 cargo bench --bench serve_flood        # HTTPS
//!     LEASEAGENT_BIN=/path/to/other/leaseagent cargo bench --bench serve_flood
//!
//! Serve runs with `--max-connections 300 --max-connections-per-peer 100`.
//! A flood thread opens connections from 127.0.0.2 as fast as it can and
//! holds up to 2,000 of them without sending a byte (so, over TLS, without
//! starting a handshake). Meanwhile 127.0.0.3 makes FLOOD_REQUESTS acquires
//! (default 300), each on a fresh connection (TLS handshake included), one
//! after the other. The figures: how many were refused (503, or closed
//! unanswered) and the latency of the answered ones (p50, p99, max),
//! measured by the client from connect to the whole answer. The same
//! requests without the flood are the baseline.
//!
//! Everything runs on one machine, flood included, so the flood's CPU use
//! is in the figures.

use std::io::{Read, Write};
use std::net::SocketAddr;

use leaseagent_testkit::{Flood, connect_from};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn bin() -> PathBuf {
    leaseagent_testkit::bench_bin(env!("CARGO_BIN_EXE_leaseagent"))
}

/// One request on a fresh connection from `ip`: the status (0: closed
/// without an answer or failed).
fn one(
    ip: [u8; 4],
    server: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    raw: &[u8],
) -> u16 {
    let Ok(sock) = connect_from(ip, server) else {
        return 0;
    };
    let mut out = Vec::new();
    match tls {
        Some(cfg) => {
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
            let mut t = rustls::StreamOwned::new(conn, sock);
            if t.write_all(raw).is_err() {
                return 0;
            }
            let _ = t.read_to_end(&mut out);
        }
        None => {
            let mut sock = sock;
            if sock.write_all(raw).is_err() {
                return 0;
            }
            let _ = sock.read_to_end(&mut out);
        }
    }
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Runs the legitimate client's requests; prints its figures.
fn measure(
    label: &str,
    server: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    n: usize,
    round: usize,
) {
    let mut ms = Vec::new();
    let mut refused = 0;
    for i in 0..n {
        let body = format!(r#"{{"task":"bench-{round}-{i}","holder":"h","ttl_ms":60000}}"#);
        let raw = format!(
            "POST /v1/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let t = Instant::now();
        let st = one([127, 0, 0, 3], server, tls, raw.as_bytes());
        if st == 200 {
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        } else {
            refused += 1;
        }
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "{label}: {n} acquires from 127.0.0.3, refused {refused}; answered p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        leaseagent_testkit::percentile(&ms, 0.5),
        leaseagent_testkit::percentile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN)
    );
}

fn main() {
    let tls = std::env::var("FLOOD_TLS").is_ok_and(|v| v == "1");
    let n: usize = std::env::var("FLOOD_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = [
        "serve",
        "--no-auth",
        "--listen",
        "127.0.0.1:0",
        "--max-connections",
        "300",
        "--max-connections-per-peer",
        "100",
        "--db",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(dir.path().join("flood.db").display().to_string());
    let client = tls.then(|| {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = p.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let (cert_path, key_path) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert_path, leaf.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        args.extend([
            "--tls-cert".to_string(),
            cert_path.display().to_string(),
            "--tls-key".to_string(),
            key_path.display().to_string(),
        ]);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
        )
    });
    let mut child = Command::new(bin())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !String::from_utf8_lossy(&line).contains('\n') {
        if err.read(&mut b).unwrap_or(0) == 0 {
            panic!("serve exited: {}", String::from_utf8_lossy(&line));
        }
        line.push(b[0]);
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let line = String::from_utf8_lossy(&line).to_string();
    let url = line.split_whitespace().find(|w| w.contains("://")).unwrap();
    let server: SocketAddr = url.split("://").nth(1).unwrap().parse().unwrap();
    let scheme = if tls { "HTTPS" } else { "plain HTTP" };
    println!("serve_flood ({scheme}, {})", bin().display());

    measure("no flood", server, client.as_ref(), n, 0);

    let flood = Flood::start([127, 0, 0, 2], server, 2000);
    assert!(
        flood.past(1000, Duration::from_secs(60)),
        "the flood did not start"
    );
    let t = Instant::now();
    measure("flood from 127.0.0.2", server, client.as_ref(), n, 1);
    let secs = t.elapsed().as_secs_f64();
    let opened = flood.opened();
    drop(flood);
    println!(
        "  the flood opened {opened} connections ({:.0}/s)",
        opened as f64 / secs
    );
    let _ = child.kill();
    let _ = child.wait();
}
