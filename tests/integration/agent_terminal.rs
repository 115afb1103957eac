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
//!   terminal, or the agent started by a script (leading no process group
//!   of its own), `/dev/tty` is not the job's (it has a session of its
//!   own);
//! - Ctrl-Z: the shell's prompt back, `jobs` Stopped, the job paused and
//!   the lease renewed past a ttl, `fg` resumes it with the terminal, and
//!   the exit code is the job's;
//! - the agent SIGKILLed while its job reads the terminal: the job's tree
//!   gone, the terminal the front's group's once the front has exited
//!   (with the shell held stopped), then the shell's, which reports 137
//!   and runs the next command, reading from the terminal.

use crate::support;

use std::os::unix::process::CommandExt;
use std::process::Command;
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

// ------------------------------------------------------------ the terminal

/// An interactive `bash` on a pseudo-terminal of its own (its session's
/// controlling terminal), driven as a person would: keys in, screen out.
struct Pty {
    master: std::fs::File,
    bash: std::process::Child,
    /// Everything read so far, and how much of it `expect` consumed.
    screen: String,
    seen: usize,
}

impl Pty {
    fn bash() -> Pty {
        use std::os::fd::FromRawFd;
        // SAFETY (test): the standard openpt sequence on a descriptor we
        // own; ptsname_r writes into a live buffer of the size given.
        let (master, slave) = unsafe {
            let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
            assert_eq!(libc::grantpt(m), 0);
            assert_eq!(libc::unlockpt(m), 0);
            let mut name = [0 as libc::c_char; 128];
            assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
            let s = libc::open(
                name.as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            );
            assert!(s >= 0, "open the pty's slave");
            (std::fs::File::from_raw_fd(m), std::fs::File::from_raw_fd(s))
        };
        let mut c = std::process::Command::new("bash");
        c.args(["--norc", "--noprofile", "-i"])
            .env("PS1", "PROMPT$ ")
            .env("TERM", "dumb")
            .env_remove("PROMPT_COMMAND")
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave);
        // SAFETY (test): setsid and the TIOCSCTTY ioctl only, between fork
        // and exec: bash's session, the pty its controlling terminal.
        unsafe {
            c.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let bash = c
            .spawn()
            .expect("bash is installed (the terminal tests drive it)");
        let mut pty = Pty {
            master,
            bash,
            screen: String::new(),
            seen: 0,
        };
        pty.expect("PROMPT$ ");
        // The strictest terminal: a background group's writes raise
        // SIGTTOU (the agent logs from one while the job has the terminal).
        pty.send("stty tostop; echo \"tostop-$((6*7))\"\n");
        pty.expect("tostop-42");
        pty
    }

    /// Types `keys`.
    fn send(&mut self, keys: &str) {
        use std::io::Write;
        self.master.write_all(keys.as_bytes()).unwrap();
    }

    /// Waits for `text` on the screen after what was already matched; the
    /// screen so far in the panic if it does not come.
    fn expect(&mut self, text: &str) {
        assert!(
            self.appears(text, T),
            "{text:?} never appeared on the terminal; it shows:\n{}",
            self.screen
        );
    }

