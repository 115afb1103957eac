//! How `serve --store postgresql://…` reaches its database: the URL (libpq's
//! conventions), the password, TLS, and the connection's session settings.
//!
//! Secrets never come from argv (`trust.md`): a URL that carries a password
//! (`user:password@`, or `?password=`) is refused with a pointer to
//! `--store-password-file`. The password comes from that file (its first
//! line; mode 0600 or stricter, a regular file that is not a symlink), else
//! from a libpq password file (`PGPASSFILE`, else `~/.pgpass`; the same
//! mode rule, which libpq applies too), else there is none (trust or
//! certificate authentication).
//!
//! TLS is not libpq's default ("prefer", which accepts any certificate and
//! even none): `sslmode=verify-full` (with `sslrootcert=FILE`, the CA that
//! signs the server's certificate, whose name must match the host) or
//! `sslmode=disable`, which is accepted only when every host is a loopback
//! address or a Unix socket. Without `sslmode`, a loopback or Unix-socket
//! store is plain and any other must say `verify-full`. The modes that do
//! not check the server (`allow`, `prefer`, `require`, `verify-ca`) are
//! refused: the password and every grant would go to whoever answers.
//!
//! Several hosts (`postgresql://a:5432,b:5432/db`) are libpq's too: with
//! `target_session_attrs=read-write` (the default set here when the URL has
//! several hosts and says nothing) a connection goes to whichever host is
//! the primary, so the store follows a Patroni switchover by reconnecting.
//!
//! Every session commits synchronously (`synchronous_commit = on`, whatever
//! the server's default): a grant is answered only once its commit is
//! flushed, and where the server replicates synchronously, once the
//! synchronous standby has it too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::config::{Host, TargetSessionAttrs};

/// How long opening a connection may take (each host).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest password or password file read.
const FILE_LIMIT: u64 = 64 * 1024;

/// Why the store's URL or its credentials cannot be used. Messages name
/// the flag or variable at fault, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "--store {0}: expected postgresql://[user@]host[:port][,host[:port]…]/dbname[?param=value…]"
    )]
    NotUrl(String),
    #[error(
        "--store {0}: the URL carries a password; secrets never come from the command line: put it in a \
         file of mode 0600 and name it with --store-password-file (or PGPASSFILE)"
    )]
    PasswordInUrl(String),
    #[error(
        "--store {url}: sslmode={mode} does not check the server's certificate; use sslmode=verify-full with sslrootcert=FILE"
    )]
    WeakSslMode { url: String, mode: String },
    #[error(
        "--store {url}: unknown sslmode={mode}; use verify-full (or disable on a loopback address)"
    )]
    UnknownSslMode { url: String, mode: String },
    #[error(
        "--store {0}: not a loopback address or a Unix socket, so the connection must be TLS: add \
         sslmode=verify-full&sslrootcert=FILE (the CA of the server's certificate)"
    )]
    Cleartext(String),
    #[error(
        "--store {0}: sslmode=verify-full needs sslrootcert=FILE (the CA of the server's certificate)"
    )]
    NoRootCert(String),
    #[error("--store {url}: {message}")]
    Invalid { url: String, message: String },
    #[error("--store {0}: the URL names no user (postgresql://USER@host/db, or PGUSER)")]
    NoUser(String),
    #[error("{what} {}: {problem}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        problem: String,
    },
}

/// A store URL made ready to connect: the client's settings (no secret
/// shown by its `Debug`), how TLS is done, and the URL as it may be shown.
#[derive(Clone)]
pub struct PgConfig {
    pub pg: tokio_postgres::Config,
    /// `None`: plain (loopback or Unix socket only).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The URL as given (it holds no secret: one with a password is refused).
    pub shown: String,
    /// How long a transaction may sit idle before the server ends it
    /// (`conn.rs`); serve sets half its leader ttl.
    pub idle_tx_ms: u64,
}

impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &self.shown)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The query parameters this file reads itself (tokio-postgres does not
/// know them, or knows them with a weaker meaning).
#[derive(Default)]
struct Own {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    passfile: Option<String>,
}

/// Splits the URL's query into the parameters read here and the rest
/// (kept as written, for tokio-postgres). A password parameter is refused.
fn split_query(url: &str) -> Result<(String, Own), ConfigError> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut own = Own::default();
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let value = || {
            percent_decode(v).ok_or_else(|| ConfigError::Invalid {
                url: url.to_string(),
                message: format!("`{k}` is not valid percent-encoded UTF-8"),
            })
        };
        match k {
            "password" => return Err(ConfigError::PasswordInUrl(redacted(url))),
            "sslmode" => own.sslmode = Some(value()?),
            "sslrootcert" => own.sslrootcert = Some(value()?),
            "passfile" => own.passfile = Some(value()?),
            _ => rest.push(pair),
        }
    }
    let mut out = base.to_string();
    if !rest.is_empty() {
        out.push('?');
        out.push_str(&rest.join("&"));
    }
    Ok((out, own))
}

