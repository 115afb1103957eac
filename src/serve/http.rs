//! A small HTTP/1.1 server for the lease protocol: just what `serve` needs,
//! with the robustness properties it must have and nothing else.
//!
//! Why not tiny_http: it has no read timeouts (a client that sends half a
//! request holds its thread forever) and its throughput on two cores is well
//! below the renewal target. This module is the only place that knows HTTP.
//!
//! - **Bounded.** One thread per open connection, at most
//!   `max_connections` of them; a connection beyond that is answered 503 and
//!   closed by the acceptor at once. Keep-alive clients keep their thread,
//!   which is what makes a renewal cheap (no handshake, no hand-off).
//! - **Stalled clients cannot delay others.** Each connection has its own
//!   thread, so a client that stalls only stalls itself; its socket reads
//!   wake every [`POLL`] to check two deadlines: `idle_timeout` between
//!   requests, and `request_timeout` from the first byte of a request to its
//!   last (a slowloris dribbling one byte a second is cut off there, 408).
//! - **Bounded input.** Heads over `max_head` bytes get 431, bodies over
//!   `max_body` get 413 (before the body is read), chunked bodies 411; all
//!   close the connection.
//! - **Shutdown.** The acceptor stops when the shutdown flag is set and it
//!   is woken (the caller connects to the listener once); idle connections
//!   notice within [`POLL`], busy ones after their current answer.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often a blocked read wakes to check its deadlines and shutdown.
pub const POLL: Duration = Duration::from_millis(200);

/// A complete request.
pub struct Request {
    pub method: String,
    /// The path, without any query string.
    pub path: String,
    pub body: Vec<u8>,
}

/// An answer.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            content_type: "application/json",
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
    pub max_head: usize,
    pub max_body: usize,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_head: 16 * 1024,
            max_body: 64 * 1024,
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Answers requests; called concurrently from connection threads.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: &Request) -> Response;
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

fn write_response(stream: &mut TcpStream, resp: &Response, close: bool) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(128 + resp.body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        resp.body.len(),
        if close { "Connection: close\r\n" } else { "" }
    );
    out.extend_from_slice(&resp.body);
    stream.write_all(&out)
}

