//! The interface between the agent (and the operator commands) and
//! whatever grants leases, split by what each caller needs.
//!
//! Every lease authority (lease protocol v1 over HTTP, the embedded SQLite
//! engine, etcd) is a [`LeaseClient`]: acquire, renew, release, and a
//! [`Renewer`] for the heartbeat thread. The supervisor never knows which
//! one it talks to: it only sees the three outcomes the protocol defines for
//! an answer — a grant or renewal, a **refusal** (the lease is gone for
//! good: stop the command), or a **transient** failure (the lease may still
//! be valid: retry until the local deadline).
//!
//! What only some authorities have is a capability, asked for and answered
//! with `None` where there is none, never a method with a default body that
//! a wrapper could forget to forward: [`LeaseClient::waiter`] (etcd's queue,
//! which keeps a `--wait`'s place between calls) and
//! [`LeaseClient::operator`] (`leases`, `revoke`, `clear`, `history`). The
//! shape is etcd's `client/v3/concurrency`: a lease's life (grant, keepalive,
//! revoke: the `Session`) apart from the queue a `Mutex` keeps on top of it.
//! No method of the traits has a default body, so a decorator
//! ([`untrusted::Checked`]) that forgets one does not compile.
//!
//! How a backend manages its connections (which handle keeps the one that
//! made the grant, what it tidies once an answer is out) is its own
//! business, behind [`LeaseClient::renewer`] and [`Renewer::renew`].
//!
//! Invariants every implementation keeps:
//! - Every call returns within the `timeout` it is given. The heartbeat thread
//!   picks timeouts below the time the lease has left, so a hung authority can
//!   never hold a renewal past the local deadline.
//! - Anything that is not a well-formed answer of the expected shape is
//!   [`RenewError::Transient`], never a success: a malformed `200` must not
//!   extend the lease.
//! - Errors are typed by their source ([`error`]): nothing reads an error's
//!   message back to decide anything.
//! - Implementations are `Send` and owned by one thread at a time; the
//!   heartbeat thread gets its own handle ([`LeaseClient::renewer`]).
//!   Nothing is shared between threads but what the handles only read (the
//!   client trust, built once from the flags) and etcd's per-lease expiry
//!   clock (a mutex held for a map lookup).

pub mod client;
pub mod embedded;
pub mod error;
pub mod etcd;
pub mod http;
pub mod netpath;
#[cfg(test)]
pub mod scripted;
pub mod transport;
pub mod trust;
pub mod untrusted;

pub use client::{
    AcquireError, AcquireRequest, Attempt, ExpiryPolicy, Grant, LeaseClient, LeaseInfo, LeaseRef,
    LeaseState, Operator, OperatorError, Outcome, RefusalReason, RenewError, Renewed, Renewer,
    Revoked, Waiter, acquired_ms,
};

/// Which authority a URL names; see [`open`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthoritySpec {
    /// `http://…` or `https://…`: lease protocol v1. Holds the base URL
    /// without a trailing slash; the replicas of one authority
    /// (`https://a:7878,https://b:7878`) are several, joined by commas.
    Http(String),
    /// `etcd://host:port[,host:port…]` (plain HTTP to etcd's gateway).
    Etcd(Vec<String>),
    /// `etcds://host:port[,host:port…]` (TLS).
    Etcds(Vec<String>),
    /// `sqlite:PATH`, or the embedded default (the path under the state dir).
    Sqlite(std::path::PathBuf),
}

/// Why an `--authority` value is not an authority URL. Each message
/// quotes the URL with any `user:password@` part already removed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("`{0}` has no host")]
    NoHost(String),
    #[error("`{0}`: expected etcd://host:port[,host:port…]")]
    EmptyEndpoint(String),
    #[error("`{url}`: endpoint `{endpoint}` has no port")]
    NoPort { url: String, endpoint: String },
    #[error(
        "`{0}`: the replicas of an authority are http://… or https://… URLs separated by \
         commas, all of one scheme"
    )]
    Replicas(String),
    #[error("`{0}`: expected sqlite:PATH")]
    NoPath(String),
    #[error(
        "`{0}` is not an authority URL: expected http://…, https://…, etcd://host:port[,…], etcds://host:port[,…] or sqlite:PATH"
    )]
    UnknownScheme(String),
}

