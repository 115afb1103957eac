//! Where per-host state lives: the embedded authority's database and the
//! lease state files that `leaseagent check` reads.
//!
//! Order, as the contract fixes it: `LEASEAGENT_STATE_DIR`, else
//! `$XDG_STATE_HOME/leaseagent`, else `~/.local/state/leaseagent`;
//! `/var/lib/leaseagent` for root. Every agent on the host computes the same
//! directory for the same user, which is what makes the embedded default a
//! shared authority.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// The state directory (not created).
pub fn state_dir() -> Result<PathBuf, NoStateDir> {
    if let Some(d) = std::env::var_os("LEASEAGENT_STATE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from(ROOT_STATE_DIR));
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("leaseagent"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(h).join(".local/state/leaseagent"));
    }
    Err(NoStateDir)
}

// ------------------------------------------------------------ files that cannot be fooled
//
// Another local user must not be able to make the agent write through a
// symlink or into a directory they control. The rules:
// - every configured path is walked from `/` one component at a time
//   ([`super::walk`]): a symlink is followed only if root or this user owns
//   it and it sits in a directory no one else can change (the kernel's
//   `protected_symlinks` rule, whatever the sysctl says), and no directory
//   on the way may be writable by another user (root's sticky `/tmp`
//   excepted);
// - a private directory (the runtime dir, the state dir, the embedded
//   database's dir) is then checked on the descriptor the walk ends with:
//   owned by this user, not writable by group or others (the runtime dir,
//   in a shared place, must be exactly 0700). New ones are made 0700. A
//   directory that fails is refused with a message naming it; nothing is
//   ever written through it.
// - files in it are created relative to that descriptor,
//   `O_CREAT | O_EXCL | O_NOFOLLOW` with a random name ([`create_temp`]),
//   then renamed over the final name: a planted symlink is never followed,
//   and there is no window between a check and a use.

pub use super::walk::{DirProblem, DirRefused, NoStateDir, PathError};
use super::walk::{Dirs, Walk};

/// Walks to the directory `dir` from `/` under [`super::walk`]'s rules for
/// trusted paths (a root-owned sticky `/tmp` allowed) and opens it: use the
/// descriptor (`*at` calls), never the name again.
pub fn open_checked_dir(dir: &Path) -> Result<OwnedFd, PathError> {
    Walk::TRUSTED.dir(dir)
}

/// How strict [`open_private_dir`] is about the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirRule {
    /// Owned by us, not group- or world-writable.
    NotWritableByOthers,
    /// Owned by us, mode exactly 0700 (a dir in a shared place).
    Exactly0700,
}

/// Walks to `dir` from `/` ([`super::walk`]'s rules for trusted paths), creating it and any
/// missing parents 0700, then checks that this user owns it and, by
/// `rule`, that no one else may write to it. The returned descriptor is
/// the directory that was checked: use it (`*at` calls), not the path.
pub fn open_private_dir(dir: &Path, rule: DirRule) -> Result<OwnedFd, PathError> {
    let fd = Walk {
        dirs: Dirs::Trusted,
        create: true,
    }
    .dir(dir)?;
    check_private(&fd, dir, rule)?;
    Ok(fd)
}

/// The private-directory rule on an open directory.
fn check_private(fd: &OwnedFd, dir: &Path, rule: DirRule) -> Result<(), PathError> {
    let refused = |why: DirProblem| DirRefused {
        dir: dir.to_path_buf(),
        why,
    };
    let st = super::walk::stat(fd, dir)?;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(refused(DirProblem::NotOwned { uid: st.st_uid, me }).into());
    }
    let mode = st.st_mode & 0o7777;
    match rule {
        DirRule::NotWritableByOthers if mode & 0o022 != 0 => {
            Err(refused(DirProblem::Loose { mode }).into())
        }
        DirRule::Exactly0700 if mode & 0o777 != 0o700 => {
            Err(refused(DirProblem::NotPrivate { mode }).into())
        }
        _ => Ok(()),
    }
}

