//! Starting the keeper: as PID 1 of a PID namespace of its own where the
//! kernel allows one, with its channels at fixed descriptors.
//!
//! Why `clone3` and not `unshare` in the keeper: `unshare(CLONE_NEWPID)`
//! moves only the caller's *children* into the new namespace, so the keeper
//! would not be its init. Created by `clone3(CLONE_NEWPID | CLONE_NEWNS)`
//! (and `CLONE_NEWUSER` where the agent is not root), the keeper is PID 1 of
//! the namespace, which is what the job's tree lives in. Then the kernel
//! gives what the keeper otherwise does by hand: the namespace's processes
//! cannot send SIGKILL or SIGSTOP to their init (signals it has no handler
//! for are dropped), cannot see or name any process outside it (the agent),
//! and when the init dies every process of the namespace is killed, its
//! `exit` completing only once they are all gone, so the agent reaping the
//! keeper proves the tree is gone.
//!
//! What the child does between `clone3` and `exec`, with raw system calls
//! only (the agent is multithreaded: no allocation, no lock):
//! 1. `PR_SET_DUMPABLE 1`: the agent is not dumpable, and a non-dumpable
//!    process's `/proc/self` files belong to root, so it could not write
//!    its own maps (exec resets this anyway; the keeper clears it again
//!    first thing);
//! 2. with a user namespace: `setgroups` `deny`, then `uid_map` and
//!    `gid_map` mapping the caller's own uid and gid to themselves, one id
//!    each, so the job is not uid 0 inside and has no capability after
//!    `exec` (capabilities in the new namespace are lost at the `exec` of a
//!    non-zero uid);
//! 3. mounts: every mount a slave (`MS_REC | MS_SLAVE` on `/`: the host's
//!    new mounts still appear, none of the job's reach the host), and a
//!    fresh `proc` on `/proc`, so `ps` inside shows the job's tree only
//!    (for a root keeper whose job is confined, `hidepid=ptraceable`: not
//!    even the keeper, see `sys::confine`);
//! 4. the two channel sockets moved to descriptors 3 and 4 (their numbers
//!    are on no command line), the signal mask emptied;
//! 5. `execveat` of the agent's own binary, opened beforehand.
//!
//! A failure of any step reaches the parent through a close-on-exec pipe
//! (stage and errno; end of file: the `exec` happened), as in std, and the
//! parent reaps the child; the caller then tries the next way (see
//! `keeper::handle`).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::clone3::{CLONE_CLEAR_SIGHAND, CloneArgs, clone3};

/// The namespaces the keeper is created in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespaces {
    /// None: the agent's own PID and mount namespaces.
    None,
    /// A PID and a mount namespace (needs CAP_SYS_ADMIN: root).
    Pid,
    /// A user namespace too, mapping only the caller's own ids: any user,
    /// where the kernel allows unprivileged user namespaces.
    UserPid,
}

/// The descriptors the keeper finds its channels at.
pub const KEEPER_CTL_FD: RawFd = 3;
pub const KEEPER_REPORT_FD: RawFd = 4;

/// Everything the child needs, made before the clone.
pub struct Prepared {
    exe: OwnedFd,
    /// Kept alive: `argv` and `envp` point into them.
    _argv_owned: Vec<CString>,
    _env_owned: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    ctl: OwnedFd,
    report: OwnedFd,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// Mount the namespace's `/proc` with `hidepid=ptraceable` (a root
    /// keeper whose job is confined: `sys::confine`).
    hide_pids: bool,
}

/// Where the keeper's start failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Clone,
    Dumpable,
    Setgroups,
    UidMap,
    GidMap,
    Propagation,
    MountProc,
    Descriptors,
    Exec,
}

impl Stage {
    fn from_u8(b: u8) -> Stage {
        [
            Stage::Clone,
            Stage::Dumpable,
            Stage::Setgroups,
            Stage::UidMap,
            Stage::GidMap,
            Stage::Propagation,
            Stage::MountProc,
            Stage::Descriptors,
            Stage::Exec,
        ]
        .get(usize::from(b))
        .copied()
        .unwrap_or(Stage::Exec)
    }

