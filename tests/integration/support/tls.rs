//! TLS material and a TLS server for the client trust tests.
//!
//! [`Pki`] makes a CA, server certificates (right and wrong host name), a
//! client certificate and an unrelated CA with the `openssl` CLI (a missing
//! `openssl` is a test failure). [`TlsServer`] is a small lease protocol v1
//! authority over rustls in the test process: it grants every acquire and
//! records, per request, the path, the `Authorization` header and whether a
//! client certificate was presented.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Certificates and keys in a temp dir. Key files are mode 0600.
pub struct Pki {
    pub dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    super::run_ok(
        Command::new("openssl").current_dir(dir).args(args),
        "run openssl (apt-get install openssl)",
        format_args!("openssl {args:?}"),
    );
}

/// `openssl req` options for a new P-256 key without a passphrase.
const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        for (ca, cn) in [("ca", "leaseagent test CA"), ("other-ca", "unrelated CA")] {
            let mut a = vec!["req", "-x509"];
            a.extend(EC);
            let (key, pem, subj) = (
                format!("{ca}.key"),
                format!("{ca}.pem"),
                format!("/CN={cn}"),
            );
            a.extend(["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj]);
            openssl(d, &a);
        }
        let pki = Pki { dir };
        let leaf = |name: &str, cn: &str, san: &str, usage: &str| pki.issue(name, cn, san, usage);
        leaf(
            "server",
            "localhost",
            "IP:127.0.0.1,DNS:localhost",
            "serverAuth,clientAuth",
        );
        leaf(
            "wrong-name",
            "other.example",
            "DNS:other.example",
            "serverAuth",
        );
        leaf("client", "", "DNS:agent-1", "clientAuth");
        pki
    }

    /// Issues `NAME.pem` and `NAME.key` (0600), signed by `ca.pem`, with
    /// common name `cn` (none when empty), subjectAltName `san` (none when
    /// empty, e.g. `IP:10.0.0.1,DNS:x`) and extendedKeyUsage `usage`.
    pub fn issue(&self, name: &str, cn: &str, san: &str, usage: &str) {
        let d = self.dir.path();
        let mut a = vec!["req"];
        a.extend(EC);
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        // An empty `cn` gives a subject without a Common Name (etcd's
        // gateway refuses client certificates that carry one).
        let subj = if cn.is_empty() {
            "/O=leaseagent tests".to_string()
        } else {
            format!("/CN={cn}")
        };
        a.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(d, &a);
        let ext = format!("{name}.ext");
        let mut text = format!("basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n");
        if !san.is_empty() {
            text.push_str(&format!("subjectAltName={san}\n"));
        }
        std::fs::write(d.join(&ext), text).expect("ext file");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
        std::fs::set_permissions(d.join(&key), std::fs::Permissions::from_mode(0o600))
            .expect("chmod key");
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a secret file with `mode`.
    pub fn secret(&self, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write secret");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        p
    }
}

/// One request as the TLS server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub authorization: Option<String>,
    pub client_cert: bool,
}

/// A TLS lease protocol v1 authority on 127.0.0.1 that grants everything.
pub struct TlsServer {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl TlsServer {
    /// Serves `cert`/`key`; with `client_ca`, asks for (but does not
    /// require) a client certificate signed by it.
    pub fn start(cert: &Path, key: &Path, client_ca: Option<&Path>) -> TlsServer {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("server cert")
            .map(|c| c.expect("cert"))
            .collect();
        let key = PrivateKeyDer::from_pem_file(key).expect("server key");
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("tls versions");
        let config = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca).expect("client ca") {
                    roots.add(c.expect("ca cert")).expect("add ca");
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .allow_unauthenticated()
                .build()
                .expect("client verifier");
                builder
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(certs, key)
            }
            None => builder.with_no_client_auth().with_single_cert(certs, key),
        }
        .expect("server config");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (config, seen) = (config.clone(), seen2.clone());
                std::thread::spawn(move || serve(conn, config, seen));
            }
        });
        TlsServer { port, seen, stop }
    }

    pub fn https_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(conn: TcpStream, config: Arc<rustls::ServerConfig>, seen: Arc<Mutex<Vec<Seen>>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(tls) = rustls::ServerConnection::new(config) else {
        return;
    };
    let stream = rustls::StreamOwned::new(tls, conn);
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        match reader.read_line(&mut request_line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_string();
        let (mut length, mut authorization) = (0usize, None);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "authorization" => authorization = Some(value.trim().to_string()),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let client_cert = reader
            .get_ref()
            .conn
            .peer_certificates()
            .is_some_and(|c| !c.is_empty());
        seen.lock().unwrap().push(Seen {
            path: path.clone(),
            authorization,
            client_cert,
        });
        let answer = match path.as_str() {
            "/v1/acquire" => r#"{"lease_id":"tls-lease","token":7,"ttl_ms":30000}"#,
            "/v1/renew" => r#"{"ttl_ms":30000}"#,
            "/v1/leases" => r#"{"leases":[]}"#,
            _ => "{}",
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        let stream = reader.get_mut();
        if stream.write_all(response.as_bytes()).is_err() || stream.flush().is_err() {
            return;
        }
    }
}
