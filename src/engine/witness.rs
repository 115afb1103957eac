//! A copy in memory of the highest token the embedded engine has answered
//! from one database file in this boot: how a grant tells that the disk
//! lost writes the page cache once held.
//!
//! Why: grants between two syncs of the token ceiling are answered from
//! the page cache (`file.rs`, "Durability"), on the reasoning that within
//! one boot the page cache is the truth. An I/O error breaks that without a
//! reboot: ext4 with `errors=remount-ro` (how Debian mounts `/`) drops the
//! dirty pages, and a writeback error marks pages clean that never reached
//! the disk. After fsck and a new mount, same boot id, the file is back at
//! its last synced state: the sequence says 1 though 2 to 4 were answered,
//! and the next grant gave token 2 again.
//!
//! The ceiling itself is safe (it is synced before any token above it is
//! answered, so the disk holds one at least as high as every answered
//! token); what is lost is the knowledge that the cache was lost. This file
//! keeps that knowledge where the disk's errors cannot reach it: a small
//! file on a memory filesystem (tmpfs or ramfs), one per database file and
//! user, raised inside every grant's transaction (under SQLite's write lock,
//! so grants raise it in order) before the commit. A grant that finds the
//! sequence below it knows that answered tokens were lost, and starts above
//! the ceiling and the copy both, syncing its own reservation, as the first
//! grant after a power loss does.
//!
//! Where: `/run/leaseagent-tokens` for root when `/run` is a tmpfs (a
//! directory no other user can plant), else `/dev/shm/leaseagent-UID`:
//! fixed places, so every agent of a user finds the same copy whatever its
//! environment, each a directory of that user's own,
//! mode 0700, on a memory filesystem (checked: a directory on a disk would
//! lose its writes with the database's). The copy is lost with a reboot,
//! when the boot id changes and the ceiling rule takes over anyway. When
//! no such directory can be used, nothing tells a lost cache from a good
//! one: every grant then starts above the ceiling and syncs ([`Trust::Unknown`]).
//! The copy may only be wrong upwards (a failed commit after the raise):
//! that skips tokens and costs a sync, never reuses one.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

/// What the memory copy says about the sequence a grant read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    /// The sequence is at or above every token answered in this boot: the
    /// page cache held everything.
    Cache,
    /// Tokens up to this were answered but the sequence is below it: the
    /// disk lost writes.
    Lost(u64),
    /// No copy to compare with.
    Unknown,
}

/// The memory copy of one database's highest answered token.
#[derive(Clone, Debug)]
pub struct Witness {
    file: Option<Arc<File>>,
    /// The database file's birth time (`statx`), written with the token: a
    /// copy left by an earlier file with the same inode number is not this
    /// file's, and reads as empty.
    born: String,
}

/// tmpfs and ramfs (`statfs` magic numbers).
const MEMORY_FS: [i64; 2] = [0x0102_1994, 0x8584_58f6];

/// Whether `path` is on a memory filesystem.
fn in_memory(path: &Path) -> bool {
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(path).is_ok_and(|fs| MEMORY_FS.contains(&(fs.f_type as i64)))
}

/// The directory of this user's copies: the same for every agent of the
/// user on the host (it depends on nothing but the uid and which of
/// `/run` and `/dev/shm` are memory filesystems).
pub fn dir() -> PathBuf {
    let uid = rustix::process::geteuid();
    if uid.is_root() && in_memory(Path::new("/run")) {
        PathBuf::from("/run/leaseagent-tokens")
    } else {
        PathBuf::from(format!("/dev/shm/leaseagent-{}", uid.as_raw()))
    }
}

impl Witness {
    /// The copy for the database file `db` (named by device and inode, so
    /// every path to it finds the same copy), created if missing. A copy
    /// that cannot be had is [`Trust::Unknown`] at every grant, logged.
    pub fn open(db: &Path) -> Witness {
        Self::open_in(db, &dir()).unwrap_or_else(|why| {
            log::debug!("no memory copy of the token sequence ({why}): every grant syncs");
            Witness {
                file: None,
                born: String::new(),
            }
        })
    }

    /// The copy in `dir`.
    pub fn open_in(db: &Path, dir: &Path) -> Result<Witness, String> {
        let via = crate::sys::sqlite_at::path_for(db).unwrap_or_else(|| db.to_path_buf());
        let st = rustix::fs::statx(
            rustix::fs::CWD,
            &via,
            rustix::fs::AtFlags::empty(),
            rustix::fs::StatxFlags::INO | rustix::fs::StatxFlags::BTIME,
        )
        .map_err(|e| format!("{}: {e}", db.display()))?;
        let born = if st.stx_mask & rustix::fs::StatxFlags::BTIME.bits() != 0 {
            format!("{}.{:09}", st.stx_btime.tv_sec, st.stx_btime.tv_nsec)
        } else {
            "0".to_owned()
        };
        let name = format!(
            "{:x}:{:x}-{}",
            st.stx_dev_major, st.stx_dev_minor, st.stx_ino
        );
        Ok(Witness {
            file: Some(Arc::new(Self::try_open(&name, dir)?)),
            born,
        })
    }

