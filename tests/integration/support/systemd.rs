//! Test support for the systemd integration: a notify socket the test owns
//! (playing systemd's part), the agent started the way systemd starts it,
//! `/proc` helpers, and a tiny unit-file reader.

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

/// One datagram as systemd would see it.
#[derive(Clone, Debug)]
pub struct Msg {
    pub at: Instant,
    /// CLOCK_BOOTTIME when it was read, in ns.
    pub boot_ns: u128,
    /// The sender's pid from SCM_CREDENTIALS (what `NotifyAccess=main` checks).
    pub pid: i32,
    pub text: String,
}

impl Msg {
    /// Whether the message carries this `KEY=VALUE` line.
    pub fn has(&self, line: &str) -> bool {
        self.text.lines().any(|l| l == line)
    }

    /// The value of `STATUS=`, if any.
    pub fn status(&self) -> Option<&str> {
        self.text.lines().find_map(|l| l.strip_prefix("STATUS="))
    }
}

pub fn boottime_ns() -> u128 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// A unix datagram socket standing in for systemd's notify socket; a thread
/// collects every message with its sender's credentials.
pub struct NotifySocket {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
    msgs: Arc<Mutex<Vec<Msg>>>,
    stop: Arc<AtomicBool>,
    /// Receive calls that found the queue empty (timed out).
    idle: Arc<AtomicU64>,
}

