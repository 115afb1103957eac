//! systemd's notify protocol (`Type=notify`), through the `sd-notify` crate.
//!
//! The supervisor loop alone talks to systemd: `READY=1` once the lease is
//! held and the job started, `STATUS=` on every lease state change,
//! `WATCHDOG=1` from the loop itself (so a wedged loop, not just a dead
//! process, trips `WatchdogSec=`), `STOPPING=1` when it starts stopping the
//! job. `NOTIFY_SOCKET` and `WATCHDOG_*` are never passed to the job: it is
//! not the service's main process, and systemd would reject (or worse,
//! believe) its messages. The environment is left untouched here (removing
//! variables from a multithreaded process is unsound); the job's environment
//! is built without them instead ([`JOB_ENV_REMOVE`]).

use std::time::Duration;

use sd_notify::NotifyState;

/// Variables removed from the job's environment.
pub const JOB_ENV_REMOVE: &[&str] = &["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// The agent's link to systemd; a no-op outside a notify service.
#[derive(Debug, Clone)]
pub struct Notifier {
    enabled: bool,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET` and `WATCHDOG_USEC`/`WATCHDOG_PID` once.
    pub fn from_env() -> Self {
        let enabled = std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty());
        let mut usec = 0u64;
        let watchdog = (enabled && sd_notify::watchdog_enabled(false, &mut usec) && usec > 0)
            .then(|| Duration::from_micros(usec));
        Notifier { enabled, watchdog }
    }

    /// A notifier that sends nothing.
    pub fn disabled() -> Self {
        Notifier {
            enabled: false,
            watchdog: None,
        }
    }

    /// How often the loop should send `WATCHDOG=1`: half the watchdog
    /// timeout, as sd_watchdog_enabled(3) recommends.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    fn send(&self, states: &[NotifyState]) {
        if self.enabled {
            if let Err(e) = sd_notify::notify(false, states) {
                log::debug!("sd_notify failed: {e}");
            }
        }
    }

    pub fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    pub fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    pub fn stopping(&self, status: &str) {
        self.send(&[NotifyState::Stopping, NotifyState::Status(status)]);
    }
}
