//! The keeper's descendants, found in `/proc`, and signalled one by one.
//!
//! A process group is not a tree: a job escapes it with `setsid`,
//! `setpgid` or a double fork. The keeper is a child subreaper, so every
//! descendant stays below it (an orphan re-parents to the keeper, not to
//! init); walking the parent links down from the keeper finds all of them,
//! whatever their group or session.
//!
//! The walk goes down from the root through `/proc/PID/task/TID/children`
//! (every thread's children), so it costs what the tree costs: a job of
//! ten processes on a host of ten thousand reads a few dozen small files,
//! and its duration fits inside the kill lead however busy the host is.
//! Only on a kernel without that file (`CONFIG_PROC_CHILDREN` off) does it
//! fall back to reading every `/proc/*/stat` on the host.
//! Each process is signalled as the walk finds it, before its own children
//! are read (a killed process forks no more, and its children are found
//! under it or, once it is gone, under the subreaper). A process may fork
//! while we walk, so killing repeats the walk until it finds nothing new
//! ([`kill_all`]); SIGKILL stops a process from forking again, so the
//! repetition ends. With a PID namespace or a cgroup of the job's own the
//! keeper needs no walk to kill (`kill(-1)` from the namespace's init,
//! `cgroup.kill`); the walk is the fallback's, and the agent's backstop.
//!
//! When the keeper may open no descriptor at all (`RLIMIT_NOFILE` lowered
//! to 0 by a same-uid job: every `open` fails with EMFILE), the walk finds
//! nothing; [`kill_own_children`] then kills the keeper's own children
//! through a descriptor opened at start, one generation a round.
//!
//! Races it guards against: a pid read from `/proc` may die and be recycled
//! before the signal goes out. Each process is opened as a pidfd first and
//! its parent is checked *after* the open: if it still has a parent inside
//! the tree (or the keeper), the pidfd is that process and the signal cannot
//! reach a stranger. Without pidfd support (kernels before 5.3) the same
//! check is made just before `kill`, which leaves only a microsecond window.

use std::collections::{HashMap, HashSet};

use rustix::process::{Pid, PidfdFlags, Signal};

/// One process as `/proc/PID/stat` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
}

/// Parses `/proc/PID/stat`: `pid (comm) state ppid pgrp ...`; `comm` may
/// contain spaces and parentheses, so fields are counted after the last `)`.
fn parse_stat(pid: i32, text: &str) -> Option<Proc> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let _state = f.next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    Some(Proc { pid, ppid, pgrp })
}

fn read_proc(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Every process's parent and group, now.
fn snapshot() -> HashMap<i32, Proc> {
    let mut all = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return all;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(p) = read_proc(pid) {
            all.insert(pid, p);
        }
    }
    all
}

/// Whether this process has no child at all, running, stopped or zombie.
/// Then it has no descendant either: a grandchild whose parent died is
/// re-parented to us (we are the subreaper), so it would be our child.
fn has_no_children() -> bool {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    let opts = WaitIdOptions::NOHANG
        | WaitIdOptions::NOWAIT
        | WaitIdOptions::EXITED
        | WaitIdOptions::STOPPED
        | WaitIdOptions::CONTINUED;
    matches!(waitid(WaitId::All, opts), Err(rustix::io::Errno::CHILD))
}

/// The children of `pid` (of all its threads), from
/// `/proc/PID/task/*/children`; `None` when the kernel has no such file.
fn children_of(pid: i32) -> Option<Vec<i32>> {
    children_in(&format!("/proc/{pid}/task"))
}

/// How many children this process has, running or not, from
/// `/proc/self/task/*/children`; where the kernel has no such files, from
/// every process's parent in `/proc`. Counted, not named: `/proc` may
/// be mounted for another PID namespace than this process's own, whose
/// pids this process does not know.
pub fn count_children_of_self() -> Option<usize> {
    if let Some(c) = children_in("/proc/self/task") {
        return Some(c.len());
    }
    // `/proc/self` names this process in the mount's namespace.
    let me: i32 = std::fs::read_link("/proc/self")
        .ok()?
        .to_str()?
        .parse()
        .ok()?;
    let dir = std::fs::read_dir("/proc").ok()?;
    Some(
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| read_proc(pid).is_some_and(|p| p.ppid == me))
            .count(),
    )
}

