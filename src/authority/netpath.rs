//! How a lease client reaches its authority: name resolution and the TCP
//! connection under ureq, built so that nothing the command exhausts can
//! stop a renewal.
//!
//! - **No thread per request.** ureq's default resolver spawns a thread for
//!   every lookup that has a timeout, even for an IP literal, and panics when
//!   the spawn fails: a command that fills a pids cgroup (or `TasksMax=`, or
//!   `RLIMIT_NPROC`) it shares with the agent made every renewal abort the
//!   agent (`panic = "abort"`: SIGABRT, no release). [`Resolver`] answers an
//!   IP literal at once, and a host name from a cache filled at its first
//!   lookup, which is the acquire, before the command starts. Only a name
//!   never looked up before goes to `getaddrinfo`, on a thread of its own so
//!   that the call's timeout holds; a failure to start that thread is an
//!   error of the call (transient), never a panic. A name is resolved once
//!   per agent: an authority that moves to another address is found by the
//!   next agent, not by this one's renewals.
//! - **Marked packets.** [`MarkedTcp`] opens every connection itself so that
//!   its options are set before the SYN leaves: a DSCP (`IP_TOS`,
//!   `IPV6_TCLASS`) for the network and an `SO_PRIORITY` for this host's
//!   queues, in that order (setting `IP_TOS` resets the priority). A host
//!   whose qdisc honours priority (`pfifo_fast`, the default, or `prio`)
//!   sends renewals ahead of the command's bulk traffic. Defaults: DSCP CS6
//!   (network control, as corosync's knet uses for its heartbeats) and
//!   priority 6 (`TC_PRIO_INTERACTIVE`, the highest without CAP_NET_ADMIN).
//!   A mark the kernel refuses is logged once and the connection goes on
//!   unmarked.
//! - **A lost SYN costs a fraction of the try.** The connect budget is split:
//!   the first SYN gets half of what the call has left, and a fresh socket
//!   gets the rest, instead of waiting out the kernel's 1 s SYN retransmit.
//!
//! The marks are process-wide ([`set_marks`], once, from the run
//! configuration before the authority is opened): every client of the
//! process, and each clone of it, builds its connector from them.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ureq::unversioned::resolver::ResolvedSocketAddrs;
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport,
};

/// What renewal traffic is marked with (`--renew-priority`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marks {
    /// Differentiated services code point, 0-63; `None`: left as it is.
    pub dscp: Option<u8>,
    /// `SO_PRIORITY`, 0-7; `None`: left as it is.
    pub priority: Option<u8>,
}

/// `--renew-priority`'s default, as typed.
pub const DEFAULT_MARKS: &str = "cs6,6";

impl Default for Marks {
    fn default() -> Self {
        Marks {
            dscp: Some(48),
            priority: Some(6),
        }
    }
}

/// A `--renew-priority` value that is not `DSCP,PRIORITY` or `off`.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{0}` is not DSCP,PRIORITY: DSCP is 0-63, cs0-cs7, ef or af11-af43; PRIORITY is 0-7 (7 needs CAP_NET_ADMIN); or `off`"
)]
pub struct MarksError(pub String);

/// Parses `DSCP,PRIORITY` (either part may be `-` for "leave it"), or `off`.
pub fn parse_marks(s: &str) -> Result<Marks, MarksError> {
    let bad = || MarksError(s.to_string());
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(Marks {
            dscp: None,
            priority: None,
        });
    }
    let (d, p) = s.split_once(',').ok_or_else(bad)?;
    let dscp = match d.trim() {
        "-" => None,
        d => Some(parse_dscp(d).ok_or_else(bad)?),
    };
    let priority = match p.trim() {
        "-" => None,
        p => Some(p.parse::<u8>().ok().filter(|p| *p <= 7).ok_or_else(bad)?),
    };
    Ok(Marks { dscp, priority })
}

