//! The directory store: fenced, atomic publication of files and directories
//! (what `leaseagent publish` runs).
//!
//! A *partition* is one entry `NAME` of a parent directory `ROOT`. Next to
//! it live two hidden files:
//!
//! | file | what |
//! |---|---|
//! | `ROOT/.NAME.leaseagent-fence` | the highest token ever published to `NAME`: decimal digits and a newline |
//! | `ROOT/.NAME.leaseagent-fence.lock` | an empty file that publishers `flock`; never deleted |
//!
//! One publication, all under an exclusive `flock` of the lock file:
//! 1. read the record; refuse with [`Superseded`] when `token < highest`
//!    (DEST untouched, record unchanged);
//! 2. write the record: temp file, `fsync`, `rename` over the record,
//!    `fsync` of ROOT, so the new highest token is on disk *before* the
//!    data moves;
//! 3. move SRC into place: a plain `rename` when DEST is absent
//!    (`RENAME_NOREPLACE`) or when both are files; otherwise
//!    `renameat2(RENAME_EXCHANGE)`, which swaps the two entries in one step,
//!    so a reader sees the whole old tree or the whole new one, never a mix;
//! 4. `fsync` ROOT (and SRC's parent), so the move is durable;
//! 5. after an exchange, delete the old tree, now at SRC's path.
//!
//! Races and failures guarded against:
//! - Two publishers: the lock serializes check-record-move; a lower token
//!   that waited for the lock is refused after the higher one moved.
//! - Crash after step 2, before step 3: the record holds the new token but
//!   DEST is old. The same attempt (equal token) may publish again; a lower
//!   one is refused; nothing was lost but the move.
//! - Crash after step 3, before 5: the old tree stays at SRC's path
//!   (the job's own temp location); DEST is already the new content.
//! - A publisher paused while holding the lock blocks the others; they wait
//!   at most [`DirStore::lock_timeout`] and fail with [`Error::LockTimeout`].
//!   It cannot make a lower token win: whatever it moves in, a later higher
//!   token replaces.
//! - SRC on another filesystem: a rename cannot be atomic there; refused
//!   before anything is recorded ([`Error::CrossDevice`]).
//! - A corrupt record is never guessed at: [`Error::CorruptRecord`].
//! - DEST's directory swapped under the publisher (a symlink on its path
//!   re-pointed between two directories): the directory is resolved once,
//!   walked from `/` as the kernel's `protected_symlinks` rule would
//!   (`crate::sys::walk`: a link another user owns or can re-point is
//!   refused), and every later step (lock, record, rename, fsync) is
//!   relative to that one descriptor, as SRC's rename is to its own
//!   directory's. Resolved afresh at each step, a stale token could check
//!   one directory's record and land in the other.
//!
//! The lock is advisory and local: every writer of DEST must go through this
//! store, on a filesystem with working `flock` and `renameat2` (ext4, xfs,
//! btrfs, tmpfs). Not NFS.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, RenameFlags};

use crate::sys::walk::{Dirs, Walk};

use super::{FenceError, FencedStore, Superseded, admit};

/// Suffix of the record file (after `.NAME`).
pub const RECORD_SUFFIX: &str = ".leaseagent-fence";
/// Suffix of the lock file (after `.NAME`).
pub const LOCK_SUFFIX: &str = ".leaseagent-fence.lock";
const TMP_SUFFIX: &str = ".leaseagent-fence.tmp";
const STAGING_INFIX: &str = ".leaseagent-staging-";