/// Why `--authority` (or its absence) names no authority.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityFlagError {
    /// Not given, and the embedded default has no place to live.
    #[error("--authority not given and {0}")]
    NoDefault(#[source] crate::sys::paths::NoStateDir),
    #[error("--authority: {0}")]
    Url(#[source] UrlError),
}

/// Why [`open`] could not open the authority.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A trust flag's file is missing, loose or not what it should hold.
    #[error(transparent)]
    Trust(#[from] trust::TrustError),
    /// The embedded database's file or directory is not safe to use.
    #[error(transparent)]
    Database(#[from] crate::sys::paths::PathError),
    /// The agent's scribe could not open the embedded database (its
    /// message, as [`OpenError::Database`]'s would be, or why no answer
    /// came).
    #[error("{0}")]
    Scribed(String),
    /// A credential would cross the network unencrypted.
    #[error(
        "{flag}: refusing to send a credential in the clear to {url}: use https:// or etcds:// \
         (or an authority on a loopback address)"
    )]
    Cleartext { flag: &'static str, url: String },
}

/// Refuses a credential (bearer token, etcd password) bound for a plain
/// `http://` or `etcd://` authority that is not on a loopback address:
/// anyone on the path would read it.
fn refuse_cleartext(spec: &AuthoritySpec, trust: &trust::ClientTrust) -> Result<(), OpenError> {
    let Some(flag) = trust.credential_flag() else {
        return Ok(());
    };
    let (url, hosts): (String, Vec<&str>) = match spec {
        AuthoritySpec::Http(bases) => {
            let hosts = bases
                .split(',')
                .filter_map(|base| base.strip_prefix("http://"))
                .map(|rest| {
                    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
                    trust::endpoint_host(&rest[..end])
                })
                .collect::<Vec<_>>();
            if hosts.is_empty() {
                return Ok(());
            }
            (bases.clone(), hosts)
        }
        AuthoritySpec::Etcd(endpoints) => (
            format!("etcd://{}", endpoints.join(",")),
            endpoints.iter().map(|e| trust::endpoint_host(e)).collect(),
        ),
        _ => return Ok(()),
    };
    if hosts.iter().all(|h| trust::is_loopback_host(h)) {
        return Ok(());
    }
    Err(OpenError::Cleartext { flag, url })
}

/// A list of URLs, each with its `user:password@` part removed.
fn redact_each(urls: &str) -> String {
    urls.split(',')
        .map(trust::redact_url)
        .collect::<Vec<_>>()
        .join(",")
}

impl AuthoritySpec {
    /// Parses an `--authority` value. The error names what is wrong. A
    /// `user:password@` part is dropped (with a warning: credentials come
    /// from files, see `trust`) and never shown.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        if url.contains(",http://") || url.contains(",https://") {
            return Self::parse_replicas(url);
        }
        let redacted = trust::redact_url(url);
        if redacted != url {
            // Parsed before logging is set up: written directly, in the
            // log's format.
            eprintln!(
                "leaseagent: warn: --authority: the user:password@ part of the URL is ignored (use --auth-token-file, or --etcd-user with --etcd-password-file)"
            );
        }
        let s = redacted.as_str();
        if let Some(rest) = s
            .strip_prefix("http://")
            .or_else(|| s.strip_prefix("https://"))
        {
            if rest.is_empty() || rest.starts_with('/') {
                return Err(UrlError::NoHost(s.to_string()));
            }
            if rest.contains(',') {
                return Err(UrlError::Replicas(redact_each(url)));
            }
            return Ok(AuthoritySpec::Http(s.trim_end_matches('/').to_string()));
        }
        let etcd = s
            .strip_prefix("etcd://")
            .map(|r| (r, false))
            .or_else(|| s.strip_prefix("etcds://").map(|r| (r, true)));
        if let Some((rest, tls)) = etcd {
            let endpoints: Vec<String> = rest
                .trim_end_matches('/')
                .split(',')
                .map(|e| e.trim().to_string())
                .collect();
            if endpoints.iter().any(|e| e.is_empty()) {
                return Err(UrlError::EmptyEndpoint(s.to_string()));
            }
            for e in &endpoints {
                if !e.contains(':') {
                    return Err(UrlError::NoPort {
                        url: s.to_string(),
                        endpoint: e.clone(),
                    });
                }
            }
            return Ok(if tls {
                AuthoritySpec::Etcds(endpoints)
            } else {
                AuthoritySpec::Etcd(endpoints)
            });
        }
        if let Some(path) = s.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(UrlError::NoPath(s.to_string()));
            }
            return Ok(AuthoritySpec::Sqlite(path.into()));
        }
        Err(UrlError::UnknownScheme(s.to_string()))
    }

    /// `https://a:7878,https://b:7878`: the replicas of one authority, each
    /// URL parsed (and redacted) alone; one scheme for all.
    fn parse_replicas(url: &str) -> Result<Self, UrlError> {
        let mut bases = Vec::new();
        for part in url.split(',') {
            match Self::parse(part.trim()) {
                Ok(AuthoritySpec::Http(base)) => bases.push(base),
                Ok(_) | Err(_) => {
                    return Err(UrlError::Replicas(redact_each(url)));
                }
            }
        }
        let tls = bases.iter().filter(|b| b.starts_with("https://")).count();
        if tls != 0 && tls != bases.len() {
            return Err(UrlError::Replicas(bases.join(",")));
        }
        Ok(AuthoritySpec::Http(bases.join(",")))
    }

    /// The authority an `--authority` value names (the flag parser has
    /// already applied `LEASEAGENT_AUTHORITY`): none or empty is the
    /// embedded default. Errors name the flag.
    pub fn from_flag(flag: Option<&str>) -> Result<Self, AuthorityFlagError> {
        match flag {
            None | Some("") => Self::default_local().map_err(AuthorityFlagError::NoDefault),
            Some(url) => Self::parse(url).map_err(AuthorityFlagError::Url),
        }
    }

    /// The default authority: the embedded SQLite database under the state
    /// directory the contract names.
    pub fn default_local() -> Result<Self, crate::sys::paths::NoStateDir> {
        Ok(AuthoritySpec::Sqlite(
            crate::sys::paths::state_dir()?.join("leases.sqlite3"),
        ))
    }
}