/// Creates a new file in the open directory `dir` with a random name
/// starting with `prefix`, `O_EXCL | O_NOFOLLOW`, mode `mode`. Returns the
/// file and its name.
pub fn create_temp(dir: &OwnedFd, prefix: &str, mode: u32) -> std::io::Result<(File, String)> {
    let mut last = None;
    for _ in 0..16 {
        let name: String = format!(
            "{prefix}{}",
            (0..12)
                .map(|_| fastrand::alphanumeric())
                .collect::<String>()
        );
        match rustix::fs::openat(
            dir,
            name.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::WRONLY,
            Mode::from_raw_mode(mode),
        ) {
            Ok(fd) => return Ok((File::from(fd), name)),
            Err(rustix::io::Errno::EXIST) => last = Some(rustix::io::Errno::EXIST),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.unwrap_or(rustix::io::Errno::EXIST).into())
}

/// The directory for lease state files (`leaseagent check`):
/// `$XDG_RUNTIME_DIR/leaseagent` (the runtime dir is the user's own), else
/// `STATE_DIR/run`. Both must be this user's, 0700.
pub fn runtime_dir() -> Result<(PathBuf, OwnedFd), PathError> {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("leaseagent"),
        None => state_dir()?.join("run"),
    };
    let fd = open_private_dir(&dir, DirRule::Exactly0700)?;
    Ok((dir, fd))
}

/// A directory of its own for one run whose job runs as another user
/// (`--user`): the runtime dir is 0700 and the agent's, and a job of
/// another uid could not read the state file there. Made in `/tmp` (the
/// one place every user can reach; the unit's private `/tmp` under
/// systemd) with a random name, owned by this user, its group `gid` (the
/// job's), mode 0750: the job's group may enter and read, nobody else;
/// each file written in it is given the group too (no set-group-ID bit: a unit's RestrictSUIDSGID= refuses it). The chain to `/tmp` is checked
/// ([`open_checked_dir`]: root-owned and sticky, so nobody can rename or
/// replace what we made), the new directory is opened `O_NOFOLLOW` and
/// checked to be ours before its group and mode are set on the descriptor.
/// Setting the group needs CAP_CHOWN or membership of `gid`.
pub struct GroupRunDir {
    pub path: PathBuf,
    pub dir: OwnedFd,
    /// The job's group, which the directory and every file in it get.
    pub gid: u32,
    /// `/tmp`, to remove the directory by name at the end.
    parent: OwnedFd,
    name: String,
}

impl GroupRunDir {
    pub const PARENT: &str = "/tmp";

    pub fn create(gid: u32) -> Result<GroupRunDir, PathError> {
        let parent_path = Path::new(Self::PARENT);
        let parent = open_checked_dir(parent_path)?;
        let failed = |path: &Path, source| PathError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut made = None;
        for _ in 0..16 {
            let name: String = format!(
                "leaseagent-{}",
                (0..12)
                    .map(|_| fastrand::alphanumeric())
                    .collect::<String>()
            );
            match rustix::fs::mkdirat(&parent, name.as_str(), Mode::from_raw_mode(0o700)) {
                Ok(()) => {
                    made = Some(name);
                    break;
                }
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(failed(parent_path, e)),
            }
        }
        let name = made.ok_or_else(|| failed(parent_path, rustix::io::Errno::EXIST))?;
        let path = parent_path.join(&name);
        let opened = rustix::fs::openat(
            &parent,
            name.as_str(),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
            Mode::empty(),
        );
        let made = GroupRunDir {
            dir: opened.map_err(|e| failed(&path, e))?,
            path,
            gid,
            parent,
            name,
        };
        let st = rustix::fs::fstat(&made.dir).map_err(|source| PathError::Stat {
            path: made.path.clone(),
            source,
        })?;
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me {
            return Err(PathError::NotOwned {
                path: made.path.clone(),
                uid: st.st_uid,
                me,
            });
        }
        let set = rustix::fs::fchown(&made.dir, None, Some(rustix::fs::Gid::from_raw(gid)))
            .and_then(|()| rustix::fs::fchmod(&made.dir, Mode::from_raw_mode(0o750)));
        if let Err(source) = set {
            made.remove();
            return Err(PathError::Group {
                path: made.path.clone(),
                gid,
                source,
            });
        }
        Ok(made)
    }

