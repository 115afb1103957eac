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
//!
//! ## Where lines go, and at which level
//!
//! - The level ([`Settings`]): `-q`/`-v`/`--log-level`/`LEASEAGENT_LOG`,
//!   else `RUST_LOG`'s, else `info`; leaseagent's own errors are never
//!   filtered out, whatever `RUST_LOG` says (`sys::logcap::builder`). The
//!   normal lifecycle of a run is `info`, a task held elsewhere too (it is
//!   an outcome, not a failure), so `-q` (errors only) makes a cron job
//!   mail nothing on a normal night.
//! - Under systemd (`JOURNAL_STREAM` names the very file stderr is, so a
//!   job's `2>file` or a pipe is never mistaken for it), each line is one
//!   datagram of journald's native protocol to [`JOURNAL_SOCKET`]: its
//!   `PRIORITY=` the line's level (error 3, warn 4, info 6, debug 7), and
//!   `LEASE_TASK=`, `LEASE_TOKEN=`, `LEASE_ID=`, `LEASE_OUTCOME=` as fields
//!   once known, so `journalctl -p warning` and `journalctl LEASE_TASK=x`
//!   work. The path is fixed: nothing a job sets can point the agent's log
//!   at another socket.
//! - Else on stderr, `leaseagent: LEVEL: text`, with an RFC 3339 time in
//!   front when stderr is not a terminal (cron's mail, a log file); or one
//!   JSON object a line with `--log-format json`.

use std::io::{IsTerminal, Write};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};

/// Lines that may wait for a stalled stderr before new ones are dropped.
pub const QUEUE_LINES: usize = 256;

/// journald's socket for the native protocol (`systemd-journald.socket`).
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// How the agent's lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Text on stderr, or the journal's native protocol under systemd.
    #[default]
    Text,
    /// One JSON object a line on stderr, under systemd too.
    Json,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "text" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

/// The levels `--log-level` and `LEASEAGENT_LOG` accept, as the error
/// names them.
pub const LEVELS: &str = "error, warn, info, debug or trace";

/// A `--log-level` (or `LEASEAGENT_LOG`) value that is not a level.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a log level: --log-level and LEASEAGENT_LOG take {LEVELS}")]
pub struct UnknownLevel(pub String);

/// `error`, `warn`, `info`, `debug` or `trace` (any case). Not `off`, nor
/// env_logger's looser words: a level typed wrong must not hide errors.
pub fn parse_level(s: &str) -> Result<log::LevelFilter, UnknownLevel> {
    match s.to_ascii_lowercase().as_str() {
        "error" => Ok(log::LevelFilter::Error),
        "warn" => Ok(log::LevelFilter::Warn),
        "info" => Ok(log::LevelFilter::Info),
        "debug" => Ok(log::LevelFilter::Debug),
        "trace" => Ok(log::LevelFilter::Trace),
        _ => Err(UnknownLevel(s.to_string())),
    }
}

/// What the command line says of logging, fixed before the scribe forks
/// ([`configure`]), so the scribe logs at the same level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `None`: `RUST_LOG`'s level for leaseagent, else `info`.
    pub level: Option<log::LevelFilter>,
    pub format: Format,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Fixes the settings for this process (and the processes it forks).
pub fn configure(s: Settings) {
    let _ = SETTINGS.set(s);
}

fn settings() -> Settings {
    SETTINGS.get().copied().unwrap_or_default()
}

/// The lease a line is about, as the journal's and JSON's fields.
#[derive(Clone, Debug, Default)]
struct Context {
    task: Option<String>,
    token: Option<u64>,
    lease_id: Option<String>,
}

static CONTEXT: Mutex<Context> = Mutex::new(Context {
    task: None,
    token: None,
    lease_id: None,
});

/// Every later line is about `task`.
pub fn set_task(task: &str) {
    if let Ok(mut c) = CONTEXT.lock() {
        c.task = Some(task.to_string());
    }
}

