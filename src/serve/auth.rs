//! Who may do what on `serve`: the auth file (`--auth-file`), its
//! principals, roles and task scopes (`trust.md`).
//!
//! - A principal is found by its bearer token (compared by sha256, so the
//!   file holds no secret) or, with mutual TLS, by the names of its
//!   verified client certificate (its DNS SANs as written, or its CN only
//!   when it has no subjectAltName extension: `certnames.rs`) equal to
//!   `cert_name`. A request that two principals match is
//!   refused (401), never settled by their order in the file: the order of
//!   entries must not decide who is operator.
//! - The file is read at start (an error there stops `serve`) and again on
//!   SIGHUP: a file that fails to load then keeps the old principals, logs
//!   an error and counts the failure for `/metrics` ([`AuthStats`]), so a
//!   typo never locks the fleet out and a failed edit is visible. Requests
//!   read the current [`Principals`] through an `Arc` swapped under a lock,
//!   so a reload drops no connection and no lease.
//! - The file holds hashes, not secrets, but whoever can write it can grant
//!   themselves any role. So it is trusted only if it is safe, checked on
//!   the descriptor that is read (no window between check and read): a
//!   regular file reached without following a symlink at its last
//!   component, owned by root or by the user serve runs as, not writable by
//!   group or others, in a directory chain no other user can write to
//!   ([`crate::sys::paths::open_checked_file`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// What a principal may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Reader,
    Agent,
    Operator,
}

/// What a request wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `GET /v1/leases`, `/metrics`.
    Read,
    /// acquire, renew, release.
    Hold,
    /// revoke, clear.
    Operate,
}

impl Role {
    pub fn may(self, a: Action) -> bool {
        matches!(
            (self, a),
            (Role::Operator, _) | (Role::Reader, Action::Read) | (Role::Agent, Action::Hold)
        )
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrincipal {
    name: String,
    role: Role,
    token_sha256: Option<String>,
    cert_name: Option<String>,
    tasks: Vec<String>,
    max_leases: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    principal: Vec<RawPrincipal>,
}

/// One principal of the auth file.
#[derive(Clone, Debug)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    token_sha256: Option<[u8; 32]>,
    cert_name: Option<String>,
    tasks: Vec<String>,
    pub max_leases: Option<u64>,
}

impl Principal {
    /// Everything, for a server without an auth file (name "").
    pub fn anyone() -> Arc<Self> {
        static ANYONE: std::sync::OnceLock<Arc<Principal>> = std::sync::OnceLock::new();
        ANYONE
            .get_or_init(|| {
                Arc::new(Principal {
                    name: String::new(),
                    role: Role::Operator,
                    token_sha256: None,
                    cert_name: None,
                    tasks: vec!["*".into()],
                    max_leases: None,
                })
            })
            .clone()
    }

    /// The task is in this principal's scope.
    pub fn covers(&self, task: &str) -> bool {
        self.tasks
            .iter()
            .any(|p| glob(p.as_bytes(), task.as_bytes()))
    }
}

/// `*` matches any run of characters (`/` too); everything else matches itself.
pub fn glob(pat: &[u8], s: &[u8]) -> bool {
    // Iterative match with one backtrack point: linear in practice.
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() && pat[p] == b'*' {
            star = Some((p, i));
            p += 1;
        } else if p < pat.len() && pat[p] == s[i] {
            p += 1;
            i += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// sha256 of a bearer token.
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Why the auth file's text is not a list of principals.
#[derive(Debug, thiserror::Error)]
pub enum PrincipalsError {
    /// Not TOML, or not the file's shape (unknown field, bad role, ...).
    #[error("{0}")]
    Toml(#[source] toml::de::Error),
    /// The `n`th `[[principal]]` (from 1) is wrong.
    #[error("principal {n} (`{name}`): {problem}")]
    Principal {
        n: usize,
        name: String,
        #[source]
        problem: PrincipalProblem,
    },
}

/// What is wrong with one principal of the auth file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalProblem {
    #[error("`name` must be 1 to 128 printable characters")]
    BadName,
    #[error("the name is used twice")]
    NameTwice,
    #[error("`token_sha256` must be 64 hex digits")]
    BadHash,
    #[error("needs `token_sha256` or `cert_name`")]
    NoCredential,
    #[error("`cert_name` is empty")]
    EmptyCertName,
    #[error("`tasks` is empty (use [\"*\"] for all)")]
    NoTasks,
}

/// Why the auth file could not be loaded; the message starts with its path.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Whoever can write the file can grant themselves any role.
    #[error(
        "{}: writable by group or others (mode {:o}); chmod go-w it",
        path.display(),
        mode & 0o7777
    )]
    Loose { path: PathBuf, mode: u32 },
    #[error(
        "{}: owned by uid {uid}, not by root or by the user serve runs as (uid {me})",
        path.display()
    )]
    NotOwned { path: PathBuf, uid: u32, me: u32 },
    /// A symlink, not a regular file, or a directory on its path is not safe.
    #[error(transparent)]
    Unsafe(#[from] crate::sys::paths::PathError),
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: PrincipalsError,
    },
}