fn parse_dscp(s: &str) -> Option<u8> {
    let l = s.to_ascii_lowercase();
    let v = if let Some(n) = l.strip_prefix("cs") {
        n.parse::<u8>().ok().filter(|n| *n <= 7)? << 3
    } else if l == "ef" {
        46
    } else if let Some(n) = l.strip_prefix("af") {
        let (class, drop) = (n.as_bytes().first()?, n.as_bytes().get(1)?);
        if n.len() != 2 || !(b'1'..=b'4').contains(class) || !(b'1'..=b'3').contains(drop) {
            return None;
        }
        ((class - b'0') << 3) | ((drop - b'0') << 1)
    } else {
        l.parse::<u8>().ok()?
    };
    (v <= 63).then_some(v)
}

static MARKS: OnceLock<Marks> = OnceLock::new();

/// Sets the process's marks; the first call wins.
pub fn set_marks(m: Marks) {
    let _ = MARKS.set(m);
}

/// The marks in force (the default when none were set).
pub fn marks() -> Marks {
    MARKS.get().copied().unwrap_or_default()
}

/// A ureq agent for `config` with this module's resolver and connector
/// (and rustls for `https://`).
pub fn agent(config: ureq::config::Config) -> ureq::Agent {
    use ureq::unversioned::transport::{Connector as _, RustlsConnector};
    let connector = ().chain(MarkedTcp { marks: marks() }).chain(RustlsConnector::default());
    ureq::Agent::with_parts(config, connector, Resolver)
}

// ---------------------------------------------------------------- resolver

/// Names resolved so far, `(host, port)` to addresses. Written at a name's
/// first lookup (the acquire), read by every later call.
type Names = Vec<((String, u16), Vec<SocketAddr>)>;
static NAMES: Mutex<Names> = Mutex::new(Vec::new());

/// The resolver of the module doc: literals at once, names from the cache.
#[derive(Debug)]
pub struct Resolver;

impl ureq::unversioned::resolver::Resolver for Resolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let _ = config;
        let authority = uri
            .authority()
            .ok_or_else(|| ureq::Error::BadUri(format!("{uri}: no host")))?;
        let port = match (authority.port_u16(), uri.scheme_str()) {
            (Some(p), _) => p,
            (None, Some("https")) => 443,
            (None, Some("http")) => 80,
            (None, _) => return Err(ureq::Error::BadUri(format!("{uri}: no port"))),
        };
        let host = authority.host();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let mut out = self.empty();
        if let Ok(ip) = bare.parse::<IpAddr>() {
            out.push(SocketAddr::new(ip, port));
            return Ok(out);
        }
        let key = (bare.to_string(), port);
        let known = lock_names()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, a)| a.clone());
        let addrs = match known {
            Some(a) => a,
            None => {
                let a = lookup(&key, timeout)?;
                let mut names = lock_names();
                if !names.iter().any(|(k, _)| *k == key) {
                    names.push((key, a.clone()));
                }
                a
            }
        };
        for a in addrs.into_iter().take(16) {
            out.push(a);
        }
        if out.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(out)
    }
}

fn lock_names() -> std::sync::MutexGuard<'static, Names> {
    // A panic while holding it cannot leave a half-written entry (one push).
    NAMES.lock().unwrap_or_else(|e| e.into_inner())
}

/// `getaddrinfo` for `(host, port)` within `timeout`, on a thread of its own
/// (the call itself cannot be bounded).
fn lookup(key: &(String, u16), timeout: NextTimeout) -> Result<Vec<SocketAddr>, ureq::Error> {
    use std::net::ToSocketAddrs;
    let target = key.clone();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("resolve".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let found = (target.0.as_str(), target.1)
                .to_socket_addrs()
                .map(|a| a.collect::<Vec<_>>());
            let _ = tx.send(found);
        })
        .map_err(ureq::Error::Io)?;
    let wait = timeout.not_zero().map_or(Duration::from_secs(60), |d| *d);
    match rx.recv_timeout(wait) {
        Ok(found) => Ok(found?),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            Err(ureq::Error::Timeout(timeout.reason))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(ureq::Error::HostNotFound),
    }
}

// ---------------------------------------------------------------- connector

/// Opens TCP connections with the [`Marks`] set before the SYN.
#[derive(Debug)]
pub struct MarkedTcp {
    marks: Marks,
}

