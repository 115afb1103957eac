//! How the keeper starts the job: in a process group of its own, inside the
//! job's cgroup when there is one, reaped through `waitpid` (never through
//! a std handle).
//!
//! The strategies, tried in this order ([`spawn_job`]):
//! 1. **Born in the cgroup** ([`spawn_into`]): `clone3(CLONE_INTO_CGROUP)`
//!    (Linux 5.7+), so no process is ever moved and the keeper is never
//!    inside the job's cgroup.
//! 2. **By moving** ([`spawn_by_moving`]): where the kernel refuses that
//!    clone, the keeper moves itself into the cgroup, starts the job there
//!    and moves back out; a probe (in and back out once) comes first, so a
//!    keeper that could not move back never starts a job in a cgroup it
//!    would kill itself with.
//! 3. **Plain** ([`spawn_plain`]): no cgroup of the job's own (none could be
//!    made, or moving is not allowed): the tree walk alone stops it.
//!
//! A failure to start becomes the [`Report::SpawnFailed`] the agent maps to
//! 127 (not found), 126 (cannot execute) or 125 (the keeper's own trouble).

use std::ffi::OsString;
use std::process::Command;

use crate::keeper::cgroup;
use crate::keeper::os::Reporter;
use crate::keeper::protocol::{Containment, ENV_CONTAINMENT, Report, SpawnFailure};
use crate::keeper::tree;

/// What the job is started with.
#[derive(Clone, Copy)]
pub(super) struct Job<'a> {
    pub program: &'a OsString,
    /// The file `program` names along `PATH`, when found beforehand.
    pub resolved: Option<&'a std::path::Path>,
    pub rest: &'a [OsString],
    /// Set over the keeper's environment: the grant's variables.
    pub env: &'a [(OsString, OsString)],
    pub oom_score_adj: i16,
    /// `--user`, the child's own steps (`sys::spawn::ChildSteps`).
    pub steps: &'a crate::sys::spawn::ChildSteps,
}

/// `job` with `LEASE_CONTAINMENT` set to what will hold it (over any value
/// the grant's variables or the agent's environment had).
fn contained<'a>(
    job: &Job<'a>,
    env: &'a mut Vec<(OsString, OsString)>,
    containment: Containment,
) -> Job<'a> {
    env.clear();
    env.extend(
        job.env
            .iter()
            .filter(|(k, _)| k != ENV_CONTAINMENT)
            .cloned(),
    );
    env.push((ENV_CONTAINMENT.into(), containment.as_str().into()));
    Job { env, ..*job }
}

/// Starts the job in a process group of its own, inside its cgroup if any
/// (said in a report once it runs there); returns its pid and what holds
/// it (the keeper's PID namespace when the keeper is its PID 1, the cgroup,
/// or the tree walk alone), which the job finds in `LEASE_CONTAINMENT`.
/// We reap through `waitpid`.
pub(super) fn spawn_job(
    out: &mut Reporter,
    job: &Job<'_>,
    cgroup: &mut Option<cgroup::JobCgroup>,
) -> Result<(i32, Containment), Report> {
    let pidns = rustix::process::getpid().as_raw_nonzero().get() == 1;
    let held = |in_cgroup: bool| match (pidns, in_cgroup) {
        (true, _) => Containment::Pidns,
        (false, true) => Containment::Cgroup,
        (false, false) => Containment::Tree,
    };
    let mut env = Vec::new();
    let mut how = String::new();
    let spawned = match cgroup.as_ref() {
        Some(cg) => match spawn_into(cg, &contained(job, &mut env, held(true))) {
            Ok(result) => result,
            // The kernel cannot clone into a cgroup: move there instead.
            Err(refused) => match cg.probe_moves() {
                Ok(()) => {
                    how = format!(" (moved there: {refused})");
                    spawn_by_moving(cg, &contained(job, &mut env, held(true)))
                }
                Err(_) => {
                    *cgroup = None;
                    spawn_plain(&contained(job, &mut env, held(false)))
                }
            },
        },
        None => spawn_plain(&contained(job, &mut env, held(false))),
    };
    match spawned {
        Ok(pid) => {
            if let Some(cg) = cgroup.as_ref() {
                out.send(&Report::Info(format!(
                    "the job runs in cgroup {}{how}; stops use cgroup.kill{}",
                    cg.dir().display(),
                    if pidns {
                        " and the PID namespace"
                    } else {
                        " and the process tree"
                    }
                )));
            }
            Ok((pid, held(cgroup.is_some())))
        }
        Err(e) => {
            if let Some(cg) = cgroup.take() {
                cg.remove();
            }
            // Kind `Other` (exit 125): the agent's trouble, not the command's.
            if let Some(message) = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<SwitchFailed>())
            {
                return Err(Report::SpawnFailed {
                    kind: SpawnFailure::Other,
                    message: message.0.clone(),
                });
            }
            let kind = match e.kind() {
                std::io::ErrorKind::NotFound => SpawnFailure::NotFound,
                std::io::ErrorKind::PermissionDenied => SpawnFailure::Permission,
                _ => SpawnFailure::Other,
            };
            Err(Report::SpawnFailed {
                kind,
                message: e.to_string(),
            })
        }
    }
}