/// Default longest wait for another publisher's lock.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the directory store.
#[derive(Debug)]
pub enum Error {
    /// A higher token was already published: nothing changed.
    Superseded(Superseded),
    /// SRC does not exist.
    MissingSource(PathBuf),
    /// SRC could not be examined.
    Source(PathBuf, std::io::Error),
    /// SRC and DEST's directory are on different filesystems.
    CrossDevice { src: PathBuf, dest_dir: PathBuf },
    /// The partition name is unusable (empty, `.`, `..`, has a `/`, or is
    /// one of this store's own files).
    BadName(OsString),
    /// DEST's parent directory is missing or not a directory.
    DestDir(PathBuf, std::io::Error),
    /// The record holds something that is not a token.
    CorruptRecord { path: PathBuf, content: String },
    /// The lock file could not be opened or locked.
    Lock(PathBuf, std::io::Error),
    /// Another publisher held the lock for longer than the timeout.
    LockTimeout(PathBuf, Duration),
    /// Reading or writing the record failed (DEST untouched).
    Record(PathBuf, std::io::Error),
    /// The rename failed (DEST untouched).
    Move {
        src: PathBuf,
        dest: PathBuf,
        source: std::io::Error,
    },
    /// The move happened but could not be made durable (fsync failed).
    Sync(PathBuf, std::io::Error),
    /// Staging for [`FencedStore::write`] failed.
    Staging(PathBuf, std::io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Superseded(s) => write!(f, "{s}"),
            Error::MissingSource(p) => write!(f, "{}: no such file or directory", p.display()),
            Error::Source(p, e) => write!(f, "{}: {e}", p.display()),
            Error::CrossDevice { src, dest_dir } => write!(
                f,
                "{} and {} are on different filesystems; an atomic move needs both on one: \
                 write the temporary output next to DEST",
                src.display(),
                dest_dir.display()
            ),
            Error::BadName(n) => write!(f, "`{}` cannot be published to", n.to_string_lossy()),
            Error::DestDir(p, e) => write!(f, "destination directory {}: {e}", p.display()),
            Error::CorruptRecord { path, content } => write!(
                f,
                "fence record {} holds `{}`, not a token; refusing to guess \
                 (write the highest token ever published there, or remove it if none was)",
                path.display(),
                content.escape_debug()
            ),
            Error::Lock(p, e) => write!(f, "lock {}: {e}", p.display()),
            Error::LockTimeout(p, d) => write!(
                f,
                "lock {} still held by another publisher after {}",
                p.display(),
                crate::time::duration::format(*d)
            ),
            Error::Record(p, e) => write!(f, "fence record {}: {e}", p.display()),
            Error::Move { src, dest, source } => {
                write!(
                    f,
                    "moving {} to {}: {source}",
                    src.display(),
                    dest.display()
                )
            }
            Error::Sync(p, e) => write!(
                f,
                "published, but syncing {} failed ({e}): the move may not survive a crash",
                p.display()
            ),
            Error::Staging(p, e) => write!(f, "staging {}: {e}", p.display()),
        }
    }
}

impl std::error::Error for Error {}

impl FenceError for Error {
    fn superseded(&self) -> Option<Superseded> {
        match self {
            Error::Superseded(s) => Some(*s),
            _ => None,
        }
    }
}

impl From<Superseded> for Error {
    fn from(s: Superseded) -> Self {
        Error::Superseded(s)
    }
}

/// What a successful publication did.
#[derive(Debug)]
pub struct Published {
    /// The highest token before this publication.
    pub previous: Option<u64>,
    /// DEST existed and was replaced.
    pub replaced: bool,
    /// The old content could not be deleted from SRC's path after the
    /// exchange (the publication itself succeeded).
    pub leftover: Option<(PathBuf, std::io::Error)>,
}

/// Fenced publication into one directory. See the module docs.
#[derive(Clone, Debug)]
pub struct DirStore {
    root: PathBuf,
    lock_timeout: Duration,
    crash_after_record: bool,
}

