//! The one HTTP transport of every lease client (protocol v1, its operator
//! calls, and etcd's JSON gateway).
//!
//! What it guarantees, once for all of them:
//! - every request is bounded by the timeout it is given (ureq's global
//!   timeout: connect, send, and reading the whole answer);
//! - an answer body is read up to a cap and never further, so a hostile or
//!   broken server cannot make the agent buffer without bound;
//! - HTTP statuses are returned, not turned into errors: each client
//!   classifies them by its own protocol's rules;
//! - no proxy from the environment stands between an agent and its lease
//!   authority (a proxy's own timeouts and buffering would void the first
//!   two points);
//! - no redirect is ever followed: a 3xx is returned as the answer (and is
//!   no grant), so an authority cannot send the agent to another host.
//! - TLS settings and credentials come from one [`ClientTrust`], and a
//!   failure that is about trust (the certificate, a TLS handshake with
//!   something that does not speak TLS, or plain HTTP answered in TLS) is
//!   told apart from other failures ([`Failure::trust`]), so that acquire can
//!   exit 125 naming the cause instead of calling it "unreachable". That
//!   is read from rustls's own error, never from an error message's words.

use std::time::Duration;

use super::trust::ClientTrust;

/// The protocol's body size limit.
pub const BODY_LIMIT: u64 = 64 * 1024;

/// Each connection's read and write buffers (ureq's default is 128 KiB
/// each, twice over with TLS: 512 KiB of zeroed, resident memory per
/// connection in an agent whose whole budget is 4 MiB). Protocol requests
/// and answer heads are a few hundred bytes; bodies stream through the
/// buffer, so its size bounds nothing but memory.
const IO_BUFFER: usize = 16 * 1024;

/// The longest answer head (status line and headers) taken; longer is a
/// failure, like an over-long body. Below [`IO_BUFFER`], so that a head
/// that does not fit is reported as too large, not as a stalled read.
const HEAD_LIMIT: usize = 8 * 1024;

/// A connection-pooling client configured as above.
///
/// Resolution and connections are [`super::netpath`]'s: no thread per
/// request, renewal packets marked, a lost SYN retried early. One
/// connection is kept alive (renewals are one at a time) for up to ten
/// minutes, so a heartbeat up to that long reuses it.
pub fn agent(trust: &ClientTrust) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .tls_config(trust.tls().clone())
        .http_status_as_error(false)
        .proxy(None)
        // Never follow a redirect: an authority's 3xx is its answer.
        .max_redirects(0)
        .max_redirects_will_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .max_idle_connections_per_host(1)
        .max_idle_age(Duration::from_secs(600))
        .user_agent(concat!("leaseagent/", env!("CARGO_PKG_VERSION")))
        .input_buffer_size(IO_BUFFER)
        .output_buffer_size(IO_BUFFER)
        .max_response_header_size(HEAD_LIMIT)
        .build();
    super::netpath::agent(config)
}

pub use super::error::{Failure, FailureKind, TrustCause};

/// One request: `GET` when `json_body` is `None`, else `POST` of that JSON,
/// with `authorization` as the `Authorization` header if given.
/// Returns the status and the body (read up to `limit`), or what failed.
pub fn call(
    agent: &ureq::Agent,
    url: &str,
    json_body: Option<&[u8]>,
    authorization: Option<&str>,
    timeout: Duration,
    limit: u64,
) -> Result<(u16, Vec<u8>), Failure> {
    let timeout = Some(timeout.max(Duration::from_millis(1)));
    // Marked sensitive: `http`'s Debug then prints `Sensitive`, never the
    // credential, wherever the request is formatted.
    let authorization = match authorization.map(ureq::http::HeaderValue::from_str) {
        None => None,
        Some(Ok(mut v)) => {
            v.set_sensitive(true);
            Some(v)
        }
        Some(Err(_)) => {
            return Err(Failure::new(
                FailureKind::Encode,
                format!("{url}: the credential is not a valid header value"),
            ));
        }
    };
    let sent = match json_body {
        None => {
            let mut r = agent.get(url).config().timeout_global(timeout).build();
            if let Some(a) = authorization {
                r = r.header("authorization", a);
            }
            r.call()
        }
        Some(body) => {
            let mut r = agent
                .post(url)
                .config()
                .timeout_global(timeout)
                .build()
                .header("content-type", "application/json");
            if let Some(a) = authorization {
                r = r.header("authorization", a);
            }
            r.send(body)
        }
    };
    let mut resp = sent.map_err(|e| describe(url, e))?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(limit)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => Failure::new(
                FailureKind::TooLarge,
                format!("{url}: answer body over {limit} bytes"),
            ),
            e => describe(url, e),
        })?;
    Ok((status, body))
}

