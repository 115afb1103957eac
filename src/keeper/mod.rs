//! The keeper: a tiny process between the agent and the job that makes
//! "no orphans" hold even when the agent is SIGKILLed.
//!
//! Why a process: a parent-death signal (`PR_SET_PDEATHSIG`) reaches only the
//! direct child, and the job's grandchildren would survive the agent. Nothing
//! in the kernel kills a process group when some unrelated process dies. So
//! the agent starts `leaseagent __keeper` (re-executing `/proc/self/exe`), and
//! the keeper starts the job in a new process group and watches a pipe from
//! the agent. The agent holds the only write end; when the agent dies for any
//! reason the kernel closes it, the keeper reads EOF and SIGKILLs the job's
//! whole group.
//!
//! ```text
//!   agent ──ctl pipe (agent writes; EOF = agent died)──▶ keeper ──fork/exec──▶ job (pgid = job pid)
//!   agent ◀──report pipe: "P pid" "E kind msg" "X exit n" "X signal n" "G"── keeper
//! ```
//!
//! Invariants and races it guards against:
//! - The keeper is the job's parent and a child subreaper, so every
//!   descendant of the job is reaped by it (no zombies left to an init that
//!   may not reap), and "no child left" (`ECHILD`) proves the whole tree is
//!   gone; it reports that as `G`.
//! - The job leader is reaped only by the keeper, and the keeper reports `X`
//!   only after reaping; the group id cannot be recycled while any member
//!   lives, and the agent stops signalling the group once it has seen `G`.
//! - The agent's end of the ctl pipe is close-on-exec, so neither the keeper
//!   nor the job holds a write end: EOF means exactly "the agent is gone".
//!   The keeper marks its own pipe ends close-on-exec before starting the
//!   job, so the job inherits neither.
//! - The keeper ignores (by handling) every signal the agent relays, so a
//!   Ctrl-C to the terminal's foreground group (agent + keeper) reaches the
//!   job only through the agent's relay: exactly once. Handled (not ignored)
//!   signals are reset to their defaults by `exec`, so the job starts clean.
//! - A normal end is `D` on the ctl pipe: the keeper exits without killing.

pub mod handle;

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{OwnedFd, RawFd};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::io::{FdFlags, fcntl_setfd};
use rustix::process::{Pid, Signal, WaitOptions, kill_process_group, set_child_subreaper};

/// The hidden first argument that selects keeper mode.
pub const KEEPER_ARG: &str = "__keeper";

/// Signals the agent relays; the keeper must not die of them.
pub const RELAYED: &[i32] = &[
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGQUIT,
    signal_hook::consts::SIGUSR1,
    signal_hook::consts::SIGUSR2,
];

/// How long the keeper keeps reaping after it killed the group on the agent's death.
const REAP_AFTER_KILL: Duration = Duration::from_secs(5);

/// Byte the agent sends for "done, exit without killing".
pub const DONE: u8 = b'D';

fn parse_fd(s: Option<&OsString>) -> Option<RawFd> {
    s?.to_str()?.parse().ok()
}

/// Runs the keeper: `__keeper CTL_FD REPORT_FD -- COMMAND [ARG...]`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let fds = (parse_fd(args.first()), parse_fd(args.get(1)));
    let (Some(ctl_fd), Some(report_fd)) = fds else {
        eprintln!("leaseagent: __keeper is internal to leaseagent");
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    let claimed = (
        crate::sys::fd::claim_inherited_fd(ctl_fd),
        crate::sys::fd::claim_inherited_fd(report_fd),
    );
    let (Ok(ctl), Ok(report)) = claimed else {
        eprintln!("leaseagent: keeper: control descriptors missing");
        return ExitCode::from(crate::exit::AGENT_FAILED);
    };
    let command: Vec<OsString> = args.iter().skip(3).cloned().collect();
    run(ctl, report, command)
}

