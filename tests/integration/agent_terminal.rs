//! The job as a person at a terminal expects it: clean signal state, and
//! the agent's terminal as its controlling terminal when stdin is one.
//!
//! - signals: the job starts with no signal ignored and none blocked, even
//!   when the agent itself was started with some ignored and blocked (a
//!   parent that used glibc's `posix_spawn` leaves its internal 32 and 33
//!   ignored; `nohup` ignores SIGHUP), in the PID namespace and without it;
//! - terminal: under a real interactive `bash` on a pseudo-terminal, a job
//!   that opens `/dev/tty` writes to and reads from it (the prompt of
//!   `ssh`, `sudo`, `git`), in both containment modes; and with stdin not a
//!   terminal, `/dev/tty` is not the job's (it has a session of its own).

use crate::support;

use std::os::unix::process::CommandExt;
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(30);

/// The `SigIgn:` or `SigBlk:` mask of a `/proc/PID/status` text.
fn mask(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    u64::from_str_radix(line[field.len()..].trim(), 16).unwrap()
}

#[test]
fn the_job_starts_with_no_signal_ignored_or_blocked() {
    let fake = FakeAuthority::start();
    for flags in [&[][..], &["--no-pid-namespace"][..]] {
        let mut c = agent_in_pidns(&fake.url(), "sigmask");
        // The agent started as a glibc `posix_spawn` or `nohup` parent
        // leaves it: 32, 33, SIGHUP and SIGUSR1 ignored, SIGRTMIN+5 and
        // SIGUSR2 blocked.
        // SAFETY (test): raw system calls only, between fork and exec.
        unsafe {
            c.pre_exec(|| {
                #[repr(C)]
                struct Act {
                    handler: usize,
                    flags: u64,
                    restorer: usize,
                    mask: u64,
                }
                let ign = Act {
                    handler: 1, // SIG_IGN
                    flags: 0,
                    restorer: 0,
                    mask: 0,
                };
                for sig in [1, 10, 32, 33] {
                    libc::syscall(
                        libc::SYS_rt_sigaction,
                        sig,
                        &ign,
                        std::ptr::null_mut::<Act>(),
                        8usize,
                    );
                }
                let block: u64 = (1 << (12 - 1)) | (1 << (39 - 1));
                libc::syscall(
                    libc::SYS_rt_sigprocmask,
                    libc::SIG_BLOCK,
                    &block,
                    std::ptr::null_mut::<u64>(),
                    8usize,
                );
                Ok(())
            });
        }
        // The job itself reads its own status: no shell in between to
        // change what it inherited.
        c.args(flags).args(["--", "cat", "/proc/self/status"]);
        let out = run_agent(c, T);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {}", out.stderr);
        assert_eq!(
            mask(&out.stdout, "SigIgn:"),
            0,
            "{flags:?}: the job starts with signals ignored: {}",
            out.stdout
        );
        assert_eq!(
            mask(&out.stdout, "SigBlk:"),
            0,
            "{flags:?}: the job starts with signals blocked: {}",
            out.stdout
        );
    }
}
