//! Walking a configured path one component at a time, trusting only what
//! the kernel's `protected_symlinks` rule would trust, whatever the sysctl
//! says.
//!
//! Why: a path such as `LEASEAGENT_STATE_DIR=/tmp/x`, `serve --db`, a key
//! file or `publish`'s DEST is resolved by the kernel afresh at every use.
//! Whoever can plant or re-point a symlink on it then chooses which file
//! root opens: `nobody` plants `/tmp/x -> A`, root checks A and uses it,
//! `nobody` re-points the link to B, and root's next run opens B's
//! database. Resolving with `realpath` first and checking the result does
//! not help: the check and the use are two resolutions.
//!
//! So the path is walked from `/` (a relative path from the current
//! directory, whose name `getcwd` gives with no link in it), each component
//! opened `O_PATH | O_NOFOLLOW` relative to the descriptor of the directory
//! before it, and:
//! - a **symlink** is followed only if it is owned by root or by this user
//!   and sits in a directory that no one else can change: owned by root or
//!   this user and not writable by group or others, or sticky (in a sticky
//!   directory only an entry's owner, the directory's owner and root can
//!   replace it). That is the kernel's `fs.protected_symlinks` rule made
//!   stricter (a link of this user in another user's directory is refused
//!   too, since that user could swap it), and applied even where the sysctl
//!   is 0. At most [`MAX_LINKS`] links are followed;
//! - a **directory** on a trusted path ([`Dirs::Trusted`]: state and
//!   runtime directories, databases, keys, credential files) must be owned
//!   by root or this user and not writable by group or others; a
//!   root-owned sticky directory (`/tmp`) is allowed, as nobody can rename
//!   or remove what they do not own in it. `publish` uses [`Dirs::Any`]: a
//!   sink directory may be shared; its links obey the rule all the same.
//!
//! What the walk hands back is a descriptor of the directory that was
//! checked (and the last name in it): every later open, create, rename or
//! SQLite open goes through that descriptor (`*at` calls,
//! `/proc/self/fd/N/NAME`), never through the path again, so nothing can
//! be swapped between the check and the use.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// Most symlinks followed in one walk (the kernel's own limit is 40).
pub const MAX_LINKS: usize = 40;

/// Neither `LEASEAGENT_STATE_DIR` nor anything to derive a state directory
/// from is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no state directory: set LEASEAGENT_STATE_DIR (or HOME)")]
pub struct NoStateDir;

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
    #[error("owned by uid {uid}, not by this user (uid {me})")]
    NotOwned { uid: u32, me: u32 },
    #[error("mode {mode:04o} lets other users write to it (chmod go-w)")]
    Loose { mode: u32 },
    /// The rule is [`DirRule::Exactly0700`].
    #[error("mode {mode:04o}, expected 0700")]
    NotPrivate { mode: u32 },
}

/// Why a path cannot be used. A message names the file or the directory
/// at fault and why.
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
    /// A symlink that the walk may not follow (module doc).
    #[error(
        "refusing {}: a symlink owned by uid {uid}; only links owned by root or this user (uid {me}) are followed",
        path.display()
    )]
    LinkOwner { path: PathBuf, uid: u32, me: u32 },
    /// A symlink in a directory someone else can change.
    #[error(
        "refusing {}: a symlink in a directory that another user can change (owned by uid {dir_uid}, mode {dir_mode:04o}), so they choose where it leads",
        path.display()
    )]
    LinkPlace {
        path: PathBuf,
        dir_uid: u32,
        dir_mode: u32,
    },
    #[error("cannot give {} to group {gid}: {source}", path.display())]
    Group {
        path: PathBuf,
        gid: u32,
        #[source]
        source: Errno,
    },
    #[error("refusing {}: more than {MAX_LINKS} symlinks", path.display())]
    TooManyLinks { path: PathBuf },
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{}: {source}", path.display())]
    Stat {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot create directory {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    /// A database file group or others may write (made 0600).
    #[error(
        "refusing {}: mode {mode:04o} lets other users write to it (it was made 0600; chmod go-w it if that change was yours)",
        path.display()
    )]
    LooseFile { path: PathBuf, mode: u32 },
    #[error("refusing {}: not a regular file", path.display())]
    NotRegular { path: PathBuf },
    #[error("refusing {}: not a directory", path.display())]
    NotDirectory { path: PathBuf },
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
        "refusing directory {}: owned by uid {uid} with mode {mode:04o}, so another user can change what is in it",
        path.display()
    )]
    UnsafeDir { path: PathBuf, uid: u32, mode: u32 },
    /// A database on a filesystem whose locks and writes other machines
    /// share (`sqlite:` on NFS, SMB, FUSE...).
    #[error(
        "refusing {}: it is on a network or user-space filesystem ({fs}), where the database's locks and clocks are not one host's; put it on a local filesystem",
        path.display()
    )]
    NetworkFs { path: PathBuf, fs: &'static str },
    /// Root's default state directory owned by another user (systemd's
    /// `StateDirectory=` of an older `leaseagent@.service` chowns it).
    #[error(
        "refusing {dir}: it belongs to uid {uid}, who could rewrite root's leases in it \
         (older leaseagent@.service units ran as that user with it as their \
         StateDirectory). Root's agents use it only when root owns it: move it away to \
         start afresh, or `chown -R root: {dir}` once you trust the database in it",
        dir = dir.display()
    )]
    ForeignStateDir { dir: PathBuf, uid: u32 },
}