/// Every later line is about this grant.
pub fn set_grant(token: u64, lease_id: &str) {
    if let Ok(mut c) = CONTEXT.lock() {
        c.token = Some(token);
        c.lease_id = Some(lease_id.to_string());
    }
}

thread_local! {
    /// The outcome the line being logged by this thread states.
    static OUTCOME: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

/// Logs `text` at `level` with `LEASE_OUTCOME=outcome` among its fields.
pub fn log_outcome(level: log::Level, outcome: &'static str, text: &str) {
    OUTCOME.with(|o| o.set(Some(outcome)));
    log::log!(level, "{text}");
    OUTCOME.with(|o| o.set(None));
}

/// Where this process's lines go.
#[derive(Clone, Copy)]
enum Sink {
    /// stderr as text; with a time in front when stderr is not a terminal.
    Text {
        stamp: bool,
    },
    Json,
    /// journald's native protocol (the writer sends each line as one
    /// datagram).
    Journal,
}

static SINK: OnceLock<Sink> = OnceLock::new();

fn sink() -> &'static Sink {
    SINK.get().unwrap_or(&Sink::Text { stamp: false })
}

/// One record as the sink writes it.
fn entry(level: log::Level, text: &str) -> Vec<u8> {
    let ctx = CONTEXT.lock().map(|c| c.clone()).unwrap_or_default();
    let outcome = OUTCOME.with(|o| o.get());
    let name = level.as_str().to_lowercase();
    match sink() {
        Sink::Text { stamp } => {
            let time = if *stamp {
                format!(
                    "{} ",
                    humantime::format_rfc3339_millis(std::time::SystemTime::now())
                )
            } else {
                String::new()
            };
            format!("{time}leaseagent: {name}: {text}\n").into_bytes()
        }
        Sink::Json => {
            let mut o = serde_json::Map::new();
            let t = humantime::format_rfc3339_millis(std::time::SystemTime::now());
            o.insert("time".into(), t.to_string().into());
            o.insert("level".into(), name.into());
            o.insert("message".into(), text.into());
            if let Some(v) = ctx.task {
                o.insert("task".into(), v.into());
            }
            if let Some(v) = ctx.token {
                o.insert("token".into(), v.into());
            }
            if let Some(v) = ctx.lease_id {
                o.insert("lease_id".into(), v.into());
            }
            if let Some(v) = outcome {
                o.insert("outcome".into(), v.into());
            }
            let mut line = serde_json::Value::Object(o).to_string().into_bytes();
            line.push(b'\n');
            line
        }
        Sink::Journal => {
            let priority = match level {
                log::Level::Error => "3",
                log::Level::Warn => "4",
                log::Level::Info => "6",
                log::Level::Debug | log::Level::Trace => "7",
            };
            let mut buf = Vec::new();
            journal_field(&mut buf, "PRIORITY", priority);
            journal_field(&mut buf, "SYSLOG_IDENTIFIER", "leaseagent");
            journal_field(&mut buf, "MESSAGE", text);
            if let Some(v) = &ctx.task {
                journal_field(&mut buf, "LEASE_TASK", v);
            }
            if let Some(v) = ctx.token {
                journal_field(&mut buf, "LEASE_TOKEN", &v.to_string());
            }
            if let Some(v) = &ctx.lease_id {
                journal_field(&mut buf, "LEASE_ID", v);
            }
            if let Some(v) = outcome {
                journal_field(&mut buf, "LEASE_OUTCOME", v);
            }
            buf
        }
    }
}

/// One field of the native protocol: `NAME=value\n`, or for a value with
/// a newline `NAME\n`, its length as 64-bit little-endian, the value, `\n`.
fn journal_field(buf: &mut Vec<u8>, name: &str, value: &str) {
    buf.extend_from_slice(name.as_bytes());
    if value.contains('\n') {
        buf.push(b'\n');
        buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        buf.push(b'=');
    }
    buf.extend_from_slice(value.as_bytes());
    buf.push(b'\n');
}