    /// Removes the directory (empty by then); best effort.
    pub fn remove(&self) {
        let _ = rustix::fs::unlinkat(
            &self.parent,
            self.name.as_str(),
            rustix::fs::AtFlags::REMOVEDIR,
        );
    }
}

/// Opens an existing file to read it, as a file that grants something
/// must be opened (the auth file, a private key): the path to its
/// directory is walked from `/` ([`super::walk`]'s rules for trusted
/// paths), the file is opened
/// relative to that descriptor without following a symlink, and it must
/// be a regular file. Returns the descriptor and its status, for the
/// caller's owner and mode rules.
pub fn open_checked_file(path: &Path) -> Result<(OwnedFd, rustix::fs::Stat), PathError> {
    let p = Walk::TRUSTED.parent(path)?;
    open_in(&p.dir, &p.name, path)
}

/// [`open_checked_file`], but a symlink at the end is followed when the
/// walk's rule allows it (a certificate that is a link managed by root,
/// as certbot's are): for files that may be links, never for the auth
/// file.
pub fn open_checked_file_following(path: &Path) -> Result<(OwnedFd, rustix::fs::Stat), PathError> {
    let p = Walk::TRUSTED.file(path)?;
    open_in(&p.dir, &p.name, path)
}

/// Opens the regular file `name` in the checked directory `dir` to read
/// it, without following a symlink or blocking on a FIFO.
fn open_in(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    path: &Path,
) -> Result<(OwnedFd, rustix::fs::Stat), PathError> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => PathError::Symlink {
            path: path.to_path_buf(),
        },
        source => PathError::Open {
            path: path.to_path_buf(),
            source,
        },
    })?;
    let st = super::walk::stat(&fd, path)?;
    if !super::walk::is_regular(st.st_mode) {
        return Err(PathError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    Ok((fd, st))
}

/// Root's default state directory (the contract's); `leaseagent@.service`,
/// whose agent is root, shares it (its `StateDirectory=`).
pub const ROOT_STATE_DIR: &str = "/var/lib/leaseagent";

/// Prepares an embedded database file (the embedded authority's, and
/// `serve --db`): the path to its directory is walked from `/`
/// ([`super::walk`]'s rules for trusted paths; missing directories are made 0700), the
/// directory must be this user's and not writable by others, and on a
/// local filesystem (not NFS, SMB, FUSE...: [`super::walk::network_fs`]);
/// the file and its WAL/SHM companions are created 0600 without following
/// symlinks if missing, and an existing one must be a regular file owned by
/// this user and writable by no one else (they are made 0600, so another
/// owner or write bits mean someone changed them since: refused, not
/// adopted). The checked directory descriptor is registered
/// ([`crate::sys::sqlite_at`]), so SQLite opens the file and its
/// companions through it, not by name again.
pub fn prepare_db_file(path: &Path) -> Result<(), PathError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let p = Walk {
        dirs: Dirs::Trusted,
        create: true,
    }
    .parent(path)
    .map_err(|e| foreign_root_state_dir(&dir, e))?;
    if let Err(e) = check_private(&p.dir, &dir, DirRule::NotWritableByOthers) {
        return Err(foreign_root_state_dir(&dir, e));
    }
    if let Some(fs) = super::walk::network_fs(&p.dir).map_err(|source| PathError::Stat {
        path: dir.clone(),
        source,
    })? {
        return Err(PathError::NetworkFs {
            path: path.to_path_buf(),
            fs,
        });
    }
    let me = rustix::process::geteuid().as_raw();
    let name = p.name;
    // The database is created here; SQLite makes its WAL and SHM files with
    // the database's mode, so those are only checked if they exist.
    for suffix in ["", "-wal", "-shm"] {
        let mut n = name.to_os_string();
        n.push(suffix);
        let shown = dir.join(&n);
        let create = if suffix.is_empty() {
            OFlags::CREATE
        } else {
            OFlags::empty()
        };
        let fd = match rustix::fs::openat(
            &p.dir,
            n.as_os_str(),
            create | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDWR | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) if !suffix.is_empty() => continue,
            Err(rustix::io::Errno::LOOP) => return Err(PathError::Symlink { path: shown }),
            Err(source) => {
                return Err(PathError::Open {
                    path: shown,
                    source,
                });
            }
        };
        let st = super::walk::stat(&fd, &shown)?;
        if !super::walk::is_regular(st.st_mode) {
            return Err(PathError::NotRegular { path: shown });
        }
        if st.st_uid != me {
            return Err(PathError::NotOwned {
                path: shown,
                uid: st.st_uid,
                me,
            });
        }
        // Made 0600: write bits for others mean someone changed it since.
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(PathError::LooseFile { path: shown, mode });
        }
    }
    super::sqlite_at::register(path, p.dir, &name);
    Ok(())
}