/// The trust cause of a call that gave no answer, worded for the user:
/// the one the transport named, or, for a failure without a named cause
/// that did not time out, the one a probe finds (at most a second): a
/// server that asks for a client certificate we did not give (the
/// handshake then fails as a reset or a broken pipe), or a port of the
/// other scheme (plain HTTP to a TLS port, or the reverse). `None`: not a
/// trust problem as far as can be told. The message starts with the cause.
pub fn trust_failure(base: &str, f: &Failure, timeout: Duration) -> Option<Failure> {
    if let Some(cause) = f.trust() {
        return Some(Failure::new(f.kind, format!("{cause}: {}", f.message)));
    }
    if !matches!(f.kind, FailureKind::Connect | FailureKind::Other) {
        return None;
    }
    let probe = timeout.min(Duration::from_secs(1));
    if client_certificate_required(base, probe) {
        return Some(Failure::new(
            FailureKind::Trust(TrustCause::Certificate),
            format!(
                "certificate: {} (the authority requires a client certificate it accepts: see --client-cert, --client-key)",
                f.message
            ),
        ));
    }
    if other_scheme_answers(base, probe) {
        let hint = if base.starts_with("https://") {
            "the port speaks plain HTTP, not TLS: use http://"
        } else {
            "the port speaks TLS: use https://"
        };
        return Some(Failure::new(
            FailureKind::Trust(TrustCause::Tls),
            format!("TLS: {} ({hint})", f.message),
        ));
    }
    None
}

/// Whether the server of `url` answers in the other scheme: for an
/// `http://` URL, a TLS handshake (certificate not checked) and any HTTP
/// answer; for an `https://` URL, any plain HTTP answer. Asked only after a
/// call failed at acquire without a named cause, so that "plain HTTP to a
/// TLS port" and the reverse are reported as such instead of
/// "unreachable". Bounded by `timeout`.
pub fn other_scheme_answers(url: &str, timeout: Duration) -> bool {
    let (other, rest) = if let Some(rest) = url.strip_prefix("http://") {
        ("https", rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        ("http", rest)
    } else {
        return false;
    };
    let host = rest.split('/').next().unwrap_or(rest);
    let probe: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .disable_verification(true)
                .build(),
        )
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(timeout.max(Duration::from_millis(1))))
        .build()
        .into();
    match probe.get(&format!("{other}://{host}/healthz")).call() {
        Ok(_) => true,
        // A TLS alert (e.g. "certificate required") is a TLS server talking.
        Err(e) => {
            other == "https" && matches!(rustls_error(&e), Some(rustls::Error::AlertReceived(_)))
        }
    }
}

