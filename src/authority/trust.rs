//! Client trust: what the agent and the operator commands present to an
//! authority and what they accept from it (TLS roots, client certificate,
//! bearer token, etcd login), built once from the flags.
//!
//! Why one place: every client of an authority (lease protocol v1, its
//! operator calls, etcd's gateway) goes through [`super::transport`], and the
//! rules of the trust contract must hold for all of them alike:
//! - secrets come only from files, never from argv or the environment
//!   (the environment names files, not secrets);
//! - a key, token or password file readable by group or others is refused,
//!   as ssh refuses such keys, naming the flag and the file;
//! - a secret is never logged: [`Secret`] has no `Display` and a redacted
//!   `Debug`, and no error message here includes file contents;
//! - the variables naming these files are removed from the job's
//!   environment ([`JOB_ENV_REMOVE`]), and a `user:password@` part of an
//!   authority URL is removed wherever the URL is shown ([`redact_url`]).
//!
//! Roots: `--ca-file` replaces the roots; without it the system's bundle
//! (`SSL_CERT_FILE`, else the distribution's CA bundle file) is read, and only
//! when the authority URL uses TLS. That costs one file read at start and no
//! extra crate: ureq's `platform-verifier` would add rustls-platform-verifier
//! and its dependencies to an agent that runs next to every job. Where no
//! bundle file exists, the Mozilla roots compiled into ureq
//! (`webpki-roots`) are used.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};

/// Environment variables of the trust flags; none of them reaches the job.
pub const JOB_ENV_REMOVE: &[&str] = &[
    "LEASEAGENT_CA_FILE",
    "LEASEAGENT_CLIENT_CERT",
    "LEASEAGENT_CLIENT_KEY",
    "LEASEAGENT_AUTH_TOKEN_FILE",
    "LEASEAGENT_ETCD_USER",
    "LEASEAGENT_ETCD_PASSWORD_FILE",
];

/// Where the system's CA bundle lives on the usual distributions.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Largest credential file read (a CA bundle is a few hundred KiB).
const FILE_LIMIT: u64 = 4 << 20;

/// The trust flags as given (paths, not contents), environment applied
/// (`cmd::defs::TRUST`): the run path and the operator commands alike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustFiles {
    /// `--ca-file`: PEM CAs that sign the authority's certificate.
    pub ca_file: Option<PathBuf>,
    /// `--client-cert`: PEM client certificate for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// `--client-key`: its key (mode 0600 or stricter).
    pub client_key: Option<PathBuf>,
    /// `--auth-token-file`: bearer token for `leaseagent serve`, first line.
    pub auth_token_file: Option<PathBuf>,
    /// `--etcd-user`: etcd's own login.
    pub etcd_user: Option<String>,
    /// `--etcd-password-file`: that user's password, first line.
    pub etcd_password_file: Option<PathBuf>,
}

/// A trust flag given without the one it pairs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrustPairError {
    #[error("--client-cert needs --client-key")]
    CertWithoutKey,
    #[error("--client-key needs --client-cert")]
    KeyWithoutCert,
    #[error("--etcd-user needs --etcd-password-file")]
    UserWithoutPassword,
    #[error("--etcd-password-file needs --etcd-user")]
    PasswordWithoutUser,
}

/// Why the trust the flags name could not be built. Messages name the flag
/// and the file, never a file's contents.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(transparent)]
    Pair(#[from] TrustPairError),
    #[error("--etcd-user: empty user name")]
    EmptyEtcdUser,
    #[error("{flag} {}: {problem}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        #[source]
        problem: FileProblem,
    },
}

/// What is wrong with a file a trust flag names.
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    #[error("{0}")]
    Io(#[source] std::io::Error),
    /// The path, walked from `/`, leads through a link or a directory
    /// another user controls, or not to a regular file.
    #[error("{0}")]
    Path(#[source] crate::sys::paths::PathError),
    /// A key, token or password file group or others may read.
    #[error(
        "refused: the file is readable by group or others (mode {:04o}); chmod 600 it",
        mode & 0o7777
    )]
    Loose { mode: u32 },
    #[error("no PEM certificate in the file")]
    NoCertificate,
    #[error("no PEM private key in the file")]
    NoKey,
    /// Holds where the text broke, not the bytes (they may be a secret).
    #[error("not UTF-8 text")]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("the first line is empty")]
    EmptyFirstLine,
}