    /// No copy at all.
    #[cfg(test)]
    pub fn none() -> Witness {
        Witness {
            file: None,
            born: String::new(),
        }
    }

    fn try_open(name: &str, dir: &Path) -> Result<File, String> {
        let fd: OwnedFd =
            crate::sys::paths::open_private_dir(dir, crate::sys::paths::DirRule::Exactly0700)
                .map_err(|e| e.to_string())?;
        let fs = rustix::fs::fstatfs(&fd).map_err(|e| format!("{}: {e}", dir.display()))?;
        #[allow(clippy::unnecessary_cast)]
        if !MEMORY_FS.contains(&(fs.f_type as i64)) {
            return Err(format!("{} is not on a memory filesystem", dir.display()));
        }
        let file = rustix::fs::openat(
            &fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| format!("{}/{name}: {e}", dir.display()))?;
        let st = rustix::fs::fstat(&file).map_err(|e| format!("{}/{name}: {e}", dir.display()))?;
        if !crate::sys::walk::is_regular(st.st_mode)
            || st.st_uid != rustix::process::geteuid().as_raw()
        {
            return Err(format!(
                "{}/{name}: not this user's regular file",
                dir.display()
            ));
        }
        Ok(File::from(file))
    }

    /// The highest token recorded, if the copy can be read (a copy never
    /// written reads as 0).
    fn highest(&self) -> Option<u64> {
        let f = self.file.as_ref()?;
        let mut buf = [0u8; 64];
        let n = f.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        if text.is_empty() {
            return Some(0);
        }
        match text.trim_end_matches('\n').split_once(' ') {
            Some((born, token)) if born == self.born => token.parse().ok(),
            // An earlier file's with the same inode number.
            Some(_) => Some(0),
            None => None,
        }
    }

    /// What the copy says about a sequence at `last_issued`.
    pub fn trust(&self, last_issued: u64) -> Trust {
        match self.highest() {
            None => Trust::Unknown,
            Some(h) if h > last_issued => Trust::Lost(h),
            Some(_) => Trust::Cache,
        }
    }

    /// Records that `token` is about to be answered (never lowers the
    /// copy). False when it could not be recorded: the grant must then be
    /// synced itself.
    pub fn raise(&self, token: u64) -> bool {
        let Some(f) = self.file.as_ref() else {
            return false;
        };
        if self.highest().is_some_and(|h| h >= token) {
            return true;
        }
        // Fixed width: a shorter line never leaves a longer one's tail.
        let text = format!("{} {token:020}\n", self.born);
        f.write_all_at(text.as_bytes(), 0).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir_in("/dev/shm").expect("/dev/shm (tmpfs) is needed");
        std::fs::set_permissions(
            d.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        d
    }

    #[test]
    fn the_copy_only_rises_and_tells_a_lost_sequence() {
        let m = memory_dir();
        let db = tempfile::NamedTempFile::new().unwrap();
        let w = Witness::open_in(db.path(), m.path()).unwrap();
        assert_eq!(w.trust(0), Trust::Cache);
        assert!(w.raise(4));
        assert!(w.raise(2));
        assert_eq!(w.trust(4), Trust::Cache);
        assert_eq!(w.trust(1), Trust::Lost(4));
        // Another handle on the same file (another process) sees it.
        let again = Witness::open_in(db.path(), m.path()).unwrap();
        assert_eq!(again.trust(3), Trust::Lost(4));
        assert!(again.raise(1025));
        assert_eq!(w.trust(1024), Trust::Lost(1025));
        assert_eq!(Witness::none().trust(7), Trust::Unknown);
        assert!(!Witness::none().raise(7));
        // What an earlier file with the same inode number left is not this
        // file's; garbage is nothing known (every grant syncs).
        let name = std::fs::read_dir(m.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        std::fs::write(&name, "123.000000000 00000000000000009999\n").unwrap();
        assert_eq!(w.trust(1), Trust::Cache);
        std::fs::write(&name, "garbage").unwrap();
        assert_eq!(w.trust(1), Trust::Unknown);
        assert!(w.raise(5));
        assert_eq!(w.trust(4), Trust::Lost(5));
    }

    #[test]
    fn a_copy_on_a_disk_is_refused() {
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        std::fs::set_permissions(
            disk.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let db = tempfile::NamedTempFile::new().unwrap();
        let e = Witness::open_in(db.path(), disk.path()).unwrap_err();
        assert!(e.contains("not on a memory filesystem"), "{e}");
    }
}
