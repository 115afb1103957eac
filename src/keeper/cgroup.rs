//! A cgroup v2 of the job's own, when the keeper may make one.
//!
//! A cgroup holds every process started in it, whatever it does with its
//! parent, group or session, and `cgroup.kill` kills them all at once, with
//! no walk and no fork race. The keeper uses one by default wherever its
//! own cgroup is writable by it (delegated, e.g. systemd `Delegate=yes`, or
//! root, even in the root cgroup) and the new cgroup has `cgroup.kill`
//! (Linux 5.14+); otherwise the tree walk alone.
//!
//! How the job is born inside it without a race: the keeper moves itself
//! into `<own>/leaseagent-job-<pid>`, starts the job (which inherits the
//! cgroup), and moves itself back to its own cgroup before anything is
//! killed. A probe (in and back out once) comes first, so a keeper that
//! could not move back never starts a job in a cgroup it would kill itself
//! with.

use std::path::{Path, PathBuf};

/// The job's cgroup directory.
pub struct JobCgroup {
    dir: PathBuf,
    parent: PathBuf,
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
    let info = read("/proc/self/mountinfo")?;
    for line in info.lines() {
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
        return Ok(Path::new(mount).join(rel.trim_start_matches('/')));
    }
    Err(CgroupError::NotMounted)
}

fn move_self(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
}

impl JobCgroup {
    /// Makes the job's cgroup and checks the keeper can move in and out.
    /// `Err` says why there is none (the tree walk is used instead).
    pub fn create() -> Result<Self, CgroupError> {
        let parent = own_dir()?;
        let dir = parent.join(format!("leaseagent-job-{}", std::process::id()));
        if let Err(source) = std::fs::create_dir(&dir) {
            return Err(CgroupError::Create { dir, source });
        }
        // The root cgroup has no cgroup.kill of its own: ask the new one.
        if !dir.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&dir);
            return Err(CgroupError::NoKill { dir });
        }
        let cg = JobCgroup { dir, parent };
        if let Err(source) = cg.enter().and_then(|()| cg.leave()) {
            // Back where we were, or nowhere to kill ourselves from.
            let _ = cg.leave();
            cg.remove();
            return Err(CgroupError::Move {
                dir: cg.dir.clone(),
                source,
            });
        }
        Ok(cg)
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

    /// Kills every process in the cgroup.
    pub fn kill(&self) -> std::io::Result<()> {
        std::fs::write(self.dir.join("cgroup.kill"), "1")
    }

    /// The pids in the cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Removes the (empty) cgroup; a cgroup with members stays.
    pub fn remove(&self) {
        remove_dir_when_released(&self.dir);
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

/// Removes the job cgroup a keeper with pid `keeper` may have left behind
/// (it was killed, or exited before the kernel released its cgroup); run
/// by the agent, whose cgroup the keeper's is. A cgroup with members stays.
pub fn remove_left_by(keeper: u32) {
    if let Ok(parent) = own_dir() {
        let dir = parent.join(format!("leaseagent-job-{keeper}"));
        if dir.exists() {
            remove_dir_when_released(&dir);
        }
    }
}
