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
//! fork/exec path does, plus the steps of [`ChildSteps`]: a process group
//! of its own (`setpgid(0, 0)`), the terminal's foreground when the agent
//! hands the job its terminal, its `oom_score_adj`, every signal back to
//! its default action, the switch to `--user`'s ids, an empty signal mask,
//! then `execvpe` (the same `PATH` search and script fallback as std's
//! `execvp`, with the environment given). Handlers go back to default with
//! `CLONE_CLEAR_SIGHAND`; *ignored* signals would stay ignored across
//! `exec`, so every signal this process ignores is set back to default by
//! hand: `SIGPIPE` (the Rust runtime ignores it), and glibc's internal 32
//! and 33, which glibc's `posix_spawn` leaves ignored in the keeper it
//! started (a job would otherwise start with them ignored, and a program
//! that uses them, a threaded one cancelling a thread, would hang). The
//! raw `rt_sigaction` call does it: glibc's own refuses those two.
//! Everything is prepared before the clone; the child makes only
//! async-signal-safe calls that allocate nothing. A failure's step and
//! errno reach the parent through a close-on-exec pipe (end of file: the
//! `exec` happened), as in std.
//!
//! The caller falls back to a move ([`Failure::Clone`]) where the kernel
//! refuses the clone (before 5.7, a cgroup that cannot take processes).

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::clone3::{CLONE_CLEAR_SIGHAND, CLONE_INTO_CGROUP, CloneArgs, clone3};
use super::user::{Identity, Switch, SwitchStep};

/// Why no job was started.
#[derive(Debug)]
pub enum Failure {
    /// The kernel refused the clone itself: nothing was started; the
    /// caller may start the job another way.
    Clone(std::io::Error),
    /// The child was created but `exec` failed (the command's own problem:
    /// not found, not executable); the child has exited and been reaped.
    Exec(std::io::Error),
    /// The child could not become `--user`'s ids (the agent's problem, not
    /// the command's); it has exited and been reaped, nothing ran.
    Switch {
        step: SwitchStep,
        error: std::io::Error,
    },
}

/// The child's own steps before `exec`, beyond a process group: made in
/// the parent, carried out in the child ([`ChildSteps::run`]) by either
/// way of starting the job (the clone here, or std's fork with
/// [`ChildSteps::on_exec`]).
#[derive(Clone, Debug)]
pub struct ChildSteps {
    /// `--user`: the ids to switch to.
    switch: Option<Switch>,
    /// The signals this process ignores (found now): set back to default.
    ignored: Vec<i32>,
    /// Make the child's process group the foreground of the terminal on
    /// stdin (it shares the agent's session and controlling terminal).
    foreground: bool,
    /// What the job starts without (`sys::confine`).
    limits: Limits,
}

/// What [`ChildSteps`] take away from the job (`sys::confine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Drop the capabilities that reach the guardians (not `--full-root`).
    pub confine: bool,
    /// `PR_SET_NO_NEW_PRIVS` (`--user` without `--allow-new-privs`).
    pub no_new_privs: bool,
    /// Every descriptor above stderr closed at the exec (`--user`).
    pub stdio_only: bool,
}

impl ChildSteps {
    pub fn new(user: Option<&Identity>, foreground: bool, limits: Limits) -> ChildSteps {
        ChildSteps {
            switch: user.map(Switch::new),
            ignored: ignored_signals(),
            foreground,
            limits,
        }
    }

    /// In the child, between `fork`/`clone` and `exec`, after `setpgid`:
    /// async-signal-safe, allocation-free. `Err`: the job must not run.
    fn run(&self) -> Result<(), (SwitchStep, i32)> {
        if self.foreground {
            // This process's group (it leads it: `setpgid(0, 0)` came
            // first) made the foreground of the terminal on stdin. A
            // failure leaves the terminal as it was (the job then reads it
            // as a background group would: SIGTTIN, which stops it, and
            // the agent's front with it, for the shell's `fg`).
            super::terminal::set_foreground(rustix::process::getpid().as_raw_nonzero().get());
        }
        for &sig in &self.ignored {
            set_default(sig);
        }
        // Before the switch: dropping from the bounding set needs the
        // CAP_SETPCAP a switch to another user clears.
        if self.limits.confine {
            super::confine::drop_capabilities().map_err(|e| (SwitchStep::Confine, e))?;
        }
        if let Some(s) = &self.switch {
            s.apply()?;
        }
        if self.limits.no_new_privs {
            super::confine::no_new_privs().map_err(|e| (SwitchStep::NoNewPrivs, e))?;
        }
        if self.limits.stdio_only {
            super::confine::close_others_on_exec();
        }
        Ok(())
    }