/// The principals of one version of the auth file.
#[derive(Debug, Default)]
pub struct Principals {
    list: Vec<Arc<Principal>>,
}

impl Principals {
    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<Self, PrincipalsError> {
        let raw: RawFile = toml::from_str(text).map_err(PrincipalsError::Toml)?;
        let mut list = Vec::new();
        for (n, p) in raw.principal.into_iter().enumerate() {
            let refuse = |problem| PrincipalsError::Principal {
                n: n + 1,
                name: p.name.clone(),
                problem,
            };
            if p.name.is_empty() || p.name.len() > 128 || p.name.chars().any(char::is_control) {
                return Err(refuse(PrincipalProblem::BadName));
            }
            if list.iter().any(|q: &Arc<Principal>| q.name == p.name) {
                return Err(refuse(PrincipalProblem::NameTwice));
            }
            let token_sha256 = match &p.token_sha256 {
                None => None,
                Some(h) => Some(unhex32(h).ok_or_else(|| refuse(PrincipalProblem::BadHash))?),
            };
            match (&token_sha256, &p.cert_name) {
                (None, None) => return Err(refuse(PrincipalProblem::NoCredential)),
                (_, Some(c)) if c.is_empty() => {
                    return Err(refuse(PrincipalProblem::EmptyCertName));
                }
                _ => {}
            }
            if p.tasks.is_empty() {
                return Err(refuse(PrincipalProblem::NoTasks));
            }
            list.push(Arc::new(Principal {
                name: p.name,
                role: p.role,
                token_sha256,
                cert_name: p.cert_name,
                tasks: p.tasks,
                max_leases: p.max_leases,
            }));
        }
        Ok(Principals { list })
    }