impl<In: Transport> Connector<In> for MarkedTcp {
    type Out = Either<In, Plain>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        if chained.is_some() {
            return Ok(chained.map(Either::A));
        }
        let budget = details
            .timeout
            .not_zero()
            .map_or(Duration::from_secs(60), |d| *d);
        let until = Instant::now() + budget;
        let mut last = None;
        for addr in details.addrs.iter() {
            match connect_marked(*addr, until, self.marks) {
                Ok(stream) => {
                    let config = details.config;
                    let buffers =
                        LazyBuffers::new(config.input_buffer_size(), config.output_buffer_size());
                    return Ok(Some(Either::B(Plain { stream, buffers })));
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(ureq::Error::Timeout(details.timeout.reason));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(ureq::Error::Io(last.unwrap_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "no address to connect to")
        })))
    }
}

/// A connected socket as ureq's transport (ureq keeps its own TCP transport
/// private): blocking reads and writes bounded by the call's timeout.
#[derive(Debug)]
pub struct Plain {
    stream: TcpStream,
    buffers: LazyBuffers,
}

/// What is left of `timeout`: `None` for "no limit", an error when spent.
fn left(timeout: NextTimeout) -> Result<Option<Duration>, ureq::Error> {
    if timeout.after.is_not_happening() {
        return Ok(None);
    }
    if timeout.after.is_zero() {
        return Err(ureq::Error::Timeout(timeout.reason));
    }
    Ok(Some(*timeout.after))
}

fn io_error(e: std::io::Error, timeout: NextTimeout) -> ureq::Error {
    match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            ureq::Error::Timeout(timeout.reason)
        }
        _ => ureq::Error::Io(e),
    }
}

impl Transport for Plain {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        use std::io::Write;
        let timeout = timeout.for_write();
        let until = left(timeout)?.map(|d| Instant::now() + d);
        let Some(output) = self.buffers.output().get(..amount) else {
            return Err(ureq::Error::Io(std::io::ErrorKind::InvalidInput.into()));
        };
        let mut sent = 0;
        while sent < output.len() {
            let wait = until.map(|u| u.saturating_duration_since(Instant::now()));
            if wait.is_some_and(|w| w.is_zero()) {
                return Err(ureq::Error::Timeout(timeout.reason));
            }
            self.stream
                .set_write_timeout(wait)
                .map_err(ureq::Error::Io)?;
            match (&self.stream).write(&output[sent..]) {
                Ok(0) => return Err(ureq::Error::Io(std::io::ErrorKind::WriteZero.into())),
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(e, timeout)),
            }
        }
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        use std::io::Read;
        let timeout = timeout.for_read();
        let until = left(timeout)?.map(|d| Instant::now() + d);
        loop {
            let wait = until.map(|u| u.saturating_duration_since(Instant::now()));
            if wait.is_some_and(|w| w.is_zero()) {
                return Err(ureq::Error::Timeout(timeout.reason));
            }
            self.stream
                .set_read_timeout(wait)
                .map_err(ureq::Error::Io)?;
            let input = self.buffers.input_append_buf();
            match (&self.stream).read(input) {
                Ok(n) => {
                    self.buffers.input_appended(n);
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(e, timeout)),
            }
        }
    }

    fn is_open(&mut self) -> bool {
        // Open and idle: a read would block. Bytes nobody asked for, EOF or
        // an error mean the connection is not fit for another request.
        let mut byte = [0u8; 1];
        match rustix::net::recv(
            &self.stream,
            &mut byte,
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            Err(rustix::io::Errno::AGAIN) => true,
            Ok(_) | Err(_) => false,
        }
    }
}

/// Connects to `addr` by `until`: a first SYN with half the time left, then
/// one fresh try with the rest.
fn connect_marked(addr: SocketAddr, until: Instant, marks: Marks) -> std::io::Result<TcpStream> {
    let first = until.saturating_duration_since(Instant::now()) / 2;
    match connect_once(addr, Instant::now() + first, marks) {
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => connect_once(addr, until, marks),
        other => other,
    }
}

fn connect_once(addr: SocketAddr, until: Instant, marks: Marks) -> std::io::Result<TcpStream> {
    use rustix::event::{PollFd, PollFlags};
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    mark(&fd, addr.is_ipv6(), marks);
    match rustix::net::connect(&fd, &addr) {
        Ok(()) => {}
        Err(rustix::io::Errno::INPROGRESS) => loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            let ts = rustix::time::Timespec::try_from(left)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {
                    rustix::net::sockopt::socket_error(&fd)??;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        },
        Err(e) => return Err(e.into()),
    }
    rustix::io::ioctl_fionbio(&fd, false)?;
    rustix::net::sockopt::set_tcp_nodelay(&fd, true)?;
    Ok(TcpStream::from(fd))
}

