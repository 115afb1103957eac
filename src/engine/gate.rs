//! Fair turns at the shared database's write lock, with a deadline.
//!
//! SQLite's own busy handling is a poll: a process that finds the write lock
//! taken sleeps (1, 2, 5, … then 100 ms) and looks again. A process that
//! commits and at once begins its next transaction holds the lock again
//! within microseconds, so under steady churn a waiter that polls every
//! 100 ms almost never finds it free: on a loaded machine one agent was
//! starved for its whole 10 s timeout while two peers took turns, and
//! exited 125 ("database is locked").
//!
//! The cure is a turnstile, a second lock taken *only while waiting for the
//! write lock*: a process takes the gate (`flock` on `<db>-gate`), then
//! `BEGIN IMMEDIATE`, then lets the gate go. While a waiter holds the gate,
//! the process in its transaction cannot start its next one, so the waiter
//! gets the write lock as soon as the current transaction ends. Each turn at
//! the gate is short (at most one transaction), so waiting on it is quick,
//! and no process can take the write lock twice while another waits.
//!
//! Every wait has a deadline: both locks are polled (about a millisecond
//! apart, with jitter so peers do not poll in step) until the caller's
//! deadline, then the call fails as busy, a transient failure. Polling
//! rather than a blocking `flock` keeps the deadline without a thread or a
//! signal. The SQLite busy handler reads the deadline from a thread-local
//! set around each call (SQLite takes a plain function pointer).
//!
//! A gate holder that dies (even by SIGKILL) loses the `flock` with its
//! last descriptor: the gate can never be stuck.

use std::cell::Cell;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;

thread_local! {
    /// The deadline of the database call this thread is making.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// One poll's pause: around a millisecond, jittered.
fn pause() {
    std::thread::sleep(Duration::from_micros(500 + fastrand::u64(..1000)));
}

/// SQLite's busy handler: keep waiting (polling) until the thread's deadline.
pub fn busy_handler(_attempts: i32) -> bool {
    match DEADLINE.with(Cell::get) {
        Some(d) if Instant::now() < d => {
            pause();
            true
        }
        _ => false,
    }
}

/// Runs `f` with the busy handler bounded by `deadline`.
pub fn with_deadline<T>(deadline: Instant, f: impl FnOnce() -> T) -> T {
    let prev = DEADLINE.with(|d| d.replace(Some(deadline)));
    let out = f();
    DEADLINE.with(|d| d.set(prev));
    out
}

/// Why the gate could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("opening the lock file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("locking {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} stayed locked until the call's deadline")]
    Timeout { path: PathBuf },
}

/// The turnstile file of one database.
pub struct Gate {
    file: File,
    path: PathBuf,
}

/// The gate is held until this is dropped.
pub struct Turn<'a> {
    gate: &'a Gate,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // Unlocking cannot fail on a valid descriptor; if it somehow did,
        // closing the file on drop of the engine still frees the gate.
        let _ = rustix::fs::flock(&self.gate.file, FlockOperation::Unlock);
    }
}

impl Gate {
    /// Opens (creating, mode 0600, never through a symlink) `<db>-gate`.
    pub fn open(db: &Path) -> Result<Gate, GateError> {
        let mut name = db.as_os_str().to_owned();
        name.push("-gate");
        let path = PathBuf::from(name);
        // Through the database's checked directory, as SQLite opens it.
        let via = crate::sys::sqlite_at::path_for(db).map(|v| {
            let mut n = v.into_os_string();
            n.push("-gate");
            PathBuf::from(n)
        });
        let fd: OwnedFd = rustix::fs::open(
            via.as_deref().unwrap_or(&path),
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| GateError::Open {
            path: path.clone(),
            source: e.into(),
        })?;
        Ok(Gate {
            file: File::from(fd),
            path,
        })
    }

    /// Takes the gate, polling until `deadline`.
    pub fn enter(&self, deadline: Instant) -> Result<Turn<'_>, GateError> {
        loop {
            match rustix::fs::flock(&self.file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(Turn { gate: self }),
                Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {}
                Err(e) => {
                    return Err(GateError::Lock {
                        path: self.path.clone(),
                        source: e.into(),
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(GateError::Timeout {
                    path: self.path.clone(),
                });
            }
            pause();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_turn_at_a_time_and_a_deadline() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("x.db");
        let a = Gate::open(&db).unwrap();
        let b = Gate::open(&db).unwrap();
        let t = a.enter(Instant::now() + Duration::from_secs(5)).unwrap();
        let start = Instant::now();
        assert!(matches!(
            b.enter(start + Duration::from_millis(50)),
            Err(GateError::Timeout { .. })
        ));
        assert!(start.elapsed() >= Duration::from_millis(50));
        drop(t);
        b.enter(Instant::now() + Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn a_symlink_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        std::os::unix::fs::symlink(&target, d.path().join("x.db-gate")).unwrap();
        assert!(matches!(
            Gate::open(&d.path().join("x.db")),
            Err(GateError::Open { .. })
        ));
    }

    #[test]
    fn the_busy_handler_stops_at_the_deadline() {
        assert!(!busy_handler(0), "no deadline: give up");
        let past = Instant::now();
        assert!(!with_deadline(past, || busy_handler(0)));
        let future = Instant::now() + Duration::from_secs(60);
        assert!(with_deadline(future, || busy_handler(0)));
        assert!(!busy_handler(0), "the deadline is cleared after the call");
    }
}