    /// Reads and parses the file, refusing one that is not safe (see the
    /// module doc).
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        use std::io::Read;
        let text = {
            let fd = open_safe(path)?;
            let mut text = String::new();
            std::fs::File::from(fd)
                .take(FILE_LIMIT)
                .read_to_string(&mut text)
                .map_err(|source| AuthFileError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
            text
        };
        Principals::parse(&text).map_err(|source| AuthFileError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The principal a request speaks for: by its bearer token if it sends
    /// one (an unknown token is not excused by a certificate), else by the
    /// client certificate's names. `None` when nobody matches, or when more
    /// than one principal does (ambiguous: refused, whatever the order).
    pub fn identify(&self, bearer: Option<&str>, cert_names: &[String]) -> Option<&Arc<Principal>> {
        let mut matches: Vec<&Arc<Principal>> = Vec::with_capacity(1);
        if let Some(tok) = bearer {
            let h = token_hash(tok);
            // Compare every hash fully: no early exit on the first byte.
            matches.extend(self.list.iter().filter(|p| {
                p.token_sha256.is_some_and(|t| {
                    t.iter()
                        .zip(h.iter())
                        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                        == 0
                })
            }));
        } else {
            matches.extend(self.list.iter().filter(|p| {
                p.cert_name
                    .as_deref()
                    .is_some_and(|c| cert_names.iter().any(|n| n.eq_ignore_ascii_case(c)))
            }));
        }
        match matches.as_slice() {
            [one] => Some(one),
            [] => None,
            many => {
                let names: Vec<&str> = many.iter().map(|p| p.name.as_str()).collect();
                log::warn!("a credential matches more than one principal ({names:?}): refused");
                None
            }
        }
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.list.len()
    }
}

/// The auth file as `serve` uses it: `None` without `--auth-file`.
pub struct Auth {
    path: Option<PathBuf>,
    current: RwLock<Arc<Principals>>,
    /// Reload figures for `/metrics`.
    pub stats: AuthStats,
}

/// What `/metrics` shows about the auth file.
#[derive(Debug, Default)]
pub struct AuthStats {
    /// SIGHUP reloads that failed (the old principals were kept).
    pub reload_failures: AtomicU64,
    /// Wall-clock time (Unix seconds) of the last good load; for people
    /// and alerts only, never for lease arithmetic.
    pub last_good_load_unix: AtomicU64,
}

impl AuthStats {
    fn loaded(&self) {
        let now = crate::time::wall_ms() / 1000;
        self.last_good_load_unix.store(now, Ordering::Relaxed);
    }
}

impl Auth {
    pub fn open(path: Option<PathBuf>) -> Result<Self, AuthFileError> {
        let current = match &path {
            Some(p) => Principals::load(p)?,
            None => Principals::default(),
        };
        let auth = Auth {
            path,
            current: RwLock::new(Arc::new(current)),
            stats: AuthStats::default(),
        };
        auth.stats.loaded();
        Ok(auth)
    }

    pub fn enabled(&self) -> bool {
        self.path.is_some()
    }

    pub fn current(&self) -> Arc<Principals> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Re-reads the file (SIGHUP); on error keeps the old principals (as
    /// trust.md says) and counts the failure for `/metrics`.
    pub fn reload(&self) {
        let Some(path) = &self.path else { return };
        match Principals::load(path) {
            Ok(p) => {
                let n = p.len();
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(p);
                self.stats.loaded();
                eprintln!("leaseagent serve: auth file reloaded: {n} principal(s)");
            }
            Err(e) => {
                self.stats.reload_failures.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "leaseagent serve: error: auth file not reloaded, keeping the old one: {e}"
                );
            }
        }
    }
}

/// Largest auth file read.
const FILE_LIMIT: u64 = 4 << 20;

/// Opens the auth file if it is safe (module doc), checked on the open
/// descriptor.
fn open_safe(path: &Path) -> Result<std::os::fd::OwnedFd, AuthFileError> {
    let (fd, st) = crate::sys::paths::open_checked_file(path)?;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != 0 && st.st_uid != me {
        return Err(AuthFileError::NotOwned {
            path: path.to_path_buf(),
            uid: st.st_uid,
            me,
        });
    }
    if st.st_mode & 0o022 != 0 {
        return Err(AuthFileError::Loose {
            path: path.to_path_buf(),
            mode: st.st_mode,
        });
    }
    Ok(fd)
}

/// `leaseagent token new`: a fresh random bearer token on stdout, its
/// `token_sha256` line for the auth file on stderr.
pub fn token_new() -> std::process::ExitCode {
    let mut raw = [0u8; 32];
    let mut filled = 0;
    while filled < raw.len() {
        match rustix::rand::getrandom(&mut raw[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                eprintln!("leaseagent token new: error: getrandom: {e}");
                return std::process::ExitCode::from(crate::exit::AGENT_FAILED);
            }
        }
    }
    use base64::Engine;
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
    println!("{token}");
    eprintln!("token_sha256 = \"{}\"", hex(&token_hash(&token)));
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_star_matches_any_run_including_slashes() {
        let g = |p: &str, s: &str| glob(p.as_bytes(), s.as_bytes());
        assert!(g("*", "anything/at/all"));
        assert!(g("nightly-*", "nightly-export"));
        assert!(!g("nightly-*", "weekly-export"));
        assert!(g("etl/*", "etl/a/b"));
        assert!(g("a*b*c", "a-x-b-y-c"));
        assert!(!g("a*b*c", "a-x-b-y"));
        assert!(g("exact", "exact"));
        assert!(!g("exact", "exactly"));
        assert!(g("*-end", "x-end"));
    }

    #[test]
    fn principals_parse_and_identify() {
        let h = hex(&token_hash("secret"));
        let text = format!(
            "[[principal]]\nname = \"a\"\nrole = \"agent\"\ntoken_sha256 = \"{h}\"\ntasks = [\"n-*\"]\n\
             [[principal]]\nname = \"w\"\nrole = \"reader\"\ncert_name = \"w1.example.org\"\ntasks = [\"*\"]\n"
        );
        let p = Principals::parse(&text).unwrap();
        assert_eq!(p.identify(Some("secret"), &[]).unwrap().name, "a");
        assert!(p.identify(Some("nope"), &[]).is_none());
        let names = vec!["w1.example.org".to_string()];
        assert_eq!(p.identify(None, &names).unwrap().name, "w");
        assert!(p.identify(None, &[]).is_none());
        // Two principals match: nobody, whatever the order.
        let both = format!(
            "{text}[[principal]]\nname = \"ops\"\nrole = \"operator\"\ncert_name = \"ops\"\ntasks = [\"*\"]\n"
        );
        let p2 = Principals::parse(&both).unwrap();
        let two = vec!["w1.example.org".to_string(), "ops".to_string()];
        assert!(p2.identify(None, &two).is_none());
        assert_eq!(p2.identify(None, &two[1..]).unwrap().name, "ops");
        let same_token = format!(
            "{text}[[principal]]\nname = \"b\"\nrole = \"operator\"\ntoken_sha256 = \"{h}\"\ntasks = [\"*\"]\n"
        );
        let p3 = Principals::parse(&same_token).unwrap();
        assert!(p3.identify(Some("secret"), &[]).is_none());
        let e = Principals::parse("[[principal]]\nname=\"x\"\nrole=\"agent\"\ntasks=[\"*\"]\n")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "principal 1 (`x`): needs `token_sha256` or `cert_name`"
        );
        let two = format!(
            "{text}[[principal]]\nname = \"a\"\nrole = \"agent\"\ncert_name = \"c\"\ntasks = []\n"
        );
        assert_eq!(
            Principals::parse(&two).unwrap_err().to_string(),
            "principal 3 (`a`): the name is used twice"
        );
        assert!(
            Principals::parse(
                "[[principal]]\nname=\"x\"\nrole=\"boss\"\ntoken_sha256=\"00\"\ntasks=[\"*\"]\n"
            )
            .is_err()
        );
    }
}
