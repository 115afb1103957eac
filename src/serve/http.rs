//! The HTTP/1.1 (and HTTPS) front of `serve`: hyper 1 on a tokio runtime,
//! rustls for TLS. This module is the only place that knows HTTP; [`Handler`]
//! sees complete, validated requests.
//!
//! Why this shape:
//! - **A connection costs a task, not a thread.** Every agent keeps one
//!   keep-alive connection open between heartbeats, so a fleet of 10,000
//!   agents is 10,000 idle sockets; each is a few KiB here.
//! - **Nothing blocks the event loop.** [`Handler::answer`] answers what
//!   needs no waiting at once (renewals, health, refusals); a grant waits
//!   for its fsync as a future ([`Answer::Later`]: no thread, no hand-off),
//!   and only work that takes a while (a listing) goes to tokio's blocking
//!   pool.
//! - **Per-peer and global connection limits, without lockout.** A peer
//!   (IP address) at `max_per_peer` open connections has any further one
//!   closed at once, on the accepting thread, before TLS and before it is
//!   counted anywhere: a flood from one address costs an accept and a close
//!   each, and never uses up the global budget that other peers share. A
//!   connection past `max_connections` (from a peer within its own limit)
//!   is still read and answered, once (it has 2 s to send its request):
//!   `/healthz` normally, everything else `503 overloaded`, then closed; it
//!   counts against its peer's limit but not against the global one, so
//!   answering it cannot push anyone else over. Limits are checked only
//!   when a connection is accepted: a connection already open (an agent's
//!   keep-alive connection) is never refused because of new ones.
//! - **A TLS handshake has [`HANDSHAKE_TIMEOUT`] to finish.** A client
//!   that connects and never (or slowly) speaks TLS holds its slot for that
//!   long, not for `request_timeout`.
//! - **Deadlines.** `idle_timeout` between requests (longer than the
//!   agents' 15 s connection pool, so the client closes first), and
//!   `request_timeout` from a request's first byte to its last body byte
//!   (a slowloris dribbling bytes is cut off there). Hyper's own
//!   `header_read_timeout` also runs while a keep-alive connection is idle,
//!   which would close agents' pooled connections under them, so this
//!   module keeps both deadlines itself ([`Watched`] notes the bytes,
//!   `serve_io` owns one timer per connection).
//! - **Strict framing.** httparse refuses a space before a header's colon;
//!   this module also refuses `Transfer-Encoding` (411), a Content-Length
//!   that is not plain digits (`+5`, `05`: 400), a bare LF in a request head
//!   (400), heads over `max_head` (431) and bodies over `max_body` (413,
//!   before reading them). Each of those answers carries `Connection:
//!   close`; the socket is then closed cleanly: write side shut, unread
//!   input drained briefly, so the client reads the answer, not a reset.
//!   The bare-LF check covers each request head read on its own; bytes of
//!   a pipelined request that arrive in the same read as the previous body
//!   are not checked (agents do not pipeline).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, TRANSFER_ENCODING};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::time::ms;

/// How long a connection past a limit, or one on probation (the
/// unauthenticated pool full), may wait before sending its request.
const OVER_LIMIT_IDLE: Duration = Duration::from_secs(2);

/// How long a TLS handshake may take, from the accept: long enough for a
/// client across a slow network, short enough that connections which never
/// finish it cannot hold slots for long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A complete request.
pub struct Request {
    pub method: String,
    /// The path, without any query string.
    pub path: String,
    /// The query string (after `?`), if any.
    pub query: Option<String>,
    /// The bearer token of `Authorization: Bearer …`, if any.
    pub bearer: Option<String>,
    /// The verified client certificate's names (its DNS SANs as written,
    /// or its CN when it has no subjectAltName extension), with mutual TLS.
    pub cert_names: Arc<Vec<String>>,
    pub body: Bytes,
    /// Set by the handler when the request spoke for a principal: the
    /// connection then moves to the authenticated pool.
    pub authenticated: AtomicBool,
}

impl Request {
    /// Notes that the request spoke for a principal.
    pub fn authenticate(&self) {
        self.authenticated.store(true, Ordering::Relaxed);
    }
}

/// An answer.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// `{"error": code, "message": message}`.
    pub fn error(status: u16, code: &str, message: &str) -> Self {
        Response::json(
            status,
            serde_json::json!({"error": code, "message": message}).to_string(),
        )
    }
}

