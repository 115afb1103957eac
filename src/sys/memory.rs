//! Memory pressure: the command, not the agent or its keeper, is what the
//! OOM killer takes, and the agent's and keeper's pages stay in memory.
//!
//! - **OOM choice.** The command's `oom_score_adj` is raised by
//!   [`JOB_OOM_RAISE`] over what it inherits (at least 0), written in the
//!   child before `exec` ([`super::priority::oom_score_adj_on_exec`]), which
//!   any user may do. The agent and the keeper each lower their own to
//!   [`AGENT_OOM_SCORE_ADJ`] where permitted (CAP_SYS_RESOURCE, i.e. root;
//!   elsewhere the write is refused and the value stays); the keeper is
//!   started first, so it does not wait for the agent's. Not -1000: an agent that leaked would then take down
//!   everything else on the host first. The command inherits at least 0 as
//!   its base, so its own children are never protected by the agent's
//!   value.
//! - **No page faults under pressure.** `mlockall(MCL_CURRENT | MCL_FUTURE |
//!   MCL_ONFAULT)`: every page the agent (or keeper) has touched stays
//!   resident, so a renewal never waits for one to come back from swap or
//!   from the file it maps. ONFAULT: pages are locked as they are touched,
//!   not all at once, so reserved but unused thread stacks and heap do not
//!   become resident and the agent's RSS stays what it uses.
//!   Locking is done only where it cannot backfire: with CAP_IPC_LOCK or an
//!   unlimited `RLIMIT_MEMLOCK`. Under a finite limit `MCL_FUTURE` makes any
//!   later mapping that crosses the limit fail, and an allocation failure
//!   aborts the process, which is exactly what this module is there to
//!   prevent; the agent then says once that it runs unlocked and why.

/// The agent's (and so the keeper's) `oom_score_adj` where it may lower it.
pub const AGENT_OOM_SCORE_ADJ: i16 = -900;
/// How much more than its base the command's `oom_score_adj` is.
pub const JOB_OOM_RAISE: i16 = 500;

const OOM_FILE: &str = "/proc/self/oom_score_adj";

/// This process's `oom_score_adj`, if readable.
pub fn oom_score_adj() -> Option<i16> {
    std::fs::read_to_string(OOM_FILE).ok()?.trim().parse().ok()
}

/// The value the command gets: [`JOB_OOM_RAISE`] over the keeper's own
/// (counted as 0 when lower), capped at the kernel's 1000.
pub fn job_oom_score_adj() -> i16 {
    let base = oom_score_adj().unwrap_or(0).max(0);
    (base + JOB_OOM_RAISE).min(1000)
}

/// What [`protect`] managed, for one log line.
#[derive(Debug)]
pub struct Protection {
    pub oom_score_adj: Option<i16>,
    /// `Err(why)`: memory not locked.
    pub locked: Result<(), String>,
}

/// Lowers this process's `oom_score_adj` (the agent's and the keeper's) where
/// permitted and locks its memory where that is safe (module doc).
pub fn protect() -> Protection {
    if oom_score_adj().is_some_and(|v| v > AGENT_OOM_SCORE_ADJ) {
        // Refused without CAP_SYS_RESOURCE: the value stays.
        let _ = std::fs::write(OOM_FILE, AGENT_OOM_SCORE_ADJ.to_string());
    }
    Protection {
        oom_score_adj: oom_score_adj(),
        locked: lock(),
    }
}

fn lock() -> Result<(), String> {
    use rustix::mm::MlockAllFlags;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    if !has_ipc_lock() && limit.current.is_some() {
        let kib = limit.current.unwrap_or(0) / 1024;
        return Err(format!(
            "RLIMIT_MEMLOCK is {kib} KiB and there is no CAP_IPC_LOCK (systemd: LimitMEMLOCK=infinity)"
        ));
    }
    rustix::mm::mlockall(MlockAllFlags::CURRENT | MlockAllFlags::FUTURE | MlockAllFlags::ONFAULT)
        .map_err(|e| format!("mlockall: {e}"))
}

/// Whether CAP_IPC_LOCK is in this process's effective set (`capget`: one
/// system call, where `/proc/self/status` is a file to render and parse).
fn has_ipc_lock() -> bool {
    rustix::thread::capabilities(None).is_ok_and(|caps| {
        caps.effective
            .contains(rustix::thread::CapabilitySet::IPC_LOCK)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capget_agrees_with_proc_status_on_cap_ipc_lock() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap();
        assert_eq!(has_ipc_lock(), eff & (1 << 14) != 0);
    }

    #[test]
    fn the_job_is_raised_over_a_base_of_at_least_zero() {
        let v = job_oom_score_adj();
        let own = oom_score_adj().unwrap_or(0).max(0);
        assert_eq!(v, (own + JOB_OOM_RAISE).min(1000));
        assert!(v >= JOB_OOM_RAISE.min(1000));
    }
}
