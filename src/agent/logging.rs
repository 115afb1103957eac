//! The agent's log lines go to stderr through a writer thread, so a stalled
//! stderr can never hold up the supervisor loop.
//!
//! Why: stderr is shared with the job. A job that fills a pipe nobody reads,
//! a stalled journald, or a terminal paused with Ctrl-S makes `write(2)` on
//! stderr block. The loop must send SIGTERM and SIGKILL on time whatever
//! stderr does, so no thread that decides or acts ever writes to it:
//! - every log record is formatted by `env_logger` into one buffer and handed
//!   to a bounded channel with `try_send` (never blocks);
//! - one thread, `log-writer`, takes lines off the channel and writes them to
//!   stderr with ordinary blocking writes;
//! - when the channel is full (stderr stalled for [`QUEUE_LINES`] lines) the
//!   line is dropped and counted; once the writer gets through again it says
//!   how many lines were lost.
//!
//! stderr's file status flags are never touched (no `O_NONBLOCK`): they are
//! shared with the job through the open file description, and a job that
//! suddenly sees `EAGAIN` on its own stderr would lose output or fail.
//!
//! At exit the agent calls [`flush`], which waits a bounded time for the
//! queue to drain: a stalled stderr costs at most that much at exit, never
//! the job's deadline.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};

/// Lines that may wait for a stalled stderr before new ones are dropped.
pub const QUEUE_LINES: usize = 256;

enum Msg {
    Line(Vec<u8>),
    /// Answer on the sender once every earlier line was written.
    Flush(Sender<()>),
}

struct Shared {
    tx: Sender<Msg>,
    dropped: AtomicU64,
}

impl Shared {
    /// Queues a line, or drops and counts it when the queue is full.
    fn offer(&self, line: &[u8]) {
        match self.tx.try_send(Msg::Line(line.to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// The `Write` target handed to `env_logger`: each record arrives in one
/// `write` call and is queued, or dropped and counted, without blocking.
struct QueueWriter;

impl Write for QueueWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(s) = SHARED.get() {
            s.offer(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sets up logging: `RUST_LOG` sets the level, `info` by default; lines look
/// like `leaseagent: warn: ...`. Starts the writer thread; if the thread
/// cannot be started, logging goes straight to stderr (it still works, only
/// without the protection).
pub fn init() {
    let mut builder = builder();
    let (tx, rx) = crossbeam_channel::bounded::<Msg>(QUEUE_LINES);
    let started = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || {
            // At a terminal the agent runs in a background group (the job
            // has the foreground); under `stty tostop` a write from there
            // would raise SIGTTOU, which the agent catches and relays to
            // the job. Blocked in this thread, the write just goes through.
            crate::sys::terminal::block_ttou_in_this_thread();
            writer(&rx, &mut std::io::stderr(), dropped)
        });
    if started.is_ok() {
        let _ = SHARED.set(Shared {
            tx,
            dropped: AtomicU64::new(0),
        });
        builder.target(env_logger::Target::Pipe(Box::new(QueueWriter)));
    }
    crate::sys::logcap::install(builder.build());
}

/// The level (`RUST_LOG`, `info` by default) and the line format of every
/// process of the agent's.
fn builder() -> env_logger::Builder {
    let env = env_logger::Env::default().filter_or("RUST_LOG", "info");
    let mut builder = env_logger::Builder::from_env(env);
    builder.format(|buf, record| {
        writeln!(
            buf,
            "leaseagent: {}: {}",
            record.level().as_str().to_lowercase(),
            record.args()
        )
    });
    builder
}

thread_local! {
    /// The scribe's lines of this thread, not yet sent ([`take_collected`]).
    static COLLECTED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The scribe's log target: each line kept by the thread that logged it.
struct Collect;

impl Write for Collect {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        COLLECTED.with(|c| {
            c.borrow_mut()
                .push(String::from_utf8_lossy(buf).into_owned())
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Logging for the agent's scribe (`scribe.rs`), which has no stderr of
/// its own (one it held could keep a caller's pipe open past the agent's
/// exit): the agent's level and format, each line kept by its thread and
/// sent to the agent with that thread's next answer ([`take_collected`]),
/// which writes it as its own ([`relay`]).
pub fn init_collecting() {
    let mut builder = builder();
    builder.target(env_logger::Target::Pipe(Box::new(Collect)));
    crate::sys::logcap::install(builder.build());
}

/// The lines this thread logged since the last call.
pub fn take_collected() -> Vec<String> {
    COLLECTED.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

/// A line another process of the agent's (its scribe) formatted: written
/// as the agent's own lines are, through the queue.
pub fn relay(line: &str) {
    match SHARED.get() {
        Some(s) => s.offer(line.as_bytes()),
        None => eprint!("{line}"),
    }
}

/// How many lines were dropped so far because stderr was stalled.
pub fn dropped() -> u64 {
    SHARED
        .get()
        .map_or(0, |s| s.dropped.load(Ordering::Relaxed))
}

/// Waits up to `within` for every queued line to be written. Returns whether
/// the queue drained.
pub fn flush(within: Duration) -> bool {
    let Some(s) = SHARED.get() else { return true };
    let until = Instant::now() + within;
    let (ack_tx, ack_rx) = crossbeam_channel::bounded(1);
    if s.tx.send_deadline(Msg::Flush(ack_tx), until).is_err() {
        return false;
    }
    ack_rx.recv_deadline(until).is_ok()
}

fn writer(rx: &Receiver<Msg>, out: &mut dyn Write, dropped: fn() -> u64) {
    let mut reported = 0u64;
    for msg in rx {
        match msg {
            Msg::Line(line) => {
                // Success means stderr moves again: say what was lost.
                if out.write_all(&line).is_ok() {
                    report_dropped(out, &mut reported, dropped());
                }
            }
            Msg::Flush(ack) => {
                report_dropped(out, &mut reported, dropped());
                let _ = ack.send(());
            }
        }
    }
}

fn report_dropped(out: &mut dyn Write, reported: &mut u64, dropped: u64) {
    if dropped > *reported {
        let n = dropped - *reported;
        let line = format!(
            "leaseagent: warn: {n} log line{} dropped: stderr was not being read\n",
            if n == 1 { "" } else { "s" }
        );
        if out.write_all(line.as_bytes()).is_ok() {
            *reported = dropped;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST_DROPPED: AtomicU64 = AtomicU64::new(0);

    #[test]
    fn a_full_queue_drops_and_counts_and_the_writer_says_how_many() {
        let (tx, rx) = crossbeam_channel::bounded::<Msg>(2);
        let shared = Shared {
            tx,
            dropped: AtomicU64::new(0),
        };
        for i in 0..5 {
            shared.offer(format!("line {i}\n").as_bytes());
        }
        assert_eq!(shared.dropped.load(Ordering::Relaxed), 3);
        TEST_DROPPED.store(3, Ordering::Relaxed);
        drop(shared);
        let mut out = Vec::new();
        writer(&rx, &mut out, || TEST_DROPPED.load(Ordering::Relaxed));
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "line 0\nleaseagent: warn: 3 log lines dropped: stderr was not being read\nline 1\n"
        );
    }
}
