//! The event loops of `serve`: four threads per core, each running its own
//! single-threaded tokio runtime (its own epoll, timers and tasks); every
//! accepted connection lives on one of them, dealt out in turn.
//!
//! Why not tokio's work-stealing runtime: it has one epoll for all its
//! workers, and the worker that polls it queues every woken connection on
//! itself; when that worker is preempted (each answer wakes a client, which
//! the kernel may run at once on the same core), those connections wait
//! until it gets the CPU back or another worker steals them, and the
//! hand-offs cost CPU. With one epoll per thread the kernel wakes the very
//! thread whose connection has data (as it woke a connection's own thread
//! in the thread-per-connection server before), and a preempted loop delays
//! only its own share. Measured on the 2-core development machine (docs/sizing.md;
//! three alternated pairs): 10,000 keep-alive agents renewing
//! 1,000 times a second, renew p99 0.40–1.15 ms instead of 0.68–2.28 ms,
//! at 98–116 µs of server CPU per renewal instead of 122–151.
//!
//! Why four loops per core, not one: when a load generator (or anything
//! else) keeps every core busy, a loop that serves many connections is
//! always runnable, so the scheduler sometimes makes it wait a whole time
//! slice for a core, and all its connections wait with it. A loop with a
//! quarter of those connections is idle more often, and the kernel runs a
//! thread that wakes from idle promptly. Measured with `wrk` (16
//! keep-alive connections, 2 threads, saturating both cores), ten
//! alternated rounds: renew p99 median 1.3 ms with 4 loops per core
//! against 14 ms with 1 per core (lower in 8 of 10 rounds), at 45,000–
//! 58,000 renewals/s against 56,000–72,000 (docs/sizing.md).
//!
//! Invariants: a connection's socket is registered with the loop that
//! serves it (so its readiness never goes through another thread); the
//! loops stop only after the accept loop has drained the connections (or
//! given up waiting); nothing on a loop blocks (a grant awaits its commit,
//! a listing runs on the loop's blocking pool).

use std::io;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;

/// Most loops, whatever the number of cores.
const MAX_LOOPS: usize = 16;

/// Threads a loop may start for blocking work (listings and metrics).
const BLOCKING_PER_LOOP: usize = 16;

/// Loops per core (see the module doc).
const LOOPS_PER_CORE: usize = 4;

/// Four loops per core, at most [`MAX_LOOPS`].
pub fn count() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    cores.saturating_mul(LOOPS_PER_CORE).clamp(1, MAX_LOOPS)
}

/// Running loops.
pub struct Loops {
    handles: Vec<Handle>,
    threads: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl Loops {
    /// Starts `n` loops (at least one).
    pub fn start(n: usize) -> io::Result<Loops> {
        let (stop, stopped) = watch::channel(false);
        let mut loops = Loops {
            handles: Vec::new(),
            threads: Vec::new(),
            stop,
        };
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .max_blocking_threads(BLOCKING_PER_LOOP)
                .thread_name(format!("serve-{i}"))
                .build()?;
            loops.handles.push(rt.handle().clone());
            let mut stopped = stopped.clone();
            let thread = std::thread::Builder::new()
                .name(format!("serve-{i}"))
                .spawn(move || {
                    rt.block_on(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    });
                    rt.shutdown_timeout(Duration::from_secs(1));
                });
            match thread {
                Ok(t) => loops.threads.push(t),
                Err(e) => {
                    loops.stop();
                    return Err(e);
                }
            }
        }
        Ok(loops)
    }

    /// The loops' runtimes, to spawn connections on.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// Stops every loop (what still runs on it gets a second) and waits.
    pub fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.threads {
            let _ = t.join();
        }
    }
}
