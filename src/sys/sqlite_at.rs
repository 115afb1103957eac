//! SQLite files opened through a checked directory descriptor.
//!
//! Why: the embedded database (and `serve --db`) lives in a directory that
//! was opened and checked on a descriptor ([`super::paths::prepare_db_file`]).
//! Opening the file again by its name would resolve the path anew, and
//! whoever could swap a directory on it in between would choose the file.
//! SQLite only takes names, so the name it gets is
//! `/proc/self/fd/N/FILE`, N being the checked directory's descriptor
//! (kept open for the life of the process): the kernel resolves that
//! through the very directory that was checked, for the database and for
//! its `-wal`, `-shm` and `-journal` companions alike.
//!
//! SQLite's own `unix` VFS would defeat that: it canonicalizes every path
//! (`lstat` and `readlink` on each component), turning `/proc/self/fd/N`
//! back into the directory's name. So a VFS is registered that is `unix` in
//! every way but one: `xFullPathname` returns the (absolute) name
//! unchanged. Hand-written because no crate offers it; it is a copy of a
//! struct and one function.
//!
//! Invariants: a registered descriptor is never closed (the path stays
//! valid for every connection of the process); without `/proc` nothing is
//! registered and the file is opened by name, the directory chain having
//! been checked all the same.

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::raw::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use rusqlite::ffi;

/// The VFS's name (pass to `Connection::open_with_flags_and_vfs`).
pub const VFS: &str = "leaseagent-at";
const VFS_C: &CStr = c"leaseagent-at";

/// Checked directories by the database path they were checked for.
fn registry() -> &'static Mutex<HashMap<PathBuf, (OwnedFd, PathBuf)>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, (OwnedFd, PathBuf)>>> = OnceLock::new();
    R.get_or_init(Mutex::default)
}

/// Remembers that `db` is the file `name` in the checked directory `dir`.
pub fn register(db: &Path, dir: OwnedFd, name: &OsStr) {
    let via = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    // `/proc` must resolve the descriptor to the directory itself.
    let works =
        std::fs::metadata(format!("/proc/self/fd/{}", dir.as_raw_fd())).is_ok_and(|m| m.is_dir());
    if !works || register_vfs().is_err() {
        log::debug!("opening {} by name: no /proc or no VFS", db.display());
        return;
    }
    // The first registration stays: connections opened through its
    // descriptor must keep finding it (a later one is the same check).
    let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
    r.entry(db.to_path_buf()).or_insert((dir, via));
}

/// The name to give SQLite for `db` (with [`VFS`]), if its directory was
/// checked and registered.
pub fn path_for(db: &Path) -> Option<PathBuf> {
    let r = registry().lock().unwrap_or_else(|p| p.into_inner());
    r.get(db).map(|(_, via)| via.clone())
}

/// Registers [`VFS`] once.
fn register_vfs() -> Result<(), c_int> {
    static DONE: OnceLock<Result<(), c_int>> = OnceLock::new();
    *DONE.get_or_init(|| {
        // SAFETY: sqlite3_initialize has no preconditions; it makes the
        // default VFS available to sqlite3_vfs_find.
        let rc = unsafe { ffi::sqlite3_initialize() };
        if rc != ffi::SQLITE_OK {
            return Err(rc);
        }
        // SAFETY: "unix" is a NUL-terminated name; the result is a pointer
        // to a VFS that SQLite keeps for the life of the process, or null.
        let unix = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
        if unix.is_null() {
            return Err(ffi::SQLITE_ERROR);
        }
        // SAFETY: `unix` is non-null and points to a valid, never-freed
        // sqlite3_vfs; copying it (a plain C struct) is sound.
        let mut vfs: ffi::sqlite3_vfs = unsafe { *unix };
        vfs.pNext = std::ptr::null_mut();
        vfs.zName = VFS_C.as_ptr();
        vfs.xFullPathname = Some(full_pathname_verbatim);
        let leaked: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
        // SAFETY: the struct lives forever (leaked) and its name is a
        // static C string, as sqlite3_vfs_register requires.
        let rc = unsafe { ffi::sqlite3_vfs_register(leaked, 0) };
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(rc)
        }
    })
}

/// `xFullPathname` that does not resolve symlinks: an absolute name is
/// returned as it is (SQLite passes absolute names through here only if
/// the caller did; a relative one is refused).
unsafe extern "C" fn full_pathname_verbatim(
    _vfs: *mut ffi::sqlite3_vfs,
    z_name: *const c_char,
    n_out: c_int,
    z_out: *mut c_char,
) -> c_int {
    if z_name.is_null() || z_out.is_null() {
        return ffi::SQLITE_CANTOPEN;
    }
    // SAFETY: SQLite passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(z_name) }.to_bytes_with_nul();
    let fits = usize::try_from(n_out).is_ok_and(|n| name.len() <= n);
    if !fits || name.first() != Some(&b'/') {
        return ffi::SQLITE_CANTOPEN;
    }
    // SAFETY: `z_out` has room for `n_out` bytes (SQLite's contract), and
    // `name.len() <= n_out` was checked; the regions do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), z_out, name.len()) };
    ffi::SQLITE_OK
}