impl DirStore {
    /// A store for the entries of `root` (which must exist).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirStore {
            root: root.into(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            crash_after_record: false,
        }
    }

    /// The longest wait for the lock held by another publisher.
    pub fn lock_timeout(mut self, d: Duration) -> Self {
        self.lock_timeout = d;
        self
    }

    /// Fault injection for tests: abort the process right after the record
    /// is durable, before the move (what a crash there leaves behind).
    #[doc(hidden)]
    pub fn crash_after_record(mut self, yes: bool) -> Self {
        self.crash_after_record = yes;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The record file of `name`.
    pub fn record_path(&self, name: &OsStr) -> PathBuf {
        self.root.join(hidden(name, RECORD_SUFFIX))
    }

    /// The lock file of `name`.
    pub fn lock_path(&self, name: &OsStr) -> PathBuf {
        self.root.join(hidden(name, LOCK_SUFFIX))
    }

    /// The highest token published to `name`, read without the lock.
    pub fn highest_of(&self, name: &OsStr) -> Result<Option<u64>, Error> {
        check_name(name)?;
        let root = self.open_root()?;
        read_record(&root, &hidden(name, RECORD_SUFFIX), &self.record_path(name))
    }

    /// Moves `src` (file, directory or symlink) to `ROOT/name` if `token` is
    /// at least the highest token published there, recording `token` durably
    /// first. See the module docs for the steps.
    pub fn publish(&self, src: &Path, name: &OsStr, token: u64) -> Result<Published, Error> {
        check_name(name)?;
        let dest = self.root.join(name);
        let root = self.open_root()?;
        let source = |e: std::io::Error| Error::Source(src.to_path_buf(), e);
        let src_at = WALK.parent(src).map_err(|e| match e {
            crate::sys::walk::PathError::Open {
                source: rustix::io::Errno::NOENT,
                ..
            } => Error::MissingSource(src.to_path_buf()),
            e => source(std::io::Error::other(e)),
        })?;
        let src_st = match rustix::fs::statat(
            &src_at.dir,
            src_at.name.as_os_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => {
                return Err(Error::MissingSource(src.to_path_buf()));
            }
            Err(e) => return Err(source(e.into())),
        };
        let root_st =
            rustix::fs::fstat(&root).map_err(|e| Error::DestDir(self.root.clone(), e.into()))?;
        if src_st.st_dev != root_st.st_dev {
            return Err(Error::CrossDevice {
                src: src.to_path_buf(),
                dest_dir: self.root.clone(),
            });
        }

        let _lock = self.lock(&root, name)?;
        let record = self.record_path(name);
        let previous = read_record(&root, &hidden(name, RECORD_SUFFIX), &record)?;
        admit(token, previous)?;
        self.write_record(&root, name, &record, token)?;
        if self.crash_after_record {
            std::process::abort();
        }

        let from = (&src_at.dir, src_at.name.as_os_str());
        let moved = move_into_place(from, src, &src_st, (&root, name), &dest)?;
        rustix::fs::fsync(&root).map_err(|e| Error::Sync(self.root.clone(), e.into()))?;
        let src_dir_st = rustix::fs::fstat(&src_at.dir).map_err(|e| source(e.into()))?;
        if (src_dir_st.st_dev, src_dir_st.st_ino) != (root_st.st_dev, root_st.st_ino) {
            rustix::fs::fsync(&src_at.dir).map_err(|e| Error::Sync(parent_of(src), e.into()))?;
        }
        let leftover = match moved {
            Moved::Exchanged { old_is_dir } => remove_at(&src_at.dir, &src_at.name, old_is_dir)
                .err()
                .map(|e| (src.to_path_buf(), e)),
            Moved::Renamed { .. } => None,
        };
        Ok(Published {
            previous,
            replaced: matches!(
                moved,
                Moved::Exchanged { .. } | Moved::Renamed { replaced: true }
            ),
            leftover,
        })
    }

    /// DEST's directory, resolved once ([`WALK`]); every step of a
    /// publication is relative to it.
    fn open_root(&self) -> Result<OwnedFd, Error> {
        WALK.dir(&self.root).map_err(|e| {
            let io = match e {
                crate::sys::walk::PathError::Open { source, .. } => source.into(),
                crate::sys::walk::PathError::NotDirectory { .. } => {
                    std::io::Error::from(std::io::ErrorKind::NotADirectory)
                }
                e => std::io::Error::other(e),
            };
            Error::DestDir(self.root.clone(), io)
        })
    }

    /// Takes the exclusive lock of `name`, waiting at most the lock timeout.
    fn lock(&self, root: &OwnedFd, name: &OsStr) -> Result<std::fs::File, Error> {
        let path = self.lock_path(name);
        let file = open_side_file(
            root,
            &hidden(name, LOCK_SUFFIX),
            OFlags::CREATE | OFlags::WRONLY,
        )
        .map_err(|e| Error::Lock(path.clone(), e))?;
        let deadline = Instant::now() + self.lock_timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(file),
                Err(rustix::io::Errno::WOULDBLOCK) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(Error::Lock(path, e.into())),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::LockTimeout(path, self.lock_timeout));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Replaces the record with `token`: temp file, fsync, rename, fsync dir.
    /// The temp file has a random name and is created `O_EXCL | O_NOFOLLOW`
    /// relative to the open directory, so a planted link is never followed.
    fn write_record(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        record: &Path,
        token: u64,
    ) -> Result<(), Error> {
        let err = |e| Error::Record(record.to_path_buf(), e);
        let prefix = format!("{}-", hidden(name, TMP_SUFFIX).to_string_lossy());
        let (mut f, tmp) = crate::sys::paths::create_temp(dir, &prefix, 0o644).map_err(err)?;
        let record_name = hidden(name, RECORD_SUFFIX);
        let written = f
            .write_all(format!("{token}\n").as_bytes())
            .and_then(|()| f.sync_all());
        drop(f);
        let renamed = written.and_then(|()| {
            rustix::fs::renameat(dir, tmp.as_str(), dir, record_name.as_os_str())
                .map_err(std::io::Error::from)
        });
        if let Err(e) = renamed {
            let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            return Err(err(e));
        }
        rustix::fs::fsync(dir).map_err(|e| err(e.into()))
    }
}