    /// In words, for the log line that says why a namespace was not had.
    pub fn describe(self) -> &'static str {
        match self {
            Stage::Clone => "clone3",
            Stage::Dumpable => "PR_SET_DUMPABLE",
            Stage::Setgroups => "writing /proc/self/setgroups",
            Stage::UidMap => "writing /proc/self/uid_map",
            Stage::GidMap => "writing /proc/self/gid_map",
            Stage::Propagation => "making the mounts slaves",
            Stage::MountProc => "mounting /proc",
            Stage::Descriptors => "moving the channels to fds 3 and 4",
            Stage::Exec => "exec",
        }
    }
}

/// Why the keeper was not started this way.
#[derive(Debug, thiserror::Error)]
#[error("{} failed: {errno}", stage.describe())]
pub struct SpawnError {
    pub stage: Stage,
    pub errno: rustix::io::Errno,
}

/// The keeper, started: its pid (in the agent's namespace) and a pidfd.
pub struct Spawned {
    pub pid: i32,
    /// `None` only on a kernel without pidfds (before 5.3).
    pub pidfd: Option<OwnedFd>,
}

/// A descriptor at 10 or above, close-on-exec, so that moving the channels
/// to 3 and 4 in the child never overwrites one of them.
fn high(fd: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(fd, 10)?)
}

fn cstring(bytes: &[u8]) -> std::io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a NUL byte in argv or env",
        )
    })
}

impl Prepared {
    /// The keeper's argv (`argv[0]` included) and environment, its two
    /// channel ends (they become fds 3 and 4), the ids to map.
    pub fn new(
        argv: &[&std::ffi::OsStr],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        ctl: BorrowedFd<'_>,
        report: BorrowedFd<'_>,
        hide_pids: bool,
    ) -> std::io::Result<Prepared> {
        use std::os::unix::ffi::OsStrExt;
        let exe = rustix::fs::open(
            "/proc/self/exe",
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let exe = high(exe.as_fd())?;
        let argv_owned = argv
            .iter()
            .map(|a| cstring(a.as_bytes()))
            .collect::<std::io::Result<Vec<_>>>()?;
        let env_owned = env
            .iter()
            .map(|(k, v)| {
                let mut e = k.as_bytes().to_vec();
                e.push(b'=');
                e.extend_from_slice(v.as_bytes());
                cstring(&e)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut argv_p: Vec<*const libc::c_char> = argv_owned.iter().map(|a| a.as_ptr()).collect();
        argv_p.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = env_owned.iter().map(|e| e.as_ptr()).collect();
        envp.push(std::ptr::null());
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        Ok(Prepared {
            exe,
            _argv_owned: argv_owned,
            _env_owned: env_owned,
            argv: argv_p,
            envp,
            ctl: high(ctl)?,
            report: high(report)?,
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            hide_pids,
        })
    }
}

/// Starts the keeper in `ns`. `Err` says which step failed (nothing is
/// left running: a child that failed was reaped).
pub fn spawn(prep: &Prepared, ns: Namespaces) -> Result<Spawned, SpawnError> {
    let (err_r, err_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|errno| SpawnError {
            stage: Stage::Clone,
            errno,
        })?;
    // Moved up out of the way of fds 3 and 4; the low copy is closed now,
    // or the read below would never see the end of file the exec means.
    let err_w = {
        let low = err_w;
        high(low.as_fd()).map_err(|e| SpawnError {
            stage: Stage::Clone,
            errno: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::MFILE),
        })?
    };
    let ns_flags = match ns {
        Namespaces::None => 0,
        Namespaces::Pid => (libc::CLONE_NEWPID | libc::CLONE_NEWNS) as u64,
        Namespaces::UserPid => {
            (libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS) as u64
        }
    };
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: ns_flags | libc::CLONE_PIDFD as u64 | CLONE_CLEAR_SIGHAND,
        pidfd: (&mut pidfd as *mut libc::c_int) as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a live, fully initialised `struct clone_args` of the
    // size passed, and `pidfd` outlives the call. Without CLONE_VM the child
    // gets a copy of this address space and returns here on a copy of this
    // stack, as after fork(); it then only runs `child`, which never
    // returns.
    let mut pid = unsafe { clone3(&mut args) };
    if pid == 0 {
        child(prep, ns, err_w.as_raw_fd());
    }
    if pid < 0 && last_errno() == rustix::io::Errno::NOSYS && ns == Namespaces::None {
        // No clone3 (an old kernel, or a seccomp filter that hides it, as
        // container runtimes do): a plain fork-like clone, whose argument
        // order is the same on every architecture when all but the flags
        // are zero.
        // SAFETY: as above: a fork, the child runs only `child`.
        pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) };
        pidfd = -1;
        if pid == 0 {
            child(prep, ns, err_w.as_raw_fd());
        }
    }
    if pid < 0 {
        return Err(SpawnError {
            stage: Stage::Clone,
            errno: last_errno(),
        });
    }
    drop(err_w);
    let pid = pid as i32;
    let pidfd = if pidfd >= 0 {
        // SAFETY: the kernel just returned this descriptor for this child
        // (CLONE_PIDFD); nothing else owns it.
        Some(unsafe { OwnedFd::from_raw_fd(pidfd) })
    } else {
        // Our unreaped child: its pid cannot have been reused.
        rustix::process::Pid::from_raw(pid)
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
    };
    // End of file: the exec happened. Five bytes: the stage and its errno.
    let mut buf = [0u8; 5];
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(&err_r, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
    }
    if got == 0 {
        return Ok(Spawned { pid, pidfd });
    }
    // The child exits right after writing: reap it.
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
    }
    let mut e = [0u8; 4];
    e.copy_from_slice(&buf[1..5]);
    Err(SpawnError {
        stage: Stage::from_u8(buf[0]),
        errno: match i32::from_ne_bytes(e) {
            n if n > 0 && n < 4096 => rustix::io::Errno::from_raw_os_error(n),
            _ => rustix::io::Errno::IO,
        },
    })
}

