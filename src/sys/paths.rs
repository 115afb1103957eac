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

/// Neither `LEASEAGENT_STATE_DIR` nor anything to derive a state directory
/// from is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no state directory: set LEASEAGENT_STATE_DIR (or HOME)")]
pub struct NoStateDir;

/// The state directory (not created).
pub fn state_dir() -> Result<PathBuf, NoStateDir> {
    if let Some(d) = std::env::var_os("LEASEAGENT_STATE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/leaseagent"));
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
// - a private directory (the runtime dir, the state dir, the embedded
//   database's dir) is opened `O_DIRECTORY | O_NOFOLLOW` and checked on the
//   open descriptor: owned by this user, not writable by group or others
//   (the runtime dir, in a shared place, must be exactly 0700). New ones are
//   made 0700. A directory that fails is refused with a message naming it;
//   nothing is ever written through it.
// - files in it are created relative to the open directory descriptor,
//   `O_CREAT | O_EXCL | O_NOFOLLOW` with a random name ([`create_temp`]),
//   then renamed over the final name: a planted symlink is never followed,
//   and there is no window between a check and a use.

/// Why a private directory was refused.
#[derive(Debug, thiserror::Error)]
#[error("refusing directory {}: {why}", dir.display())]
pub struct DirRefused {
    pub dir: PathBuf,
    #[source]
    pub why: DirProblem,
}

/// What is wrong with a directory [`open_private_dir`] refused.
#[derive(Debug, thiserror::Error)]
pub enum DirProblem {
    #[error("cannot create it: {0}")]
    Create(#[source] std::io::Error),
    /// `O_NOFOLLOW | O_DIRECTORY` failed: a planted link, or a file.
    #[error("it is a symlink or not a directory")]
    Symlink,
    #[error("cannot open it: {0}")]
    Open(#[source] rustix::io::Errno),
    #[error("cannot stat it: {0}")]
    Stat(#[source] rustix::io::Errno),
    #[error("owned by uid {uid}, not by this user (uid {me})")]
    NotOwned { uid: u32, me: u32 },
    #[error("mode {mode:04o} lets other users write to it (chmod go-w)")]
    Loose { mode: u32 },
    /// The rule is [`DirRule::Exactly0700`].
    #[error("mode {mode:04o}, expected 0700")]
    NotPrivate { mode: u32 },
}

/// Why a path under a private directory cannot be used (see
/// [`runtime_dir`] and [`prepare_db_file`]). A file's messages name it.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error(transparent)]
    NoStateDir(#[from] NoStateDir),
    #[error(transparent)]
    Dir(#[from] DirRefused),
    #[error("{}: not a file name", path.display())]
    NotAFile { path: PathBuf },
    #[error("refusing {}: it is a symlink", path.display())]
    Symlink { path: PathBuf },
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rustix::io::Errno,
    },
    #[error("{}: {source}", path.display())]
    Stat {
        path: PathBuf,
        #[source]
        source: rustix::io::Errno,
    },
    #[error("refusing {}: not a regular file", path.display())]
    NotRegular { path: PathBuf },
    #[error("refusing {}: owned by uid {uid}, not by this user (uid {me})", path.display())]
    NotOwned { path: PathBuf, uid: u32, me: u32 },
    #[error("cannot resolve {}: {source}", path.display())]
    Resolve {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A directory on the path that another user could write to: they
    /// could replace what is in it (ssh's rule for `~/.ssh`).
    #[error(
        "refusing {}: owned by uid {uid} with mode {mode:04o}, so another user can change what is in it",
        path.display()
    )]
    UnsafeDir { path: PathBuf, uid: u32, mode: u32 },
    #[error("refusing {}: it changed while it was being checked", path.display())]
    Changed { path: PathBuf },
    #[error("cannot give {} to group {gid}: {source}", path.display())]
    Group {
        path: PathBuf,
        gid: u32,
        #[source]
        source: rustix::io::Errno,
    },
}

/// Opens `dir` through a chain of descriptors from `/`, one component at a
/// time with `O_NOFOLLOW`, checking each directory on the descriptor that
/// the next step uses: owned by root or by this user, and not writable by
/// group or others, except a root-owned sticky directory such as `/tmp`
/// (there nobody can rename or remove what they do not own). Symlinks in
/// `dir` are resolved first (as ssh does with `realpath`), then the walk
/// refuses any that appears. The returned descriptor is the directory that
/// was checked: open files in it with `*at` calls, never by name again.
pub fn open_checked_dir(dir: &Path) -> Result<OwnedFd, PathError> {
    use std::path::Component;
    let real = std::fs::canonicalize(dir).map_err(|source| PathError::Resolve {
        path: dir.to_path_buf(),
        source,
    })?;
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY;
    let me = rustix::process::geteuid().as_raw();
    let mut shown = PathBuf::from("/");
    let mut fd = rustix::fs::open("/", flags, Mode::empty()).map_err(|source| PathError::Open {
        path: shown.clone(),
        source,
    })?;
    let check = |fd: &OwnedFd, shown: &Path| -> Result<(), PathError> {
        let st = rustix::fs::fstat(fd).map_err(|source| PathError::Stat {
            path: shown.to_path_buf(),
            source,
        })?;
        let mode = st.st_mode & 0o7777;
        let owner_ok = st.st_uid == 0 || st.st_uid == me;
        let sticky_root = st.st_uid == 0 && mode & 0o1000 != 0;
        if !owner_ok || (mode & 0o022 != 0 && !sticky_root) {
            return Err(PathError::UnsafeDir {
                path: shown.to_path_buf(),
                uid: st.st_uid,
                mode,
            });
        }
        Ok(())
    };
    check(&fd, &shown)?;
    for c in real.components() {
        let Component::Normal(name) = c else { continue };
        shown.push(name);
        fd = rustix::fs::openat(&fd, name, flags, Mode::empty()).map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => PathError::Changed {
                path: shown.clone(),
            },
            source => PathError::Open {
                path: shown.clone(),
                source,
            },
        })?;
        check(&fd, &shown)?;
    }
    Ok(fd)
}