/// What the server accepts.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_peer: usize,
    /// Most connections that have not (yet) made an authenticated request,
    /// within `max_connections` (see the module doc).
    pub max_unauthenticated: usize,
    pub max_head: usize,
    pub max_body: usize,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    /// Idle time allowed between requests on a connection that has made no
    /// authenticated request.
    pub unauthenticated_idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 16_384,
            max_per_peer: 1024,
            max_unauthenticated: 1024,
            max_head: 16 * 1024,
            max_body: 64 * 1024,
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            unauthenticated_idle_timeout: Duration::from_secs(10),
        }
    }
}

/// How a request is answered.
pub enum Answer {
    /// At once: it needed no waiting (a renewal, `/healthz`, a refusal).
    Now(Response),
    /// When this completes: it waits (for a commit) without blocking, so
    /// it runs on the event loop and holds no thread meanwhile.
    Later(Pin<Box<dyn Future<Output = Response> + Send>>),
    /// By this, on a blocking thread: work that takes a while (a listing).
    Blocking(Box<dyn FnOnce() -> Response + Send>),
}

/// Answers requests.
pub trait Handler: Send + Sync + 'static {
    /// Called on the event loop: must not block.
    fn answer(self: Arc<Self>, req: &Request) -> Answer;
}

/// Milliseconds since the server started (never 0, so 0 can mean "none"),
/// on the monotonic clock that times connections' deadlines
/// ([`instant_at`] turns one back into an `Instant`).
fn now_ms() -> u64 {
    static BASE: OnceLock<std::time::Instant> = OnceLock::new();
    let base = *BASE.get_or_init(std::time::Instant::now);
    ms(base.elapsed()).saturating_add(1)
}

fn instant_at(ms: u64) -> Instant {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    let (base, base_ms) = *BASE.get_or_init(|| (Instant::now(), now_ms()));
    base + Duration::from_millis(ms.saturating_sub(base_ms))
}

/// Per-connection bookkeeping shared by [`Watched`], the service and `serve_io`.
#[derive(Default)]
struct ConnState {
    /// When the current request's first byte arrived; 0 between requests.
    started_ms: AtomicU64,
    /// Last time a request completed (or the connection opened).
    last_ms: AtomicU64,
    /// A bare LF was seen in a request head.
    bare_lf: AtomicBool,
    /// The reader is inside a request head (scanning for bare LFs).
    in_head: AtomicBool,
    /// The peer closed its side.
    eof: AtomicBool,
}

impl ConnState {
    fn new() -> Self {
        let s = ConnState::default();
        s.last_ms.store(now_ms(), Ordering::Relaxed);
        s.in_head.store(true, Ordering::Relaxed);
        s
    }

    /// When the connection is closed unless bytes come: `request_timeout`
    /// after a request's first byte, else `idle` after the last answer.
    fn deadline(&self, limits: &Limits, idle: Duration) -> u64 {
        let started = self.started_ms.load(Ordering::Relaxed);
        if started != 0 {
            started.saturating_add(ms(limits.request_timeout))
        } else {
            self.last_ms
                .load(Ordering::Relaxed)
                .saturating_add(ms(idle))
        }
    }

    /// The request is fully read: the next bytes start a new head.
    fn request_read(&self) {
        self.last_ms.store(now_ms(), Ordering::Relaxed);
        self.started_ms.store(0, Ordering::Relaxed);
        self.in_head.store(true, Ordering::Relaxed);
    }

    fn answered(&self) {
        self.last_ms.store(now_ms(), Ordering::Relaxed);
    }
}

