//! systemd's notify protocol (`Type=notify`, sd_notify(3)), spoken by the
//! supervisor loop alone.
//!
//! What is sent, and when:
//! - `READY=1` (with `STATUS=`) once the lease is held *and* the job started:
//!   `systemctl start` returns, and units ordered `After=` start, only when
//!   the work is really running under a lease. An agent that never gets the
//!   lease (75) or cannot start the job (126/127) never says READY.
//! - `STATUS=` on every lease state change (holding token N, renewals failing
//!   for Xs, lost, stopping); `systemctl status` shows the latest line.
//! - `WATCHDOG=1` from the loop itself, every `WATCHDOG_USEC / 2`: a wedged
//!   loop, not only a dead process, trips `WatchdogSec=`. Enabled only when
//!   `WATCHDOG_PID` (if set) is this process, as sd_watchdog_enabled(3) says.
//! - `STOPPING=1` when the agent starts stopping the job, for any reason.
//!
//! Why our own sender (no libsystemd, no crate): the loop enforces the lease
//! deadline, so a send must never block it. Each message is one datagram
//! sent with `MSG_DONTWAIT` on a fresh socket (so a re-executed systemd with
//! a new socket inode is found again); if systemd's queue is full the message
//! is dropped, except `READY=1`, which is kept and re-sent by [`flush`] on the
//! next loop turn until it is delivered or superseded by `STOPPING=1`.
//! `NOTIFY_SOCKET` may name a file (`/run/systemd/notify`) or an abstract
//! socket (`@name`).
//!
//! `NOTIFY_SOCKET` and `WATCHDOG_*` are never passed to the job (nor the
//! keeper): the job is not the service's main process, so with
//! `NotifyAccess=main` systemd would drop its messages, and with a wider
//! setting it would believe them. The agent's own environment is left
//! untouched (removing variables in a multithreaded process is unsound); the
//! job's environment is built without them ([`JOB_ENV_REMOVE`]).
//!
//! [`flush`]: Notifier::flush

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Variables removed from the job's environment.
pub const JOB_ENV_REMOVE: &[&str] = &["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Why a notification could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The socket could not be created or addressed.
    #[error("notify socket: {0}")]
    Socket(#[source] std::io::Error),
    /// systemd's queue is full (the send would block).
    #[error("the service manager's queue is full")]
    Busy,
    /// The send failed otherwise.
    #[error("send: {0}")]
    Send(#[source] std::io::Error),
}

/// The agent's link to systemd; a no-op outside a notify service.
#[derive(Debug, Clone)]
pub struct Notifier {
    target: Option<SocketAddr>,
    watchdog: Option<Duration>,
    /// A READY message not delivered yet.
    pending_ready: Option<String>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` once.
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::var_os("NOTIFY_SOCKET").as_deref(),
            std::env::var_os("WATCHDOG_USEC").as_deref(),
            std::env::var_os("WATCHDOG_PID").as_deref(),
            std::process::id(),
        )
    }

    /// The notifier those variables describe, for process `pid`.
    pub fn from_vars(
        socket: Option<&OsStr>,
        watchdog_usec: Option<&OsStr>,
        watchdog_pid: Option<&OsStr>,
        pid: u32,
    ) -> Self {
        let target = socket.filter(|s| !s.is_empty()).and_then(|s| {
            socket_addr(s)
                .map_err(|e| {
                    log::warn!(
                        "NOTIFY_SOCKET={}: {e}; not notifying",
                        std::path::Path::new(s).display()
                    )
                })
                .ok()
        });
        let usec = watchdog_usec
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&u| u > 0);
        let for_us = match watchdog_pid {
            None => true,
            Some(p) => p.to_str().and_then(|p| p.parse::<u32>().ok()) == Some(pid),
        };
        let watchdog = (target.is_some() && for_us)
            .then_some(usec)
            .flatten()
            .map(Duration::from_micros);
        Notifier {
            target,
            watchdog,
            pending_ready: None,
        }
    }

    /// Whether messages go anywhere.
    #[cfg(test)]
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// How often the loop should send `WATCHDOG=1`: half the watchdog
    /// timeout, as sd_watchdog_enabled(3) recommends.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    /// Sends one message now, never waiting.
    fn send_now(&self, msg: &str) -> Result<(), NotifyError> {
        let Some(addr) = &self.target else {
            return Ok(());
        };
        let sock = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        sock.connect_addr(addr).map_err(NotifyError::Socket)?;
        let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
        match rustix::net::send(&sock, msg.as_bytes(), flags) {
            Ok(_) => Ok(()),
            Err(rustix::io::Errno::AGAIN) => Err(NotifyError::Busy),
            Err(e) => Err(NotifyError::Send(e.into())),
        }
    }

    fn send(&self, msg: &str) {
        if let Err(e) = self.send_now(msg) {
            log::debug!("sd_notify {:?} not sent: {e}", msg.lines().next());
        }
    }

    /// `READY=1` with a status line; kept for [`Notifier::flush`] if it
    /// cannot be delivered now.
    pub fn ready(&mut self, status: &str) {
        let msg = format!("READY=1\nSTATUS={}\n", one_line(status));
        self.pending_ready = None;
        if let Err(e) = self.send_now(&msg) {
            log::debug!("sd_notify READY=1 not sent yet: {e}");
            self.pending_ready = Some(msg);
        }
    }

    /// Re-sends an undelivered `READY=1`; cheap when there is none.
    pub fn flush(&mut self) {
        if let Some(msg) = self.pending_ready.take() {
            if self.send_now(&msg).is_err() {
                self.pending_ready = Some(msg);
            }
        }
    }

    pub fn status(&mut self, status: &str) {
        self.flush();
        self.send(&format!("STATUS={}\n", one_line(status)));
    }

    pub fn watchdog(&mut self) {
        self.flush();
        self.send("WATCHDOG=1\n");
    }

    pub fn stopping(&mut self, status: &str) {
        // STOPPING wins over READY in systemd; a late READY would be ignored.
        self.pending_ready = None;
        self.send(&format!("STOPPING=1\nSTATUS={}\n", one_line(status)));
    }
}

/// Status text is one line of the datagram.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// `/path` or `@abstract-name`, as sd_notify(3) accepts them.
fn socket_addr(s: &OsStr) -> std::io::Result<SocketAddr> {
    let bytes = s.as_bytes();
    match bytes.first() {
        Some(b'/') => SocketAddr::from_pathname(s),
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(&bytes[1..])
        }
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "neither an absolute path nor an @abstract name",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn messages_reach_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut n = Notifier::from_vars(Some(path.as_os_str()), None, None, 1);
        assert!(n.enabled());
        assert_eq!(n.watchdog_interval(), None);
        n.ready("holding token 7,\ncommand running");
        assert_eq!(
            recv(&sock),
            "READY=1\nSTATUS=holding token 7, command running\n"
        );
        n.status("renewals failing");
        assert_eq!(recv(&sock), "STATUS=renewals failing\n");
        n.watchdog();
        assert_eq!(recv(&sock), "WATCHDOG=1\n");
        n.stopping("stopping");
        assert_eq!(recv(&sock), "STOPPING=1\nSTATUS=stopping\n");
    }

    #[test]
    fn abstract_sockets_work() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("leaseagent-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let var = OsString::from(format!("@{name}"));
        let mut n = Notifier::from_vars(Some(&var), None, None, 1);
        n.status("x");
        assert_eq!(recv(&sock), "STATUS=x\n");
    }

    #[test]
    fn watchdog_only_for_our_pid_and_a_positive_timeout() {
        let s = OsStr::new("/run/systemd/notify");
        let u = OsStr::new("3000000");
        let n = Notifier::from_vars(Some(s), Some(u), Some(OsStr::new("42")), 42);
        assert_eq!(n.watchdog_interval(), Some(Duration::from_millis(1500)));
        let n = Notifier::from_vars(Some(s), Some(u), None, 42);
        assert_eq!(n.watchdog_interval(), Some(Duration::from_millis(1500)));
        let n = Notifier::from_vars(Some(s), Some(u), Some(OsStr::new("41")), 42);
        assert_eq!(n.watchdog_interval(), None);
        let n = Notifier::from_vars(Some(s), Some(OsStr::new("0")), None, 42);
        assert_eq!(n.watchdog_interval(), None);
        let n = Notifier::from_vars(None, Some(u), None, 42);
        assert_eq!(n.watchdog_interval(), None);
        assert!(!n.enabled());
    }

    #[test]
    fn bad_socket_names_disable_notification() {
        let n = Notifier::from_vars(Some(OsStr::new("relative/path")), None, None, 1);
        assert!(!n.enabled());
        let n = Notifier::from_vars(Some(OsStr::new("")), None, None, 1);
        assert!(!n.enabled());
    }

    #[test]
    fn an_undelivered_ready_is_sent_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        // No listener yet: the send fails and READY stays pending.
        let mut n = Notifier::from_vars(Some(path.as_os_str()), None, None, 1);
        n.ready("r");
        assert!(n.pending_ready.is_some());
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        n.watchdog();
        assert_eq!(recv(&sock), "READY=1\nSTATUS=r\n");
        assert_eq!(recv(&sock), "WATCHDOG=1\n");
        assert!(n.pending_ready.is_none());
        // STOPPING drops a pending READY.
        drop(sock);
        std::fs::remove_file(&path).unwrap();
        n.ready("r2");
        n.stopping("s");
        assert!(n.pending_ready.is_none());
    }
}