/// How strict [`open_private_dir`] is about the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirRule {
    /// Owned by us, not group- or world-writable.
    NotWritableByOthers,
    /// Owned by us, mode exactly 0700 (a dir in a shared place).
    Exactly0700,
}

/// Creates `dir` (0700, with any missing parents 0700) if it does not
/// exist, then opens and checks it. The returned descriptor is the
/// directory that was checked: use it (`*at` calls), not the path.
pub fn open_private_dir(dir: &Path, rule: DirRule) -> Result<OwnedFd, DirRefused> {
    use std::os::unix::fs::DirBuilderExt;
    let refused = |why: DirProblem| DirRefused {
        dir: dir.to_path_buf(),
        why,
    };
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| refused(DirProblem::Create(e)))?;
    }
    let fd = rustix::fs::open(
        dir,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => refused(DirProblem::Symlink),
        e => refused(DirProblem::Open(e)),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| refused(DirProblem::Stat(e)))?;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(refused(DirProblem::NotOwned { uid: st.st_uid, me }));
    }
    let mode = st.st_mode & 0o7777;
    match rule {
        DirRule::NotWritableByOthers if mode & 0o022 != 0 => {
            Err(refused(DirProblem::Loose { mode }))
        }
        DirRule::Exactly0700 if mode & 0o777 != 0o700 => {
            Err(refused(DirProblem::NotPrivate { mode }))
        }
        _ => Ok(fd),
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
/// must be opened (the auth file, a private key): its directory chain is
/// checked ([`open_checked_dir`]), the file is opened relative to that
/// descriptor without following a symlink, and it must be a regular file.
/// Returns the descriptor and its status, for the caller's owner and mode
/// rules.
pub fn open_checked_file(path: &Path) -> Result<(OwnedFd, rustix::fs::Stat), PathError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| PathError::NotAFile {
        path: path.to_path_buf(),
    })?;
    let dirfd = open_checked_dir(dir)?;
    let fd = rustix::fs::openat(
        &dirfd,
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
    let st = rustix::fs::fstat(&fd).map_err(|source| PathError::Stat {
        path: path.to_path_buf(),
        source,
    })?;
    if st.st_mode & 0o170000 != 0o100000 {
        return Err(PathError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    Ok((fd, st))
}

/// Prepares an embedded database file (the embedded authority's, and
/// `serve --db`): its directory (symlinks in its path resolved) is checked
/// (owned by this user, not writable by others; made 0700 if missing), and
/// so is every directory
/// above it ([`open_checked_dir`]: none writable by another user, root's
/// sticky `/tmp` excepted); the file and its WAL/SHM companions are created
/// 0600 without following symlinks if missing; an existing one must be a
/// regular file owned by this user. The checked directory descriptor is
/// registered ([`crate::sys::sqlite_at`]), so SQLite opens the file and its
/// companions through it, not by name again.
pub fn prepare_db_file(path: &Path) -> Result<(), PathError> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| PathError::NotAFile {
        path: path.to_path_buf(),
    })?;
    // Symlinks in the directory's path are resolved first, as ssh does
    // (systemd's `DynamicUser=` state directory is a symlink into
    // `/var/lib/private`); the real path is then checked all the way up.
    let real = match std::fs::canonicalize(&dir) {
        Ok(real) => real,
        Err(_) => {
            open_private_dir(&dir, DirRule::NotWritableByOthers)?;
            std::fs::canonicalize(&dir).map_err(|source| PathError::Resolve {
                path: dir.clone(),
                source,
            })?
        }
    };
    let private = open_private_dir(&real, DirRule::NotWritableByOthers)?;
    let dirfd = open_checked_dir(&real)?;
    let same = |a: &OwnedFd, b: &OwnedFd| -> Result<bool, PathError> {
        let stat = |fd: &OwnedFd| {
            rustix::fs::fstat(fd).map_err(|source| PathError::Stat {
                path: dir.clone(),
                source,
            })
        };
        let (x, y) = (stat(a)?, stat(b)?);
        Ok(x.st_dev == y.st_dev && x.st_ino == y.st_ino)
    };
    if !same(&private, &dirfd)? {
        return Err(PathError::Changed { path: dir });
    }
    let me = rustix::process::geteuid().as_raw();
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
            &dirfd,
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
        let st = match rustix::fs::fstat(&fd) {
            Ok(st) => st,
            Err(source) => {
                return Err(PathError::Stat {
                    path: shown,
                    source,
                });
            }
        };
        if st.st_mode & 0o170000 != 0o100000 {
            return Err(PathError::NotRegular { path: shown });
        }
        if st.st_uid != me {
            return Err(PathError::NotOwned {
                path: shown,
                uid: st.st_uid,
                me,
            });
        }
    }
    super::sqlite_at::register(path, dirfd, name);
    Ok(())
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
                "refusing directory {}: mode 0777 lets other users write to it (chmod go-w)",
                d.display()
            )
        );
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = open_private_dir(&link, DirRule::Exactly0700).unwrap_err();
        assert!(matches!(e.why, DirProblem::Symlink), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
        let e = open_private_dir(&d, DirRule::Exactly0700).unwrap_err();
        assert_eq!(e.why.to_string(), "mode 0750, expected 0700");
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
    }
}