/// A child that could not become `--user`'s ids (carried inside the
/// `io::Error` of a spawn, so the report says so, not "cannot execute").
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SwitchFailed(String);

/// The job born in its cgroup (`clone3(CLONE_INTO_CGROUP)`). `Err`: the
/// kernel refused the clone (or the directory cannot be opened); nothing
/// was started.
fn spawn_into(cg: &cgroup::JobCgroup, job: &Job<'_>) -> Result<std::io::Result<i32>, String> {
    use std::os::fd::AsFd;
    let dir = cg
        .open()
        .map_err(|e| format!("cannot open {}: {e}", cg.dir().display()))?;
    match crate::sys::spawn::spawn_in_cgroup(
        job.program,
        job.resolved,
        job.rest,
        job.env,
        dir.as_fd(),
        job.oom_score_adj,
        job.steps,
    ) {
        Ok(pid) => Ok(Ok(pid)),
        Err(crate::sys::spawn::Failure::Exec(e)) => Ok(Err(e)),
        Err(crate::sys::spawn::Failure::Switch { step, error }) => {
            Ok(Err(std::io::Error::other(SwitchFailed(format!(
                "keeper: cannot switch the command to --user's ids ({}): {error}",
                step.describe()
            )))))
        }
        Err(crate::sys::spawn::Failure::Clone(e)) => Err(format!("clone3 into it refused: {e}")),
    }
}

/// The fallback before Linux 5.7: the keeper moves into the job's cgroup,
/// starts the job there, and moves back out.
fn spawn_by_moving(cg: &cgroup::JobCgroup, job: &Job<'_>) -> std::io::Result<i32> {
    // Kind `Other`: not the command's problem (exit 126/127 would say it was).
    cg.enter().map_err(|e| {
        std::io::Error::other(format!("keeper: cannot enter the job's cgroup: {e}"))
    })?;
    let spawned = spawn_plain(job);
    if let Err(e) = cg.leave() {
        // We are inside the job's cgroup: cgroup.kill would kill us too.
        if spawned.is_ok() {
            tree::kill_all(rustix::process::getpid().as_raw_nonzero().get(), None);
        }
        return Err(std::io::Error::other(format!(
            "keeper: cannot leave the job's cgroup: {e}"
        )));
    }
    spawned
}

/// The job started by std, in a process group of its own.
fn spawn_plain(job: &Job<'_>) -> std::io::Result<i32> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(job.program);
    cmd.args(job.rest)
        .envs(job.env.iter().cloned())
        .process_group(0);
    crate::sys::priority::oom_score_adj_on_exec(&mut cmd, job.oom_score_adj);
    job.steps.clone().on_exec(&mut cmd);
    // The std handle is dropped: we reap through `waitpid`.
    cmd.spawn().map(|child| child.id() as i32)
}