/// journald's socket, when stderr is the stream systemd connected to the
/// journal (`JOURNAL_STREAM=DEV:INODE` of stderr itself: a job's own
/// redirect of the agent's stderr is not the journal).
fn journal() -> Option<UnixDatagram> {
    let v = std::env::var("JOURNAL_STREAM").ok()?;
    let (dev, ino) = v.split_once(':')?;
    let st = rustix::fs::fstat(std::io::stderr()).ok()?;
    if st.st_dev.to_string() != dev || st.st_ino.to_string() != ino {
        return None;
    }
    let sock = UnixDatagram::unbound().ok()?;
    sock.connect(JOURNAL_SOCKET).ok()?;
    Some(sock)
}

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

/// The journal as the writer's output: one `write`, one datagram.
struct JournalWriter(UnixDatagram);

impl Write for JournalWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.send(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sets up logging (the level and format of [`configure`]d settings, the
/// journal under systemd). Starts the writer thread; if the thread cannot
/// be started, logging goes straight to stderr (it still works, only
/// without the protection).
pub fn init() {
    let s = settings();
    let journal = match s.format {
        Format::Json => None,
        Format::Text => journal(),
    };
    let text = Sink::Text {
        stamp: !std::io::stderr().is_terminal(),
    };
    let sink = match (s.format, &journal) {
        (Format::Json, _) => Sink::Json,
        (Format::Text, Some(_)) => Sink::Journal,
        (Format::Text, None) => text,
    };
    let mut builder = builder(s);
    let (tx, rx) = crossbeam_channel::bounded::<Msg>(QUEUE_LINES);
    let started = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || {
            // At a terminal the agent runs in a background group (the job
            // has the foreground); under `stty tostop` a write from there
            // would raise SIGTTOU, which the agent catches and relays to
            // the job. Blocked in this thread, the write just goes through.
            crate::sys::terminal::block_ttou_in_this_thread();
            match journal {
                Some(sock) => writer(&rx, &mut JournalWriter(sock), dropped),
                None => writer(&rx, &mut std::io::stderr(), dropped),
            }
        });
    if started.is_ok() {
        let _ = SHARED.set(Shared {
            tx,
            dropped: AtomicU64::new(0),
        });
        builder.target(env_logger::Target::Pipe(Box::new(QueueWriter)));
        let _ = SINK.set(sink);
    } else {
        // No writer thread, so no journal socket: stderr gets text, not
        // the native protocol's binary records.
        let _ = SINK.set(match sink {
            Sink::Journal => text,
            other => other,
        });
    }
    crate::sys::logcap::install(builder.build());
}

/// The level ([`Settings`], `RUST_LOG`, `info` by default) and the line
/// format of every process of the agent's.
fn builder(s: Settings) -> env_logger::Builder {
    let mut builder = crate::sys::logcap::builder(s.level, log::LevelFilter::Info);
    builder.format(|buf, record| buf.write_all(&entry(record.level(), &record.args().to_string())));
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
    let _ = SINK.set(Sink::Text { stamp: false });
    let mut builder = builder(settings());
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
    let text = line.trim_end_matches('\n');
    let parsed = text.strip_prefix("leaseagent: ").and_then(|rest| {
        let (level, msg) = rest.split_once(": ")?;
        Some((level.parse::<log::Level>().ok()?, msg))
    });
    match (parsed, SHARED.get()) {
        // Its level and fields as the agent's own lines, in the agent's sink.
        (Some((level, msg)), _) => log::log!(target: "leaseagent::agent::scribe", level, "{msg}"),
        (None, Some(s)) => s.offer(line.as_bytes()),
        (None, None) => eprint!("{line}"),
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
        let line = entry(
            log::Level::Warn,
            &format!(
                "{n} log line{} dropped: stderr was not being read",
                if n == 1 { "" } else { "s" }
            ),
        );
        if out.write_all(&line).is_ok() {
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