/// How publish walks DEST's directory and SRC's: from `/`, following only
/// the symlinks the kernel's `protected_symlinks` rule would trust; a sink
/// directory may be shared, so directories themselves are not judged.
const WALK: Walk = Walk {
    dirs: Dirs::Any,
    create: false,
};

/// Opens a side file (record, lock) in the store's directory without
/// following a symlink and without blocking on a planted FIFO; it must be
/// a regular file.
fn open_side_file(dir: &OwnedFd, name: &OsStr, flags: OFlags) -> std::io::Result<std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => std::io::Error::other("it is a symlink; refusing to follow it"),
        e => e.into(),
    })?;
    let st = rustix::fs::fstat(&fd)?;
    if st.st_mode & 0o170000 != 0o100000 {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(std::fs::File::from(fd))
}

/// How the move went.
#[derive(Clone, Copy, Debug)]
enum Moved {
    Renamed { replaced: bool },
    Exchanged { old_is_dir: bool },
}

fn move_into_place(
    (src_dir, src_name): (&OwnedFd, &OsStr),
    src: &Path,
    src_st: &rustix::fs::Stat,
    (dest_dir, dest_name): (&OwnedFd, &OsStr),
    dest: &Path,
) -> Result<Moved, Error> {
    let move_err = |e: std::io::Error| Error::Move {
        src: src.to_path_buf(),
        dest: dest.to_path_buf(),
        source: e,
    };
    let rename = |flags: RenameFlags| {
        rustix::fs::renameat_with(src_dir, src_name, dest_dir, dest_name, flags)
    };
    match rename(RenameFlags::NOREPLACE) {
        Ok(()) => return Ok(Moved::Renamed { replaced: false }),
        Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(move_err(e.into())),
    }
    let dest_st = rustix::fs::statat(dest_dir, dest_name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| move_err(e.into()))?;
    let is_dir = |st: &rustix::fs::Stat| st.st_mode & 0o170000 == 0o040000;
    if !is_dir(src_st) && !is_dir(&dest_st) {
        // rename(2) replaces a non-directory atomically.
        rename(RenameFlags::empty()).map_err(|e| move_err(e.into()))?;
        return Ok(Moved::Renamed { replaced: true });
    }
    rename(RenameFlags::EXCHANGE).map_err(|e| move_err(e.into()))?;
    Ok(Moved::Exchanged {
        old_is_dir: is_dir(&dest_st),
    })
}

/// Deletes the entry `name` of `dir` (a whole tree if `is_dir`), never
/// following a symlink inside it.
fn remove_at(dir: &OwnedFd, name: &OsStr, is_dir: bool) -> std::io::Result<()> {
    if !is_dir {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(Into::into);
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut entries = Vec::new();
    for e in rustix::fs::Dir::read_from(&sub)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        let child: OsString = std::os::unix::ffi::OsStringExt::from_vec(n.to_vec());
        entries.push((child, e.file_type() == rustix::fs::FileType::Directory));
    }
    for (child, child_is_dir) in entries {
        remove_at(&sub, &child, child_is_dir)?;
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).map_err(Into::into)
}

