//! `leaseagent serve`: the reference lease authority over HTTP(S).
//!
//! Wiring only: the engine (`engine::batched`) holds the rules and the
//! durability, [`http`] the connections (hyper on tokio, rustls), [`loops`]
//! the threads they run on, [`api`] the protocol, [`auth`] the principals.
//! The tokio runtimes are built here and in [`loops`], nowhere else: the
//! agent's path never starts one.
//! SIGTERM and SIGINT stop accepting, let open requests finish (bounded),
//! commit whatever the writer has queued, and exit 0. SIGHUP re-reads the
//! auth file.

pub mod api;
pub mod auth;
pub mod certnames;
pub mod cursor;
pub mod guard;
pub mod http;
pub mod leader;
pub mod loops;
pub mod metrics;
pub mod replica;
pub mod standby;
pub mod status;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::EngineError;
use crate::engine::batched::BatchedEngine;
use crate::engine::sqlite::SqliteStore;
use replica::Replica;

/// Arguments of `leaseagent serve` (flags and help: `cmd::defs::SERVE`).
#[derive(Debug, Clone, Default)]
pub struct ServeArgs {
    /// `--listen`: address to listen on; anything but loopback needs TLS and
    /// an auth file, or `--insecure-listen`.
    pub listen: String,
    /// `--db`: the SQLite database file (empty with `--store`).
    pub db: PathBuf,
    /// `--store`: a PostgreSQL URL that several replicas share.
    pub store: Option<String>,
    /// `--store-password-file`: the store's password (mode 0600).
    pub store_password_file: Option<PathBuf>,
    /// `--store-allow-async`: run on a store replicating asynchronously.
    pub store_allow_async: bool,
    /// `--advertise`: the URL clients reach this replica at (named to them
    /// by standbys); default: the listening address.
    pub advertise: Option<String>,
    /// `--leader-ttl`: how long a leadership lasts past its last confirmed
    /// renewal.
    pub leader_ttl: Duration,
    /// `--tls-cert`, `--tls-key`: serve HTTPS (both or neither).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// `--client-ca`: require client certificates from these CAs.
    pub client_ca: Option<PathBuf>,
    /// `--auth-file`: the principals.
    pub auth_file: Option<PathBuf>,
    /// `--no-auth`: run without an auth file, said explicitly (the command
    /// line refuses neither-nor and both).
    pub no_auth: bool,
    /// `--server-name` (repeatable): names the `Host` header may carry
    /// besides the listen address (`guard`).
    pub server_names: Vec<String>,
    /// `--insecure-listen`.
    pub insecure_listen: bool,
    /// `--max-connections`: most open connections in all.
    pub max_connections: usize,
    /// `--max-connections-per-peer`: most open connections from one address.
    pub max_connections_per_peer: usize,
    /// `--max-unauthenticated-connections`: most open connections that have
    /// made no authenticated request (at most half of `--max-connections`).
    pub max_unauthenticated: usize,
    /// `--max-new-tasks-per-hour`: most distinct tasks one principal may
    /// create in an hour (with an auth file).
    pub max_new_tasks_per_hour: u64,
    /// `--metrics-max-tasks`: most tasks named in each per-task family of
    /// `/metrics` (the rest in one `task="(other)"` series).
    pub metrics_max_tasks: usize,
    /// `--max-leases`: the most live leases overall (`None`: no limit).
    pub max_leases: Option<u64>,
    /// `--max-leases-per-principal`: the cap of a principal whose entry in
    /// the auth file has no `max_leases` (without an auth file, of all
    /// clients together).
    pub max_leases_per_principal: u64,
    /// `--history-max-age`, `--history-max-rows`,
    /// `--history-max-rows-per-principal`: how much run history is kept.
    pub history: crate::engine::history::Bounds,
    /// `--status-listen`: a loopback address serving the status page
    /// without credentials (every task, to every local user: docs/history.md).
    pub status_listen: Option<String>,
    /// `--status-held-alert`: a task held for an operator longer than this
    /// is shown red on the status page.
    pub status_held_alert: Duration,
}

/// The line printed to stderr once the server listens (tests parse it);
/// followed by `http://ADDR` or `https://ADDR`.
pub const LISTENING: &str = "leaseagent serve: listening on ";

