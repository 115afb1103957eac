//! Test support: a cgroup with one resource limit (pids or memory), on
//! whichever hierarchy the machine has the controller on: cgroup v2 (the
//! controller enabled in the root's `cgroup.subtree_control`) or a v1
//! hierarchy of its own. Needs root; a machine with neither fails the test.
//!
//! A process joins with [`Cgroup::enter_then_exec`] (a `sh` that writes its
//! pid, then execs the real command, so nothing outside is ever inside).
//! On drop, everything still in the group is SIGKILLed and the group is
//! removed.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Cgroup {
    pub dir: PathBuf,
    v2: bool,
}

/// `(mount point, is v2)` of the hierarchy that has `controller`.
fn hierarchy(controller: &str) -> (PathBuf, bool) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut v2_root = None;
    for l in info.lines() {
        let Some((left, right)) = l.split_once(" - ") else {
            continue;
        };
        let mut r = right.split_whitespace();
        let (fstype, _src, opts) = (r.next(), r.next(), r.next().unwrap_or(""));
        let Some(mount) = left.split_whitespace().nth(4).map(PathBuf::from) else {
            continue;
        };
        match fstype {
            Some("cgroup") if opts.split(',').any(|o| o == controller) => return (mount, false),
            Some("cgroup2") => v2_root = Some(mount),
            _ => {}
        }
    }
    let root =
        v2_root.unwrap_or_else(|| panic!("no cgroup hierarchy with the {controller} controller"));
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    assert!(
        controllers.split_whitespace().any(|c| c == controller),
        "cgroup v2 at {} has no {controller} controller and no v1 hierarchy has it",
        root.display()
    );
    std::fs::write(
        root.join("cgroup.subtree_control"),
        format!("+{controller}"),
    )
    .unwrap_or_else(|e| {
        panic!(
            "enable {controller} in {}: {e} (needs root)",
            root.display()
        )
    });
    (root, true)
}

impl Cgroup {
    fn new(controller: &str, name: &str) -> Cgroup {
        let (root, v2) = hierarchy(controller);
        let dir = root.join(format!("leaseagent-test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("create {} (needs root): {e}", dir.display()));
        Cgroup { dir, v2 }
    }

    /// A group that holds at most `max` tasks (processes and threads).
    pub fn pids(name: &str, max: u32) -> Cgroup {
        let cg = Cgroup::new("pids", name);
        cg.write("pids.max", &max.to_string());
        cg
    }

    /// A group whose memory use is capped at `bytes`; no swap.
    pub fn memory(name: &str, bytes: u64) -> Cgroup {
        let cg = Cgroup::new("memory", name);
        if cg.v2 {
            cg.write("memory.max", &bytes.to_string());
            cg.write("memory.swap.max", "0");
        } else {
            cg.write("memory.limit_in_bytes", &bytes.to_string());
            let _ = std::fs::write(cg.dir.join("memory.swappiness"), "0");
        }
        cg
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.dir.join(file), value)
            .unwrap_or_else(|e| panic!("write {value} to {}/{file}: {e}", self.dir.display()));
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// A key's value in a flat keyed file (`memory.events`, `pids.events`,
    /// v1's `memory.oom_control`).
    fn keyed(&self, file: &str, key: &str) -> u64 {
        self.read(file)
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0)
    }

    /// How many times a fork was refused for the limit.
    pub fn pids_refused(&self) -> u64 {
        self.keyed("pids.events", "max")
    }

    /// How many processes the OOM killer killed in the group.
    pub fn oom_kills(&self) -> u64 {
        if self.v2 {
            self.keyed("memory.events", "oom_kill")
        } else {
            self.keyed("memory.oom_control", "oom_kill")
        }
    }

    /// Pids in the group now.
    pub fn procs(&self) -> Vec<i32> {
        self.read("cgroup.procs")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// `c` run inside the group: a `sh` joins it, then execs `c`'s program
    /// with `c`'s arguments and environment.
    pub fn enter_then_exec(&self, inner: &Command) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
                self.dir.display()
            ))
            .arg(inner.get_program())
            .args(inner.get_args());
        for (k, v) in inner.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let procs = self.procs();
            if procs.is_empty() || Instant::now() > until {
                break;
            }
            for p in procs {
                super::kill(p, 9);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