/// What the directories on a walked path must be (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dirs {
    /// Owned by root or this user, not writable by group or others
    /// (root's sticky `/tmp` excepted).
    Trusted,
    /// Any directory; symlinks still obey the rule.
    Any,
}

/// A walk's rules.
#[derive(Clone, Copy, Debug)]
pub struct Walk {
    pub dirs: Dirs,
    /// Make missing directories (mode 0700) on the way.
    pub create: bool,
}

/// Where the walk ended: the checked directory that holds the last
/// component, and that component's name in it.
pub struct Parent {
    pub dir: OwnedFd,
    pub name: OsString,
}

/// One step still to walk.
enum Step {
    Root,
    Up,
    Name(OsString),
}

/// A directory the walk stands in.
struct At {
    fd: OwnedFd,
    st: rustix::fs::Stat,
    shown: PathBuf,
}

/// What the last component must be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    /// Not looked at: the walk ends in its directory.
    Keep,
    /// A directory (a final link followed).
    Dir,
    /// A regular file (a final link followed).
    File,
}

fn me() -> u32 {
    rustix::process::geteuid().as_raw()
}

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;
const S_IFREG: u32 = 0o100000;

/// Whether a directory lets no one but root and this user change what is
/// in it (the trusted-directory rule).
fn dir_is_safe(st: &rustix::fs::Stat, me: u32) -> bool {
    let mode = st.st_mode & 0o7777;
    let owner_ok = st.st_uid == 0 || st.st_uid == me;
    let sticky_root = st.st_uid == 0 && mode & 0o1000 != 0;
    owner_ok && (mode & 0o022 == 0 || sticky_root)
}

/// Whether a symlink in a directory with status `dir` may be followed.
fn link_place_is_safe(dir: &rustix::fs::Stat, me: u32) -> bool {
    let mode = dir.st_mode & 0o7777;
    let owner_ok = dir.st_uid == 0 || dir.st_uid == me;
    owner_ok && (mode & 0o022 == 0 || mode & 0o1000 != 0)
}