fn children_in(task_dir: &str) -> Option<Vec<i32>> {
    let Ok(tasks) = std::fs::read_dir(task_dir) else {
        // Gone already: no children.
        return Some(Vec::new());
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let path = t.path().join("children");
        match std::fs::read_to_string(&path) {
            Ok(text) => out.extend(
                text.split_whitespace()
                    .filter_map(|n| n.parse::<i32>().ok()),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && t.path().exists() => {
                return None;
            }
            Err(_) => {}
        }
    }
    Some(out)
}

/// The descendants of `root` by the children links, parents before
/// children; `None` when the kernel has no children files.
fn descendants_by_children(root: i32) -> Option<Vec<Proc>> {
    let mut out = Vec::new();
    let mut queue = vec![root];
    let mut seen = HashSet::from([root]);
    while let Some(parent) = queue.pop() {
        for c in children_of(parent)? {
            if !seen.insert(c) {
                continue;
            }
            // Gone between the two reads: nothing to signal.
            if let Some(p) = read_proc(c) {
                out.push(p);
                queue.push(c);
            }
        }
    }
    Some(out)
}

/// The descendants of `root` (not `root` itself), parents before children.
/// For ourselves with no child left, that is known without reading `/proc`
/// (the usual end of a run).
pub fn descendants(root: i32) -> Vec<Proc> {
    if root == rustix::process::getpid().as_raw_nonzero().get() && has_no_children() {
        return Vec::new();
    }
    if let Some(d) = descendants_by_children(root) {
        return d;
    }
    let all = snapshot();
    let mut children: HashMap<i32, Vec<Proc>> = HashMap::new();
    for p in all.values() {
        children.entry(p.ppid).or_default().push(*p);
    }
    let mut out = Vec::new();
    let mut queue = vec![root];
    let mut seen = HashSet::from([root]);
    while let Some(parent) = queue.pop() {
        for c in children.get(&parent).into_iter().flatten() {
            if seen.insert(c.pid) {
                out.push(*c);
                queue.push(c.pid);
            }
        }
    }
    out
}

/// Sends `sig` to `p` if it is still a descendant: its parent (checked
/// after the pidfd is open) is one of `parents`. Returns whether it was
/// signalled.
fn signal_checked(p: &Proc, parents: &HashSet<i32>, sig: Signal) -> bool {
    let Some(pid) = Pid::from_raw(p.pid) else {
        return false;
    };
    let still_ours = || read_proc(p.pid).is_some_and(|now| parents.contains(&now.ppid));
    match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => still_ours() && rustix::process::pidfd_send_signal(&fd, sig).is_ok(),
        Err(rustix::io::Errno::NOSYS) => {
            still_ours() && rustix::process::kill_process(pid, sig).is_ok()
        }
        Err(_) => false,
    }
}

/// Signals `leader`, a child of the caller that the caller has not reaped,
/// at once: until it is reaped its pid cannot be reused, so no check (and
/// no walk of `/proc`, which takes about a millisecond) stands between
/// the decision and the job's own process getting the signal.
pub fn signal_leader(leader: i32, sig: Signal) -> bool {
    Pid::from_raw(leader).is_some_and(|pid| rustix::process::kill_process(pid, sig).is_ok())
}

/// Walks the descendants of `root` from the top down and hands each one to
/// `visit` the moment it is found, with the pids found so far (its parent
/// among them, or `root`): a process is signalled before its children are
/// read, not after the whole tree was (a walk of 2,000 processes took tens
/// of milliseconds, all of it before the first SIGKILL). `visit` returns
/// whether to descend into the process's children. Without children files
/// (`CONFIG_PROC_CHILDREN` off), one snapshot of `/proc` instead.
fn walk(root: i32, mut visit: impl FnMut(&Proc, &HashSet<i32>) -> bool) {
    let mut seen = HashSet::from([root]);
    let mut queue = std::collections::VecDeque::from([root]);
    while let Some(parent) = queue.pop_front() {
        let Some(children) = children_of(parent) else {
            for p in descendants(root) {
                if seen.insert(p.pid) {
                    visit(&p, &seen);
                }
            }
            return;
        };
        for c in children {
            if !seen.insert(c) {
                continue;
            }
            // Gone between the two reads: nothing to signal; its children
            // went to the subreaper, where a later walk finds them.
            if let Some(p) = read_proc(c) {
                if visit(&p, &seen) {
                    queue.push_back(c);
                }
            }
        }
    }
}

/// Signals every descendant of `root` once (one walk, each as it is found);
/// returns the pids signalled. `only_group`: only members of that process
/// group. `leader`: an unreaped child of `root`, signalled first and
/// directly ([`signal_leader`]), then left out of the walk.
pub fn signal_all(
    root: i32,
    sig: Signal,
    only_group: Option<i32>,
    leader: Option<i32>,
) -> Vec<i32> {
    let mut done = Vec::new();
    if let Some(l) = leader {
        if signal_leader(l, sig) {
            done.push(l);
        }
    }
    walk(root, |p, parents| {
        let skip = only_group.is_some_and(|g| g != p.pgrp) || leader == Some(p.pid);
        if !skip && signal_checked(p, parents, sig) {
            done.push(p.pid);
        }
        true
    });
    done
}

/// SIGKILLs every descendant of `root`, each as the walk finds it, and
/// walks again until a walk finds no process it has not already killed (a
/// process may fork while we walk; once killed it cannot fork again).
/// Bounded: at most 64 walks. `leader`: an unreaped child of `root`,
/// killed first ([`signal_leader`]). Returns the pids killed.
pub fn kill_all(root: i32, leader: Option<i32>) -> HashSet<i32> {
    kill_all_except(root, leader, &[])
}