fn run(ctl: OwnedFd, report: OwnedFd, command: Vec<OsString>) -> ExitCode {
    // Neither pipe end may reach the job.
    if fcntl_setfd(&ctl, FdFlags::CLOEXEC).is_err()
        || fcntl_setfd(&report, FdFlags::CLOEXEC).is_err()
    {
        return ExitCode::from(crate::exit::AGENT_FAILED);
    }
    let mut report = std::fs::File::from(report);
    for &sig in RELAYED {
        // Handled, not ignored: the disposition resets to default in the job.
        let _ = signal_hook::flag::register(sig, Arc::new(AtomicBool::new(false)));
    }
    // A session of our own (and so, with CONFIG_SCHED_AUTOGROUP, a CPU
    // scheduling group of our own): the job and everything it starts compete
    // for CPU as one entity against the agent, so a job that forks a hundred
    // busy processes cannot starve the heartbeat thread. It also takes the
    // job off the agent's controlling terminal: terminal signals reach it
    // only through the agent's relay, and it never gets SIGTTIN/SIGTTOU.
    let _ = rustix::process::setsid();
    // Orphaned descendants of the job are re-parented to us, so we reap them
    // and know when the whole tree is gone.
    let _ = set_child_subreaper(Some(rustix::process::getpid()));

    let Some((program, rest)) = command.split_first() else {
        let _ = writeln!(report, "E other no command");
        return ExitCode::SUCCESS;
    };
    let spawned = {
        use std::os::unix::process::CommandExt;
        Command::new(program).args(rest).process_group(0).spawn()
    };
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let kind = match e.kind() {
                std::io::ErrorKind::NotFound => "not_found",
                std::io::ErrorKind::PermissionDenied => "permission",
                _ => "other",
            };
            let _ = writeln!(report, "E {kind} {e}");
            return ExitCode::SUCCESS;
        }
    };
    let job_pid = child.id() as i32;
    // We reap through wait(2) below; the std handle is not used again.
    drop(child);
    let _ = writeln!(report, "P {job_pid}");

    let reaped_all = Arc::new(AtomicBool::new(false));
    {
        let reaped_all = reaped_all.clone();
        let spawned = std::thread::Builder::new()
            .name("keeper-ctl".into())
            .spawn(move || watch_agent(ctl, job_pid, &reaped_all));
        if spawned.is_err() {
            // Without the watcher there is no orphan protection: do not run.
            if let Some(pid) = Pid::from_raw(job_pid) {
                let _ = kill_process_group(pid, Signal::KILL);
            }
        }
    }

    let mut job_done = false;
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) => {
                if pid.as_raw_nonzero().get() == job_pid && !job_done {
                    job_done = true;
                    let at = crate::time::clock::BootInstant::now()
                        .since_boot()
                        .as_millis();
                    let line = match (status.exit_status(), status.terminating_signal()) {
                        (Some(code), _) => format!("X exit {code} {at}"),
                        (None, Some(sig)) => format!("X signal {sig} {at}"),
                        (None, None) => format!("X exit 255 {at}"),
                    };
                    let _ = writeln!(report, "{line}");
                }
            }
            Ok(None) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                // ECHILD: the job and every descendant are gone.
                if job_done {
                    reaped_all.store(true, Ordering::SeqCst);
                    let _ = writeln!(report, "G");
                    drop(report);
                    // The agent decides when we exit (ctl thread).
                    loop {
                        std::thread::park();
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Blocks on the ctl pipe: `D` means exit quietly; EOF means the agent died,
/// so the job's group is killed.
fn watch_agent(ctl: OwnedFd, job_pid: i32, reaped_all: &AtomicBool) -> ! {
    let mut ctl = std::fs::File::from(ctl);
    let mut buf = [0u8; 1];
    let done = loop {
        match ctl.read(&mut buf) {
            Ok(0) => break false,
            Ok(_) if buf[0] == DONE => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if !done {
        if let Some(pid) = Pid::from_raw(job_pid) {
            let _ = kill_process_group(pid, Signal::KILL);
        }
        // Keep reaping (the main thread does) so nothing is left a zombie.
        let until = Instant::now() + REAP_AFTER_KILL;
        while !reaped_all.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    std::process::exit(0)
}
