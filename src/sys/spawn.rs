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
pub fn spawn_in_cgroup(
    program: &OsStr,
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
    let mut argv_owned = vec![prog.clone()];
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
        child(&prog, &argv, &envp, &oom_text, report_w.as_raw_fd());
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