/// Whether the TLS server of the `https://` `url` refuses a client that
/// presents no certificate (mutual TLS). Asked only after a call at acquire
/// failed without a named cause: under TLS 1.3 the server's refusal comes
/// after the client's handshake finished, and a client that already wrote
/// its request often sees only a broken pipe. This probe finishes a
/// handshake, writes nothing and reads: the server's alert arrives intact.
/// The server's certificate is not checked (that would have failed with a
/// named cause already). Bounded by `timeout` (connect and read).
pub fn client_certificate_required(url: &str, timeout: Duration) -> bool {
    use std::io::Read;
    use std::net::ToSocketAddrs;
    let Some(rest) = url.strip_prefix("https://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    // `host[:port]` or `[v6][:port]`.
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, p)) => (h, p.strip_prefix(':')),
            None => return false,
        },
        None => match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    let Ok(port) = port.unwrap_or("443").parse::<u16>() else {
        return false;
    };
    let target = (host, port);
    let Some(addr) = target.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return false;
    };
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_string()) else {
        return false;
    };
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let Ok(builder) = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
    else {
        return false;
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    let Ok(conn) = rustls::ClientConnection::new(std::sync::Arc::new(config), name) else {
        return false;
    };
    let timeout = timeout.max(Duration::from_millis(1));
    let Ok(sock) = std::net::TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    if sock.set_read_timeout(Some(timeout)).is_err()
        || sock.set_write_timeout(Some(timeout)).is_err()
    {
        return false;
    }
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let mut byte = [0u8; 1];
    match tls.read_exact(&mut byte) {
        Err(e) => io_rustls_error(&e).and_then(tls_cause) == Some(TrustCause::Certificate),
        Ok(()) => false,
    }
}

/// Accepts any server certificate: only for [`client_certificate_required`],
/// which sends nothing over the connection.
#[derive(Debug)]
struct AnyServer(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn describe(url: &str, e: ureq::Error) -> Failure {
    let detail = match &e {
        ureq::Error::Timeout(_) => "timed out".to_string(),
        ureq::Error::Io(io) => io.to_string(),
        e => e.to_string(),
    };
    // Classified on the error alone: the URL may contain any word. Plain
    // `http://` failures are never classified here: "plain HTTP to a TLS
    // port" is found by [`other_scheme_answers`].
    let tls = url.starts_with("https://");
    let rustls = if tls { rustls_error(&e) } else { None };
    let trust = rustls.and_then(tls_cause);
    let message = match (trust, rustls) {
        (Some(TrustCause::Tls), _) => format!(
            "{url}: {detail} (TLS handshake failed: does this port speak TLS? use http:// for a plain port)"
        ),
        // An alert the server sent is about our side: no client
        // certificate, or one it does not accept.
        (Some(_), Some(rustls::Error::AlertReceived(_))) => format!(
            "{url}: {detail} (the authority requires a client certificate it accepts: see --client-cert, --client-key)"
        ),
        (Some(_), _) => format!("{url}: {detail} (certificate not accepted; see --ca-file)"),
        (None, _) => format!("{url}: {detail}"),
    };
    let kind = match (&e, trust) {
        (_, Some(cause)) => FailureKind::Trust(cause),
        (ureq::Error::Timeout(_), _) => FailureKind::Timeout,
        (ureq::Error::HostNotFound | ureq::Error::ConnectionFailed, _) => FailureKind::Connect,
        (ureq::Error::Io(io), _) if is_connect(io.kind()) => FailureKind::Connect,
        (ureq::Error::Io(io), _) if io.kind() == std::io::ErrorKind::TimedOut => {
            FailureKind::Timeout
        }
        _ => FailureKind::Other,
    };
    Failure { kind, message }
}

/// io errors that mean "no connection to talk over".
fn is_connect(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | AddrNotAvailable
            | BrokenPipe
            | HostUnreachable
            | NetworkUnreachable
    )
}

/// The rustls error behind a failed call, if TLS failed: ureq passes it on
/// as its own variant, or (from inside a TLS stream) inside an io error.
fn rustls_error(e: &ureq::Error) -> Option<&rustls::Error> {
    match e {
        ureq::Error::Rustls(r) => Some(r),
        ureq::Error::Io(io) => io_rustls_error(io),
        _ => None,
    }
}

