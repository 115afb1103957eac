//! Starting the job directly inside its cgroup: `clone3(CLONE_INTO_CGROUP)`.
//!
//! Why not `std::process::Command`: std cannot create a child in another
//! cgroup, so the job had to be moved there, by the keeper moving itself in
//! and out around the spawn, or by the child before `exec`. Every move is a
//! write to `cgroup.procs`, and every such write takes the kernel's
//! cgroup-wide `cgroup_threadgroup_rwsem` for writing, which waits for an RCU
//! grace period when no other move happened just before: 0.1 to 16 ms,
//! measured here, on the path of every run before the job starts. A child
//! created with `CLONE_INTO_CGROUP` (Linux 5.7) is born in the cgroup: no
//! move, no wait, and the keeper is never inside the job's cgroup, so its
//! `cgroup.kill` can never take the keeper.
//!
//! What the child does between `clone3` and `exec` is what std's own
//! fork/exec path does, and no more: a process group of its own
//! (`setpgid(0, 0)`), its `oom_score_adj`, `SIGPIPE` back to default (the
//! Rust runtime ignores it, and an ignored signal stays ignored across
//! `exec`), an empty signal mask, then `execvpe` (the same `PATH` search
//! and script fallback as std's `execvp`, with the environment given). Handlers go back to default with
//! `CLONE_CLEAR_SIGHAND`. Everything is prepared before the clone; the
//! child makes only async-signal-safe calls that allocate nothing. An
//! `exec` failure's errno reaches the parent through a close-on-exec pipe
//! (end of file: the `exec` happened), as in std.
//!
//! The caller falls back to a move ([`Failure::Clone`]) where the kernel
//! refuses the clone (before 5.7, a cgroup that cannot take processes).

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why no job was started.
#[derive(Debug)]
pub enum Failure {
    /// The kernel refused the clone itself: nothing was started; the
    /// caller may start the job another way.
    Clone(std::io::Error),
    /// The child was created but `exec` failed (the command's own problem:
    /// not found, not executable); the child has exited and been reaped.
    Exec(std::io::Error),
}

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`, Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Starts `program` with `args`, with this process's environment and `env`
/// over it, in the cgroup whose directory `cgroup` is open, in a process
/// group of its own, with `oom_score_adj` = `oom_adj`. Returns its pid.
/// `resolved`: the file `program` names, found beforehand ([`find_in_path`]);
/// `program` stays the command's `argv[0]`.
pub fn spawn_in_cgroup(
    program: &OsStr,
    resolved: Option<&Path>,
    args: &[std::ffi::OsString],
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    cgroup: BorrowedFd<'_>,
    oom_adj: i16,
) -> Result<i32, Failure> {
    let invalid = |what: &str| {
        Failure::Exec(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        ))
    };
    // Everything the child needs, made before the clone.
    let prog = CString::new(program.as_bytes()).map_err(|_| invalid("the command"))?;
    let file = match resolved {
        Some(p) => CString::new(p.as_os_str().as_bytes()).map_err(|_| invalid("the command"))?,
        None => prog.clone(),
    };
    let mut argv_owned = vec![prog];
    for a in args {
        argv_owned.push(CString::new(a.as_bytes()).map_err(|_| invalid("an argument"))?);
    }
    let mut argv: Vec<*const libc::c_char> = argv_owned.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut env_owned = Vec::new();
    let entry = |k: &OsStr, v: &OsStr| {
        let mut e = k.as_bytes().to_vec();
        e.push(b'=');
        e.extend_from_slice(v.as_bytes());
        CString::new(e).map_err(|_| invalid("an environment variable"))
    };
    for (k, v) in std::env::vars_os() {
        if !env.iter().any(|(ek, _)| *ek == k) {
            env_owned.push(entry(&k, &v)?);
        }
    }
    for (k, v) in env {
        env_owned.push(entry(k, v)?);
    }
    let mut envp: Vec<*const libc::c_char> = env_owned.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let oom_text = oom_adj.to_string().into_bytes();
    let (report_r, report_w): (OwnedFd, OwnedFd) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| Failure::Clone(e.into()))?;

    let mut cl_args = CloneArgs {
        flags: CLONE_INTO_CGROUP | CLONE_CLEAR_SIGHAND,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `cl_args` is a live, fully initialised `struct clone_args`
    // of the size passed. Without CLONE_VM the child gets a copy of this
    // address space and returns here on a copy of this stack, as after
    // fork(); it then only runs `child` below, which never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut cl_args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0 {
        return Err(Failure::Clone(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        child(&file, &argv, &envp, &oom_text, report_w.as_raw_fd());
    }
    drop(report_w);
    let pid = pid as i32;
    // End of file: the exec happened. Four bytes: its errno.
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(&report_r, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
    }
    if got == 0 {
        return Ok(pid);
    }
    // The child exits right after writing: reap it.
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
    }
    Err(Failure::Exec(std::io::Error::from_raw_os_error(
        i32::from_ne_bytes(buf),
    )))
}

/// The file `execvp` would run for `program` under `path` (a `PATH`
/// value; `None`: unset, glibc's default `/bin:/usr/bin`), when it can be
/// told beforehand: the first regular file along it that we may execute.
/// `None` when `program` has a slash (nothing to search) or nothing
/// qualifies: `execvpe` then searches itself, with its own errors.
///
/// Why: the keeper looks the command up while it waits for the grant, so
/// the child execs the file at once instead of trying each directory of
/// `PATH` in turn (a failed `execve` each) on the way from the grant to
/// the job. The lookup follows `execvp`'s order (an empty entry is the
/// current directory), and `execvpe` given the found path still runs a
/// script without a `#!` line through `/bin/sh`, as the search would.
pub fn find_in_path(program: &OsStr, path: Option<&OsStr>) -> Option<PathBuf> {
    if program.is_empty() || program.as_bytes().contains(&b'/') {
        return None;
    }
    let path = path.unwrap_or(OsStr::new("/bin:/usr/bin"));
    path.as_bytes().split(|b| *b == b':').find_map(|dir| {
        let dir = if dir.is_empty() { b".".as_slice() } else { dir };
        let candidate = Path::new(OsStr::from_bytes(dir)).join(program);
        let is_file = std::fs::metadata(&candidate).is_ok_and(|m| m.is_file());
        let may_exec = rustix::fs::access(&candidate, rustix::fs::Access::EXEC_OK).is_ok();
        (is_file && may_exec).then_some(candidate)
    })
}