/// [`kill_all`], but `spare` (processes of the tree, e.g. the keeper when
/// the agent walks from itself, and its scribe) are walked through, never
/// signalled.
pub fn kill_all_except(root: i32, leader: Option<i32>, spare: &[i32]) -> HashSet<i32> {
    let mut killed = HashSet::new();
    killed.extend(spare.iter().copied());
    if let Some(l) = leader {
        if signal_leader(l, Signal::KILL) {
            killed.insert(l);
        }
    }
    for _ in 0..64 {
        let mut new = 0;
        walk(root, |p, parents| {
            if !killed.contains(&p.pid) {
                new += 1;
                if signal_checked(p, parents, Signal::KILL) {
                    killed.insert(p.pid);
                }
            }
            true
        });
        if new == 0 {
            break;
        }
    }
    for s in spare {
        killed.remove(s);
    }
    killed
}

/// The direct children of this (single-threaded) process, read again
/// from the start through `children`, an open `/proc/thread-self/children`:
/// no `open` needed, so it works when `RLIMIT_NOFILE` forbids every new
/// descriptor.
pub fn own_children(children: &std::os::fd::OwnedFd) -> Vec<i32> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = rustix::io::pread(children, &mut buf, 0).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect()
}

/// SIGKILL to each direct child of this process, by pid: they are our
/// unreaped children, so no pid of theirs can have been reused. The kill
/// path that needs no new descriptor: each round takes one generation (a
/// killed child's children re-parent to us, the subreaper, and are the
/// next round's).
pub fn kill_own_children(children: &std::os::fd::OwnedFd) {
    for pid in own_children(children) {
        signal_leader(pid, Signal::KILL);
    }
}

/// Why `pid`, SIGKILLed, is still there: it may not be signalled, it is in
/// uninterruptible sleep, or its cgroup is frozen.
pub fn why_alive(pid: i32) -> crate::keeper::protocol::Survival {
    use crate::keeper::protocol::Survival;
    if let Some(p) = Pid::from_raw(pid) {
        if rustix::process::test_kill_process(p) == Err(rustix::io::Errno::PERM) {
            return Survival::CannotSignal;
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    if in_frozen_cgroup(pid) {
        return Survival::Frozen;
    }
    if state == Some("D") {
        return Survival::Uninterruptible;
    }
    Survival::Unknown
}

/// Whether `pid`'s cgroup v2 (or v1 freezer) says it is frozen.
fn in_frozen_cgroup(pid: i32) -> bool {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in cg.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        for m in mounts.lines() {
            let Some((left, right)) = m.split_once(" - ") else {
                continue;
            };
            let mut r = right.split_whitespace();
            let fstype = r.next();
            let opts = r.nth(1).unwrap_or("");
            let mount = left.split_whitespace().nth(4).unwrap_or("");
            let dir = format!("{mount}{path}");
            let frozen = match (fstype, ctrl) {
                (Some("cgroup2"), "") => std::fs::read_to_string(format!("{dir}/cgroup.events"))
                    .is_ok_and(|e| e.lines().any(|l| l == "frozen 1")),
                (Some("cgroup"), "freezer") if opts.split(',').any(|o| o == "freezer") => {
                    std::fs::read_to_string(format!("{dir}/freezer.state"))
                        .is_ok_and(|s| s.trim() != "THAWED")
                }
                _ => false,
            };
            if frozen {
                return true;
            }
        }
    }
    false
}

/// A process's command line for a log line (arguments joined by spaces,
/// cut at 200 bytes), or its `comm` if the command line is empty.
pub fn command_of(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut s: String = String::from_utf8_lossy(&raw)
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if s.is_empty() {
        s = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| format!("[{}]", c.trim_end()))
            .unwrap_or_default();
    }
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let p = parse_stat(12, "12 (a) b (c)) S 7 12 12 0 -1 4194560").unwrap();
        assert_eq!(
            p,
            Proc {
                pid: 12,
                ppid: 7,
                pgrp: 12
            }
        );
        assert_eq!(parse_stat(1, "garbage"), None);
    }

    #[test]
    fn finds_a_grandchild_in_another_session() {
        let me = std::process::id() as i32;
        let mut direct = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 30 & wait"])
            .spawn()
            .unwrap();
        let found = (0..400).find_map(|_| {
            let d = descendants(me);
            let sleeper = d
                .iter()
                .find(|p| p.ppid != me && command_of(p.pid).starts_with("sleep"));
            if sleeper.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            sleeper.copied()
        });
        let killed = kill_all(direct.id() as i32, None);
        let _ = direct.kill();
        let _ = direct.wait();
        let sleeper = found.expect("grandchild in its own session not found");
        assert!(killed.contains(&sleeper.pid));
        assert_ne!(sleeper.pgrp, me);
    }
}