/// The URL with everything between `://` and `@` replaced: only for the
/// error that refuses a URL with a password, so the password is not shown.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(a URL)".into();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let tail = tail.split('?').next().unwrap_or("");
    match authority.rsplit_once('@') {
        Some((_, hosts)) => format!("{scheme}://…@{hosts}{tail}"),
        None => format!("{scheme}://{authority}{tail}"),
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether every host of `pg` is a Unix socket or a loopback address.
fn all_local(pg: &tokio_postgres::Config) -> bool {
    pg.get_hosts().iter().all(|h| match h {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            name == "localhost"
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    })
}

/// Reads a secret file: a regular file, not a symlink, its directories
/// safe, readable by nobody but its owner.
fn read_secret(what: &'static str, path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let fail = |problem: String| ConfigError::File {
        what,
        path: path.to_path_buf(),
        problem,
    };
    let (fd, st) = crate::sys::paths::open_checked_file(path).map_err(|e| fail(e.to_string()))?;
    if st.st_mode & 0o077 != 0 {
        return Err(fail(format!(
            "refused: the file may be read or written by group or others (mode {:04o}); chmod 600 it",
            st.st_mode & 0o7777
        )));
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(FILE_LIMIT)
        .read_to_string(&mut text)
        .map_err(|e| fail(e.to_string()))?;
    Ok(text)
}

/// The password for `user` at `host:port/db` in a libpq password file's
/// text (`hostname:port:database:username:password`, `*` matches anything,
/// `\` escapes `:` and `\`, `#` starts a comment line).
pub fn pgpass_lookup(text: &str, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::new();
        let mut cur = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        fields.push(cur);
        if fields.len() != 5 {
            continue;
        }
        let ok = |f: &str, v: &str| f == "*" || f == v;
        if ok(&fields[0], host)
            && ok(&fields[1], &port)
            && ok(&fields[2], db)
            && ok(&fields[3], user)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

/// The TLS client of `sslmode=verify-full`: the CAs of `sslrootcert`, the
/// server's name checked (rustls's default verifier).
fn tls_config(url: &str, root: &Path) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let fail = |problem: String| ConfigError::File {
        what: "--store sslrootcert",
        path: root.to_path_buf(),
        problem,
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(root)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no certificate in the file".into()));
    }
    for c in certs {
        roots.add(c).map_err(|e| fail(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Invalid {
            url: url.to_string(),
            message: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Checks and reads what `--store URL` and `--store-password-file` name.
/// `env` looks up an environment variable (`PGPASSFILE`, `PGUSER`, `HOME`).
pub fn configure(
    url: &str,
    password_file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PgConfig, ConfigError> {
    if !(url.starts_with("postgresql://") || url.starts_with("postgres://")) {
        return Err(ConfigError::NotUrl(redacted(url)));
    }
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    if authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    {
        return Err(ConfigError::PasswordInUrl(redacted(url)));
    }
    let (stripped, own) = split_query(url)?;
    let mut pg: tokio_postgres::Config =
        stripped
            .parse()
            .map_err(|e: tokio_postgres::Error| ConfigError::Invalid {
                url: url.to_string(),
                message: e.to_string(),
            })?;
    if pg.get_password().is_some() {
        return Err(ConfigError::PasswordInUrl(redacted(url)));
    }
    if pg.get_user().is_none() {
        match env("PGUSER") {
            Some(u) if !u.is_empty() => {
                pg.user(&u);
            }
            _ => return Err(ConfigError::NoUser(url.to_string())),
        }
    }
    if pg.get_hosts().is_empty() {
        pg.host("localhost");
    }
    let local = all_local(&pg);
    let mode = own
        .sslmode
        .clone()
        .unwrap_or_else(|| if local { "disable" } else { "verify-full" }.into());
    let tls = match mode.as_str() {
        "disable" if local => None,
        "disable" => return Err(ConfigError::Cleartext(url.to_string())),
        "verify-full" => {
            let root = own
                .sslrootcert
                .as_deref()
                .ok_or_else(|| ConfigError::NoRootCert(url.to_string()))?;
            Some(tls_config(url, Path::new(root))?)
        }
        "allow" | "prefer" | "require" | "verify-ca" => {
            return Err(ConfigError::WeakSslMode {
                url: url.to_string(),
                mode,
            });
        }
        _ => {
            return Err(ConfigError::UnknownSslMode {
                url: url.to_string(),
                mode,
            });
        }
    };
    pg.ssl_mode(if tls.is_some() {
        tokio_postgres::config::SslMode::Require
    } else {
        tokio_postgres::config::SslMode::Disable
    });
    if let Some(pw) = password(&pg, password_file, own.passfile.as_deref(), env)? {
        pg.password(pw);
    }
    if pg.get_hosts().len() > 1 && !url.contains("target_session_attrs=") {
        pg.target_session_attrs(TargetSessionAttrs::ReadWrite);
    }
    pg.connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(Duration::from_secs(10))
        .application_name("leaseagent-serve");
    Ok(PgConfig {
        pg,
        tls,
        shown: url.to_string(),
        idle_tx_ms: 30_000,
    })
}

/// The password: `--store-password-file`'s first line, else the matching
/// line of the libpq password file (`?passfile=`, `PGPASSFILE`, else
/// `~/.pgpass`, if it exists), else none.
fn password(
    pg: &tokio_postgres::Config,
    file: Option<&Path>,
    passfile: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    if let Some(f) = file {
        let text = read_secret("--store-password-file", f)?;
        let line = text.lines().next().unwrap_or("").trim().to_string();
        if line.is_empty() {
            return Err(ConfigError::File {
                what: "--store-password-file",
                path: f.to_path_buf(),
                problem: "the first line is empty".into(),
            });
        }
        return Ok(Some(line));
    }
    let (path, named) = match passfile.map(String::from).or_else(|| env("PGPASSFILE")) {
        Some(p) => (PathBuf::from(p), true),
        None => match env("HOME") {
            Some(h) => (Path::new(&h).join(".pgpass"), false),
            None => return Ok(None),
        },
    };
    if !named && !path.exists() {
        return Ok(None);
    }
    let text = read_secret("PGPASSFILE", &path)?;
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => "localhost".into(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let user = pg.get_user().unwrap_or("");
    let db = pg.get_dbname().unwrap_or(user);
    Ok(pgpass_lookup(&text, &host, port, db, user))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_password_in_the_url_is_refused_without_showing_it() {
        for url in [
            "postgresql://lease:s3cret@db.example.org/leases",
            "postgresql://lease@db.example.org/leases?password=s3cret",
        ] {
            let e = configure(url, None, &no_env).unwrap_err().to_string();
            assert!(e.contains("--store-password-file"), "{e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
    }

    #[test]
    fn tls_rules() {
        let e = configure("postgresql://u@db.example.org/x", None, &no_env).unwrap_err();
        assert!(matches!(e, ConfigError::NoRootCert(_)), "{e}");
        let e = configure(
            "postgresql://u@db.example.org/x?sslmode=disable",
            None,
            &no_env,
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::Cleartext(_)), "{e}");
        for mode in ["prefer", "require", "verify-ca", "allow"] {
            let e = configure(
                &format!("postgresql://u@127.0.0.1/x?sslmode={mode}"),
                None,
                &no_env,
            )
            .unwrap_err();
            assert!(matches!(e, ConfigError::WeakSslMode { .. }), "{e}");
        }
        let c = configure("postgresql://u@127.0.0.1:5433/x", None, &no_env).unwrap();
        assert!(c.tls.is_none());
        let c = configure("postgresql://u@%2Frun%2Fpg/x", None, &no_env).unwrap();
        assert!(c.tls.is_none());
        let e = configure("mysql://u@h/x", None, &no_env).unwrap_err();
        assert!(matches!(e, ConfigError::NotUrl(_)), "{e}");
        let e = configure("postgresql://127.0.0.1/x", None, &no_env).unwrap_err();
        assert!(matches!(e, ConfigError::NoUser(_)), "{e}");
    }

    #[test]
    fn several_hosts_go_to_the_primary() {
        let c = configure("postgresql://u@127.0.0.1:1,127.0.0.1:2/x", None, &no_env).unwrap();
        assert_eq!(c.pg.get_hosts().len(), 2);
        assert_eq!(
            c.pg.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
    }

    #[test]
    fn password_files_must_be_private() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("pw");
        std::fs::write(&f, "hunter2\nignored\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = configure("postgresql://u@127.0.0.1/x", Some(&f), &no_env)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--store-password-file"), "{e}");
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = configure("postgresql://u@127.0.0.1/x", Some(&f), &no_env).unwrap();
        assert_eq!(c.pg.get_password(), Some(&b"hunter2"[..]));
        assert!(!format!("{c:?}").contains("hunter2"));
        // A libpq password file, by PGPASSFILE.
        let pass = d.path().join("pgpass");
        std::fs::write(
            &pass,
            "# c\nother:*:*:*:no\n127.0.0.1:5432:x:u:yes\\:colon\n",
        )
        .unwrap();
        std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = pass.display().to_string();
        let env = move |k: &str| (k == "PGPASSFILE").then(|| p.clone());
        let c = configure("postgresql://u@127.0.0.1/x", None, &env).unwrap();
        assert_eq!(c.pg.get_password(), Some(&b"yes:colon"[..]));
        std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(configure("postgresql://u@127.0.0.1/x", None, &env).is_err());
    }

    #[test]
    fn pgpass_wildcards() {
        let t = "*:*:*:u:any\n";
        assert_eq!(pgpass_lookup(t, "h", 1, "d", "u").as_deref(), Some("any"));
        assert_eq!(pgpass_lookup(t, "h", 1, "d", "v"), None);
    }
}