/// The line printed to stderr once the status listener listens; followed
/// by `http://ADDR`.
pub const STATUS_LISTENING: &str = "leaseagent serve: status page on ";

/// Most connections the status listener keeps open (it serves one page to
/// people, never a fleet).
const STATUS_MAX_CONNECTIONS: usize = 64;

/// Why `serve` could not start (or stopped listening): exit 125 with one
/// line that names the flag or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--tls-key {}: {source}", path.display())]
    KeyMeta {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// As ssh refuses such keys; group-readable is allowed.
    #[error(
        "--tls-key {}: readable by others (mode {:o}); chmod o-r it",
        path.display(),
        mode & 0o7777
    )]
    KeyLoose { path: PathBuf, mode: u32 },
    /// A symlink, not a regular file, or a directory on its path is not safe.
    #[error("--tls-key {source}")]
    KeyFile {
        path: PathBuf,
        #[source]
        source: crate::sys::paths::PathError,
    },
    /// A certificate file (`--tls-cert`, `--client-ca`) reached through a
    /// link or a directory another user controls (`sys::walk`).
    #[error("{flag} {source}")]
    CertFile {
        flag: &'static str,
        #[source]
        source: crate::sys::paths::PathError,
    },
    /// `--db`'s file or a directory above it is not safe.
    #[error("--db {}: {source}", path.display())]
    DbFile {
        path: PathBuf,
        #[source]
        source: crate::sys::paths::PathError,
    },
    /// A PEM file (`--tls-cert`, `--tls-key`, `--client-ca`) unreadable or
    /// malformed.
    #[error("{flag} {}: {source}", path.display())]
    Pem {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("{flag} {}: no certificate in the file", path.display())]
    NoCertificate { flag: &'static str, path: PathBuf },
    #[error("TLS: {0}")]
    Tls(#[source] rustls::Error),
    #[error("--client-ca {}: {source}", path.display())]
    ClientCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("--client-ca {}: {source}", path.display())]
    ClientVerifier {
        path: PathBuf,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    /// The certificate and the key do not go together (or are unusable).
    #[error("--tls-cert/--tls-key: {0}")]
    CertKey(#[source] rustls::Error),
    #[error("--auth-file {0}")]
    AuthFile(#[source] auth::AuthFileError),
    #[error("--listen {listen}: {source}")]
    Resolve {
        listen: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--listen {listen}: no address")]
    NoAddress { listen: String },
    #[error(
        "--status-listen {0}: must be a loopback address (the status page needs no credentials there)"
    )]
    StatusNotLoopback(String),
    #[error("--status-listen {listen}: {source}")]
    StatusListen {
        listen: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "--listen {listen}: not a loopback address; serving a network needs --tls-cert, --tls-key and \
         --auth-file (or --insecure-listen to accept the risk)"
    )]
    NotLoopback { listen: String },
    #[error("{}: {source}", path.display())]
    Database {
        path: PathBuf,
        #[source]
        source: crate::engine::EngineError,
    },
    /// `--store`'s URL or password file cannot be used.
    #[error("{0}")]
    StoreConfig(#[source] crate::engine::postgres::connect::ConfigError),
    /// The PostgreSQL store could not be prepared (reached, migrated).
    #[error("--store {url}: {}", crate::engine::error::chain(source))]
    Store {
        url: String,
        #[source]
        source: crate::engine::error::StoreError,
    },
    #[error("starting the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("the kernel's random numbers: {0}")]
    Random(#[source] std::io::Error),
    #[error("starting the event loops: {0}")]
    Loops(#[source] std::io::Error),
    #[error("installing signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("starting the signal thread: {0}")]
    SignalThread(#[source] std::io::Error),
    /// Binding or accepting on the listen address failed.
    #[error("--listen {listen}: {source}")]
    Listen {
        listen: String,
        #[source]
        source: std::io::Error,
    },
}

/// A configuration error: exit 125 with one line.
fn usage(e: &ServeError) -> ExitCode {
    eprintln!("leaseagent serve: error: {e}");
    ExitCode::from(crate::exit::AGENT_FAILED)
}

/// Raises the soft open-files limit to the hard one: every connection is a
/// descriptor, and the default soft limit (often 1024) is far below a fleet.
fn raise_nofile() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            log::warn!("cannot raise the open-files limit: {e}");
        }
    }
}

/// The TLS acceptor (`None` without `--tls-cert`), and the names in the
/// server certificate (for `guard::HostNames`).
type Tls = (Option<tokio_rustls::TlsAcceptor>, Option<certnames::Names>);

fn tls_config(args: &ServeArgs) -> Result<Tls, ServeError> {
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok((None, None));
    };
    let key_pem = read_key_file(key)?;
    let chain = read_certs("--tls-cert", cert)?;
    let names = chain.first().and_then(|c| certnames::read(c));
    let pkey = PrivateKeyDer::from_pem_slice(&key_pem).map_err(pem_error("--tls-key", key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ServeError::Tls)?;
    let builder = match &args.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs("--client-ca", ca)? {
                roots.add(c).map_err(|source| ServeError::ClientCa {
                    path: ca.clone(),
                    source,
                })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|source| ServeError::ClientVerifier {
                path: ca.clone(),
                source,
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, pkey)
        .map_err(ServeError::CertKey)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        names,
    ))
}

/// The names `Host` may carry besides the address a connection arrived on
/// (`guard`): the `--listen` host when it is a name or a specific address,
/// every `--server-name`, and the server certificate's DNS and IP names.
fn host_names(args: &ServeArgs, cert: Option<&certnames::Names>) -> guard::HostNames {
    let mut names = guard::HostNames::default();
    let host = match args.listen.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => args.listen.as_str(),
    };
    if host
        .parse::<IpAddr>()
        .map_or(true, |ip| !ip.is_unspecified())
    {
        names.add(host);
    }
    for n in &args.server_names {
        names.add(n);
    }
    if let Some(c) = cert {
        for n in &c.dns {
            names.add(n);
        }
        for ip in &c.ips {
            names.add(&ip.to_string());
        }
        if !c.has_san {
            for cn in &c.cns {
                names.add(cn);
            }
        }
    }
    names
}