/// The rustls error inside an io error from a TLS stream.
fn io_rustls_error(io: &std::io::Error) -> Option<&rustls::Error> {
    io.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Whether a TLS failure is about trust, and which: the certificate (the
/// peer's not accepted, ours refused or missing: the alerts about
/// certificates) or TLS itself (the peer does not speak TLS, or not the
/// TLS we speak: a corrupt or unexpected record, an incompatible peer, a
/// handshake the peer ended). Other TLS failures (a misbehaving peer, a
/// decryption error, an alert about something else) are not trust problems.
fn tls_cause(e: &rustls::Error) -> Option<TrustCause> {
    use rustls::AlertDescription as A;
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(_) | E::InvalidCertRevocationList(_) | E::NoCertificatesPresented => {
            Some(TrustCause::Certificate)
        }
        E::AlertReceived(
            A::NoCertificate
            | A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::CertificateUnobtainable
            | A::BadCertificateStatusResponse
            | A::BadCertificateHashValue
            | A::CertificateRequired,
        ) => Some(TrustCause::Certificate),
        E::AlertReceived(A::HandshakeFailure)
        | E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. }
        | E::PeerIncompatible(_)
        | E::HandshakeNotComplete => Some(TrustCause::Tls),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn plain() -> ureq::Agent {
        agent(&ClientTrust::none())
    }

    /// A TLS server on loopback that requires a client certificate and
    /// ends every handshake without one; it serves `conns` connections.
    fn mtls_server(conns: usize) -> u16 {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        let cert = CertificateDer::from(ck.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der()));
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let config = std::sync::Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_client_cert_verifier(verifier)
                .with_single_cert(vec![cert], key)
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for sock in listener.incoming().take(conns) {
                let mut sock = sock.unwrap();
                sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut conn = rustls::ServerConnection::new(config.clone()).unwrap();
                while conn.is_handshaking() {
                    if conn.complete_io(&mut sock).is_err() {
                        break;
                    }
                }
            }
        });
        port
    }

    #[test]
    fn an_unnamed_failure_against_a_server_wanting_a_client_certificate_is_named() {
        // Under TLS 1.3 a server's refusal of a missing client certificate
        // often reaches the client as a broken pipe or a reset: the probe
        // names it, for the agent and the operator commands alike.
        let port = mtls_server(1);
        let url = format!("https://127.0.0.1:{port}");
        let f = Failure::new(
            FailureKind::Connect,
            format!("{url}/v1/leases: Broken pipe (os error 32)"),
        );
        let named = trust_failure(&url, &f, Duration::from_secs(5)).expect("named");
        assert_eq!(named.trust(), Some(TrustCause::Certificate));
        let named = named.message;
        assert!(named.starts_with("certificate: "), "{named}");
        assert!(named.contains("--client-cert"), "{named}");
        // A timeout is not probed (it would only wait again), and a cause
        // the transport named is kept as it is.
        let timeout = Failure {
            kind: FailureKind::Timeout,
            ..f.clone()
        };
        assert_eq!(trust_failure(&url, &timeout, Duration::from_secs(5)), None);
        let known = Failure::new(FailureKind::Trust(TrustCause::Certificate), "m");
        assert_eq!(
            trust_failure(&url, &known, Duration::from_secs(5)).map(|f| f.message),
            Some("certificate: m".to_string())
        );
    }

    #[test]
    fn an_unnamed_failure_against_a_closed_port_stays_unnamed() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("https://127.0.0.1:{port}");
        let f = Failure::new(
            FailureKind::Connect,
            format!("{url}/v1/leases: Connection refused (os error 111)"),
        );
        assert_eq!(trust_failure(&url, &f, Duration::from_secs(2)), None);
    }

    #[test]
    fn a_refused_connection_is_connect() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}/v1/renew");
        let f = call(
            &plain(),
            &url,
            Some(b"{}"),
            None,
            Duration::from_secs(5),
            1024,
        )
        .unwrap_err();
        assert_eq!(f.kind, FailureKind::Connect, "{f}");
    }

    #[test]
    fn a_silent_server_is_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/renew", l.local_addr().unwrap());
        // Accepts and never answers.
        let hold = std::thread::spawn(move || l.accept().map(|(s, _)| s));
        let f = call(
            &plain(),
            &url,
            Some(b"{}"),
            None,
            Duration::from_millis(300),
            1024,
        )
        .unwrap_err();
        assert_eq!(f.kind, FailureKind::Timeout, "{f}");
        drop(hold);
    }

    #[test]
    fn a_body_over_the_cap_is_too_large() {
        let mut answer = b"HTTP/1.1 200 OK\r\ncontent-length: 10000\r\n\r\n".to_vec();
        answer.extend_from_slice(&[b'x'; 10_000]);
        let url = answer_once(answer);
        let f = call(&plain(), &url, None, None, Duration::from_secs(5), 1024).unwrap_err();
        assert_eq!(f.kind, FailureKind::TooLarge, "{f}");
    }

    /// Serves one connection: reads the request, writes `answer`.
    fn answer_once(answer: Vec<u8>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/leases", l.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(&answer);
        });
        url
    }

    #[test]
    fn a_body_at_the_cap_streams_whole_through_the_small_buffers() {
        // 64 KiB: four times the connection's read buffer.
        let body: Vec<u8> = (0..BODY_LIMIT).map(|i| b'a' + (i % 26) as u8).collect();
        let mut answer =
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
        answer.extend_from_slice(&body);
        let url = answer_once(answer);
        let (status, got) = call(
            &plain(),
            &url,
            None,
            None,
            Duration::from_secs(5),
            BODY_LIMIT,
        )
        .unwrap();
        assert_eq!(status, 200);
        assert_eq!(got, body);
    }

    #[test]
    fn an_answer_head_over_the_limit_is_refused_by_name() {
        let filler = "x".repeat(IO_BUFFER * 2);
        let answer =
            format!("HTTP/1.1 200 OK\r\nx-filler: {filler}\r\ncontent-length: 2\r\n\r\n{{}}");
        let url = answer_once(answer.into_bytes());
        let f = call(&plain(), &url, None, None, Duration::from_secs(5), 1024).unwrap_err();
        assert!(f.message.contains(&HEAD_LIMIT.to_string()), "{f}");
        assert_eq!(f.kind, FailureKind::Other, "{f}");
    }

    #[test]
    fn trust_causes_come_from_the_error_not_the_url() {
        use rustls::{AlertDescription, CertificateError, InvalidMessage};
        let io = |e: rustls::Error| {
            ureq::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        };
        let url = "https://h:1/v1/acquire";
        let f = describe(
            url,
            io(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer,
            )),
        );
        assert_eq!(f.trust(), Some(TrustCause::Certificate));
        assert_eq!(
            f.message,
            "https://h:1/v1/acquire: invalid peer certificate: UnknownIssuer (certificate not accepted; see --ca-file)"
        );
        let f = describe(
            url,
            io(rustls::Error::InvalidMessage(
                InvalidMessage::InvalidContentType,
            )),
        );
        assert_eq!(f.trust(), Some(TrustCause::Tls));
        assert!(f.message.ends_with("use http:// for a plain port)"), "{f}");
        let f = describe(
            url,
            io(rustls::Error::AlertReceived(
                AlertDescription::CertificateRequired,
            )),
        );
        assert_eq!(f.trust(), Some(TrustCause::Certificate));
        assert!(f.message.contains("requires a client certificate"), "{f}");
        // Words alone name nothing: an io error that says "certificate"
        // is not a TLS failure, and a plain http:// URL is never classified.
        let words = std::io::Error::other("certificate handshake corrupt message");
        assert_eq!(describe(url, ureq::Error::Io(words)).trust(), None);
        let plain = describe(
            "http://h:1/v1/acquire",
            io(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer,
            )),
        );
        assert_eq!(plain.trust(), None);
        let f = describe(
            "https://certificate.example:1/v1/acquire",
            ureq::Error::Timeout(ureq::Timeout::Global),
        );
        assert_eq!(f.trust(), None);
        assert_eq!(f.kind, FailureKind::Timeout);
        assert!(f.message.ends_with("timed out"), "{}", f.message);
    }
}
