//! A cgroup v2 of the job's own, when the keeper may make one.
//!
//! A cgroup holds every process started in it, whatever it does with its
//! parent, group or session, and `cgroup.kill` kills them all at once, with
//! no walk and no fork race. The keeper uses one by default wherever its
//! own cgroup is writable by it (delegated, e.g. systemd `Delegate=yes`, or
//! root, even in the root cgroup) and the new cgroup has `cgroup.kill`
//! (Linux 5.14+); otherwise the tree walk alone.
//!
//! How the job is born inside it without a race: created there by
//! `clone3(CLONE_INTO_CGROUP)` ([`crate::sys::spawn`]), so no process is
//! ever moved and the keeper is never inside the job's cgroup. Where the
//! kernel refuses that clone (before Linux 5.7), the keeper moves itself
//! into `<own>/leaseagent-job-<pid>`, starts the job (which inherits the
//! cgroup), and moves itself back to its own cgroup before anything is
//! killed; a probe (in and back out once) comes first, so a keeper that
//! could not move back never starts a job in a cgroup it would kill itself
//! with.
//!
//! Finding the keeper's own cgroup directory: `/proc/self/cgroup` names it
//! relative to the cgroup v2 mount, usually `/sys/fs/cgroup` (or
//! `/sys/fs/cgroup/unified` on a hybrid host). Those are checked first
//! (`statfs`: a cgroup2 file system whose directory lists this process);
//! only otherwise is `/proc/self/mountinfo` read, which on a host with many
//! mounts costs more than the rest of the keeper's start.

use std::path::{Path, PathBuf};

/// The job's cgroup directory, with the two files the kill path needs open
/// from the start: a job that lowers the keeper's `RLIMIT_NOFILE` (same
/// uid, `prlimit`) makes every later `open` fail with EMFILE, and
/// `cgroup.kill` and `cgroup.events` must still work then.
pub struct JobCgroup {
    dir: PathBuf,
    parent: PathBuf,
    kill: std::os::fd::OwnedFd,
    events: std::os::fd::OwnedFd,
}

