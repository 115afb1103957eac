//! Helpers for the fencing tests: running `leaseagent publish`, building
//! token-tagged trees, reading a tree through one directory descriptor,
//! polling with deadlines, process states.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_leaseagent"))
}

/// PATH with the built `leaseagent` first, for shell jobs.
pub fn path_with_bin() -> std::ffi::OsString {
    let dir = bin().parent().map(Path::to_path_buf).unwrap_or_default();
    let mut p = dir.into_os_string();
    p.push(":");
    p.push(std::env::var_os("PATH").unwrap_or_default());
    p
}

/// `leaseagent publish ARGS` with `LEASE_TOKEN` set to `env_token` (or unset).
pub fn publish(env_token: Option<&str>, args: &[&std::ffi::OsStr]) -> Output {
    let mut c = Command::new(bin());
    c.arg("publish").args(args).env_remove("LEASE_TOKEN");
    if let Some(t) = env_token {
        c.env("LEASE_TOKEN", t);
    }
    c.output().expect("run leaseagent publish")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A directory of `files` files `f0..`, each holding `tag`.
pub fn make_tree(path: &Path, tag: &str, files: usize) {
    std::fs::create_dir(path).expect("mkdir tree");
    for i in 0..files {
        std::fs::write(path.join(format!("f{i}")), tag).expect("write tree file");
    }
}

/// Reads files `f0..f{files}` of the directory at `path` through one open
/// descriptor, so every read sees the same directory even if `path` is
/// swapped meanwhile. `None` when the directory or a file vanished (an old
/// tree being deleted after an exchange), which is not a mixed view.
pub fn read_tree_at_once(path: &Path, files: usize) -> Option<Vec<String>> {
    use rustix::fs::{Mode, OFlags};
    let dir: OwnedFd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut out = Vec::with_capacity(files);
    for i in 0..files {
        let fd = rustix::fs::openat(
            &dir,
            format!("f{i}"),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let mut s = String::new();
        std::fs::File::from(fd).read_to_string(&mut s).ok()?;
        out.push(s);
    }
    Some(out)
}

/// Polls `f` until it returns `Some`, failing the test after `limit`.
pub fn poll<T>(what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    super::poll_every(what, limit, Duration::from_millis(5), f)
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T` stopped, `Z`...).
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// The child processes of `pid` (every thread's `children` list).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// Waits for a child with a deadline; kills it and fails the test after.
pub fn wait_child(child: &mut std::process::Child, what: &str, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            use std::os::unix::process::ExitStatusExt;
            return st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads a whole small file, `None` while it does not exist.
pub fn read_opt(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}