/// `.NAME` + suffix.
fn hidden(name: &OsStr, suffix: &str) -> OsString {
    let mut s = OsString::from(".");
    s.push(name);
    s.push(suffix);
    s
}

fn check_name(name: &OsStr) -> Result<(), Error> {
    let bytes = name.as_encoded_bytes();
    let own = name.to_str().is_some_and(|n| {
        n.starts_with('.')
            && (n.ends_with(RECORD_SUFFIX)
                || n.ends_with(LOCK_SUFFIX)
                || n.contains(TMP_SUFFIX)
                || n.contains(STAGING_INFIX))
    });
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') || own {
        return Err(Error::BadName(name.to_os_string()));
    }
    Ok(())
}

fn read_record(dir: &OwnedFd, name: &OsStr, path: &Path) -> Result<Option<u64>, Error> {
    let read = open_side_file(dir, name, OFlags::RDONLY).and_then(|f| {
        use std::io::Read;
        let mut bytes: Vec<u8> = Vec::new();
        f.take(64).read_to_end(&mut bytes).map(|_| bytes)
    });
    match read {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let digits = text.strip_suffix('\n').unwrap_or(&text);
            super::parse_token(digits)
                .map(Some)
                .ok_or_else(|| Error::CorruptRecord {
                    path: path.to_path_buf(),
                    content: text.into_owned(),
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Record(path.to_path_buf(), e)),
    }
}

fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Splits a DEST path into its store root and entry name.
pub fn split_dest(dest: &Path) -> Result<(PathBuf, OsString), Error> {
    let name = dest
        .file_name()
        .ok_or_else(|| Error::BadName(dest.as_os_str().to_os_string()))?;
    check_name(name)?;
    Ok((parent_of(dest), name.to_os_string()))
}

/// Where [`FencedStore::write`] lets the caller build the new content: a
/// path in ROOT (so the final move stays on one filesystem) at which the
/// caller creates a file or a directory.
#[derive(Debug)]
pub struct Staging {
    path: PathBuf,
}

impl Staging {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl FencedStore for DirStore {
    type Txn<'a> = Staging;
    type Error = Error;

    fn highest(&mut self, partition: &str) -> Result<Option<u64>, Error> {
        self.highest_of(OsStr::new(partition))
    }

    /// Checks the fence early (to skip useless work), lets `f` build the
    /// content at [`Staging::path`], then [`DirStore::publish`]es it, which
    /// checks again under the lock. The staged content is removed when `f`
    /// fails or the publication is refused.
    fn write<R, E>(
        &mut self,
        partition: &str,
        token: u64,
        f: impl FnOnce(&mut Staging) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<Error>,
    {
        let name = OsStr::new(partition);
        admit(token, self.highest_of(name)?).map_err(Error::from)?;
        let staged = format!(".{partition}{STAGING_INFIX}{}-{token}", std::process::id());
        let mut staging = Staging {
            path: self.root.join(staged),
        };
        let cleanup = |p: &Path| {
            let _ = std::fs::remove_dir_all(p);
            let _ = std::fs::remove_file(p);
        };
        cleanup(&staging.path);
        let out = match f(&mut staging) {
            Ok(r) => r,
            Err(e) => {
                cleanup(&staging.path);
                return Err(e);
            }
        };
        match self.publish(&staging.path, name, token) {
            Ok(_) => Ok(out),
            Err(Error::MissingSource(p)) => Err(Error::Staging(
                p,
                std::io::Error::other("the write created nothing at the staging path"),
            )
            .into()),
            Err(e) => {
                cleanup(&staging.path);
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(p: &Path, s: &str) {
        std::fs::write(p, s).unwrap();
    }

    #[test]
    fn file_publish_equal_lower_higher() {
        let d = tempfile::tempdir().unwrap();
        let store = DirStore::new(d.path());
        let name = OsStr::new("out");
        let src = d.path().join("src");
        put(&src, "five");
        let p = store.publish(&src, name, 5).unwrap();
        assert_eq!(p.previous, None);
        assert!(!p.replaced);
        assert_eq!(
            std::fs::read_to_string(d.path().join("out")).unwrap(),
            "five"
        );
        assert_eq!(store.highest_of(name).unwrap(), Some(5));

        put(&src, "five again");
        assert!(store.publish(&src, name, 5).unwrap().replaced);
        assert_eq!(
            std::fs::read_to_string(d.path().join("out")).unwrap(),
            "five again"
        );

        put(&src, "four");
        let e = store.publish(&src, name, 4).unwrap_err();
        assert_eq!(
            e.superseded(),
            Some(Superseded {
                token: 4,
                highest: 5
            })
        );
        assert!(e.to_string().contains("token 4 superseded by 5"));
        assert!(src.exists(), "a refused SRC stays where it was");
        assert_eq!(
            std::fs::read_to_string(d.path().join("out")).unwrap(),
            "five again"
        );

        put(&src, "nine");
        store.publish(&src, name, 9).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("out")).unwrap(),
            "nine"
        );
        assert_eq!(store.highest_of(name).unwrap(), Some(9));
        assert_eq!(
            std::fs::read_to_string(store.record_path(name)).unwrap(),
            "9\n"
        );
    }

    #[test]
    fn directory_is_exchanged_and_old_tree_removed() {
        let d = tempfile::tempdir().unwrap();
        let store = DirStore::new(d.path());
        let name = OsStr::new("tree");
        let mk = |tag: &str| {
            let p = d.path().join(format!("tmp-{tag}"));
            std::fs::create_dir(&p).unwrap();
            put(&p.join("a"), tag);
            std::fs::create_dir(p.join("sub")).unwrap();
            put(&p.join("sub/b"), tag);
            p
        };
        let one = mk("one");
        store.publish(&one, name, 1).unwrap();
        assert!(!one.exists());
        let two = mk("two");
        let p = store.publish(&two, name, 2).unwrap();
        assert!(p.replaced);
        assert!(p.leftover.is_none());
        assert!(!two.exists(), "the old tree is removed from SRC's path");
        assert_eq!(
            std::fs::read_to_string(d.path().join("tree/sub/b")).unwrap(),
            "two"
        );
        // A file may replace a directory and the other way round.
        let f = d.path().join("file");
        put(&f, "flat");
        store.publish(&f, name, 3).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("tree")).unwrap(),
            "flat"
        );
        let back = mk("three");
        store.publish(&back, name, 3).unwrap();
        assert!(d.path().join("tree/sub/b").exists());
        assert!(!back.exists());
    }

    #[test]
    fn clear_errors() {
        let d = tempfile::tempdir().unwrap();
        let store = DirStore::new(d.path());
        let e = store
            .publish(&d.path().join("nope"), OsStr::new("out"), 1)
            .unwrap_err();
        assert!(matches!(e, Error::MissingSource(_)), "{e}");
        assert!(e.to_string().contains("no such file"));
        assert!(!store.record_path(OsStr::new("out")).exists());
        for bad in ["", ".", "..", ".x.leaseagent-fence"] {
            assert!(matches!(
                store.highest_of(OsStr::new(bad)),
                Err(Error::BadName(_))
            ));
        }
        put(&store.record_path(OsStr::new("out")), "garbage");
        put(&d.path().join("s"), "x");
        let e = store
            .publish(&d.path().join("s"), OsStr::new("out"), 1)
            .unwrap_err();
        assert!(matches!(e, Error::CorruptRecord { .. }), "{e}");
        assert!(!d.path().join("out").exists());
    }

    #[test]
    fn fenced_store_write_stages_and_cleans_up() {
        let d = tempfile::tempdir().unwrap();
        let mut store = DirStore::new(d.path());
        let r: Result<u32, Error> = store.write("o", 3, |s| {
            std::fs::create_dir(s.path()).map_err(|e| Error::Staging(s.path().into(), e))?;
            put(&s.path().join("x"), "3");
            Ok(7)
        });
        assert_eq!(r.unwrap(), 7);
        assert_eq!(std::fs::read_to_string(d.path().join("o/x")).unwrap(), "3");
        let r: Result<(), Error> = store.write("o", 2, |_| panic!("not called when refused"));
        assert_eq!(r.unwrap_err().superseded().map(|s| s.highest), Some(3));
        assert_eq!(store.highest("o").unwrap(), Some(3));
        let left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("staging"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