fn steps_of(path: &Path) -> VecDeque<Step> {
    path.components()
        .filter_map(|c| match c {
            Component::RootDir => Some(Step::Root),
            Component::ParentDir => Some(Step::Up),
            Component::Normal(n) => Some(Step::Name(n.to_os_string())),
            Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

impl Walk {
    /// Trusted directories, nothing created.
    pub const TRUSTED: Walk = Walk {
        dirs: Dirs::Trusted,
        create: false,
    };

    /// Walks to the directory that holds `path`'s last component and opens
    /// it; the last component itself is not looked at (the caller opens or
    /// creates it relative to [`Parent::dir`], with `O_NOFOLLOW`).
    pub fn parent(&self, path: &Path) -> Result<Parent, PathError> {
        self.run(path, Last::Keep)
    }

    /// Walks the whole path, which must end at a directory (a final link
    /// obeys the rule), and opens it.
    pub fn dir(&self, path: &Path) -> Result<OwnedFd, PathError> {
        let p = self.run(path, Last::Dir)?;
        Ok(p.dir)
    }

    /// Walks the whole path, which must end at a regular file (a final link
    /// obeys the rule): the directory that holds the file and its name.
    pub fn file(&self, path: &Path) -> Result<Parent, PathError> {
        self.run(path, Last::File)
    }

    fn run(&self, path: &Path, last: Last) -> Result<Parent, PathError> {
        let abs = if path.is_absolute() {
            path.to_path_buf()
        } else {
            let cwd = std::env::current_dir().map_err(|source| PathError::Resolve {
                path: path.to_path_buf(),
                source,
            })?;
            cwd.join(path)
        };
        let me = me();
        let mut todo = steps_of(&abs);
        let root = self.enter(rustix::fs::CWD, OsStr::new("/"), PathBuf::from("/"), me)?;
        let mut stack: Vec<At> = vec![root];
        let mut links = 0usize;
        loop {
            let Some(step) = todo.pop_front() else {
                let at = stack.pop().ok_or_else(|| PathError::NotAFile {
                    path: path.to_path_buf(),
                })?;
                return match last {
                    Last::Dir => Ok(Parent {
                        dir: readable(at.fd),
                        name: OsString::new(),
                    }),
                    // The path led to a directory.
                    Last::File => Err(PathError::NotRegular {
                        path: path.to_path_buf(),
                    }),
                    // `/`, or a path ending in `..`: no name to keep.
                    Last::Keep => Err(PathError::NotAFile {
                        path: path.to_path_buf(),
                    }),
                };
            };
            let name = match step {
                Step::Root => {
                    stack.truncate(1);
                    continue;
                }
                Step::Up => {
                    if stack.len() > 1 {
                        stack.pop();
                    }
                    continue;
                }
                Step::Name(n) => n,
            };
            let is_last = todo.is_empty();
            let Some(at) = stack.last() else {
                return Err(PathError::NotAFile {
                    path: path.to_path_buf(),
                });
            };
            if is_last && last == Last::Keep {
                return ended(&mut stack, name, path);
            }
            let shown = at.shown.join(&name);
            let fd = match open_path(&at.fd, &name) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if self.create && (!is_last || last == Last::Dir) => {
                    match rustix::fs::mkdirat(&at.fd, name.as_os_str(), Mode::from_raw_mode(0o700))
                    {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(source) => {
                            return Err(PathError::Create {
                                path: shown,
                                source,
                            });
                        }
                    }
                    open_path(&at.fd, &name).map_err(|source| PathError::Open {
                        path: shown.clone(),
                        source,
                    })?
                }
                Err(source) => {
                    return Err(PathError::Open {
                        path: shown,
                        source,
                    });
                }
            };
            let st = stat(&fd, &shown)?;
            match st.st_mode & S_IFMT {
                S_IFLNK => {
                    if st.st_uid != 0 && st.st_uid != me {
                        return Err(PathError::LinkOwner {
                            path: shown,
                            uid: st.st_uid,
                            me,
                        });
                    }
                    if !link_place_is_safe(&at.st, me) {
                        return Err(PathError::LinkPlace {
                            path: shown,
                            dir_uid: at.st.st_uid,
                            dir_mode: at.st.st_mode & 0o7777,
                        });
                    }
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(PathError::TooManyLinks {
                            path: path.to_path_buf(),
                        });
                    }
                    let target = rustix::fs::readlinkat(&at.fd, name.as_os_str(), Vec::new())
                        .map_err(|source| PathError::Open {
                            path: shown.clone(),
                            source,
                        })?;
                    let target: OsString =
                        std::os::unix::ffi::OsStringExt::from_vec(target.into_bytes());
                    let target = PathBuf::from(target);
                    for s in steps_of(&target).into_iter().rev() {
                        todo.push_front(s);
                    }
                }
                S_IFDIR => {
                    if self.dirs == Dirs::Trusted && !dir_is_safe(&st, me) {
                        return Err(PathError::UnsafeDir {
                            path: shown,
                            uid: st.st_uid,
                            mode: st.st_mode & 0o7777,
                        });
                    }
                    stack.push(At { fd, st, shown });
                }
                S_IFREG if is_last && last == Last::File => {
                    return ended(&mut stack, name, path);
                }
                _ if is_last && last == Last::File => {
                    return Err(PathError::NotRegular { path: shown });
                }
                _ => return Err(PathError::NotDirectory { path: shown }),
            }
        }
    }

    /// Opens the walk's first directory (`/`) and checks it.
    fn enter(
        &self,
        at: impl std::os::fd::AsFd,
        name: &OsStr,
        shown: PathBuf,
        me: u32,
    ) -> Result<At, PathError> {
        let fd = open_path(at, name).map_err(|source| PathError::Open {
            path: shown.clone(),
            source,
        })?;
        let st = stat(&fd, &shown)?;
        if st.st_mode & S_IFMT != S_IFDIR {
            return Err(PathError::NotDirectory { path: shown });
        }
        if self.dirs == Dirs::Trusted && !dir_is_safe(&st, me) {
            return Err(PathError::UnsafeDir {
                path: shown,
                uid: st.st_uid,
                mode: st.st_mode & 0o7777,
            });
        }
        Ok(At { fd, st, shown })
    }
}

/// The walk's end: the directory it stands in (the top of `stack`) holds
/// `name`.
fn ended(stack: &mut Vec<At>, name: OsString, path: &Path) -> Result<Parent, PathError> {
    let at = stack.pop().ok_or_else(|| PathError::NotAFile {
        path: path.to_path_buf(),
    })?;
    Ok(Parent {
        dir: readable(at.fd),
        name,
    })
}

/// `fstat`, its error naming `shown`.
pub fn stat(fd: &OwnedFd, shown: &Path) -> Result<rustix::fs::Stat, PathError> {
    rustix::fs::fstat(fd).map_err(|source| PathError::Stat {
        path: shown.to_path_buf(),
        source,
    })
}

/// `O_PATH | O_NOFOLLOW`: the entry itself, link or not, needing no read
/// permission.
fn open_path(at: impl std::os::fd::AsFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        at,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The same directory opened for reading (what `fsync` and `flock` need),
/// if this user may read it; else the `O_PATH` descriptor, which serves
/// every `*at` call.
fn readable(fd: OwnedFd) -> OwnedFd {
    rustix::fs::openat(
        &fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap_or(fd)
}

/// Whether `mode` (an `st_mode`) is a regular file.
pub fn is_regular(mode: u32) -> bool {
    mode & S_IFMT == S_IFREG
}

/// The filesystems where a lease database is refused: their locks, their
/// page cache or their clocks belong to more than one machine (or to a
/// user-space server), so neither SQLite's locking nor the engine's
/// reasoning about one host's page cache holds. `None` for a local one.
pub fn network_fs(dir: &OwnedFd) -> Result<Option<&'static str>, Errno> {
    const KNOWN: [(i64, &str); 11] = [
        (0x6969, "NFS"),
        (0x517B, "SMB"),
        (0xFE53_4D42, "SMB2"),
        (0xFF53_4D42, "CIFS"),
        (0x6573_5546, "FUSE"),
        (0x0102_1997, "9P"),
        (0x5346_414F, "AFS"),
        (0x6B41_4653, "AFS"),
        (0x00C3_6400, "Ceph"),
        (0x7375_7245, "Coda"),
        (0x564C, "NCP"),
    ];
    let st = rustix::fs::fstatfs(dir)?;
    #[allow(clippy::unnecessary_cast)]
    let kind = st.f_type as i64;
    Ok(KNOWN.iter().find(|(m, _)| *m == kind).map(|(_, n)| *n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_path_with_safe_links_is_walked_to_its_directory() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("f"), "x").unwrap();
        std::os::unix::fs::symlink("real", t.path().join("rel")).unwrap();
        std::os::unix::fs::symlink(&real, t.path().join("abs")).unwrap();
        std::os::unix::fs::symlink("../real/f", real.join("up")).unwrap();
        for p in ["rel/f", "abs/f", "real/up", "abs/../real/f", "real/./f"] {
            let got = Walk::TRUSTED.file(&t.path().join(p)).unwrap();
            assert_eq!(got.name, "f", "{p}");
            let st = rustix::fs::statat(&got.dir, "f", rustix::fs::AtFlags::empty()).unwrap();
            assert!(is_regular(st.st_mode), "{p}");
        }
        let p = Walk::TRUSTED.parent(&t.path().join("abs/new")).unwrap();
        assert_eq!(p.name, "new");
        let st = rustix::fs::fstat(&p.dir).unwrap();
        assert_eq!(st.st_ino, std::fs::metadata(&real).unwrap().ino());
        Walk::TRUSTED.dir(&t.path().join("rel")).unwrap();
    }

    #[test]
    fn a_link_in_a_directory_others_can_change_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::create_dir(t.path().join("target")).unwrap();
        std::os::unix::fs::symlink(t.path().join("target"), shared.join("l")).unwrap();
        chmod(&shared, 0o777);
        let any = Walk {
            dirs: Dirs::Any,
            create: false,
        };
        let e = any.dir(&shared.join("l")).err().unwrap();
        assert!(matches!(e, PathError::LinkPlace { .. }), "{e}");
        assert!(e.to_string().contains("another user can change"), "{e}");
        // Sticky (as /tmp is): only its owner could replace the link.
        chmod(&shared, 0o1777);
        any.dir(&shared.join("l")).unwrap();
        // A trusted walk refuses the world-writable directory itself.
        chmod(&shared, 0o777);
        let e = Walk::TRUSTED.parent(&shared.join("x")).err().unwrap();
        assert!(matches!(e, PathError::UnsafeDir { .. }), "{e}");
    }

    #[test]
    fn loops_end_and_missing_directories_are_made_private() {
        let t = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("b", t.path().join("a")).unwrap();
        std::os::unix::fs::symlink("a", t.path().join("b")).unwrap();
        let e = Walk::TRUSTED.dir(&t.path().join("a")).err().unwrap();
        assert!(matches!(e, PathError::TooManyLinks { .. }), "{e}");
        let make = Walk {
            dirs: Dirs::Trusted,
            create: true,
        };
        let p = make.parent(&t.path().join("x/y/db")).unwrap();
        assert_eq!(p.name, "db");
        let mode = std::fs::metadata(t.path().join("x/y"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let e = Walk::TRUSTED.file(&t.path().join("x")).err().unwrap();
        assert!(matches!(e, PathError::NotRegular { .. }), "{e}");
    }
}