/// Why the job gets no cgroup of its own (the tree walk is used instead).
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// `/proc/self/cgroup` or `/proc/self/mountinfo` could not be read.
    #[error("{0}")]
    Read(#[source] std::io::Error),
    #[error("no cgroup v2 hierarchy")]
    NoV2,
    #[error("the keeper is in the root cgroup")]
    InRoot,
    #[error("cgroup v2 is not mounted")]
    NotMounted,
    /// Linux before 5.14.
    #[error("{} has no cgroup.kill", dir.display())]
    NoKill { dir: PathBuf },
    #[error("cannot create {}: {source}", dir.display())]
    Create {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The probe (in and back out) failed: not delegated to us.
    #[error("cannot move into {}: {source}", dir.display())]
    Move {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn read(file: &str) -> Result<String, CgroupError> {
    std::fs::read_to_string(file).map_err(CgroupError::Read)
}

/// The keeper's own cgroup v2 directory, if cgroup v2 is mounted and we
/// are in a non-root cgroup of it.
fn own_dir() -> Result<PathBuf, CgroupError> {
    let cg = read("/proc/self/cgroup")?;
    let path = cg
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(CgroupError::NoV2)?;
    // Only root may make cgroups beside the root cgroup's own processes.
    if path == "/" && !rustix::process::geteuid().is_root() {
        return Err(CgroupError::InRoot);
    }
    if let Some(dir) = usual_mount_dir(path) {
        return Ok(dir);
    }
    let info = read("/proc/self/mountinfo")?;
    mount_dir_from_mountinfo(&info, path).ok_or(CgroupError::NotMounted)
}

/// `path` under one of the usual cgroup v2 mount points, if that is a
/// cgroup2 file system and the directory found there is ours (it lists
/// this process): a mount of a sub-tree (a container's) would otherwise
/// give a wrong directory.
fn usual_mount_dir(path: &str) -> Option<PathBuf> {
    const CGROUP2_SUPER_MAGIC: rustix::fs::FsWord = 0x6367_7270;
    let me = std::process::id().to_string();
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .filter(|m| rustix::fs::statfs(*m).is_ok_and(|st| st.f_type == CGROUP2_SUPER_MAGIC))
        .map(|m| Path::new(m).join(path.trim_start_matches('/')))
        .find(|dir| {
            // The root cgroup (root only: `own_dir`) is the mount itself;
            // its cgroup.procs lists the whole host, not worth reading.
            path == "/"
                || std::fs::read_to_string(dir.join("cgroup.procs"))
                    .is_ok_and(|procs| procs.lines().any(|l| l.trim() == me))
        })
}

/// The directory of cgroup `path` (as `/proc/self/cgroup` names it) under
/// the first cgroup2 mount of `mountinfo` whose root contains it.
fn mount_dir_from_mountinfo(mountinfo: &str, path: &str) -> Option<PathBuf> {
    for line in mountinfo.lines() {
        // id parent maj:min root mountpoint opts ... - fstype source opts
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        let (Some(root), Some(mount)) = (f.get(3), f.get(4)) else {
            continue;
        };
        let Some(rel) = path.strip_prefix(root.trim_end_matches('/')) else {
            continue;
        };
        return Some(Path::new(mount).join(rel.trim_start_matches('/')));
    }
    None
}

fn move_self(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
}

/// The job cgroup's name for the agent `agent` (the agent's pid, not the
/// keeper's: a keeper in a PID namespace of its own is PID 1 there, like
/// every other run's keeper).
pub fn name_for(agent: u32) -> String {
    format!("leaseagent-job-{agent}")
}

impl JobCgroup {
    /// Makes the job's cgroup for agent `agent` (empty; nothing moved yet),
    /// its `cgroup.kill` and `cgroup.events` opened. `Err` says why there
    /// is none (the tree walk is used instead).
    pub fn create(agent: u32) -> Result<Self, CgroupError> {
        use rustix::fs::{Mode, OFlags};
        let parent = own_dir()?;
        let dir = parent.join(name_for(agent));
        if let Err(source) = std::fs::create_dir(&dir) {
            return Err(CgroupError::Create { dir, source });
        }
        // The root cgroup has no cgroup.kill of its own: ask the new one.
        let opened = (
            rustix::fs::open(
                dir.join("cgroup.kill"),
                OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::empty(),
            ),
            rustix::fs::open(
                dir.join("cgroup.events"),
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            ),
        );
        let (Ok(kill), Ok(events)) = opened else {
            let _ = std::fs::remove_dir(&dir);
            return Err(CgroupError::NoKill { dir });
        };
        Ok(JobCgroup {
            dir,
            parent,
            kill,
            events,
        })
    }

    /// Whether any process is left in the cgroup (`populated` of
    /// `cgroup.events`, read again from the start through the descriptor
    /// opened at creation). `None`: it could not be read, which is never
    /// taken for empty.
    pub fn populated(&self) -> Option<bool> {
        let mut buf = [0u8; 256];
        let n = rustix::io::pread(&self.events, &mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        text.lines().find_map(|l| match l.trim() {
            "populated 0" => Some(false),
            "populated 1" => Some(true),
            _ => None,
        })
    }

    /// The directory, open, for `clone3(CLONE_INTO_CGROUP)`.
    pub fn open(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        use rustix::fs::{Mode, OFlags};
        Ok(rustix::fs::open(
            &self.dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// For the fallback that moves the keeper: checks it can move in and
    /// back out. On `Err` the keeper is back where it was (or the error
    /// says it could not be) and the cgroup is removed.
    pub fn probe_moves(&self) -> Result<(), CgroupError> {
        if let Err(source) = self.enter().and_then(|()| self.leave()) {
            // Back where we were, or nowhere to kill ourselves from.
            let _ = self.leave();
            self.remove();
            return Err(CgroupError::Move {
                dir: self.dir.clone(),
                source,
            });
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves the keeper into the job's cgroup (before starting the job).
    pub fn enter(&self) -> std::io::Result<()> {
        move_self(&self.dir)
    }

    /// Moves the keeper back to its own cgroup (right after starting the job).
    pub fn leave(&self) -> std::io::Result<()> {
        move_self(&self.parent)
    }

    /// Kills every process in the cgroup (through the descriptor opened
    /// at creation: no `open` on the kill path).
    pub fn kill(&self) -> std::io::Result<()> {
        rustix::io::write(&self.kill, b"1")?;
        Ok(())
    }

    /// The pids in the cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Signals `pid` if (checked after its pidfd is open, so a recycled pid
    /// is never hit) it is still in this cgroup.
    pub fn signal_member(&self, pid: i32, sig: rustix::process::Signal) {
        let Some(p) = rustix::process::Pid::from_raw(pid) else {
            return;
        };
        let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) else {
            return;
        };
        if self.holds(pid) {
            let _ = rustix::process::pidfd_send_signal(&fd, sig);
        }
    }

    /// Whether `/proc/PID/cgroup` names this cgroup (v2) as `pid`'s.
    fn holds(&self, pid: i32) -> bool {
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
            c.lines()
                .any(|l| l.starts_with("0::") && l.ends_with(&name))
        })
    }

    /// Removes the (empty) cgroup; a cgroup with members stays.
    pub fn remove(&self) {
        remove_dir_when_released(&self.dir);
    }

    /// One `rmdir`, no retry: whether the directory is gone now (removed,
    /// or already gone). EBUSY (a just-reaped member still counted) leaves
    /// it for [`Self::remove`] at the end.
    pub fn try_remove(&self) -> bool {
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => true,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }
}

/// `rmdir` of an emptied cgroup, retried for a moment: the kernel may still
/// count a just-reaped process (EBUSY) for a few milliseconds.
fn remove_dir_when_released(dir: &Path) {
    for _ in 0..50 {
        match std::fs::remove_dir(dir) {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            _ => return,
        }
    }
}

/// Removes the job cgroup the keeper of agent `agent` (this process) may
/// have left behind (it was killed, or exited before the kernel released
/// its cgroup); run by the agent, whose cgroup the keeper's is. A cgroup
/// with members stays.
pub fn remove_left_by(agent: u32) {
    if let Ok(parent) = own_dir() {
        let dir = parent.join(name_for(agent));
        if dir.exists() {
            remove_dir_when_released(&dir);
        }
    }
}

/// The agent pid a job cgroup's name carries (`leaseagent-job-<pid>`).
fn agent_of(name: &str) -> Option<u32> {
    let pid = name.strip_prefix("leaseagent-job-")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

/// Removes the job cgroups of dead runs beside ours: a keeper killed (or
/// aborted) after its agent died leaves `leaseagent-job-<agent pid>`
/// behind, which nobody else removes. Run by the agent before it starts
/// its keeper. Only a cgroup whose agent pid is not alive (no
/// `/proc/<pid>`, seen from the agent's PID namespace) is tried, and only
/// an empty one goes (`rmdir` of a cgroup with members fails): another
/// live run's cgroup is never touched; a dead run's pid reused by some
/// other process only keeps its cgroup a while longer. Best effort.
pub fn remove_stale(me: u32) {
    let Ok(parent) = own_dir() else { return };
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(agent) = name.to_str().and_then(agent_of) else {
            continue;
        };
        if agent == me || Path::new(&format!("/proc/{agent}")).exists() {
            continue;
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_job_cgroups_name_gives_an_agent_pid() {
        assert_eq!(agent_of("leaseagent-job-4242"), Some(4242));
        for bad in [
            "leaseagent-job-",
            "leaseagent-job-0",
            "leaseagent-job-+12",
            "leaseagent-job-12x",
            "leaseagent-job-99999999999",
            "other-12",
        ] {
            assert_eq!(agent_of(bad), None, "{bad}");
        }
    }

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
35 22 0:30 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
40 35 0:33 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";

    #[test]
    fn mountinfo_gives_the_cgroup2_mount_and_strips_a_sub_tree_root() {
        assert_eq!(
            mount_dir_from_mountinfo(MOUNTINFO, "/system.slice/x.service"),
            Some(PathBuf::from(
                "/sys/fs/cgroup/unified/system.slice/x.service"
            ))
        );
        // A container's mount of its own sub-tree.
        let sub = "50 1 0:31 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            mount_dir_from_mountinfo(sub, "/docker/abc/job"),
            Some(PathBuf::from("/sys/fs/cgroup/job"))
        );
        assert_eq!(
            mount_dir_from_mountinfo("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", "/"),
            None
        );
    }

    #[test]
    fn the_usual_mount_point_agrees_with_mountinfo() {
        let cg = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let Some(path) = cg.lines().find_map(|l| l.strip_prefix("0::")) else {
            return; // no cgroup v2 on this host: nothing to compare
        };
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let slow = mount_dir_from_mountinfo(&info, path);
        assert!(
            slow.is_some(),
            "cgroup v2 in /proc/self/cgroup but not mounted"
        );
        if let Some(fast) = usual_mount_dir(path) {
            assert_eq!(Some(fast), slow);
        }
    }
}