impl TrustFiles {
    /// Checks that need no file: pairs given together.
    pub fn check_usage(&self) -> Result<(), TrustPairError> {
        match (&self.client_cert, &self.client_key) {
            (Some(_), None) => return Err(TrustPairError::CertWithoutKey),
            (None, Some(_)) => return Err(TrustPairError::KeyWithoutCert),
            _ => {}
        }
        match (&self.etcd_user, &self.etcd_password_file) {
            (Some(_), None) => Err(TrustPairError::UserWithoutPassword),
            (None, Some(_)) => Err(TrustPairError::PasswordWithoutUser),
            _ => Ok(()),
        }
    }
}

/// A secret read from a file. Never printed: no `Display`, redacted `Debug`.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// etcd's own login (`--etcd-user`, `--etcd-password-file`).
#[derive(Clone, Debug)]
pub struct EtcdLogin {
    pub user: String,
    pub password: Secret,
}

/// Everything a client presents and accepts, built once from [`TrustFiles`].
#[derive(Clone)]
pub struct ClientTrust {
    tls: TlsConfig,
    bearer: Option<Secret>,
    etcd: Option<EtcdLogin>,
}

impl std::fmt::Debug for ClientTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTrust")
            .field("client_cert", &self.tls.client_cert().is_some())
            .field("bearer", &self.bearer.is_some())
            .field("etcd_user", &self.etcd.as_ref().map(|l| &l.user))
            .finish()
    }
}

impl Default for ClientTrust {
    fn default() -> Self {
        ClientTrust::none()
    }
}

impl ClientTrust {
    /// No credentials; the compiled-in roots (for tests and plain URLs).
    pub fn none() -> Self {
        ClientTrust {
            tls: TlsConfig::builder().root_certs(RootCerts::WebPki).build(),
            bearer: None,
            etcd: None,
        }
    }

    /// Reads and checks every file the flags name. `uses_tls`: the authority
    /// URL is https:// or etcds:// (only then are the system's roots read).
    /// The error names the flag and the file, never a file's contents.
    pub fn load(files: &TrustFiles, uses_tls: bool) -> Result<Arc<ClientTrust>, TrustError> {
        files.check_usage()?;
        let roots = match &files.ca_file {
            Some(path) => {
                let certs = read_certs("--ca-file", path)?;
                RootCerts::new_with_certs(&certs)
            }
            None if uses_tls => system_roots(),
            None => RootCerts::WebPki,
        };
        let client_cert = match (&files.client_cert, &files.client_key) {
            (Some(cert), Some(key)) => {
                let chain = read_certs("--client-cert", cert)?;
                let key = read_key("--client-key", key)?;
                Some(ClientCert::new_with_certs(&chain, key))
            }
            _ => None,
        };
        let bearer = match &files.auth_token_file {
            Some(path) => Some(read_first_line("--auth-token-file", path)?),
            None => None,
        };
        let etcd = match (&files.etcd_user, &files.etcd_password_file) {
            (Some(user), Some(path)) => {
                if user.is_empty() {
                    return Err(TrustError::EmptyEtcdUser);
                }
                Some(EtcdLogin {
                    user: user.clone(),
                    password: read_first_line("--etcd-password-file", path)?,
                })
            }
            _ => None,
        };
        let tls = TlsConfig::builder()
            .root_certs(roots)
            .client_cert(client_cert)
            .build();
        Ok(Arc::new(ClientTrust { tls, bearer, etcd }))
    }

    pub fn tls(&self) -> &TlsConfig {
        &self.tls
    }

    /// The `Authorization` header value for lease protocol v1, if any.
    pub fn bearer_header(&self) -> Option<String> {
        self.bearer
            .as_ref()
            .map(|t| format!("Bearer {}", t.expose()))
    }

    /// The flag of the credential this trust would send, if any.
    pub fn credential_flag(&self) -> Option<&'static str> {
        if self.bearer.is_some() {
            Some("--auth-token-file")
        } else if self.etcd.is_some() {
            Some("--etcd-password-file")
        } else {
            None
        }
    }

    pub fn etcd_login(&self) -> Option<&EtcdLogin> {
        self.etcd.as_ref()
    }
}