/// The connection's byte stream, noting arrivals for the deadlines and
/// scanning request heads for bare LFs. Dropping it closes the socket
/// cleanly (see [`linger_close`]).
struct Watched<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> {
    inner: Option<S>,
    state: Arc<ConnState>,
    /// The last bytes of the head seen so far (for CRLF CRLF and bare LF).
    prev: [u8; 3],
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Watched<S> {
    fn scan(&mut self, data: &[u8]) {
        let st = &self.state;
        if data.is_empty() {
            return;
        }
        if st.started_ms.load(Ordering::Relaxed) == 0 {
            st.started_ms.store(now_ms(), Ordering::Relaxed);
        }
        if !st.in_head.load(Ordering::Relaxed) {
            return;
        }
        for &b in data {
            if b == b'\n' && self.prev[2] != b'\r' {
                st.bare_lf.store(true, Ordering::Relaxed);
            }
            self.prev = [self.prev[1], self.prev[2], b];
            if b == b'\n' && self.prev == [b'\n', b'\r', b'\n'] {
                // CRLF CRLF: the head ends here.
                st.in_head.store(false, Ordering::Relaxed);
                self.prev = [0; 3];
                return;
            }
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "connection closed")
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Err(gone()));
        };
        let r = Pin::new(inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            let new = &buf.filled()[before..];
            if new.is_empty() {
                self.state.eof.store(true, Ordering::Relaxed);
            } else {
                self.scan(new);
            }
        }
        r
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.inner.as_mut() {
            Some(s) => Pin::new(s).poll_write(cx, buf),
            None => Poll::Ready(Err(gone())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner.as_mut() {
            Some(s) => Pin::new(s).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The clean close happens on drop (write side shut, input drained);
        // here only flush, so hyper's own shutdown does not skip the drain.
        match self.inner.as_mut() {
            Some(s) => Pin::new(s).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.inner.as_mut() {
            Some(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            None => Poll::Ready(Err(gone())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|s| s.is_write_vectored())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Drop for Watched<S> {
    fn drop(&mut self) {
        if let Some(s) = self.inner.take() {
            let eof = self.state.eof.load(Ordering::Relaxed);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(linger_close(s, eof));
            }
        }
    }
}

/// Closes without resetting: shut our write side (TLS: close_notify), then
/// discard input for a bounded time and amount, so a client still sending
/// a body we refused reads our answer instead of a reset.
async fn linger_close<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, eof: bool) {
    let _ = tokio::time::timeout(Duration::from_millis(500), s.shutdown()).await;
    if eof {
        return;
    }
    let drain = async {
        let mut left: usize = 1 << 20;
        let mut scratch = vec![0u8; 16 * 1024];
        while left > 0 {
            match s.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
}

/// Connection figures for `/metrics`.
#[derive(Default)]
pub struct ConnStats {
    /// Open connections within the limits (both pools).
    pub open: AtomicU64,
    /// Of those, connections in the unauthenticated pool.
    pub unauthenticated: AtomicU64,
    /// Connections past `max_connections` (answered once, then closed).
    pub over_limit: AtomicU64,
    /// Connections closed at once for being past their peer's limit.
    pub refused_peer: AtomicU64,
    /// Connections taken on probation (the unauthenticated pool full) that
    /// made no authenticated request: answered once, then closed.
    pub unauthenticated_closed: AtomicU64,
}

/// Open connections per peer address, and in all.
#[derive(Default)]
struct Peers {
    by_ip: Mutex<HashMap<IpAddr, usize>>,
    stats: Arc<ConnStats>,
}

/// How a connection is counted. It starts unauthenticated (or on
/// probation, or over the limit) and moves to `AUTH` at its first
/// authenticated request; it never moves back.
mod pool {
    /// Past `max_connections`: one answer (503 except `/healthz`), then
    /// closed. Counted only against its peer's limit.
    pub const OVER: u8 = 0;
    /// The unauthenticated pool was full: one request, served; closed after
    /// it unless it authenticated (and the global limit has room). Counted
    /// only against its peer's limit until then.
    pub const PROBATION: u8 = 1;
    /// In the unauthenticated pool (and in `open`).
    pub const UNAUTH: u8 = 2;
    /// Authenticated (in `open`).
    pub const AUTH: u8 = 3;
}

/// A connection's slot; released on drop.
struct Slot {
    peers: Arc<Peers>,
    ip: IpAddr,
    pool: std::sync::atomic::AtomicU8,
    max_connections: usize,
}

impl Slot {
    fn pool(&self) -> u8 {
        self.pool.load(Ordering::Relaxed)
    }

    /// The connection made an authenticated request: into the
    /// authenticated pool (a connection on probation only if the global
    /// limit has room).
    fn promote(&self) {
        let stats = &self.peers.stats;
        match self.pool() {
            pool::UNAUTH => {
                stats.unauthenticated.fetch_sub(1, Ordering::Relaxed);
                self.pool.store(pool::AUTH, Ordering::Relaxed);
            }
            pool::PROBATION if take(&stats.open, self.max_connections) => {
                self.pool.store(pool::AUTH, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// One more of `counter` if it is below `max`.
fn take(counter: &AtomicU64, max: usize) -> bool {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (usize::try_from(n).unwrap_or(usize::MAX) < max).then_some(n + 1)
        })
        .is_ok()
}

impl Peers {
    /// A slot for a new connection from `ip`, or `None` when that peer is
    /// at its limit (the connection is to be closed at once, uncounted).
    fn admit(self: &Arc<Self>, ip: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut map = self.by_ip.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= limits.max_per_peer {
            drop(map);
            self.stats.refused_peer.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *n += 1;
        drop(map);
        let stats = &self.stats;
        let max_unauth = limits.max_unauthenticated.min(limits.max_connections);
        let pool = if take(&stats.unauthenticated, max_unauth) {
            if take(&stats.open, limits.max_connections) {
                pool::UNAUTH
            } else {
                stats.unauthenticated.fetch_sub(1, Ordering::Relaxed);
                pool::OVER
            }
        } else if usize::try_from(stats.open.load(Ordering::Relaxed))
            .is_ok_and(|open| open < limits.max_connections)
        {
            pool::PROBATION
        } else {
            pool::OVER
        };
        if pool == pool::OVER {
            stats.over_limit.fetch_add(1, Ordering::Relaxed);
        }
        Some(Slot {
            peers: self.clone(),
            ip,
            pool: std::sync::atomic::AtomicU8::new(pool),
            max_connections: limits.max_connections,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let stats = &self.peers.stats;
        match self.pool() {
            pool::UNAUTH => {
                stats.unauthenticated.fetch_sub(1, Ordering::Relaxed);
                stats.open.fetch_sub(1, Ordering::Relaxed);
            }
            pool::AUTH => {
                stats.open.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        let mut map = self.peers.by_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Everything a connection needs.
pub struct Server {
    pub limits: Limits,
    pub handler: Arc<dyn Handler>,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The names `Host` may carry (`super::guard`).
    pub names: Arc<super::guard::HostNames>,
    peers: Arc<Peers>,
}

impl Server {
    pub fn new(
        limits: Limits,
        handler: Arc<dyn Handler>,
        tls: Option<tokio_rustls::TlsAcceptor>,
        stats: Arc<ConnStats>,
        names: Arc<super::guard::HostNames>,
    ) -> Self {
        Server {
            limits,
            handler,
            tls,
            names,
            peers: Arc::new(Peers {
                by_ip: Mutex::default(),
                stats,
            }),
        }
    }
}

/// Accepts connections until `shutdown` turns true, then asks open
/// connections to finish their current request and waits up to `drain`.
/// Connections are dealt out to the event `loops` in turn (see
/// `super::loops`); each is registered with its loop's own reactor.
pub async fn run(
    listener: TcpListener,
    server: Arc<Server>,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
    loops: &[tokio::runtime::Handle],
) {
    let tasks = tokio_util_lite::TaskCount::default();
    let mut turn = 0usize;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                log::warn!("accept: {e}");
                // Out of descriptors: give connections a moment to close.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(slot) = server.peers.admit(peer.ip(), &server.limits) else {
            // Past its peer's limit: closed here, before TLS, uncounted.
            drop(tcp);
            continue;
        };
        let local = match tcp.local_addr() {
            Ok(a) => a.ip(),
            Err(e) => {
                log::warn!("accept: {e}");
                continue;
            }
        };
        // Off the accepting reactor, onto the serving loop's.
        let tcp = match tcp.into_std() {
            Ok(t) => t,
            Err(e) => {
                log::warn!("accept: {e}");
                continue;
            }
        };
        let guard = tasks.enter();
        let (srv, sd) = (server.clone(), shutdown.clone());
        let serve = async move {
            match TcpStream::from_std(tcp) {
                Ok(tcp) => connection(tcp, (peer, local), slot, srv, sd).await,
                Err(e) => log::warn!("registering a connection from {peer}: {e}"),
            }
            drop(guard);
        };
        turn = turn.wrapping_add(1);
        match loops.get(turn % loops.len().max(1)) {
            Some(l) => drop(l.spawn(serve)),
            None => drop(tokio::spawn(serve)),
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(drain, tasks.idle()).await;
}

/// Counting open connection tasks, to wait for them at shutdown.
mod tokio_util_lite {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Notify;

    #[derive(Default, Clone)]
    pub struct TaskCount(Arc<(AtomicUsize, Notify)>);

    pub struct Guard(Arc<(AtomicUsize, Notify)>);

    impl TaskCount {
        pub fn enter(&self) -> Guard {
            self.0.0.fetch_add(1, Ordering::SeqCst);
            Guard(self.0.clone())
        }

        pub async fn idle(&self) {
            loop {
                let notified = self.0.1.notified();
                if self.0.0.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            if self.0.0.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.0.1.notify_waiters();
            }
        }
    }
}

async fn connection(
    tcp: TcpStream,
    (peer, local): (SocketAddr, IpAddr),
    slot: Slot,
    server: Arc<Server>,
    shutdown: watch::Receiver<bool>,
) {
    let _ = tcp.set_nodelay(true);
    let conn = Conn {
        slot: Arc::new(slot),
        local,
    };
    match &server.tls {
        None => serve_io(tcp, Arc::new(Vec::new()), conn, server, shutdown).await,
        Some(acceptor) => {
            let hs = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
            let tls = match hs.await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    log::debug!("TLS handshake with {peer}: {e}");
                    return;
                }
                Err(_) => {
                    log::debug!("TLS handshake with {peer}: timed out");
                    return;
                }
            };
            let names = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| super::certnames::principal_names(c))
                .unwrap_or_default();
            serve_io(tls, Arc::new(names), conn, server, shutdown).await;
        }
    }
}

type Body = Full<Bytes>;

fn to_hyper(resp: Response, close: bool) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(Full::new(Bytes::from(resp.body)));
    *r.status_mut() = hyper::StatusCode::from_u16(resp.status)
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(resp.content_type));
    for (name, value) in resp.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    if close {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// A Content-Length value as RFC 9110 writes it: digits only, no sign, no
/// leading zero (except "0" itself).
fn plain_length(v: &HeaderValue) -> Option<u64> {
    let b = v.as_bytes();
    if b.is_empty()
        || b.len() > 19
        || !b.iter().all(u8::is_ascii_digit)
        || (b.len() > 1 && b[0] == b'0')
    {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// A connection's slot and the address it arrived on.
#[derive(Clone)]
struct Conn {
    slot: Arc<Slot>,
    local: IpAddr,
}

async fn serve_request(
    req: hyper::Request<Incoming>,
    server: Arc<Server>,
    state: Arc<ConnState>,
    names: Arc<Vec<String>>,
    conn: Conn,
) -> Result<hyper::Response<Body>, Infallible> {
    let refuse =
        |status: u16, code: &str, msg: &str| Ok(to_hyper(Response::error(status, code, msg), true));
    if state.bare_lf.load(Ordering::Relaxed) {
        return refuse(
            400,
            "bad_request",
            "a bare LF in the request head: lines end with CRLF",
        );
    }
    if req.headers().contains_key(TRANSFER_ENCODING) {
        return refuse(
            411,
            "length_required",
            "Transfer-Encoding is not supported: send Content-Length",
        );
    }
    let mut length: Option<u64> = None;
    for v in req.headers().get_all(CONTENT_LENGTH) {
        match plain_length(v) {
            Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
            _ => return refuse(400, "bad_request", "malformed Content-Length"),
        }
    }
    let max_body = server.limits.max_body;
    if length.is_some_and(|n| n > max_body as u64) {
        return refuse(
            413,
            "too_large",
            &format!("request body over {max_body} bytes"),
        );
    }
    if let Err(r) = super::guard::check(
        req.method(),
        req.uri(),
        req.headers(),
        &server.names,
        conn.local,
    ) {
        return refuse(r.status, r.code, &r.message);
    }
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let bearer = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| rest.trim().to_string())
        });
    let body = match Limited::new(req.into_body(), max_body).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return refuse(400, "bad_request", "the request body could not be read"),
    };
    state.request_read();
    let request = Request {
        method,
        path,
        query,
        bearer,
        cert_names: names,
        body,
        authenticated: AtomicBool::new(false),
    };
    let slot = &conn.slot;
    let resp = if slot.pool() == pool::OVER && request.path != "/healthz" {
        let code = crate::protocol::v1::ErrorCode::Overloaded;
        Response::error(code.status(), code.as_str(), "too many open connections")
    } else {
        match server.handler.clone().answer(&request) {
            Answer::Now(r) => r,
            Answer::Later(f) => f.await,
            Answer::Blocking(f) => match tokio::task::spawn_blocking(f).await {
                Ok(r) => r,
                Err(_) => Response::error(500, "internal", "the request handler failed"),
            },
        }
    };
    if request.authenticated.load(Ordering::Relaxed) {
        slot.promote();
    }
    // Past the global limit, or on probation and still unauthenticated:
    // this was its one answer.
    let close = match slot.pool() {
        pool::OVER => true,
        pool::PROBATION => {
            let stats = &slot.peers.stats;
            stats.unauthenticated_closed.fetch_add(1, Ordering::Relaxed);
            true
        }
        _ => false,
    };
    state.answered();
    Ok(to_hyper(resp, close))
}

/// How long a connection in `pool` may stay idle between requests.
fn idle_allowed(limits: &Limits, pool: u8) -> Duration {
    match pool {
        pool::AUTH => limits.idle_timeout,
        pool::UNAUTH => limits.unauthenticated_idle_timeout.min(limits.idle_timeout),
        _ => OVER_LIMIT_IDLE.min(limits.idle_timeout),
    }
}

async fn serve_io<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: S,
    names: Arc<Vec<String>>,
    conn: Conn,
    server: Arc<Server>,
    mut shutdown: watch::Receiver<bool>,
) {
    let state = Arc::new(ConnState::new());
    let watched = Watched {
        inner: Some(io),
        state: state.clone(),
        prev: [0; 3],
    };
    let slot = conn.slot.clone();
    let over = slot.pool() == pool::OVER;
    let (srv, st) = (server.clone(), state.clone());
    let service = hyper::service::service_fn(move |req| {
        serve_request(req, srv.clone(), st.clone(), names.clone(), conn.clone())
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(!over)
        .half_close(false)
        .max_buf_size(server.limits.max_head.max(8192))
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(watched), service);
    let mut conn = std::pin::pin!(conn);
    // A connection past a limit (or on probation) gets a short while to
    // send its one request, one not yet authenticated a shorter idle time
    // than an agent's: a hog cannot pile up idle descriptors beyond its
    // share.
    let limits = &server.limits;
    let deadline = || state.deadline(limits, idle_allowed(limits, slot.pool()));
    let mut timer = std::pin::pin!(tokio::time::sleep_until(instant_at(deadline())));
    let mut stop = std::pin::pin!(async move {
        let _ = shutdown.wait_for(|s| *s).await;
    });
    let mut stop_deadline: Option<Instant> = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = conn.as_mut().poll(cx) {
            if let Err(e) = r {
                log::debug!("connection: {e}");
            }
            return Poll::Ready(());
        }
        if stop_deadline.is_none() && stop.as_mut().poll(cx).is_ready() {
            // Finish the request in progress (if any), then close.
            stop_deadline = Some(Instant::now() + Duration::from_secs(3));
            conn.as_mut().graceful_shutdown();
            if conn.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        // The deadline moves as requests come and go: re-arm the one timer.
        loop {
            let mut at = instant_at(deadline());
            if let Some(d) = stop_deadline {
                at = at.min(d);
            }
            if timer.deadline() != at {
                timer.as_mut().reset(at);
            }
            match timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => {
                    if stop_deadline.is_some_and(|d| Instant::now() >= d) || now_ms() >= deadline()
                    {
                        return Poll::Ready(());
                    }
                }
            }
        }
    })
    .await;
    drop(slot);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_past_a_peer_limit_do_not_use_the_global_budget() {
        let peers = Arc::new(Peers::default());
        let limits = Limits {
            max_connections: 3,
            max_per_peer: 2,
            ..Limits::default()
        };
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "127.0.0.2".parse().unwrap(),
            "127.0.0.3".parse().unwrap(),
            "127.0.0.4".parse().unwrap(),
        );
        let held: Vec<Slot> = (0..2).map(|_| peers.admit(a, &limits).unwrap()).collect();
        // A flood past a's limit: refused, counted nowhere else.
        for _ in 0..1000 {
            assert!(peers.admit(a, &limits).is_none());
        }
        assert_eq!(peers.stats.refused_peer.load(Ordering::Relaxed), 1000);
        assert_eq!(peers.stats.open.load(Ordering::Relaxed), 2);
        // Another peer still gets a real slot; past the global limit, a
        // connection is answered once and does not count against it.
        let ok = peers.admit(b, &limits).unwrap();
        assert_eq!(ok.pool(), pool::UNAUTH);
        let over = peers.admit(c, &limits).unwrap();
        assert_eq!(over.pool(), pool::OVER);
        assert_eq!(peers.stats.open.load(Ordering::Relaxed), 3);
        drop(over);
        assert_eq!(peers.stats.open.load(Ordering::Relaxed), 3);
        drop(held);
        assert_ne!(peers.admit(c, &limits).unwrap().pool(), pool::OVER);
    }

    #[test]
    fn unauthenticated_connections_have_a_pool_of_their_own() {
        let peers = Arc::new(Peers::default());
        let limits = Limits {
            max_connections: 4,
            max_per_peer: 100,
            max_unauthenticated: 2,
            ..Limits::default()
        };
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let stats = peers.stats.clone();
        // Two idle unauthenticated connections fill their pool...
        let idle: Vec<Slot> = (0..2).map(|_| peers.admit(ip, &limits).unwrap()).collect();
        assert!(idle.iter().all(|s| s.pool() == pool::UNAUTH));
        // ...the next ones are on probation: counted nowhere but their peer.
        let probation: Vec<Slot> = (0..10).map(|_| peers.admit(ip, &limits).unwrap()).collect();
        assert!(probation.iter().all(|s| s.pool() == pool::PROBATION));
        assert_eq!(stats.open.load(Ordering::Relaxed), 2);
        // An agent's connection authenticates: it takes a real slot...
        probation[0].promote();
        probation[1].promote();
        assert_eq!(probation[0].pool(), pool::AUTH);
        assert_eq!(stats.open.load(Ordering::Relaxed), 4);
        // ...until the global limit, which unauthenticated ones never fill.
        probation[2].promote();
        assert_eq!(probation[2].pool(), pool::PROBATION);
        // An unauthenticated connection that authenticates leaves its pool.
        idle[0].promote();
        assert_eq!(stats.unauthenticated.load(Ordering::Relaxed), 1);
        assert_eq!(stats.open.load(Ordering::Relaxed), 4);
        drop(idle);
        drop(probation);
        assert_eq!(stats.open.load(Ordering::Relaxed), 0);
        assert_eq!(stats.unauthenticated.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn content_length_must_be_plain_digits() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(plain_length(&v("0")), Some(0));
        assert_eq!(plain_length(&v("42")), Some(42));
        assert_eq!(plain_length(&v("+5")), None);
        assert_eq!(plain_length(&v("05")), None);
        assert_eq!(plain_length(&v(" 5")), None);
        assert_eq!(plain_length(&v("")), None);
        assert_eq!(plain_length(&v("99999999999999999999")), None);
    }

    fn scanned(chunks: &[&[u8]]) -> (bool, bool) {
        let mut w = Watched {
            inner: None::<tokio::io::DuplexStream>,
            state: Arc::new(ConnState::new()),
            prev: [0; 3],
        };
        for c in chunks {
            w.scan(c);
        }
        let st = w.state.clone();
        (
            st.bare_lf.load(Ordering::Relaxed),
            st.in_head.load(Ordering::Relaxed),
        )
    }

    #[test]
    fn bare_lfs_are_found_in_heads_only() {
        // CRLF heads, split anywhere: fine; the head's end is found.
        let head: &[u8] = b"POST / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(scanned(&[head]), (false, false));
        assert_eq!(
            scanned(&[&head[..16], &head[16..27], &head[27..]]),
            (false, false)
        );
        // A bare LF in the head, or a head ending LF LF.
        assert!(scanned(&[b"POST / HTTP/1.1\r\nHost: x\nContent-Length: 5\r\n\r\n"]).0);
        assert!(scanned(&[b"GET / HTTP/1.1\n\n"]).0);
        // A LF in the body after a proper head is not the head's business.
        assert_eq!(scanned(&[head, b"{\n}"]), (false, false));
    }
}
