//! `leaseagent serve`: the reference lease authority over HTTP.
//!
//! Wiring only: the engine (`engine::memory`) holds the rules and the
//! durability, [`http`] the connection handling, [`api`] the protocol.
//! SIGTERM and SIGINT stop accepting, let open requests finish (bounded),
//! commit whatever the writer has queued, and exit 0.

pub mod api;
pub mod http;
pub mod metrics;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::engine::batched::ServeEngine;

/// Arguments of `leaseagent serve` (flags and help: `cmd::defs::SERVE`).
#[derive(Debug, Clone)]
pub struct ServeArgs {
    /// `--listen`: address to listen on.
    pub listen: String,
    /// `--db`: the SQLite database file.
    pub db: PathBuf,
    /// `--max-connections`: most open connections.
    pub max_connections: usize,
}

/// The line printed to stderr once the server listens (tests parse it).
pub const LISTENING: &str = "leaseagent serve: listening on http://";

fn wake_addr(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

pub fn main(args: ServeArgs) -> ExitCode {
    let fail = |m: String| {
        eprintln!("leaseagent serve: error: {m}");
        ExitCode::from(crate::exit::AGENT_FAILED)
    };
    let engine = match ServeEngine::open(&args.db) {
        Ok(e) => Arc::new(e),
        Err(e) => return fail(format!("{}: {e}", args.db.display())),
    };
    let listener = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => return fail(format!("--listen {}: {e}", args.listen)),
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return fail(format!("--listen {}: {e}", args.listen)),
    };
    let shutdown = Arc::new(AtomicBool::new(false));
    let mut signals = match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ]) {
        Ok(s) => s,
        Err(e) => return fail(format!("installing signal handlers: {e}")),
    };
    let flag = shutdown.clone();
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!("leaseagent serve: signal {sig}, shutting down");
                flag.store(true, Ordering::SeqCst);
                // Wake the acceptor out of accept().
                let _ = TcpStream::connect_timeout(&wake_addr(addr), Duration::from_secs(1));
            }
        });
    if let Err(e) = spawned {
        return fail(format!("starting the signal thread: {e}"));
    }
    eprintln!("{LISTENING}{addr} (db {})", args.db.display());
    let api = Arc::new(api::Api {
        engine: engine.clone(),
        latency: metrics::Latency::default(),
    });
    let limits = http::Limits {
        max_connections: args.max_connections.max(1),
        ..http::Limits::default()
    };
    http::run(listener, limits, api, shutdown, Duration::from_secs(3));
    engine.shutdown();
    eprintln!("leaseagent serve: stopped");
    ExitCode::SUCCESS
}