/// A [`ServeError::Pem`] for the file `flag` names.
fn pem_error(
    flag: &'static str,
    path: &Path,
) -> impl FnOnce(rustls_pki_types::pem::Error) -> ServeError {
    move |source| ServeError::Pem {
        flag,
        path: path.to_path_buf(),
        source,
    }
}

/// Every certificate of the PEM file `flag` names; none is an error.
fn read_certs(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, ServeError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use std::io::Read;
    // Walked from `/` as the kernel's protected_symlinks rule would
    // (`sys::walk`): a link another user owns or can re-point is refused.
    let (fd, _) = crate::sys::paths::open_checked_file_following(path)
        .map_err(|source| ServeError::CertFile { flag, source })?;
    let mut pem = Vec::new();
    std::fs::File::from(fd)
        .take(4 << 20)
        .read_to_end(&mut pem)
        .map_err(|e| pem_error(flag, path)(rustls_pki_types::pem::Error::Io(e)))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error(flag, path))?;
    if certs.is_empty() {
        return Err(ServeError::NoCertificate {
            flag,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Reads the `--tls-key` file without following a symlink at its last
/// component, from a directory chain no other user can write to, checked
/// on the descriptor that is read. A private key readable by others is
/// refused (as ssh refuses such keys); group-readable is allowed, for the
/// common `root:ssl-cert 0640` setup.
fn read_key_file(path: &Path) -> Result<Vec<u8>, ServeError> {
    use std::io::Read;
    let (fd, st) =
        crate::sys::paths::open_checked_file(path).map_err(|source| ServeError::KeyFile {
            path: path.to_path_buf(),
            source,
        })?;
    if st.st_mode & 0o004 != 0 {
        return Err(ServeError::KeyLoose {
            path: path.to_path_buf(),
            mode: st.st_mode,
        });
    }
    let mut pem = Vec::new();
    std::fs::File::from(fd)
        .take(1 << 20)
        .read_to_end(&mut pem)
        .map_err(|source| ServeError::KeyMeta {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(pem)
}

/// Runs `leaseagent serve`: exit 0 after a clean stop, 125 with one line
/// on a configuration or startup error.
pub fn main(args: ServeArgs) -> ExitCode {
    init_logging();
    match serve(&args) {
        Ok(()) => {
            eprintln!("leaseagent serve: stopped");
            ExitCode::SUCCESS
        }
        Err(e) => usage(&e),
    }
}

/// serve's log records on stderr as `leaseagent serve: LEVEL: ...`,
/// `warn` and above unless `RUST_LOG` says otherwise, the wire crates
/// capped ([`crate::sys::logcap`]). Without a logger every `log::warn!` and
/// `log::error!` of the server was dropped: a replica that could not load
/// the store's rows, or was deposed, said nothing of it.
fn init_logging() {
    use std::io::Write;
    let env = env_logger::Env::default().filter_or("RUST_LOG", "warn");
    let mut builder = env_logger::Builder::from_env(env);
    builder.format(|buf, record| {
        writeln!(
            buf,
            "leaseagent serve: {}: {}",
            record.level().as_str().to_lowercase(),
            record.args()
        )
    });
    crate::sys::logcap::install(builder.build());
}

/// The server's lifecycle, one named step each.
fn serve(args: &ServeArgs) -> Result<(), ServeError> {
    let (tls, cert_names) = tls_config(args)?;
    let auth = load_auth(args)?;
    let addr = listen_address(args, tls.is_some(), &auth)?;
    let status_addr = status_address(args)?;
    let names = Arc::new(host_names(args, cert_names.as_ref()));
    raise_nofile();
    let rt = build_runtime()?;
    // The store's own runtime (PostgreSQL's client), when there is one.
    let store_rt = match &args.store {
        Some(_) => Some(build_store_runtime()?),
        None => None,
    };
    let listen_err = |source| ServeError::Listen {
        listen: args.listen.clone(),
        source,
    };
    // Bound first: the URL a replica advertises has the port it got.
    let listener = {
        let _in_rt = rt.enter();
        listen(addr).map_err(listen_err)?
    };
    let local = listener.local_addr().map_err(listen_err)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let advertise = args
        .advertise
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{local}"));
    let replica = open_replica(
        args,
        store_rt.as_ref().map(|r| r.handle().clone()),
        advertise,
    )?;
    let stop_rx = watch_signals(auth.clone())?;
    let listeners = Listeners {
        listener,
        status_addr,
        tls,
        names,
    };
    let served = run(args, listeners, auth, replica.clone(), rt, stop_rx);
    replica.shutdown();
    if let Some(rt) = store_rt {
        rt.shutdown_timeout(Duration::from_secs(1));
    }
    served
}

/// Where and how `serve` listens: the API's listener, bound already (the
/// URL a replica advertises has its port), and the status listener's
/// address.
struct Listeners {
    listener: tokio::net::TcpListener,
    status_addr: Option<SocketAddr>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    names: Arc<guard::HostNames>,
}

/// The PostgreSQL client's runtime: one worker drives every connection;
/// the threads that use the store block on it (`engine/postgres/conn.rs`).
fn build_store_runtime() -> Result<tokio::runtime::Runtime, ServeError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("store")
        .enable_io()
        .enable_time()
        .build()
        .map_err(ServeError::Runtime)
}

/// This replica: on SQLite (`--db`) the one engine, always leading; on
/// PostgreSQL (`--store`) a standby whose leadership thread takes over
/// when it may.
fn open_replica(
    args: &ServeArgs,
    store_rt: Option<tokio::runtime::Handle>,
    advertise: String,
) -> Result<Arc<Replica>, ServeError> {
    let (Some(url), Some(rt)) = (&args.store, store_rt) else {
        let engine = open_engine(args)?;
        return Ok(Replica::single(engine, advertise));
    };
    let env = |k: &str| std::env::var(k).ok();
    let mut cfg =
        crate::engine::postgres::connect::configure(url, args.store_password_file.as_deref(), &env)
            .map_err(ServeError::StoreConfig)?;
    cfg.idle_tx_ms = (crate::time::ms(args.leader_ttl) / 2).max(1000);
    let store_err = |source| ServeError::Store {
        url: url.clone(),
        source,
    };
    crate::engine::postgres::PgStore::prepare(&cfg, &rt, args.store_allow_async)
        .map_err(store_err)?;
    let limits = engine_limits(args);
    let config = replica::Replicated {
        cfg,
        rt,
        limits,
        timing: leader::Timing::for_ttl(crate::time::ms(args.leader_ttl)),
        allow_async: args.store_allow_async,
    };
    Replica::replicated(config, advertise).map_err(ServeError::Loops)
}

/// Resolves `--status-listen`: loopback only, whatever else is configured.
fn status_address(args: &ServeArgs) -> Result<Option<SocketAddr>, ServeError> {
    let Some(listen) = &args.status_listen else {
        return Ok(None);
    };
    let err = |source| ServeError::StatusListen {
        listen: listen.clone(),
        source,
    };
    let addrs: Vec<SocketAddr> = listen.to_socket_addrs().map_err(err)?.collect();
    match addrs.first() {
        Some(a) if addrs.iter().all(|a| is_loopback(a.ip())) => Ok(Some(*a)),
        _ => Err(ServeError::StatusNotLoopback(listen.clone())),
    }
}

fn load_auth(args: &ServeArgs) -> Result<Arc<auth::Auth>, ServeError> {
    auth::Auth::open(args.auth_file.clone())
        .map(Arc::new)
        .map_err(ServeError::AuthFile)
}

/// Resolves `--listen` and applies the listen rule: anything but loopback
/// needs TLS and an auth file, or `--insecure-listen`.
fn listen_address(
    args: &ServeArgs,
    tls: bool,
    auth: &auth::Auth,
) -> Result<SocketAddr, ServeError> {
    let listen = || args.listen.clone();
    let addrs: Vec<SocketAddr> = args
        .listen
        .to_socket_addrs()
        .map_err(|source| ServeError::Resolve {
            listen: listen(),
            source,
        })?
        .collect();
    let Some(addr) = addrs.first().copied() else {
        return Err(ServeError::NoAddress { listen: listen() });
    };
    let secured = tls && auth.enabled();
    if !args.insecure_listen && !secured && addrs.iter().any(|a| !is_loopback(a.ip())) {
        return Err(ServeError::NotLoopback { listen: listen() });
    }
    Ok(addr)
}

/// The engine's bounds, whichever store is behind it.
fn engine_limits(args: &ServeArgs) -> crate::engine::batched::Limits {
    let mut history = args.history;
    if args.auth_file.is_none() {
        // Every client is one principal: the per-principal bound would
        // only shrink the one history there is.
        history.max_rows_per_principal = history.max_rows;
    }
    crate::engine::batched::Limits {
        max_live_leases: args.max_leases,
        history,
        // Without an auth file every client is one principal: no cap on
        // the tasks all of them create together.
        max_new_tasks_per_hour: args
            .auth_file
            .is_some()
            .then_some(args.max_new_tasks_per_hour),
    }
}

fn open_engine(args: &ServeArgs) -> Result<BatchedEngine, ServeError> {
    // Created 0600, no symlink followed, no directory on the path writable
    // by another user; SQLite then opens it through the checked directory.
    crate::sys::paths::prepare_db_file(&args.db).map_err(|source| ServeError::DbFile {
        path: args.db.clone(),
        source,
    })?;
    let limits = engine_limits(args);
    // The store behind the engine's storage seam: the SQLite file.
    SqliteStore::open(&args.db)
        .map_err(EngineError::from)
        .and_then(|store| BatchedEngine::start(store, limits))
        .map_err(|source| ServeError::Database {
            path: args.db.clone(),
            source,
        })
}

/// The accepting runtime (this thread); connections are served on the
/// [`loops`].
fn build_runtime() -> Result<tokio::runtime::Runtime, ServeError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(ServeError::Runtime)
}

/// A thread for SIGTERM/SIGINT (stop: the returned channel turns true) and
/// SIGHUP (re-read the auth file).
fn watch_signals(auth: Arc<auth::Auth>) -> Result<tokio::sync::watch::Receiver<bool>, ServeError> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(ServeError::Signals)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == signal_hook::consts::SIGHUP {
                    auth.reload();
                    continue;
                }
                eprintln!("leaseagent serve: signal {sig}, shutting down");
                let _ = stop_tx.send(true);
                break;
            }
        })
        .map_err(ServeError::SignalThread)?;
    Ok(stop_rx)
}