/// The errno of the last failed call (EIO if it reads as none).
fn last_errno() -> rustix::io::Errno {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(n) if n > 0 => rustix::io::Errno::from_raw_os_error(n),
        _ => rustix::io::Errno::IO,
    }
}

/// The child, between `clone3` and `exec`: raw system calls only, no
/// allocation, never returns.
fn child(prep: &Prepared, ns: Namespaces, err: libc::c_int) -> ! {
    // SAFETY: in the single-threaded child of a clone without CLONE_VM,
    // each call below is a plain system call wrapper (prctl, open, write,
    // close, mount, dup2, sigprocmask, syscall(execveat), _exit), given only
    // pointers to NUL-terminated strings, byte buffers and NULL-terminated
    // argv and envp prepared before the clone (`prep`, alive in this copy of
    // the address space) or to this stack frame.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
            fail(err, Stage::Dumpable);
        }
        if ns == Namespaces::UserPid {
            write_file(c"/proc/self/setgroups", b"deny\n", err, Stage::Setgroups);
            write_file(c"/proc/self/uid_map", &prep.uid_map, err, Stage::UidMap);
            write_file(c"/proc/self/gid_map", &prep.gid_map, err, Stage::GidMap);
        }
        if ns != Namespaces::None {
            let none: *const libc::c_char = std::ptr::null();
            if libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) != 0
            {
                fail(err, Stage::Propagation);
            }
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            let proc_at = |data: *const libc::c_void| {
                libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    flags,
                    data,
                )
            };
            // A root keeper (PID namespace, no user namespace) whose job is
            // confined: the job's /proc lists only what it may trace, so
            // not the non-dumpable keeper (its root-owned oom_score_adj, its
            // command line and environment). Before Linux 5.8 the option is
            // unknown (EINVAL): the plain mount; the dropped CAP_SYS_PTRACE
            // still keeps the keeper's mem, fds and environment closed.
            let hidden = ns == Namespaces::Pid
                && prep.hide_pids
                && proc_at(c"hidepid=ptraceable".as_ptr().cast()) == 0;
            if !hidden && proc_at(std::ptr::null()) != 0 {
                fail(err, Stage::MountProc);
            }
        }
        if libc::dup2(prep.ctl.as_raw_fd(), KEEPER_CTL_FD) < 0
            || libc::dup2(prep.report.as_raw_fd(), KEEPER_REPORT_FD) < 0
        {
            fail(err, Stage::Descriptors);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::syscall(
            libc::SYS_execveat,
            prep.exe.as_raw_fd(),
            c"".as_ptr(),
            prep.argv.as_ptr(),
            prep.envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
        fail(err, Stage::Exec)
    }
}