impl AuthoritySpec {
    /// Whether the authority is reached over TLS.
    pub fn uses_tls(&self) -> bool {
        match self {
            AuthoritySpec::Http(base) => base.starts_with("https://"),
            AuthoritySpec::Etcds(_) => true,
            AuthoritySpec::Etcd(_) | AuthoritySpec::Sqlite(_) => false,
        }
    }
}

/// Opens the authority a spec names, with the client trust the flags name
/// (read and checked here, once; the error names the flag and the file),
/// behind the checks every answer must pass ([`untrusted::Checked`]).
pub fn open(
    spec: &AuthoritySpec,
    files: &trust::TrustFiles,
) -> Result<Box<dyn LeaseClient>, OpenError> {
    open_via(spec, files, open_embedded)
}

/// The embedded authority at `path`, opened in this process: its
/// directory must be this user's alone; no symlinks followed.
pub fn open_embedded(path: &std::path::Path) -> Result<Box<dyn LeaseClient>, OpenError> {
    crate::sys::paths::prepare_db_file(path)?;
    Ok(Box::new(embedded::EmbeddedAuthority::new(
        path.to_path_buf(),
    )))
}

/// [`open`], the embedded authority opened by `embedded` (the agent's
/// goes through its scribe, `agent/scribe.rs`).
pub fn open_via(
    spec: &AuthoritySpec,
    files: &trust::TrustFiles,
    embedded: impl FnOnce(&std::path::Path) -> Result<Box<dyn LeaseClient>, OpenError>,
) -> Result<Box<dyn LeaseClient>, OpenError> {
    let trust = trust::ClientTrust::load(files, spec.uses_tls())?;
    refuse_cleartext(spec, &trust)?;
    let inner: Box<dyn LeaseClient> = match spec {
        AuthoritySpec::Http(base) => Box::new(http::HttpAuthority::with_trust(base, trust)),
        AuthoritySpec::Etcd(endpoints) => Box::new(etcd::EtcdAuthority::with_trust(
            endpoints.clone(),
            false,
            trust,
        )),
        AuthoritySpec::Etcds(endpoints) => Box::new(etcd::EtcdAuthority::with_trust(
            endpoints.clone(),
            true,
            trust,
        )),
        AuthoritySpec::Sqlite(path) => embedded(path)?,
    };
    Ok(Box::new(untrusted::Checked::new(inner)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_urls_of_one_scheme_separated_by_commas() {
        assert_eq!(
            AuthoritySpec::parse("https://a:7878/,https://b:7878").unwrap(),
            AuthoritySpec::Http("https://a:7878,https://b:7878".into())
        );
        for bad in [
            "http://a:1,b:2",
            "http://a:1,https://b:2",
            "https://a:1,etcd://b:2",
            "https://a:1,https://",
        ] {
            assert!(
                matches!(AuthoritySpec::parse(bad), Err(UrlError::Replicas(_))),
                "{bad}: {:?}",
                AuthoritySpec::parse(bad)
            );
        }
        let e = AuthoritySpec::parse("http://u:pw@a:1,ftp://b")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pw"), "{e}");
        // A bearer token never goes in the clear to any of them.
        let spec = AuthoritySpec::parse("http://127.0.0.1:1,http://10.0.0.2:1").unwrap();
        let d = tempfile::tempdir().unwrap();
        let token = d.path().join("token");
        std::fs::write(&token, "t0k3n-abcdefghijklmnop\n").unwrap();
        std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let files = trust::TrustFiles {
            auth_token_file: Some(token),
            ..Default::default()
        };
        let trust = trust::ClientTrust::load(&files, false).unwrap();
        assert!(matches!(
            refuse_cleartext(&spec, &trust),
            Err(OpenError::Cleartext { .. })
        ));
        let local = AuthoritySpec::parse("http://127.0.0.1:1,http://[::1]:2").unwrap();
        assert!(refuse_cleartext(&local, &trust).is_ok());
    }

    #[test]
    fn parses_every_scheme() {
        assert_eq!(
            AuthoritySpec::parse("http://127.0.0.1:80/").unwrap(),
            AuthoritySpec::Http("http://127.0.0.1:80".into())
        );
        assert_eq!(
            AuthoritySpec::parse("etcd://a:1,b:2").unwrap(),
            AuthoritySpec::Etcd(vec!["a:1".into(), "b:2".into()])
        );
        assert_eq!(
            AuthoritySpec::parse("sqlite:/tmp/x.db").unwrap(),
            AuthoritySpec::Sqlite("/tmp/x.db".into())
        );
        assert!(matches!(
            AuthoritySpec::parse("ftp://x"),
            Err(UrlError::UnknownScheme(_))
        ));
        assert_eq!(
            AuthoritySpec::parse("etcd://a,b:1")
                .unwrap_err()
                .to_string(),
            "`etcd://a,b:1`: endpoint `a` has no port"
        );
        assert_eq!(
            AuthoritySpec::parse("etcds://a:1,,b:2")
                .unwrap_err()
                .to_string(),
            "`etcds://a:1,,b:2`: expected etcd://host:port[,host:port…]"
        );
        assert_eq!(
            AuthoritySpec::parse("http://").unwrap_err().to_string(),
            "`http://` has no host"
        );
        assert_eq!(
            AuthoritySpec::parse("sqlite:").unwrap_err().to_string(),
            "`sqlite:`: expected sqlite:PATH"
        );
        assert_eq!(
            AuthoritySpec::parse("etcds://u:pw@a:1,b:2").unwrap(),
            AuthoritySpec::Etcds(vec!["a:1".into(), "b:2".into()])
        );
        assert_eq!(
            AuthoritySpec::parse("https://u:pw@h:1/").unwrap(),
            AuthoritySpec::Http("https://h:1".into())
        );
        let e = AuthoritySpec::parse("ftp://u:pw@h")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "`ftp://h` is not an authority URL: expected http://…, https://…, etcd://host:port[,…], etcds://host:port[,…] or sqlite:PATH"
        );
    }
}