/// Logged once per process: a mark the kernel refused.
static MARK_REFUSED: AtomicBool = AtomicBool::new(false);

/// Sets the DSCP, then the priority (setting the TOS resets the priority).
fn mark(fd: &std::os::fd::OwnedFd, v6: bool, marks: Marks) {
    let mut failed = Vec::new();
    if let Some(dscp) = marks.dscp {
        let r = if v6 {
            rustix::net::sockopt::set_ipv6_tclass(fd, u32::from(dscp) << 2)
        } else {
            rustix::net::sockopt::set_ip_tos(fd, dscp << 2)
        };
        if let Err(e) = r {
            failed.push(format!("DSCP {dscp}: {e}"));
        }
    }
    if let Some(p) = marks.priority {
        if let Err(e) = crate::sys::priority::set_socket_priority(fd, p) {
            failed.push(format!("SO_PRIORITY {p}: {e}"));
        }
    }
    if !failed.is_empty() && !MARK_REFUSED.swap(true, Ordering::Relaxed) {
        log::warn!(
            "renewal traffic goes unmarked: {} (see --renew-priority)",
            failed.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_parse_names_numbers_and_off() {
        assert_eq!(parse_marks(DEFAULT_MARKS).unwrap(), Marks::default());
        let m = parse_marks("ef,5").unwrap();
        assert_eq!((m.dscp, m.priority), (Some(46), Some(5)));
        let m = parse_marks("af41,-").unwrap();
        assert_eq!((m.dscp, m.priority), (Some(34), None));
        let m = parse_marks("10,0").unwrap();
        assert_eq!((m.dscp, m.priority), (Some(10), Some(0)));
        let m = parse_marks("off").unwrap();
        assert_eq!((m.dscp, m.priority), (None, None));
        for bad in ["cs8,6", "64,1", "cs6", "cs6,8", "af51,1", "x,1", ""] {
            assert!(parse_marks(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sockets_carry_the_marks_before_connecting() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let marks = Marks::default();
        let s = connect_marked(addr, Instant::now() + Duration::from_secs(5), marks).unwrap();
        assert_eq!(rustix::net::sockopt::ip_tos(&s).unwrap(), 48 << 2);
        let (peer, _) = l.accept().unwrap();
        // The accepted side of a loopback connection reflects the SYN's TOS
        // only on some kernels; the sending side is what we control.
        drop(peer);
    }

    #[test]
    fn a_connect_whose_syns_are_dropped_ends_within_its_budget() {
        // A listener whose accept queue is full drops further SYNs: the
        // kernel would retransmit after 1 s, 3 s, ...; the connector gives
        // up on its own budget, having tried twice.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        rustix::net::listen(&l, 0).unwrap();
        let addr = l.local_addr().unwrap();
        let mut held = Vec::new();
        let started = Instant::now();
        let err = loop {
            let budget = Duration::from_millis(300);
            match connect_marked(addr, Instant::now() + budget, Marks::default()) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 64, "the accept queue never filled");
        };
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let t = Instant::now();
        let again = connect_marked(
            addr,
            Instant::now() + Duration::from_millis(300),
            Marks::default(),
        );
        assert!(again.is_err());
        let took = t.elapsed();
        // Not a timing figure: without the budget the kernel's own SYN
        // retries would take minutes; "well under that" is the point.
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(10),
            "{took:?}"
        );
    }

    #[test]
    fn an_ip_literal_resolves_without_a_lookup() {
        use ureq::unversioned::resolver::Resolver as _;
        let config = ureq::config::Config::default();
        for (url, want) in [
            ("http://127.0.0.1:7/v1", "127.0.0.1:7"),
            ("https://[::1]/v1", "[::1]:443"),
        ] {
            let uri: ureq::http::Uri = url.parse().unwrap();
            let got = Resolver
                .resolve(&uri, &config, NextTimeout::default())
                .unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].to_string(), want);
        }
    }
}