    /// Whether `text` comes on the screen, after what was already
    /// matched, within `within`.
    fn appears(&mut self, text: &str, within: Duration) -> bool {
        use std::io::Read;
        use std::os::fd::AsFd;
        let until = std::time::Instant::now() + within;
        loop {
            if let Some(at) = self.screen[self.seen..].find(text) {
                self.seen += at + text.len();
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            if readable_soon(self.master.as_fd()) {
                let mut buf = [0u8; 4096];
                match self.master.read(&mut buf) {
                    Ok(n) if n > 0 => self.screen.push_str(&String::from_utf8_lossy(&buf[..n])),
                    _ => {}
                }
            }
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.bash.kill();
        let _ = self.bash.wait();
    }
}

/// The agent's command line for the shell, on `url`, `flags` after the
/// task.
/// An agent whose process group's leader is outside its PID namespace
/// (`unshare --pid --fork`, as `nsenter` into a container or systemd-run
/// in one gives) sees its group id as 0: it runs its job as anywhere else.
/// (rustix's `getpgrp` took the 0 for a non-zero id: a panic in a debug
/// build, found by the real-systemd tests' `nsenter`.)
#[test]
fn an_agent_whose_group_leader_is_outside_its_pid_namespace_runs() {
    let fake = FakeAuthority::start();
    for flags in [&[][..], &["--no-pid-namespace"][..]] {
        let out = Command::new("unshare")
            .args(["--pid", "--fork", "--"])
            .arg(bin())
            .args(flags)
            .args(["--authority", &fake.url(), "--task", "outside-group", "--"])
            .args(["sh", "-c", "exit 7"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run unshare (util-linux)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(7), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
    }
}

fn agent_line(url: &str, task: &str, flags: &str) -> String {
    format!(
        "{} --authority {url} --task {task} {flags}",
        bin().display()
    )
}

#[test]
fn a_job_run_from_an_interactive_shell_prompts_through_dev_tty() {
    let fake = FakeAuthority::start();
    for flags in ["", "--no-pid-namespace"] {
        let mut pty = Pty::bash();
        // The job's stdin and stdout are not the terminal: only /dev/tty,
        // as `ssh` and `sudo` open it for a password.
        let job = "exec </dev/null >/dev/null; printf \"Pass%s: \" word >/dev/tty; \
                   read p </dev/tty; echo \"got-$p-ok\" >/dev/tty";
        pty.send(&format!(
            "{} -- sh -c '{job}'; echo \"rc-$?-end\"\n",
            agent_line(&fake.url(), "tty", flags)
        ));
        pty.expect("Password: ");
        pty.send("sekret\n");
        pty.expect("got-sekret-ok");
        pty.expect("rc-0-end");
        // The shell has its terminal back: the next line runs.
        pty.send("echo \"back-$((40+2))\"\n");
        pty.expect("back-42");
        // Stdin not a terminal: the job has a session of its own, no
        // controlling terminal (today's behaviour for scripts).
        pty.send(&format!(
            "{} -- sh -c 'echo x >/dev/tty' </dev/null; echo \"rc-$?-none\"\n",
            agent_line(&fake.url(), "notty", flags)
        ));
        pty.expect("rc-2-none");
        // Started by a script (no job control: the agent leads no group):
        // the script's group keeps the terminal, the job a session of its
        // own, as before.
        pty.send(&format!(
            "sh -c '{} -- sh -c \"echo x >/dev/tty\"'; echo \"rc-$?-script\"\n",
            agent_line(&fake.url(), "script", flags)
        ));
        pty.expect("rc-2-script");
    }
}

/// A job of another user (`--user nobody`), run from a root shell at its
/// terminal, pushes a line into the terminal's input queue (`TIOCSTI`, the
/// kernel here allows it to a process whose controlling terminal it is)
/// and exits: after the agent returns, the root shell must not run it. The
/// job has no controlling terminal of the caller's, so the push is refused.
#[test]
fn a_job_of_another_user_cannot_push_a_line_into_the_callers_shell() {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs a job as nobody: run it as root"
    );
    let python = "/usr/bin/python3";
    assert!(
        std::path::Path::new(python).exists(),
        "{python} (python3) must be installed: the job pushes input with fcntl.ioctl"
    );
    let fake = FakeAuthority::start();
    let dir = Dir::new();
    std::fs::set_permissions(dir.0.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (n, flags) in ["", "--no-pid-namespace"].into_iter().enumerate() {
        let planted = dir.path(&format!("planted-{n}"));
        let script = dir.path(&format!("sti-{n}.py"));
        std::fs::write(
            &script,
            format!(
                "import fcntl, termios\n\
                 try:\n    \
                     for c in b'id > {}\\n':\n        \
                         fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))\n    \
                     print('sti-pushed')\n\
                 except OSError as e:\n    \
                     print('sti-refused', e.errno)\n",
                planted.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut pty = Pty::bash();
        pty.send(&format!(
            "{} --user nobody -- {python} {}; echo \"rc-$?-sti\"\n",
            agent_line(&fake.url(), &format!("sti-{n}"), flags),
            script.display()
        ));
        pty.expect("sti-refused");
        pty.expect("rc-0-sti");
        // Whatever the job queued would be read by the shell before this.
        pty.send("echo \"after-$((6*7))\"\n");
        pty.expect("after-42");
        assert!(
            !planted.exists(),
            "{flags:?}: the root shell ran the job's line: {}\nthe terminal shows:\n{}",
            std::fs::read_to_string(&planted).unwrap_or_default(),
            pty.screen
        );
    }
}

/// The host pid of the test job's shell (its command line names
/// `marker`, which no other test's job does), found once it runs.
fn job_shell(marker: &str) -> i32 {
    wait_for(T, || {
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd);
            (cmd.starts_with("sh\0-c\0") && cmd.contains(marker)).then_some(pid)
        })
    })
    .unwrap_or_else(|| panic!("the job with {marker} runs"))
}

/// The state letter of `pid` in /proc (`R`, `S`, `T`, ...).
fn state_of(pid: i32) -> Option<char> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    st.rsplit(')').next()?.trim_start().chars().next()
}

/// A bash on a pty that ran the agent (`flags`, a 4 s ttl: a busy test
/// machine's late renewal is no loss) with a job that reads a line from
/// `/dev/tty`, echoes it after `marker` and runs `then`; Ctrl-Z typed once
/// the job runs. Returns at the shell's prompt, the job's shell paused.
fn stopped_at_the_prompt(
    fake: &FakeAuthority,
    task: &str,
    flags: &str,
    marker: &str,
    then: &str,
) -> (Pty, i32) {
    let mut pty = Pty::bash();
    // The job's shell is found by a tag no other run of the suite on the
    // machine has (`job_shell` looks through all of /proc; another run's
    // job, with the same marker, ends on its own test's `fg`).
    let tag = format!("{marker}{}-", std::process::id());
    let job = format!(
        "printf \"job-%s\\n\" ready; read x </dev/tty; echo \"{marker}$x\"; : {tag}; {then}"
    );
    pty.send(&format!(
        "{} --ttl 4s --heartbeat 400ms --grace 1s -- sh -c '{job}'\n",
        agent_line(&fake.url(), task, flags)
    ));
    pty.expect("job-ready");
    pty.send("\x1a"); // Ctrl-Z
    pty.expect("Stopped");
    pty.expect("PROMPT$ ");
    let job = job_shell(&tag);
    assert_eq!(
        state_of(job),
        Some('T'),
        "{flags}: the job is paused; the terminal shows:\n{}",
        pty.screen
    );
    (pty, job)
}

/// Ctrl-Z as at any shell: the job pauses and the shell's prompt comes
/// back (`jobs`: Stopped) while the lease is renewed for longer than a
/// ttl; `fg` gives the job the terminal again, it reads from it, and its
/// exit code is the agent's.
#[test]
fn ctrl_z_gives_the_shell_its_prompt_and_fg_resumes_the_job_as_renewals_go_on() {
    let fake = FakeAuthority::start();
    for flags in ["", "--no-pid-namespace"] {
        let (mut pty, job) = stopped_at_the_prompt(&fake, "ctrl-z", flags, "job-got-", "exit 7");
        pty.send("jobs\n");
        pty.expect("Stopped");
        pty.expect("PROMPT$ ");
        // Longer than a ttl at the prompt: the lease is renewed all along.
        let before = fake.requests_to("/v1/renew").len();
        wait_for(T, || {
            (fake.requests_to("/v1/renew").len() >= before + 11).then_some(())
        })
        .expect("renewals go on while the job is stopped");
        assert!(
            fake.requests_to("/v1/release").len() < (if flags.is_empty() { 1 } else { 2 }),
            "released while stopped"
        );
        assert_eq!(
            state_of(job),
            Some('T'),
            "{flags}: the job stays paused; the terminal shows:\n{}",
            pty.screen
        );
        pty.send("fg\n");
        // The shell says what it continues; then the job has the terminal.
        pty.expect("ctrl-z");
        pty.send("hello\n");
        pty.expect("job-got-hello");
        pty.expect("PROMPT$ ");
        pty.send("echo \"rc-$?-end\"\n");
        pty.expect("rc-7-end");
        let rel = fake.requests_to("/v1/release");
        assert_eq!(rel.last().unwrap().body["exit_code"], 7, "{flags}");
    }
}

/// The keeper guards the deadline while the job is stopped at the shell's
/// prompt: a lease lost then kills the paused tree, and the shell hears
/// the agent's 124 without an `fg` (the agent continues its front).
#[test]
fn a_lease_lost_while_the_job_is_stopped_kills_it_and_the_shell_hears_124() {
    for flags in ["", "--no-pid-namespace"] {
        // A fresh authority: this one's task stays held after the refusal.
        let fake = FakeAuthority::start();
        let (mut pty, job) =
            stopped_at_the_prompt(&fake, "lost-while-stopped", flags, "lost-got-", "true");
        fake.set_renew(Reply::Refuse("superseded"));
        wait_for(T, || (!alive(job)).then_some(()))
            .unwrap_or_else(|| panic!("{flags}: the stopped job outlived its lease"));
        // The front ended with the agent's status: the shell says so at
        // its next command, once the agent has released and exited.
        wait_for(T, || {
            let from = pty.seen;
            pty.send("jobs; echo \"jobs-$((1+1))-done\"\n");
            pty.expect("jobs-2-done");
            pty.screen[from..pty.seen]
                .contains("Exit 124")
                .then_some(())
        })
        .unwrap_or_else(|| panic!("{flags}: the shell never heard 124: {}", pty.screen));
    }
}

/// The children of `pid` (its main thread's, from /proc).
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The process group of `pid` (field 5 of /proc/PID/stat).
fn group_of(pid: i32) -> Option<i32> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    st.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// The terminal's foreground process group, as the pty's master sees it.
fn foreground_of(master: &std::fs::File) -> i32 {
    use std::os::fd::AsRawFd;
    // SAFETY (test): tcgetpgrp takes a descriptor we own, numbers only.
    let fg = unsafe { libc::tcgetpgrp(master.as_raw_fd()) };
    assert!(fg > 0, "tcgetpgrp: {}", std::io::Error::last_os_error());
    fg
}

/// Whether the process of `pidfd` ended within `within` (its pidfd reads
/// as ready once it exits).
fn ended(pidfd: &std::os::fd::OwnedFd, within: Duration) -> bool {
    use std::os::fd::AsFd;
    wait_for(within, || readable_soon(pidfd.as_fd()).then_some(())).is_some()
}

/// Whether `fd` is readable within 100 ms.
fn readable_soon(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let ms = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    let _ = rustix::event::poll(&mut fds, Some(&ms));
    fds[0].revents().contains(rustix::event::PollFlags::IN)
}

/// An agent SIGKILLed (as the OOM killer does) while its job holds the
/// terminal, reading from it: the keeper kills the job's tree, and the
/// front, seeing its agent gone, takes the terminal back for its own
/// group before it exits with 137, so the terminal never stays with the
/// job's dead group. The shell is held stopped meanwhile (a shell that
/// notices late, or a parent that does not handle the terminal at all):
/// once the front has exited the terminal is already the front's; then
/// the shell reports 137, has the terminal, and a command typed next runs
/// and reads from it.
#[test]
fn an_agent_killed_while_its_job_reads_the_terminal_leaves_it_to_the_front_then_the_shell() {
    for flags in ["", "--no-pid-namespace"] {
        // A fresh authority: the killed agent's lease is left to expire.
        let fake = FakeAuthority::start();
        let mut pty = Pty::bash();
        let shell = i32::try_from(pty.bash.id()).unwrap();
        // A tree: the job's shell and a child, in the job's group; a marker
        // no other run of this test on the machine has (`job_shell` looks
        // through all of /proc).
        let marker = format!("killed-got-{}-", std::process::id());
        let job = format!(
            "sleep 300 & printf \"job-%s\\n\" ready; read x </dev/tty; echo \"{marker}$x\""
        );
        pty.send(&format!(
            "{} -- sh -c '{job}'\n",
            agent_line(&fake.url(), "agent-killed", flags)
        ));
        pty.expect("job-ready");
        let job = job_shell(&marker);
        let sleeper = wait_for(T, || children_of(job).first().copied())
            .unwrap_or_else(|| panic!("{flags}: the job's sleep runs"));
        let job_group = group_of(job).unwrap();
        // The front: the shell's child, leading the shell's job group; the
        // agent: the front's child, in a group of its own.
        let front = wait_for(T, || {
            children_of(shell).into_iter().find(|&p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.starts_with(bin().as_os_str().as_encoded_bytes()))
            })
        })
        .unwrap_or_else(|| panic!("{flags}: the shell runs the agent's front"));
        assert_eq!(group_of(front), Some(front), "{flags}: the front's group");
        let agent = wait_for(T, || children_of(front).first().copied())
            .unwrap_or_else(|| panic!("{flags}: the front has its agent"));
        assert_eq!(group_of(agent), Some(agent), "{flags}: the agent's group");
        let pidfds: Vec<_> = [job, sleeper]
            .iter()
            .map(|&p| {
                rustix::process::pidfd_open(
                    rustix::process::Pid::from_raw(p).unwrap(),
                    rustix::process::PidfdFlags::empty(),
                )
                .unwrap_or_else(|e| panic!("{flags}: pidfd_open({p}): {e}"))
            })
            .collect();
        // The job reads from the terminal, its foreground: blocked in
        // read(2) (number 0 on x86-64, 63 on arm64) on descriptor 0.
        let read_nr = if cfg!(target_arch = "aarch64") {
            "63"
        } else {
            "0"
        };
        wait_for(T, || {
            std::fs::read_to_string(format!("/proc/{job}/syscall"))
                .is_ok_and(|s| s.split_whitespace().take(2).eq([read_nr, "0x0"]))
                .then_some(())
        })
        .unwrap_or_else(|| panic!("{flags}: the job never read from the terminal"));
        assert_eq!(foreground_of(&pty.master), job_group, "{flags}");

        kill(shell, libc::SIGSTOP);
        kill(agent, libc::SIGKILL);
        for (fd, pid) in pidfds.iter().zip([job, sleeper]) {
            assert!(
                ended(fd, T),
                "{flags}: the job's {pid} outlived its killed agent"
            );
        }
        // The front exits (a zombie: its shell is stopped) with the
        // terminal its own group's, not the job's dead one.
        wait_for(T, || (state_of(front) == Some('Z')).then_some(()))
            .unwrap_or_else(|| panic!("{flags}: the front outlived its agent"));
        assert_eq!(
            foreground_of(&pty.master),
            front,
            "{flags}: the front left the terminal to the job's group {job_group}"
        );
        // No member of the job's group runs on (a zombie left to its
        // reaper does not count; nor does a process of another session that
        // got the group's id since: the test machine is shared).
        let left: Vec<String> = group_members(job_group)
            .iter()
            .filter(|&&p| alive(p))
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
            .filter(|st| {
                st.rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().nth(3))
                    == Some(shell.to_string().as_str())
            })
            .collect();
        assert!(
            left.is_empty(),
            "{flags}: the front exited before the job's group was gone: {left:?}"
        );

        kill(shell, libc::SIGCONT);
        pty.expect("PROMPT$ ");
        pty.send("echo \"rc-$?-killed\"\n");
        pty.expect("rc-137-killed");
        pty.send("read y </dev/tty; echo \"next-$y-read\"\n");
        pty.send("typed\n");
        pty.expect("next-typed-read");
        pty.expect("PROMPT$ ");
        assert_eq!(
            foreground_of(&pty.master),
            shell,
            "{flags}: the shell has the terminal"
        );
    }
}
