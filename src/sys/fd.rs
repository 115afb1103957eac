//! Taking ownership of a descriptor number inherited across `exec` (the
//! keeper's pipes): one of the few `unsafe` blocks of the crate, all under
//! `sys/`. Everything else (signals, waits, pipes, clocks, renames) goes
//! through std and rustix's safe API.

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Claims a descriptor the parent passed by number across `exec`.
///
/// Call once per number, at start-up, before anything else could open or
/// close descriptors.
pub fn claim_inherited_fd(fd: RawFd) -> std::io::Result<OwnedFd> {
    if fd < 3 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "refusing to claim a standard stream",
        ));
    }
    // SAFETY: the borrow lives only for this call, and `fcntl(F_GETFD)` on a
    // number that is not open fails with EBADF instead of touching anything.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_getfd(borrowed)?;
    // SAFETY: the number is open (checked above), was inherited from the
    // agent for this process alone, and nothing else in this process has
    // claimed it: the keeper calls this once per number before starting any
    // thread or opening any file, so the new `OwnedFd` is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
