//! The `clone3` system call's argument block, shared by the two places that
//! start a process with it: the job inside its cgroup (`spawn`,
//! `CLONE_INTO_CGROUP`) and the keeper in namespaces of its own
//! (`keeper_spawn`, `CLONE_NEWPID`, `CLONE_PIDFD`). libc has no binding for
//! `struct clone_args` or for the call, hence this small hand-written one.
//!
//! The size passed to the kernel is the smallest that carries what is asked
//! for: without `CLONE_INTO_CGROUP` the block stops before `cgroup`
//! (`CLONE_ARGS_SIZE_VER1`, Linux 5.5), so a kernel older than 5.7 still
//! takes a keeper's start; with it, `CLONE_ARGS_SIZE_VER2`.

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`, Linux 5.7).
#[repr(C)]
#[derive(Default)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}

/// Resets every handled signal of the child to its default (Linux 5.5).
pub const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
/// Starts the child in the cgroup whose directory fd is `cgroup` (Linux 5.7).
pub const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3(args)`: the child's pid in the parent, 0 in the child, -1 with
/// `errno` set on failure.
///
/// # Safety
/// As `fork()`: without `CLONE_VM` the child returns here with a copy of
/// this address space and of the calling thread only. The caller must make
/// the child run only async-signal-safe code until it execs or exits, and
/// every pointer in `args` (e.g. `pidfd`) must be valid for the call.
pub unsafe fn clone3(args: &mut CloneArgs) -> libc::c_long {
    let size = if args.flags & CLONE_INTO_CGROUP != 0 {
        std::mem::size_of::<CloneArgs>()
    } else {
        std::mem::size_of::<CloneArgs>() - std::mem::size_of::<u64>()
    };
    // SAFETY: `args` is a live, fully initialised `struct clone_args` of at
    // least `size` bytes (the fields up to `set_tid_size` when `cgroup` is
    // not used); the caller upholds the rest (see above).
    unsafe { libc::syscall(libc::SYS_clone3, args as *mut CloneArgs, size) }
}