/// The child, between `clone3` and `exec`: async-signal-safe calls only,
/// no allocation, never returns.
fn child(
    prog: &CString,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    oom_text: &[u8],
    report: libc::c_int,
) -> ! {
    // SAFETY: in the single-threaded child of a clone without CLONE_VM,
    // each call below is async-signal-safe (setpgid; the oom_score_adj
    // write's raw open/write/close; signal; sigprocmask; execvpe as glibc
    // implements it: no malloc for a PATH search, which std's own child
    // relies on too; _exit) and is given only pointers into memory prepared
    // before the clone (NUL-terminated strings, NULL-terminated argv and
    // envp) or on this stack frame.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            fail(report);
        }
        // Best effort: a refused write leaves the inherited value.
        super::priority::write_own_oom_score_adj(oom_text);
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execvpe(prog.as_ptr(), argv.as_ptr(), envp.as_ptr());
        fail(report)
    }
}

/// Sends errno to the parent and exits (child only).
fn fail(report: libc::c_int) -> ! {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let bytes = errno.to_ne_bytes();
    // SAFETY: write and _exit are async-signal-safe; `bytes` is on this
    // stack frame and its length is passed.
    unsafe {
        let _ = libc::write(report, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn the_first_executable_regular_file_along_path_is_found() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        // In `a`: a directory and a file nobody may execute by that name.
        std::fs::create_dir(a.path().join("job")).unwrap();
        file(a.path(), "other", 0o644);
        let in_b = file(b.path(), "job", 0o755);
        file(b.path(), "other", 0o755);
        let path = std::env::join_paths([a.path(), b.path()]).unwrap();
        assert_eq!(find_in_path(OsStr::new("job"), Some(&path)), Some(in_b));
        let other = find_in_path(OsStr::new("other"), Some(&path)).unwrap();
        // Root may execute a 0644 file only if some x bit is set: never here.
        assert_eq!(other, b.path().join("other"));
    }

    #[test]
    fn nothing_is_searched_for_a_path_or_an_unknown_name() {
        let a = tempfile::tempdir().unwrap();
        file(a.path(), "job", 0o755);
        let path = a.path().as_os_str();
        assert_eq!(find_in_path(OsStr::new("./job"), Some(path)), None);
        assert_eq!(find_in_path(OsStr::new("sub/job"), Some(path)), None);
        assert_eq!(find_in_path(OsStr::new(""), Some(path)), None);
        assert_eq!(find_in_path(OsStr::new("no-such-job"), Some(path)), None);
    }

    #[test]
    fn odd_path_entries_are_passed_over() {
        use std::os::unix::ffi::OsStringExt;
        let a = tempfile::tempdir().unwrap();
        let job = file(a.path(), "job", 0o755);
        // Bytes that are no UTF-8, a relative directory and an empty entry
        // (the current directory, which holds no `job`) before the real one.
        let mut path = b"/no\xffsuch:relative/dir::".to_vec();
        path.extend_from_slice(a.path().as_os_str().as_bytes());
        let path = std::ffi::OsString::from_vec(path);
        assert_eq!(find_in_path(OsStr::new("job"), Some(&path)), Some(job));
    }

    #[test]
    fn an_unset_path_is_glibcs_default() {
        assert_eq!(
            find_in_path(OsStr::new("sh"), None),
            Some(PathBuf::from("/bin/sh"))
        );
    }
}