/// A [`TrustError::File`] for the file `flag` names.
fn file_error(flag: &'static str, path: &Path) -> impl Fn(FileProblem) -> TrustError {
    move |problem| TrustError::File {
        flag,
        path: path.to_path_buf(),
        problem,
    }
}

/// Opens a file the flag names and refuses it if group or others may read
/// it (`secret`), then reads it (bounded).
fn read_file(flag: &'static str, path: &Path, secret: bool) -> Result<Vec<u8>, TrustError> {
    use std::io::Read;
    let fail = file_error(flag, path);
    let io = |e| fail(FileProblem::Io(e));
    // Walked from `/` as the kernel's protected_symlinks rule would
    // (crate::sys::walk): a link another user owns or can re-point is
    // never followed, and no directory on the way is another user's.
    let (fd, st) = crate::sys::paths::open_checked_file_following(path)
        .map_err(|e| fail(FileProblem::Path(e)))?;
    let file = std::fs::File::from(fd);
    let mode = st.st_mode & 0o7777;
    if secret && mode & 0o044 != 0 {
        return Err(fail(FileProblem::Loose { mode }));
    }
    let mut bytes = Vec::new();
    file.take(FILE_LIMIT).read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}

fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<Certificate<'static>>, TrustError> {
    let bytes = read_file(flag, path, false)?;
    let certs = parse_certs(&bytes);
    if certs.is_empty() {
        return Err(file_error(flag, path)(FileProblem::NoCertificate));
    }
    Ok(certs)
}

fn parse_certs(bytes: &[u8]) -> Vec<Certificate<'static>> {
    ureq::tls::parse_pem(bytes)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect()
}

fn read_key(flag: &'static str, path: &Path) -> Result<PrivateKey<'static>, TrustError> {
    let bytes = read_file(flag, path, true)?;
    ureq::tls::parse_pem(&bytes)
        .find_map(|item| match item {
            Ok(PemItem::PrivateKey(k)) => Some(k),
            _ => None,
        })
        .ok_or_else(|| file_error(flag, path)(FileProblem::NoKey))
}

fn read_first_line(flag: &'static str, path: &Path) -> Result<Secret, TrustError> {
    let fail = file_error(flag, path);
    let bytes = read_file(flag, path, true)?;
    let text = String::from_utf8(bytes).map_err(|e| fail(FileProblem::NotUtf8(e.utf8_error())))?;
    let line = text.lines().next().unwrap_or("").trim();
    if line.is_empty() {
        return Err(fail(FileProblem::EmptyFirstLine));
    }
    Ok(Secret(line.to_string()))
}

/// The system's roots: `SSL_CERT_FILE`, else the first CA bundle file found,
/// else the compiled-in Mozilla roots.
fn system_roots() -> RootCerts {
    let env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    let candidates = env
        .into_iter()
        .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from));
    for path in candidates {
        if let Ok(bytes) = std::fs::read(&path) {
            let certs = parse_certs(&bytes);
            if !certs.is_empty() {
                return RootCerts::new_with_certs(&certs);
            }
        }
    }
    RootCerts::WebPki
}

/// `url` with any `user:password@` (or `user@`) part of its authority
/// section removed, for every place a URL is shown or passed on.
/// Handles `scheme://[userinfo@]host…` and etcd's `h:p,h:p` lists.
///
/// Parsed, not matched: the authority is what follows the *last* `@`
/// behind which a well-formed host list starts (host names, IPv4 or
/// bracketed IPv6 literals, optional `:port`, comma-separated), ending at
/// the URL's end or at `/`, `?` or `#`. Everything between `://` and that
/// `@` is userinfo, whatever it holds: a password with `/`, `?`, `#` or
/// `@` in it is removed whole, never cut where such a character happens
/// to be. Erring that way is deliberate: a path holding `@host` is shown
/// without what precedes it, a secret is never shown.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let start = rest
        .rmatch_indices('@')
        .map(|(i, _)| i + 1)
        .find(|&i| host_list_at(&rest[i..]));
    match start {
        Some(i) => format!("{scheme}://{}", &rest[i..]),
        None => url.to_string(),
    }
}