impl NotifySocket {
    pub fn bind() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        rustix::net::sockopt::set_socket_passcred(&sock, true).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let msgs: Arc<Mutex<Vec<Msg>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let idle = Arc::new(AtomicU64::new(0));
        let (m, s, i) = (msgs.clone(), stop.clone(), idle.clone());
        std::thread::spawn(move || {
            let mut data = [0u8; 4096];
            while !s.load(Ordering::SeqCst) {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
                let mut control = RecvAncillaryBuffer::new(&mut space);
                let mut iov = [IoSliceMut::new(&mut data)];
                let Ok(r) = rustix::net::recvmsg(&sock, &mut iov, &mut control, RecvFlags::empty())
                else {
                    i.fetch_add(1, Ordering::SeqCst);
                    continue;
                };
                let (at, boot_ns) = (Instant::now(), boottime_ns());
                let mut pid = 0;
                for c in control.drain() {
                    if let RecvAncillaryMessage::ScmCredentials(cred) = c {
                        pid = cred.pid.as_raw_nonzero().get();
                    }
                }
                let text = String::from_utf8_lossy(&data[..r.bytes]).into_owned();
                m.lock().unwrap().push(Msg {
                    at,
                    boot_ns,
                    pid,
                    text,
                });
            }
        });
        NotifySocket {
            path,
            _dir: dir,
            msgs,
            stop,
            idle,
        }
    }

    /// Returns once every datagram queued before the call has been read:
    /// the reader has since found the queue empty twice.
    pub fn settle(&self) {
        let start = self.idle.load(Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(10);
        while self.idle.load(Ordering::SeqCst) < start + 2 {
            assert!(Instant::now() < until, "notify reader stuck");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn messages(&self) -> Vec<Msg> {
        self.msgs.lock().unwrap().clone()
    }

    /// Waits for the first message (from the start) that satisfies `f`.
    pub fn wait_for(&self, within: Duration, f: impl Fn(&Msg) -> bool) -> Option<Msg> {
        let until = Instant::now() + within;
        loop {
            if let Some(m) = self.messages().into_iter().find(|m| f(m)) {
                return Some(m);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `n` messages satisfy `f`.
    pub fn wait_count(&self, n: usize, within: Duration, f: impl Fn(&Msg) -> bool) -> Vec<Msg> {
        let until = Instant::now() + within;
        loop {
            let got: Vec<Msg> = self.messages().into_iter().filter(|m| f(m)).collect();
            if got.len() >= n || Instant::now() >= until {
                return got;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Everything received, for assertion messages.
    pub fn dump(&self) -> String {
        self.messages()
            .iter()
            .map(|m| format!("[pid {}] {:?}", m.pid, m.text))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// How the agent is started: like systemd does, with `NOTIFY_SOCKET` and,
/// optionally, `WATCHDOG_USEC` and `WATCHDOG_PID` naming the agent itself.
pub struct Launch {
    pub notify: Option<PathBuf>,
    pub watchdog_usec: Option<u64>,
    /// `Some(pid)` sets this WATCHDOG_PID instead of the agent's own.
    pub watchdog_pid_override: Option<u32>,
}

/// Starts `leaseagent ARGS...` through `sh -c 'export WATCHDOG_PID=$$; exec ...'`
/// so that WATCHDOG_PID is the agent's pid from its first instruction, the
/// way systemd sets it. The returned child's pid is the agent's.
pub fn spawn_agent(
    launch: &Launch,
    args: &[&str],
    state_dir: &Path,
    stderr: Stdio,
) -> std::io::Result<Child> {
    let script = match (launch.watchdog_usec, launch.watchdog_pid_override) {
        (Some(_), None) => "export WATCHDOG_PID=$$; exec \"$0\" \"$@\"",
        _ => "exec \"$0\" \"$@\"",
    };
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_leaseagent"))
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env("LEASEAGENT_STATE_DIR", state_dir)
        .env("XDG_RUNTIME_DIR", state_dir)
        .env("RUST_LOG", "leaseagent=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    if let Some(p) = &launch.notify {
        c.env("NOTIFY_SOCKET", p);
    }
    if let Some(u) = launch.watchdog_usec {
        c.env("WATCHDOG_USEC", u.to_string());
    }
    if let Some(p) = launch.watchdog_pid_override {
        c.env("WATCHDOG_PID", p.to_string());
    }
    c.spawn()
}

/// Fields of /proc/PID/stat after the command name: [0] state, [1] ppid,
/// [2] pgrp, [3] session, ... [19] starttime.
pub fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        s.rsplit(')')
            .next()?
            .split_whitespace()
            .map(str::to_string)
            .collect(),
    )
}

/// Live children of `pid`, from /proc.
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some(f) = stat_fields(p) {
            if f.get(1).and_then(|x| x.parse().ok()) == Some(pid) && f[0] != "Z" {
                out.push(p);
            }
        }
    }
    out
}

/// The NUL-separated environment of a process.
pub fn environ(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

pub fn clock_ticks_per_sec() -> u128 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

pub fn sigterm(pid: u32) {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

// ---------------------------------------------------------------- unit files

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A unit file as `section -> key -> values` (a key may repeat). Good enough
/// for the project's own units: no line continuations, `#` comments only.
pub struct Unit {
    pub sections: HashMap<String, HashMap<String, Vec<String>>>,
}

impl Unit {
    pub fn read(path: &Path) -> Unit {
        let text = std::fs::read_to_string(path).unwrap();
        let mut sections: HashMap<String, HashMap<String, Vec<String>>> = HashMap::new();
        let mut current = String::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                current = s.to_string();
                continue;
            }
            let (k, v) = line.split_once('=').unwrap();
            sections
                .entry(current.clone())
                .or_default()
                .entry(k.trim().to_string())
                .or_default()
                .push(v.trim().to_string());
        }
        Unit { sections }
    }

    /// The last value of a key (systemd's rule for single-valued keys).
    pub fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.sections
            .get(section)?
            .get(key)?
            .last()
            .map(String::as_str)
    }

    pub fn all(&self, section: &str, key: &str) -> Vec<String> {
        self.sections
            .get(section)
            .and_then(|s| s.get(key))
            .cloned()
            .unwrap_or_default()
    }
}

/// A systemd time span (`90s`, `10min`, `1h`, `infinity`) in seconds.
pub fn span_secs(v: &str) -> f64 {
    if v == "infinity" {
        return f64::INFINITY;
    }
    let digits: String = v.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: f64 = digits.parse().unwrap();
    match &v[digits.len()..] {
        "" | "s" | "sec" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        u => panic!("unit {u} not handled in {v}"),
    }
}

/// `KEY=VALUE` lines of an EnvironmentFile (comments skipped).
pub fn env_file(path: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
