//! The agent's view of its lease, published for the job.
//!
//! The agent writes a small JSON file (atomically: write a temp file, then
//! rename) whenever its view changes: after the grant, after each successful
//! renewal, when renewals start failing, when the lease is lost. The job finds
//! it through `LEASEAGENT_STATE_FILE`; `leaseagent check` reads it.
//!
//! The supervisor loop never writes the file itself: a filesystem can stall
//! (a hung NFS home, a stuck disk, `fsfreeze`), and a loop asleep in D
//! state cannot act on a refusal or a deadline. It hands each new view to
//! [`StateQueue`], whose thread passes it on; when writes are slow, views
//! that were overtaken are skipped (the latest value wins), like the log
//! queue. Only the first write, before the job starts, is asked for
//! directly, so `leaseagent check` works from the job's first line.
//!
//! Where the writes happen is a [`StateSink`]: the agent's scribe
//! (`scribe.rs`), a process of its own, so that not even the writer thread
//! sleeps on a stalled filesystem (a thread asleep in the kernel keeps the
//! whole agent from being reaped); a [`StateWriter`] in the agent itself
//! only where the scribe could not be forked.
//!
//! Times are on `CLOCK_BOOTTIME` (one clock for the whole host), tagged with
//! the boot id, so a reader in another process computes the time left as
//! `deadline_boot_ms - now_boot_ms` without any wall clock. A file whose boot
//! id differs from the current one describes a lease from a previous boot,
//! which cannot be valid.

use std::io::Write;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::time::clock::BootInstant;

/// The environment variable that names the state file for the job.
pub const ENV_STATE_FILE: &str = "LEASEAGENT_STATE_FILE";

/// What the agent believes about its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseView {
    /// Held, last renewal (or the grant) succeeded.
    Valid,
    /// Renewals are failing; the lease is valid until the deadline at most.
    Renewing,
    /// Refused or expired: the attempt must not write anything.
    Lost,
    /// The agent is stopping the command (signal, release).
    Stopping,
}