/// Root's default state directory taken by another user: what systemd did
/// to it when an older `leaseagent@.service` had it as `StateDirectory=`.
/// Says what to do.
fn foreign_root_state_dir(dir: &Path, e: PathError) -> PathError {
    let root = rustix::process::geteuid().is_root();
    match e {
        PathError::Dir(DirRefused {
            why: DirProblem::NotOwned { uid, .. },
            ..
        }) if root && dir == Path::new(ROOT_STATE_DIR) => PathError::ForeignStateDir {
            dir: dir.to_path_buf(),
            uid,
        },
        // The walk itself refuses it on the way (another user's directory).
        PathError::UnsafeDir { path, uid, .. }
            if root && uid != 0 && path == Path::new(ROOT_STATE_DIR) =>
        {
            PathError::ForeignStateDir { dir: path, uid }
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_dirs_are_made_0700_and_others_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        open_private_dir(&d, DirRule::Exactly0700).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = open_private_dir(&d, DirRule::NotWritableByOthers).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "refusing directory {}: owned by uid {} with mode 0777, so another user can change what is in it",
                d.display(),
                rustix::process::geteuid().as_raw()
            )
        );
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        // This user's own link in this user's own directory is what the
        // kernel would follow too: the checks apply to where it leads.
        let via_link = open_private_dir(&link, DirRule::Exactly0700).unwrap();
        let st = rustix::fs::fstat(&via_link).unwrap();
        assert_eq!(
            st.st_ino,
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&d).unwrap())
        );
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
        let e = open_private_dir(&link, DirRule::Exactly0700).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "refusing directory {}: mode 0750, expected 0700",
                link.display()
            )
        );
    }

    #[test]
    fn temp_files_get_fresh_random_names() {
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let fd = open_private_dir(t.path(), DirRule::Exactly0700).unwrap();
        let (_, a) = create_temp(&fd, ".x-", 0o600).unwrap();
        let (_, b) = create_temp(&fd, ".x-", 0o600).unwrap();
        assert_ne!(a, b);
        let mode = std::fs::metadata(t.path().join(&a))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn db_files_are_private_and_symlinks_refused() {
        let t = tempfile::tempdir().unwrap();
        let db = t.path().join("s/l.sqlite3");
        prepare_db_file(&db).unwrap();
        let m = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(m(&db), 0o600);
        assert_eq!(m(db.parent().unwrap()), 0o700);
        let victim = t.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let db2 = t.path().join("s/other.sqlite3");
        std::os::unix::fs::symlink(&victim, &db2).unwrap();
        let e = prepare_db_file(&db2).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("refusing {}: it is a symlink", db2.display())
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        // Made 0600; made writable by others since: refused, not adopted.
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o620)).unwrap();
        let e = prepare_db_file(&db).unwrap_err();
        assert!(matches!(e, PathError::LooseFile { mode: 0o620, .. }), "{e}");
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o640)).unwrap();
        prepare_db_file(&db).unwrap();
    }
}