    /// The same steps for a child of std's `Command` (which made the
    /// process group already). A failed switch reaches the caller as the
    /// spawn's error, with its errno (`EPERM` for a failed check).
    pub fn on_exec(self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let hook = move || {
            self.run().map_err(|(_, errno)| {
                std::io::Error::from_raw_os_error(if errno == 0 { libc::EPERM } else { errno })
            })
        };
        // SAFETY: the hook runs in the forked child before exec and makes
        // only the raw system calls of `ChildSteps::run`, on memory made
        // before the fork: async-signal-safe, no allocation, no lock.
        unsafe {
            cmd.pre_exec(hook);
        }
    }
}

/// The kernel's `struct sigaction` for `rt_sigaction` (the generic layout
/// of x86_64, aarch64 and riscv64).
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Every signal (1 to 64, but SIGKILL and SIGSTOP) whose action in this
/// process is "ignore".
fn ignored_signals() -> Vec<i32> {
    (1..=64)
        .filter(|&sig| sig != libc::SIGKILL && sig != libc::SIGSTOP && is_ignored(sig))
        .collect()
}

#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
fn is_ignored(sig: i32) -> bool {
    let mut old = KernelSigaction::default();
    // SAFETY: a query (no new action); `old` is a live kernel sigaction
    // of the size the call writes, 8 the mask's size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            std::ptr::null::<KernelSigaction>(),
            &mut old,
            8usize,
        )
    };
    rc == 0 && old.handler == libc::SIG_IGN
}

/// Elsewhere the kernel's layout differs: glibc's own call, which does not
/// answer for its internal 32 and 33.
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
fn is_ignored(sig: i32) -> bool {
    // SAFETY: a query; `old` is a live sigaction.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    rc == 0 && old.sa_sigaction == libc::SIG_IGN
}

/// `sig` back to its default action (child only: async-signal-safe).
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
fn set_default(sig: i32) {
    let dfl = KernelSigaction::default();
    // SAFETY: `dfl` is a live kernel sigaction (SIG_DFL, no flags, empty
    // mask) of the size the call reads; the old action is not asked for.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &dfl,
            std::ptr::null_mut::<KernelSigaction>(),
            8usize,
        );
    }
}

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
fn set_default(sig: i32) {
    // SAFETY: signal(2) is async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// Starts `program` with `args`, with this process's environment and `env`
/// over it, in the cgroup whose directory `cgroup` is open, in a process
/// group of its own, with `oom_score_adj` = `oom_adj` and `steps`. Returns
/// its pid. `resolved`: the file `program` names, found beforehand
/// ([`find_in_path`]); `program` stays the command's `argv[0]`.
pub fn spawn_in_cgroup(
    program: &OsStr,
    resolved: Option<&Path>,
    args: &[std::ffi::OsString],
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    cgroup: BorrowedFd<'_>,
    oom_adj: i16,
    steps: &ChildSteps,
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
    let pid = unsafe { clone3(&mut cl_args) };
    if pid < 0 {
        return Err(Failure::Clone(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        child(&file, &argv, &envp, &oom_text, steps, report_w.as_raw_fd());
    }
    drop(report_w);
    let pid = pid as i32;
    // End of file: the exec happened. Eight bytes: the step (0: exec) and
    // its errno.
    let mut buf = [0u8; 8];
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
    let step = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
    Err(match SwitchStep::from_code(step) {
        Some(step) => Failure::Switch {
            step,
            error: match errno {
                0 => std::io::Error::other(step.describe()),
                e => std::io::Error::from_raw_os_error(e),
            },
        },
        None => Failure::Exec(std::io::Error::from_raw_os_error(errno)),
    })
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
    steps: &ChildSteps,
    report: libc::c_int,
) -> ! {
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: in the single-threaded child of a clone without CLONE_VM,
    // each call below is async-signal-safe (setpgid; the oom_score_adj
    // write's raw open/write/close; `ChildSteps::run`'s raw calls;
    // sigprocmask; execvpe as glibc implements it: no malloc for a PATH
    // search, which std's own child relies on too; _exit) and is given only
    // pointers into memory prepared before the clone (NUL-terminated
    // strings, NULL-terminated argv and envp) or on this stack frame.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            fail(report, 0, errno());
        }
        // Best effort: a refused write leaves the inherited value. Before
        // the switch: the job's user may not write its own.
        super::priority::write_own_oom_score_adj(oom_text);
        if let Err((step, e)) = steps.run() {
            fail(report, step.code(), e);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execvpe(prog.as_ptr(), argv.as_ptr(), envp.as_ptr());
        fail(report, 0, errno())
    }
}

/// Sends the failed step (0: exec) and its errno to the parent and exits
/// (child only).
fn fail(report: libc::c_int, step: u32, errno: i32) -> ! {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&step.to_ne_bytes());
    bytes[4..].copy_from_slice(&errno.to_ne_bytes());
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