/// Listens, serves until told to stop, then drains the runtime and commits
/// what the engine's writer has queued.
fn run(
    args: &ServeArgs,
    listeners: Listeners,
    auth: Arc<auth::Auth>,
    replica: Arc<Replica>,
    rt: tokio::runtime::Runtime,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let Listeners {
        listener,
        status_addr,
        tls,
        names,
    } = listeners;
    let limits = http::Limits {
        max_connections: args.max_connections.max(1),
        max_per_peer: args.max_connections_per_peer.max(1),
        // Never more than half of all slots: the other half is for
        // connections that speak for a principal.
        max_unauthenticated: args
            .max_unauthenticated
            .min(args.max_connections / 2)
            .max(1),
        ..http::Limits::default()
    };
    // The status listener answers only unauthenticated requests: a small
    // budget of its own.
    let status_limits = http::Limits {
        max_connections: limits.max_connections.min(STATUS_MAX_CONNECTIONS),
        max_per_peer: limits.max_per_peer.min(STATUS_MAX_CONNECTIONS),
        max_unauthenticated: limits.max_connections.min(STATUS_MAX_CONNECTIONS),
        ..limits.clone()
    };
    let conns = Arc::new(http::ConnStats::default());
    let status = Arc::new(status::Status::new(args.status_held_alert));
    let api = Arc::new(api::Api {
        replica: replica.clone(),
        latency: metrics::Latency::default(),
        auth,
        conns: conns.clone(),
        default_max_leases: args.max_leases_per_principal,
        status: status.clone(),
        metrics_max_tasks: args.metrics_max_tasks,
        cursors: cursor::Sealer::new().map_err(ServeError::Random)?,
    });
    let status_only = Arc::new(standby::StatusOnly {
        replica: replica.clone(),
        conns: conns.clone(),
        status,
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    let db = match &args.store {
        Some(url) => format!("store {url}, advertised as {}", replica.url),
        None => format!("db {}", args.db.display()),
    };
    let loops = loops::Loops::start(loops::count()).map_err(ServeError::Loops)?;
    let handles = loops.handles().to_vec();
    let listen_err = |source| ServeError::Listen {
        listen: args.listen.clone(),
        source,
    };
    let status_err = |source| ServeError::StatusListen {
        listen: args.status_listen.clone().unwrap_or_default(),
        source,
    };
    let served = rt.block_on(async move {
        let local = listener.local_addr().map_err(listen_err)?;
        eprintln!("{LISTENING}{scheme}://{local} ({db})");
        let status_server = match status_addr {
            None => None,
            Some(a) => {
                let l = listen(a).map_err(status_err)?;
                let local = l.local_addr().map_err(status_err)?;
                eprintln!("{STATUS_LISTENING}http://{local}");
                let stats = Arc::new(http::ConnStats::default());
                let server =
                    http::Server::new(status_limits, status_only, None, stats, names.clone());
                Some((l, Arc::new(server)))
            }
        };
        let server = Arc::new(http::Server::new(limits, api, tls, conns, names));
        let drain = Duration::from_secs(3);
        let main = http::run(listener, server, stop_rx.clone(), drain, &handles);
        match status_server {
            None => main.await,
            Some((l, s)) => {
                let side = http::run(l, s, stop_rx, Duration::from_secs(1), &handles);
                tokio::join!(main, side);
            }
        }
        Ok::<(), ServeError>(())
    });
    loops.stop();
    rt.shutdown_timeout(Duration::from_secs(1));
    served
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Binds with a deep accept queue: a fleet reconnecting at once (after a
/// restart) must not overflow the default backlog of 128.
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let sock = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn errors_name_the_flag_and_the_file() {
        let d = tempfile::tempdir().unwrap();
        let key = d.path().join("key.pem");
        std::fs::write(&key, "").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            read_key_file(&key).unwrap_err().to_string(),
            format!(
                "--tls-key {}: readable by others (mode 644); chmod o-r it",
                key.display()
            )
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(read_key_file(&key).is_ok());
        let link = d.path().join("link.pem");
        std::os::unix::fs::symlink(&key, &link).unwrap();
        assert_eq!(
            read_key_file(&link).unwrap_err().to_string(),
            format!("--tls-key refusing {}: it is a symlink", link.display())
        );
        let e = read_certs("--client-ca", &key).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--client-ca {}: no certificate in the file", key.display())
        );
        let auth = d.path().join("auth.toml");
        std::fs::write(&auth, "").unwrap();
        std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o664)).unwrap();
        let e = ServeError::AuthFile(auth::Auth::open(Some(auth.clone())).err().unwrap());
        assert_eq!(
            e.to_string(),
            format!(
                "--auth-file {}: writable by group or others (mode 664); chmod go-w it",
                auth.display()
            )
        );
    }
}