/// Accepts connections until `shutdown` is set (and the acceptor is woken by
/// a connection), then waits up to `drain` for open connections to finish.
pub fn run(
    listener: TcpListener,
    limits: Limits,
    handler: Arc<dyn Handler>,
    shutdown: Arc<AtomicBool>,
    drain: Duration,
) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if shutdown.load(Ordering::SeqCst) {
            break;
        }
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                log::warn!("accept: {e}");
                // Out of descriptors: give connections a moment to close.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if active.load(Ordering::SeqCst) >= limits.max_connections {
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = write_response(
                &mut stream,
                &Response::error(503, "overloaded", "too many open connections"),
                true,
            );
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let (h, l, s, a) = (
            handler.clone(),
            limits.clone(),
            shutdown.clone(),
            active.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("http-conn".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                connection(stream, &*h, &l, &s);
                a.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            log::warn!("cannot start a connection thread: {e}");
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let deadline = Instant::now() + drain;
    while active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

enum ReadOutcome {
    Data,
    Closed,
    Timeout,
}

/// One read into `buf`, retrying on the poll wake-ups until `deadline`
/// (or until shutdown when `idle` is set and nothing has arrived).
fn read_more(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
    idle: bool,
    shutdown: &AtomicBool,
) -> ReadOutcome {
    let mut scratch = [0u8; 16 * 1024];
    loop {
        if Instant::now() >= deadline || (idle && shutdown.load(Ordering::Relaxed)) {
            return ReadOutcome::Timeout;
        }
        match stream.read(&mut scratch) {
            Ok(0) => return ReadOutcome::Closed,
            Ok(n) => {
                buf.extend_from_slice(&scratch[..n]);
                return ReadOutcome::Data;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return ReadOutcome::Closed,
        }
    }
}

struct Head {
    method: String,
    path: String,
    content_length: usize,
    keep_alive: bool,
}

/// Parses a request head; `Err` is the response to send before closing.
fn parse_head(head: &[u8], limits: &Limits) -> Result<Head, Response> {
    let bad = |m: &str| Response::error(400, "bad_request", m);
    let text = std::str::from_utf8(head).map_err(|_| bad("request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(bad("unsupported HTTP version")),
    };
    let mut keep_alive = http11;
    let mut content_length: Option<usize> = None;
    for h in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = h.split_once(':') else {
            return Err(bad("malformed header line"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.parse().map_err(|_| bad("malformed Content-Length"))?;
            if content_length.is_some_and(|c| c != n) {
                return Err(bad("conflicting Content-Length headers"));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Response::error(
                411,
                "length_required",
                "chunked request bodies are not supported: send Content-Length",
            ));
        } else if name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            if v.contains("close") {
                keep_alive = false;
            } else if v.contains("keep-alive") {
                keep_alive = true;
            }
        }
    }
    let content_length = content_length.unwrap_or(0);
    if content_length > limits.max_body {
        return Err(Response::error(
            413,
            "too_large",
            &format!("request body over {} bytes", limits.max_body),
        ));
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    Ok(Head {
        method: method.to_string(),
        path,
        content_length,
        keep_alive,
    })
}

/// Sends a final answer and closes without resetting the connection: the
/// client may still be sending a body we refused (413), and closing with
/// unread input would make the kernel send RST, losing our answer. So: shut
/// our side, then discard input for a bounded time and amount.
fn answer_and_close(stream: &mut TcpStream, resp: &Response) {
    if write_response(stream, resp, true).is_err() {
        return;
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut left: usize = 1 << 20;
    let mut scratch = [0u8; 16 * 1024];
    while left > 0 && Instant::now() < deadline {
        match stream.read(&mut scratch) {
            Ok(0) => return,
            Ok(n) => left = left.saturating_sub(n),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

fn connection(
    mut stream: TcpStream,
    handler: &dyn Handler,
    limits: &Limits,
    shutdown: &AtomicBool,
) {
    let _ = stream.set_nodelay(true);
    if stream.set_read_timeout(Some(POLL)).is_err()
        || stream
            .set_write_timeout(Some(limits.write_timeout))
            .is_err()
    {
        return;
    }
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        // The head: wait idle for the first byte, then request_timeout for the rest.
        let mut deadline = if buf.is_empty() {
            Instant::now() + limits.idle_timeout
        } else {
            Instant::now() + limits.request_timeout
        };
        let mut started = !buf.is_empty();
        let head_end = loop {
            if let Some(end) = find_head_end(&buf) {
                break end;
            }
            if buf.len() > limits.max_head {
                let r = Response::error(431, "too_large", "request head too large");
                answer_and_close(&mut stream, &r);
                return;
            }
            match read_more(&mut stream, &mut buf, deadline, !started, shutdown) {
                ReadOutcome::Data => {
                    if !started {
                        started = true;
                        deadline = Instant::now() + limits.request_timeout;
                    }
                }
                ReadOutcome::Closed => return,
                ReadOutcome::Timeout => {
                    if started {
                        let r = Response::error(408, "timeout", "request not received in time");
                        let _ = write_response(&mut stream, &r, true);
                    }
                    return;
                }
            }
        };
        let head = match parse_head(&buf[..head_end], limits) {
            Ok(h) => h,
            Err(resp) => {
                answer_and_close(&mut stream, &resp);
                return;
            }
        };
        let total = head_end + head.content_length;
        while buf.len() < total {
            match read_more(&mut stream, &mut buf, deadline, false, shutdown) {
                ReadOutcome::Data => {}
                ReadOutcome::Closed => return,
                ReadOutcome::Timeout => {
                    let r = Response::error(408, "timeout", "request body not received in time");
                    let _ = write_response(&mut stream, &r, true);
                    return;
                }
            }
        }
        let req = Request {
            method: head.method,
            path: head.path,
            body: buf[head_end..total].to_vec(),
        };
        buf.drain(..total);
        let resp = handler.handle(&req);
        let close = !head.keep_alive || shutdown.load(Ordering::Relaxed);
        if write_response(&mut stream, &resp, close).is_err() || close {
            return;
        }
    }
}