/// The file's contents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStateFile {
    pub task: String,
    pub lease_id: String,
    pub token: u64,
    pub state: LeaseView,
    /// Local deadline (last successful renewal's send time + ttl), in ms on
    /// CLOCK_BOOTTIME.
    pub deadline_boot_ms: u64,
    pub boot_id: String,
    /// The writer's time namespace's `CLOCK_BOOTTIME` offset (ns; absent
    /// when 0, the host's own clock): a reader in another time namespace
    /// of the same boot translates `deadline_boot_ms` by the difference
    /// (a job may sit in a time namespace of its own, e.g. after a CRIU
    /// restore, where the raw numbers would be a day or more apart).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub boot_offset_ns: i64,
    pub agent_pid: u32,
    /// The run's outcome once the agent decided it (`succeeded`, `failed`,
    /// `cancelled`, `lost`): tells a job's own 124 from the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// What holds the command's tree once it runs (`pidns`, `cgroup`,
    /// `tree`: `LEASE_CONTAINMENT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containment: Option<String>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl LeaseStateFile {
    /// Time the lease has left as the agent sees it, 0 when lost or from
    /// another boot.
    ///
    /// `now` is read on the reader's boot clock, whose time namespace
    /// offset is `offset_ns` ([`crate::time::clock::boottime_offset`]).
    pub fn remaining(
        &self,
        now: BootInstant,
        boot_id: &str,
        offset_ns: i128,
    ) -> std::time::Duration {
        if self.boot_id != boot_id || matches!(self.state, LeaseView::Lost) {
            return std::time::Duration::ZERO;
        }
        // The deadline on the reader's clock: the host's instant plus the
        // reader's offset. One that falls before the reader's boot clock's
        // zero has passed.
        let ns = i128::from(self.deadline_boot_ms) * 1_000_000 - i128::from(self.boot_offset_ns)
            + offset_ns;
        let Ok(ns) = u64::try_from(ns) else {
            return std::time::Duration::ZERO;
        };
        now.until(BootInstant::from_since_boot(
            std::time::Duration::from_nanos(ns),
        ))
    }

    pub fn read(path: &Path) -> std::io::Result<Self> {
        let bytes = std::fs::read(path)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

/// Writes the state file atomically; owned by the supervisor loop alone.
///
/// Every file operation is relative to the directory descriptor that was
/// checked ([`crate::sys::paths::open_private_dir`]); the temp file is
/// created `O_EXCL | O_NOFOLLOW` with a random name, so a link planted in
/// the directory is never written through.
pub struct StateWriter {
    dir: OwnedFd,
    path: PathBuf,
    name: String,
    /// For a job of another user: the run's own directory, removed with
    /// the file; the file is made group-readable (the directory's group is
    /// the job's).
    group_dir: Option<crate::sys::paths::GroupRunDir>,
}

impl StateWriter {
    /// A writer in `dir`, which is created 0700 if missing and must be this
    /// user's, writable by no one else (see
    /// [`crate::sys::paths::open_private_dir`]).
    pub fn in_dir(dir: &Path) -> std::io::Result<Self> {
        use crate::sys::paths::{DirRule, open_private_dir};
        let fd = open_private_dir(dir, DirRule::NotWritableByOthers)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
        Ok(Self::in_checked_dir(dir, fd, std::process::id()))
    }

    /// A writer for a fresh file named after the agent's pid `agent` in the
    /// checked directory `dir` (whose path is `shown`). The pid is given:
    /// the writer may live in the agent's scribe (`scribe.rs`).
    pub fn in_checked_dir(shown: &Path, dir: OwnedFd, agent: u32) -> Self {
        let name = format!("lease-{agent}.json");
        StateWriter {
            path: shown.join(&name),
            dir,
            name,
            group_dir: None,
        }
    }

    /// A writer for a job that runs as another user, whose group is `gid`
    /// (`--user`): the file goes in a directory of the run's own that only
    /// that group may enter ([`crate::sys::paths::GroupRunDir`]).
    pub fn for_group(gid: u32, agent: u32) -> Result<Self, crate::sys::paths::PathError> {
        let run = crate::sys::paths::GroupRunDir::create(gid)?;
        let dir =
            rustix::io::dup(&run.dir).map_err(|source| crate::sys::paths::PathError::Open {
                path: run.path.clone(),
                source,
            })?;
        let mut w = Self::in_checked_dir(&run.path, dir, agent);
        w.group_dir = Some(run);
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file's contents (write to a temp file, then rename, so a
    /// reader never sees half a file). No fsync: the file only matters while
    /// this agent runs.
    ///
    /// Once the file exists, the new one is swapped in with
    /// `renameat2(RENAME_EXCHANGE)` and the old one, now under the temp
    /// name, is unlinked: as atomic for a reader, but ext4 takes a rename
    /// *over* an existing file for the replace-via-rename pattern and starts
    /// writeback of the new file at once (`auto_da_alloc`): 110 µs against
    /// 24 µs a write measured here, for a file nobody needs on disk. Where
    /// the exchange is not supported, a plain rename.
    pub fn write(&self, state: &LeaseStateFile) -> std::io::Result<()> {
        use rustix::fs::{AtFlags, RenameFlags, renameat, renameat_with, unlinkat};
        let (mut f, tmp) = crate::sys::paths::create_temp(&self.dir, ".lease-", 0o644)?;
        if let Some(run) = &self.group_dir {
            // Whatever the umask and the agent's group: the job's group
            // reads it. The group is set per file, not inherited from a
            // set-group-ID directory: a unit's RestrictSUIDSGID= refuses
            // that mode bit, and an agent in the job's group (Group=) may
            // give its own file that group without CAP_CHOWN.
            use std::os::unix::fs::PermissionsExt;
            rustix::fs::fchown(&f, None, Some(rustix::fs::Gid::from_raw(run.gid)))?;
            f.set_permissions(std::fs::Permissions::from_mode(0o640))?;
        }
        let bytes = serde_json::to_vec(state).map_err(std::io::Error::other)?;
        let written = f.write_all(&bytes);
        drop(f);
        let (dir, tmp, name) = (&self.dir, tmp.as_str(), self.name.as_str());
        let renamed = written.and_then(|()| {
            if renameat_with(dir, tmp, dir, name, RenameFlags::EXCHANGE).is_ok() {
                // The old contents, now under the temp name.
                let _ = unlinkat(dir, tmp, AtFlags::empty());
                return Ok(());
            }
            // No file yet (the first write), or no exchange here.
            renameat(dir, tmp, dir, name).map_err(std::io::Error::from)
        });
        if renamed.is_err() {
            let _ = unlinkat(dir, tmp, AtFlags::empty());
        }
        renamed
    }

    /// Removes the file (the agent is done), and the run's own directory
    /// if it has one.
    pub fn remove(&self) {
        let _ = rustix::fs::unlinkat(&self.dir, self.name.as_str(), rustix::fs::AtFlags::empty());
        if let Some(d) = &self.group_dir {
            d.remove();
        }
    }
}

/// Where the agent's views of its lease go: a [`StateWriter`] in the
/// agent's own process, or the one its scribe holds (`scribe.rs`), which
/// keeps the agent's threads off the filesystem.
pub trait StateSink: Send {
    /// The file's path, for the job (`LEASEAGENT_STATE_FILE`).
    fn path(&self) -> &Path;
    /// Replaces the file's contents.
    fn write(&mut self, state: &LeaseStateFile) -> std::io::Result<()>;
    /// Removes the file (the agent is done).
    fn remove(&mut self);
}

impl StateSink for StateWriter {
    fn path(&self) -> &Path {
        StateWriter::path(self)
    }
    fn write(&mut self, state: &LeaseStateFile) -> std::io::Result<()> {
        StateWriter::write(self, state)
    }
    fn remove(&mut self) {
        StateWriter::remove(self)
    }
}

enum Msg {
    Write(Box<LeaseStateFile>),
    /// Remove the file, then answer and end.
    Remove(Sender<()>),
}

/// The state file's writer thread: [`StateQueue::publish`] never blocks.
pub struct StateQueue {
    tx: Sender<Msg>,
}

impl StateQueue {
    /// Starts the thread that owns `writer`.
    pub fn spawn(writer: Box<dyn StateSink>) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded::<Msg>();
        std::thread::Builder::new()
            .name("state-file".into())
            .spawn(move || write_latest(writer, &rx))?;
        Ok(StateQueue { tx })
    }

    /// Queues `state`; an older view still waiting is dropped.
    pub fn publish(&self, state: LeaseStateFile) {
        let _ = self.tx.send(Msg::Write(Box::new(state)));
    }

    /// Asks the thread to remove the file and end, without waiting: the
    /// removal runs while the caller does something else; [`Removing::wait`]
    /// then waits a bounded time (a stalled filesystem delays the agent's
    /// exit by that much, never more).
    pub fn begin_remove(self) -> Removing {
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let sent = self.tx.send(Msg::Remove(done_tx)).is_ok();
        Removing {
            done: sent.then_some(done_rx),
        }
    }
}

/// A removal under way ([`StateQueue::begin_remove`]).
pub struct Removing {
    done: Option<Receiver<()>>,
}

impl Removing {
    /// Waits until the file is removed, at most `within`.
    pub fn wait(self, within: Duration) {
        if let Some(done) = self.done {
            let _ = done.recv_deadline(Instant::now() + within);
        }
    }
}

/// The thread: takes every waiting message, writes only the latest view.
fn write_latest(mut writer: Box<dyn StateSink>, rx: &Receiver<Msg>) {
    while let Ok(first) = rx.recv() {
        let mut latest = first;
        while let Ok(next) = rx.try_recv() {
            if matches!(latest, Msg::Remove(_)) {
                break;
            }
            latest = next;
        }
        match latest {
            Msg::Write(state) => {
                if let Err(e) = writer.write(&state) {
                    log::debug!("cannot write the lease state file: {e}");
                }
            }
            Msg::Remove(done) => {
                writer.remove();
                let _ = done.send(());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn round_trip_and_remaining() {
        let dir = tempfile::tempdir().unwrap();
        let w = StateWriter::in_dir(dir.path()).unwrap();
        let now = BootInstant::now();
        let s = LeaseStateFile {
            task: "t".into(),
            lease_id: "l".into(),
            token: 7,
            state: LeaseView::Valid,
            deadline_boot_ms: (now + Duration::from_secs(10)).since_boot().as_millis() as u64,
            boot_id: "b".into(),
            agent_pid: 1,
            boot_offset_ns: 0,
            outcome: None,
            containment: None,
        };
        w.write(&s).unwrap();
        let back = LeaseStateFile::read(w.path()).unwrap();
        assert_eq!(back, s);
        let left = back.remaining(now, "b", 0);
        assert!(left > Duration::from_secs(9) && left <= Duration::from_secs(10));
        assert_eq!(back.remaining(now, "other-boot", 0), Duration::ZERO);
        w.remove();
        assert!(!w.path().exists());
    }

    #[test]
    fn rewrites_leave_one_whole_file_and_no_temp_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let w = StateWriter::in_dir(dir).unwrap();
        let mut st = LeaseStateFile {
            task: "t".into(),
            lease_id: "l".into(),
            token: 0,
            state: LeaseView::Valid,
            deadline_boot_ms: 1,
            boot_id: "b".into(),
            agent_pid: 1,
            boot_offset_ns: 0,
            outcome: None,
            containment: None,
        };
        for token in 1..=5 {
            st.token = token;
            w.write(&st).unwrap();
            let names: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(names, vec![w.name.clone()], "after write {token}");
            assert_eq!(LeaseStateFile::read(w.path()).unwrap().token, token);
        }
        w.remove();
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
    }

    #[test]
    fn the_queue_writes_the_latest_view_and_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let w = StateWriter::in_dir(dir.path()).unwrap();
        let path = w.path().to_path_buf();
        let q = StateQueue::spawn(Box::new(w)).unwrap();
        let view = |token| LeaseStateFile {
            task: "t".into(),
            lease_id: "l".into(),
            token,
            state: LeaseView::Valid,
            deadline_boot_ms: 1,
            boot_id: "b".into(),
            agent_pid: 1,
            boot_offset_ns: 0,
            outcome: None,
            containment: None,
        };
        for t in 1..=50 {
            q.publish(view(t));
        }
        let until = Instant::now() + Duration::from_secs(10);
        while LeaseStateFile::read(&path).map(|s| s.token).ok() != Some(50) {
            assert!(Instant::now() < until, "the latest view was never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        q.begin_remove().wait(Duration::from_secs(10));
        assert!(!path.exists());
    }
}