/// Whether `s` starts with a well-formed `host[:port][,host[:port]…]`
/// followed by its end, `/`, `?` or `#`.
fn host_list_at(s: &str) -> bool {
    let end = s.find(['/', '?', '#']).unwrap_or(s.len());
    let hosts = &s[..end];
    !hosts.is_empty() && hosts.split(',').all(host_port)
}

/// `name[:port]`, `a.b.c.d[:port]` or `[v6][:port]`.
fn host_port(s: &str) -> bool {
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return false;
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => ("v6", Some(port)),
                None => return false,
            },
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

/// Whether `host` (as written in a URL: a name, an IPv4 literal or a
/// bracketed IPv6 literal, without the port) is this machine's loopback.
pub fn is_loopback_host(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.eq_ignore_ascii_case("localhost") {
        return true;
    }
    bare.parse::<std::net::IpAddr>().is_ok_and(|ip| match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    })
}

/// The host of a `host:port` or `[v6]:port` endpoint.
pub fn endpoint_host(endpoint: &str) -> &str {
    if endpoint.starts_with('[') {
        return endpoint
            .split_once(']')
            .map_or(endpoint, |(h, _)| &endpoint[..=h.len()]);
    }
    endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h)
}

/// Whether a URL carries a `user[:password]@` part.
pub fn has_userinfo(url: &str) -> bool {
    redact_url(url) != url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_removed() {
        assert_eq!(
            redact_url("https://u:p@h:1/x?y"),
            "https://h:1/x?y".to_string()
        );
        assert_eq!(
            redact_url("etcds://u:p@a:1,b:2"),
            "etcds://a:1,b:2".to_string()
        );
        assert_eq!(redact_url("http://h:1"), "http://h:1".to_string());
        assert_eq!(redact_url("sqlite:/x@y"), "sqlite:/x@y".to_string());
        assert!(has_userinfo("http://a@b:1"));
        assert!(!has_userinfo("http://b:1/x"));
        // Passwords holding the characters that end an authority are
        // removed whole.
        for url in [
            "http://u:pa/ss@h:1/x",
            "http://u:pa?ss@h:1/x",
            "http://u:pa#ss@h:1/x",
            "http://u:p@ss@h:1/x",
            "http://u:12/34@h:1/x",
        ] {
            assert_eq!(redact_url(url), "http://h:1/x", "{url}");
        }
        assert_eq!(
            redact_url("etcd://u:a/b?c@h:1,[::1]:2"),
            "etcd://h:1,[::1]:2"
        );
        assert_eq!(redact_url("https://[::1]:7/"), "https://[::1]:7/");
        assert!(is_loopback_host("127.0.0.9") && is_loopback_host("[::1]"));
        assert!(is_loopback_host("LOCALHOST") && !is_loopback_host("10.0.0.1"));
        assert_eq!(endpoint_host("[::1]:2379"), "[::1]");
        assert_eq!(endpoint_host("h:2379"), "h");
    }

    #[test]
    fn pairs_go_together() {
        let f = TrustFiles {
            client_cert: Some("c".into()),
            ..Default::default()
        };
        assert_eq!(f.check_usage(), Err(TrustPairError::CertWithoutKey));
        assert_eq!(
            TrustPairError::CertWithoutKey.to_string(),
            "--client-cert needs --client-key"
        );
        let f = TrustFiles {
            etcd_user: Some("u".into()),
            ..Default::default()
        };
        assert_eq!(
            f.check_usage().unwrap_err().to_string(),
            "--etcd-user needs --etcd-password-file"
        );
    }

    #[test]
    fn loose_secret_files_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "  s3cret  \nsecond\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let files = TrustFiles {
            auth_token_file: Some(p.clone()),
            ..Default::default()
        };
        let e = ClientTrust::load(&files, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "--auth-token-file {}: refused: the file is readable by group or others (mode 0640); chmod 600 it",
                p.display()
            )
        );
        assert!(!format!("{e:?}").contains("s3cret"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = ClientTrust::load(&files, false).unwrap();
        assert_eq!(t.bearer_header().as_deref(), Some("Bearer s3cret"));
        assert!(!format!("{t:?}").contains("s3cret"));
    }
}