/// Writes `text` to `path` (child only); on failure reports `stage`.
///
/// # Safety
/// Raw system calls on a NUL-terminated path and a buffer of the given
/// length; for the child between clone and exec.
unsafe fn write_file(path: &std::ffi::CStr, text: &[u8], err: libc::c_int, stage: Stage) {
    // SAFETY: see the function's contract.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            fail(err, stage);
        }
        if libc::write(fd, text.as_ptr().cast(), text.len()) != text.len() as isize {
            fail(err, stage);
        }
        libc::close(fd);
    }
}

/// Sends the stage and errno to the parent and exits (child only).
fn fail(err: libc::c_int, stage: Stage) -> ! {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let mut bytes = [0u8; 5];
    bytes[0] = stage as u8;
    bytes[1..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: write and _exit are async-signal-safe; `bytes` is on this
    // stack frame and its length is passed.
    unsafe {
        let _ = libc::write(err, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    }
}

/// `PR_SET_DUMPABLE 0` for this process: no ptrace, no `/proc/PID/fd`,
/// `/proc/PID/mem` or `oom_score_adj` writes by another process of the same
/// user (the files become root's). `exec` sets it back, so the keeper calls
/// this again first thing.
pub fn not_dumpable() -> std::io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// `kill(-1, sig)`: every process the caller may signal but itself. From
/// the init of a PID namespace that is every other process of the
/// namespace and nothing outside it (processes of other namespaces have no
/// pid there): how the keeper stops the whole tree in one call. Never to
/// be called outside a namespace of our own (it would signal every process
/// of the user, or of the host for root): the caller checks it is PID 1.
pub fn kill_every_other(sig: rustix::process::Signal) -> rustix::io::Result<()> {
    if rustix::process::getpid().as_raw_nonzero().get() != 1 {
        return Err(rustix::io::Errno::PERM);
    }
    // SAFETY: kill(2) takes no pointer; -1 and a valid signal number.
    let rc = unsafe { libc::kill(-1, sig.as_raw()) };
    if rc == 0 { Ok(()) } else { Err(last_errno()) }
}

/// The variable the keeper finds its agent's pid in (the agent's PID
/// namespace's number, which names the job's cgroup). Not an argument: a
/// command line is world-readable, and the pid would name the agent to a
/// job that escaped its `/proc`. The keeper takes it out of its own
/// environment first thing ([`take_agent_pid`]), so the job never gets it,
/// and its `/proc/1/environ` is readable only by a tracer (non-dumpable).
pub const AGENT_PID_ENV: &str = "LEASEAGENT_KEEPER_AGENT_PID";

/// The agent's pid from [`AGENT_PID_ENV`], which is removed from this
/// process's environment. For the keeper's `main` only, before it starts
/// anything: the keeper never starts a thread.
pub fn take_agent_pid() -> Option<u32> {
    let pid = std::env::var(AGENT_PID_ENV).ok()?.parse().ok();
    // SAFETY: called first thing in the keeper's `main` (a fresh exec of
    // this binary that starts no thread, ever): no other thread reads or
    // writes the environment meanwhile.
    unsafe { std::env::remove_var(AGENT_PID_ENV) };
    pid
}
