//! The keeper's one loop, in tini's manner: reap; once the tree is gone, say
//! so and end; else run a due kill round, read the agent's commands, keep
//! the deadline, and wait for SIGCHLD, a control byte, the deadline timer
//! or the next kill round. No helper thread, no sleep-polling.
//!
//! Everything outside its own state goes through [`Os`] (`os.rs`), so the
//! unit tests below drive it through a fake: children that end or survive,
//! ctl bytes, the agent's end, the timer, the clock.
//!
//! Invariants it keeps:
//! - "Tree gone" is proven, never guessed: no child left below the keeper
//!   (a child subreaper, so every descendant stays below it) and an empty
//!   job cgroup. Then `TreeGone` goes out and the loop ends, `Done` or not.
//! - The agent's end (EOF on the ctl socket) kills the whole tree at once;
//!   so does `Done` (normally nothing is left). A wait that fails (a
//!   resource failure: `poll` refused under a lowered `RLIMIT_NOFILE`) is
//!   not the agent's end: it stops the tree now, once, with what is
//!   already open, and says why.
//! - The tree is sampled (processes, private resident memory) at most
//!   every [`SAMPLE_MIN`] and at a cost of at most about 2 % of a CPU
//!   ([`SAMPLE_COST_RATIO`]): the guard sizes its kill lead from it, and the
//!   agent's machine hears of each change that moves the lead.
//! - The deadline the agent handed over ([`Guard`]) is kept whatever the
//!   agent does: SIGTERM (then SIGCONT) to the tree when due, SIGKILL
//!   rounds from the kill time. All queued commands are read before the
//!   deadline is looked at, so a keeper resumed after a stop acts on the
//!   newest `Arm`, not on one a renewal replaced.
//! - Every timed wait's lateness (from when it was due to end to when the
//!   keeper ran again) is measured ([`Lateness`]) and goes into the
//!   guard's lead at once and into the next `Size` report: a keeper that
//!   waits for a CPU on a busy host sends its SIGKILL earlier by twice
//!   that (`time::deadline::kill_lead`). Only a wait that did wait counts
//!   (one due already when it began says nothing about the scheduler).
//! - A kill goes in rounds (cgroup.kill and the tree walk) until the tree is
//!   gone: fast at first, then backing off, to [`KILL_ROUND_SURVIVORS`] once
//!   survivors were reported (once, after [`SURVIVOR_REPORT_AFTER`]).
//! - A relayed signal goes to the members of the job's group found in the
//!   tree (never `kill(-pgid)`, which could hit a recycled group); the
//!   leader is signalled without a check only while it is unreaped.

use std::time::Duration;

use crate::keeper::guard::{Due, Guard};
use crate::keeper::lateness::Lateness;
use crate::keeper::os::{Os, Reaped, Survivor};
use crate::keeper::protocol::{Command as Ctl, Decoder, Report};
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;
use crate::time::deadline;

/// While killing: the first rounds of SIGKILL come this fast, then slower,
/// up to the longest pause between rounds once survivors were reported (a
/// process the keeper cannot kill costs a walk of the tree every few
/// seconds, not a busy loop).
const KILL_ROUND_FIRST: Duration = Duration::from_millis(10);
const KILL_ROUND_MAX: Duration = Duration::from_millis(500);
const KILL_ROUND_SURVIVORS: Duration = Duration::from_secs(5);
/// Survivors of SIGKILL this long are reported (once) with pid and command.
const SURVIVOR_REPORT_AFTER: Duration = Duration::from_secs(1);
/// The tree is sampled at most this often...
pub const SAMPLE_MIN: Duration = Duration::from_millis(250);
/// ... at least this often...
const SAMPLE_MAX: Duration = Duration::from_secs(5);
/// ... and a sample that took `t` waits `t` times this for the next one.
const SAMPLE_COST_RATIO: u32 = 50;
/// A sample is reported when the lead it sizes moves by this much.
const LEAD_REPORT_STEP: Duration = Duration::from_millis(5);

/// What the keeper says when the agent died without its `Done` (its ctl
/// socket ended): the agent was killed (SIGKILL, the OOM killer) or
/// crashed, not the job. The agent is gone, so it reaches the keeper's
/// stderr (see `os::Reporter`); wrappers look for the `agent_died` word.
pub const AGENT_DIED: &str = "agent_died: the agent is gone without a word (SIGKILL, the OOM killer, a crash): stopping the job's tree now";

/// A kill in progress: rounds of SIGKILL until the tree is gone.
struct Killing {
    since: BootInstant,
    next_round: BootInstant,
    round: Duration,
    survivors_reported: bool,
}

/// The loop's state; the system is `os`.
pub struct EventLoop<O: Os> {
    os: O,
    job_pid: i32,
    leader_reaped: bool,
    /// False once the agent closed it (EOF) or said `Done`.
    ctl_open: bool,
    /// The agent is gone or done: exit once the tree is gone.
    finishing: bool,
    killing: Option<Killing>,
    /// The deadline the agent handed over, enforced by the keeper alone.
    guard: Guard,
    decoder: Decoder,
    /// Commands that came right behind the "go" frame, read with it.
    carry: Vec<u8>,
    /// When the tree is sampled next (`None`: the system does not sample).
    next_sample: Option<BootInstant>,
    /// The lead the last reported sample sized (uncapped).
    reported_lead: Option<Duration>,
    /// A wait failed: the tree is being stopped for it (said once).
    resources_failed: bool,
    /// How late the keeper's timed wakes were lately.
    late: Lateness,
}

impl<O: Os> EventLoop<O> {
    /// The loop for the job `job_pid` (its leader, our child), with the
    /// ctl bytes read past the "go" frame.
    pub fn new(os: O, job_pid: i32, carry: Vec<u8>) -> Self {
        EventLoop {
            os,
            job_pid,
            leader_reaped: false,
            ctl_open: true,
            finishing: false,
            killing: None,
            guard: Guard::default(),
            decoder: Decoder::default(),
            carry,
            next_sample: Some(BootInstant::from_since_boot(Duration::ZERO)),
            reported_lead: None,
            resources_failed: false,
            late: Lateness::default(),
        }
    }

    /// Runs until the tree is gone; returns the system.
    pub fn run(mut self) -> O {
        loop {
            if self.reap() && self.os.cgroup_empty() {
                self.tree_gone();
                return self.os;
            }
            // Does nothing unless a kill is in progress and a round is due.
            self.kill_round();
            // The newest deadline first: a keeper resumed after a stop has
            // the `Arm`s sent meanwhile queued (a read that finds nothing
            // costs one syscall).
            self.read_ctl();
            self.sample_due();
            self.deadline_due();
            self.os.flush();
            // While killing, the rounds set the pace and no sample is taken
            // (a sample due meanwhile must not turn the wait into a spin).
            let until = match &self.killing {
                Some(k) => Some(k.next_round),
                None => self.next_sample,
            };
            let due = match (until, self.guard.next_wake()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let before = self.os.now();
            let woken = self.os.wait(until);
            self.measure(before, due);
            if woken.failed {
                self.resource_failure();
            }
            if woken.ctl {
                self.read_ctl();
            } else if !self.ctl_open && !self.finishing {
                self.agent_gone();
            }
        }
    }

    /// Reaps every child that has ended (the leader's end is reported with
    /// its time); whether no child is left.
    fn reap(&mut self) -> bool {
        loop {
            match self.os.reap() {
                Reaped::Ended { pid, status } => {
                    if pid == self.job_pid && !self.leader_reaped {
                        self.leader_reaped = true;
                        let at_ms = crate::time::ms(self.os.now().since_boot());
                        self.os.report(Report::Exited { status, at_ms });
                    }
                }
                // Said for the job's leader only: the agent's front process
                // stops with it, and the shell gets its prompt back.
                Reaped::Stopped { pid } => {
                    if pid == self.job_pid && !self.leader_reaped {
                        self.os.report(Report::Stopped);
                    }
                }
                Reaped::Running => return false,
                Reaped::NoChild => return true,
            }
        }
    }

    /// The end of the keeper's work, `Done` or not: no process is left to
    /// fork into the tree, and a subreaper's tree cannot gain members from
    /// outside. `TreeGone` goes out, and the empty cgroup is removed now,
    /// while the agent releases the lease, not after: the agent waits for
    /// this process's end.
    fn tree_gone(&mut self) {
        self.os.report(Report::TreeGone);
        self.os.flush();
        self.os.remove_cgroup();
    }

    /// The keeper's own deadline: SIGTERM and SIGKILL when due, whatever
    /// the agent does; then the timer is set to the next time due.
    fn deadline_due(&mut self) {
        for due in self.guard.due(self.os.now()) {
            match due {
                Due::Term => {
                    self.os.report(Report::Info(
                        "the keeper's deadline timer fired: SIGTERM to the tree".into(),
                    ));
                    self.term();
                }
                Due::Kill => self.start_kill(),
            }
        }
        self.os.set_timer(self.guard.next_wake());
    }

    /// The wait failed: the keeper cannot watch its channel, the children
    /// and the timer any more, so it stops the tree now (never read as the
    /// agent's end: the ctl socket stays, and is still read).
    fn resource_failure(&mut self) {
        if self.resources_failed {
            return;
        }
        self.resources_failed = true;
        self.os.report(Report::Warning(
            "keeper: its wait failed (a resource limit lowered, e.g. RLIMIT_NOFILE, or out of memory): stopping the tree now".into(),
        ));
        self.start_kill();
    }

    /// A wait that began at `before` was due to end at `due`: if it did
    /// wait and ran again after that, how late is one observation.
    fn measure(&mut self, before: BootInstant, due: Option<BootInstant>) {
        let Some(due) = due.filter(|&d| d > before) else {
            return;
        };
        let now = self.os.now();
        if now >= due {
            self.late.observe(now.saturating_since(due), now);
            self.guard.late(self.late.micros(now));
        }
    }

    /// Samples the tree when due (never while killing it): the guard's own
    /// lead follows it, and the agent hears of a change that moves the lead.
    fn sample_due(&mut self) {
        let Some(due) = self.next_sample else { return };
        let now = self.os.now();
        if now < due || self.killing.is_some() {
            return;
        }
        let Some(mut size) = self.os.sample() else {
            self.next_sample = None;
            return;
        };
        size.late_us = self.late.micros(now);
        let cost = now.until(self.os.now());
        self.next_sample = Some(now + (cost * SAMPLE_COST_RATIO).clamp(SAMPLE_MIN, SAMPLE_MAX));
        self.guard.sized(size);
        // Uncapped (the longest ttl): the agent caps it by its own ttl.
        let lead = deadline::kill_lead(Duration::MAX, size);
        let moved = self
            .reported_lead
            .is_none_or(|r| r.abs_diff(lead) >= LEAD_REPORT_STEP);
        if moved {
            self.reported_lead = Some(lead);
            self.os.report(Report::Size {
                procs: size.procs,
                private_kib: size.private_bytes / 1024,
                busy_milli: size.busy_milli,
                late_us: size.late_us,
            });
        }
    }

    fn close_ctl(&mut self) {
        self.ctl_open = false;
        self.os.close_ctl();
    }

    /// Reads everything the agent queued (to the end), then carries it out
    /// in order. All of it first: a keeper stopped for a while finds
    /// several `Arm`s queued, and acting on the first (an old deadline)
    /// before reading the last would stop a job whose lease was renewed
    /// since. The deadline itself is checked by the loop after.
    fn read_ctl(&mut self) {
        if !self.ctl_open {
            return;
        }
        let mut bytes = std::mem::take(&mut self.carry);
        let (read, eof) = self.os.read_ctl();
        bytes.extend_from_slice(&read);
        let commands = self.decoder.push(&bytes);
        if commands.is_empty() && eof {
            self.close_ctl();
            self.agent_gone();
            return;
        }
        for cmd in commands {
            match cmd {
                Ctl::Relay(sig) => self.relay(sig),
                Ctl::Term => {
                    if self.guard.term_requested() {
                        self.term();
                    }
                }
                Ctl::Kill => self.start_kill(),
                Ctl::Arm(a) => self.guard.arm(a),
                Ctl::Done => {
                    self.close_ctl();
                    self.finishing = true;
                    // Normally nothing is left; if something is, it dies.
                    self.start_kill();
                    return;
                }
            }
        }
        if eof {
            self.close_ctl();
            self.agent_gone();
        }
    }

    /// The job's leader while it is ours to signal without a check: not
    /// yet reaped, so its pid cannot have been reused.
    fn leader(&self) -> Option<i32> {
        (!self.leader_reaped).then_some(self.job_pid)
    }

    /// The agent is gone (EOF without `Done`): kill the whole tree at once.
    /// Said as `agent_died` (the agent died: SIGKILL, the OOM killer, a
    /// crash), so that a wrapper reading the keeper's stderr can tell it
    /// from a job that was killed; the agent cannot say it any more.
    fn agent_gone(&mut self) {
        self.finishing = true;
        self.os.report(Report::Warning(AGENT_DIED.into()));
        self.start_kill();
    }

    /// A relayed signal: to the members of the job's process group.
    fn relay(&mut self, sig: Sig) {
        self.os.relay(sig, self.job_pid, self.leader());
    }

    /// SIGTERM to the whole tree, then SIGCONT (as `timeout` and systemd
    /// do), so a job paused with SIGTSTP or SIGSTOP acts on it within its
    /// grace.
    fn term(&mut self) {
        for sig in [Sig::Term, Sig::Cont] {
            self.os.signal_tree(sig, self.leader());
        }
    }

    fn start_kill(&mut self) {
        if self.killing.is_none() {
            let now = self.os.now();
            self.killing = Some(Killing {
                since: now,
                next_round: now,
                round: KILL_ROUND_FIRST,
                survivors_reported: false,
            });
        }
        self.kill_round();
    }

    /// One round of SIGKILL, if one is due; survivors of earlier rounds are
    /// reported once.
    fn kill_round(&mut self) {
        let now = self.os.now();
        let Some(k) = self.killing.as_mut() else {
            return;
        };
        if now < k.next_round {
            return;
        }
        k.next_round = now + k.round;
        let max = if k.survivors_reported {
            KILL_ROUND_SURVIVORS
        } else {
            KILL_ROUND_MAX
        };
        k.round = (k.round * 2).min(max);
        let report_now = !k.survivors_reported && now >= k.since + SURVIVOR_REPORT_AFTER;
        if report_now {
            k.survivors_reported = true;
        }
        let leader = self.leader();
        if let Err(warning) = self.os.kill_tree(leader) {
            self.os.report(Report::Warning(warning));
        }
        if report_now {
            for Survivor { pid, command, why } in self.os.survivors() {
                self.os.report(Report::Survivor { pid, command, why });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, VecDeque};

    use super::*;
    use crate::exit::ChildStatus;
    use crate::keeper::os::Woken;
    use crate::keeper::protocol::{Arm, Survival};
    use crate::time::deadline::Deadline;

    /// What the loop did to the system, in order.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Did {
        Signal(Sig, Option<i32>),
        Relay(Sig, i32, Option<i32>),
        KillRound(Option<i32>),
        Timer(Option<BootInstant>),
        CloseCtl,
        /// The reports of one flush, in order.
        Sent(Vec<Report>),
        RemoveCgroup,
    }

    /// Something that happens while the loop waits.
    #[derive(Clone, Debug)]
    enum Then {
        /// The agent writes these bytes on the ctl pipe.
        Ctl(Vec<u8>),
        /// The agent's end of the ctl pipe closes.
        Eof,
        /// A child ends with this status.
        Ends(i32, ChildStatus),
        /// A child stops (Ctrl-Z).
        Stops(i32),
        /// Time passes to the armed timer.
        Timer,
        /// Time passes to the loop's own `until` (the next kill round).
        Until,
        /// Time passes by this much.
        Later(Duration),
        /// The wait fails.
        Fails,
    }

    /// A system without processes: children are pids that end when told to
    /// (or when killed, unless they survive SIGKILL), time passes only in
    /// `wait`, and everything the loop does is written down.
    struct Fake {
        now: BootInstant,
        /// Children alive: whether they survive SIGKILL.
        alive: BTreeMap<i32, bool>,
        ended: VecDeque<(i32, ChildStatus)>,
        /// Children that stopped, not yet reported by a reap.
        stops: VecDeque<i32>,
        /// Members of the job's cgroup that are no child (escaped the tree).
        cgroup_only: Vec<i32>,
        /// `cgroup.kill` fails with this.
        kill_fails: Option<String>,
        ctl: Vec<u8>,
        eof: bool,
        ctl_closed: bool,
        timer: Option<BootInstant>,
        queued: Vec<Report>,
        script: VecDeque<Then>,
        did: Vec<Did>,
        /// What a sample finds (`None`: no sampling).
        size: Option<TreeSize>,
        /// Waits in a row that returned at once with nothing new.
        spins: u32,
    }

    fn t(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_millis(1_000_000 + ms))
    }

    const JOB: i32 = 100;

    impl Fake {
        fn new(children: &[i32], script: Vec<Then>) -> Self {
            Fake {
                now: t(0),
                alive: children.iter().map(|&p| (p, false)).collect(),
                ended: VecDeque::new(),
                stops: VecDeque::new(),
                cgroup_only: Vec::new(),
                kill_fails: None,
                ctl: Vec::new(),
                eof: false,
                ctl_closed: false,
                timer: None,
                queued: Vec::new(),
                script: script.into(),
                did: Vec::new(),
                size: None,
                spins: 0,
            }
        }

        fn end(&mut self, pid: i32, status: ChildStatus) {
            if self.alive.remove(&pid).is_some() {
                self.ended.push_back((pid, status));
            }
        }

        /// Every report sent, flushes joined.
        fn sent(&self) -> Vec<Report> {
            self.did
                .iter()
                .filter_map(|d| match d {
                    Did::Sent(r) => Some(r.clone()),
                    _ => None,
                })
                .flatten()
                .collect()
        }

        /// What the loop did to processes, in order.
        fn acts(&self) -> Vec<Did> {
            self.did
                .iter()
                .filter(|d| matches!(d, Did::Signal(..) | Did::Relay(..) | Did::KillRound(_)))
                .cloned()
                .collect()
        }
    }

    use crate::time::deadline::TreeSize;

    impl Os for Fake {
        fn now(&self) -> BootInstant {
            self.now
        }

        fn reap(&mut self) -> Reaped {
            if let Some(pid) = self.stops.pop_front() {
                return Reaped::Stopped { pid };
            }
            match self.ended.pop_front() {
                Some((pid, status)) => Reaped::Ended { pid, status },
                None if self.alive.is_empty() => Reaped::NoChild,
                None => Reaped::Running,
            }
        }

        fn cgroup_empty(&self) -> bool {
            self.cgroup_only.is_empty()
        }

        fn remove_cgroup(&mut self) -> bool {
            self.did.push(Did::RemoveCgroup);
            true
        }

        fn signal_tree(&mut self, sig: Sig, leader: Option<i32>) {
            self.did.push(Did::Signal(sig, leader));
        }

        fn relay(&mut self, sig: Sig, pgid: i32, leader: Option<i32>) {
            self.did.push(Did::Relay(sig, pgid, leader));
        }

        fn kill_tree(&mut self, leader: Option<i32>) -> Result<(), String> {
            self.did.push(Did::KillRound(leader));
            let killed: Vec<i32> = self
                .alive
                .iter()
                .filter(|(_, survives)| !**survives)
                .map(|(p, _)| *p)
                .collect();
            for pid in killed {
                self.end(pid, ChildStatus::Signaled(9));
            }
            match self.kill_fails.clone() {
                Some(e) => Err(e),
                None => {
                    self.cgroup_only.clear();
                    Ok(())
                }
            }
        }

        fn survivors(&mut self) -> Vec<Survivor> {
            self.alive
                .keys()
                .map(|&pid| Survivor {
                    pid,
                    command: format!("job {pid}"),
                    why: Survival::Uninterruptible,
                })
                .collect()
        }

        fn read_ctl(&mut self) -> (Vec<u8>, bool) {
            assert!(!self.ctl_closed, "read after close");
            (std::mem::take(&mut self.ctl), self.eof)
        }

        fn close_ctl(&mut self) {
            self.ctl_closed = true;
            self.did.push(Did::CloseCtl);
        }

        fn set_timer(&mut self, at: Option<BootInstant>) {
            if self.timer != at {
                self.did.push(Did::Timer(at));
            }
            self.timer = at;
        }

        fn report(&mut self, report: Report) {
            self.queued.push(report);
        }

        fn flush(&mut self) {
            if !self.queued.is_empty() {
                let sent = std::mem::take(&mut self.queued);
                self.did.push(Did::Sent(sent));
            }
        }

        fn sample(&mut self) -> Option<TreeSize> {
            self.size
        }

        fn wait(&mut self, until: Option<BootInstant>) -> Woken {
            assert!(self.queued.is_empty(), "reports left unsent while waiting");
            // What is ready already wakes the wait at once, as `poll` does:
            // SIGCHLD of a child that ended, ctl bytes, the timer, `until`.
            let ctl_ready = !self.ctl_closed && (!self.ctl.is_empty() || self.eof);
            if !self.ended.is_empty()
                || !self.stops.is_empty()
                || ctl_ready
                || self.timer.is_some_and(|at| self.now >= at)
                || until.is_some_and(|at| self.now >= at)
            {
                if self.ended.is_empty() && self.stops.is_empty() && !ctl_ready {
                    self.spins += 1;
                    assert!(self.spins < 1_000, "the loop spins: {:?}", self.did);
                }
                return Woken {
                    ctl: ctl_ready,
                    failed: false,
                };
            }
            self.spins = 0;
            let then = self.script.pop_front().unwrap_or_else(|| {
                panic!("the loop waits with nothing left to happen: {:?}", self.did)
            });
            let mut woken = Woken::default();
            match then {
                Then::Ctl(bytes) => {
                    self.ctl.extend(bytes);
                    woken.ctl = !self.ctl_closed;
                }
                Then::Eof => {
                    self.eof = true;
                    woken.ctl = !self.ctl_closed;
                }
                Then::Ends(pid, status) => self.end(pid, status),
                Then::Stops(pid) => self.stops.push_back(pid),
                Then::Timer => {
                    let at = self.timer.expect("no timer armed");
                    self.now = self.now.max(at);
                }
                Then::Until => {
                    let at = until.expect("the loop waits without a time");
                    self.now = self.now.max(at);
                }
                Then::Later(d) => self.now = self.now + d,
                Then::Fails => woken.failed = true,
            }
            woken
        }
    }

    fn run(children: &[i32], script: Vec<Then>) -> Fake {
        EventLoop::new(Fake::new(children, script), JOB, Vec::new()).run()
    }

    fn arm(at_ms: u64, grace_ms: u64, lead_ms: u64) -> Vec<u8> {
        let ms = Duration::from_millis;
        Ctl::Arm(Arm::of(Deadline {
            at: t(at_ms),
            grace: ms(grace_ms),
            kill_lead: ms(lead_ms),
            ttl: Duration::from_secs(3600),
        }))
        .encode()
    }

    #[test]
    fn the_jobs_end_is_reported_then_the_tree_gone_and_the_loop_ends() {
        let f = run(
            &[JOB],
            vec![
                Then::Later(Duration::from_millis(1500)),
                Then::Ends(JOB, ChildStatus::Exited(3)),
            ],
        );
        assert_eq!(
            f.sent(),
            vec![
                Report::Exited {
                    status: ChildStatus::Exited(3),
                    at_ms: 1_001_500
                },
                Report::TreeGone
            ]
        );
        // Both in one write, then the cgroup goes; nothing was signalled.
        assert_eq!(
            &f.did[f.did.len() - 2..],
            &[
                Did::Sent(vec![
                    Report::Exited {
                        status: ChildStatus::Exited(3),
                        at_ms: 1_001_500
                    },
                    Report::TreeGone
                ]),
                Did::RemoveCgroup
            ]
        );
        assert!(f.acts().is_empty(), "{:?}", f.did);
        assert!(f.script.is_empty());
    }

    #[test]
    fn a_stop_of_the_leader_is_reported_and_a_stop_of_another_child_is_not() {
        let f = run(
            &[JOB, 8],
            vec![
                Then::Stops(8),
                Then::Stops(JOB),
                Then::Ends(JOB, ChildStatus::Exited(0)),
                Then::Ends(8, ChildStatus::Exited(0)),
            ],
        );
        assert_eq!(
            f.sent(),
            vec![
                Report::Stopped,
                Report::Exited {
                    status: ChildStatus::Exited(0),
                    at_ms: 1_000_000
                },
                Report::TreeGone
            ]
        );
        // A stop is news for the terminal only: nothing is signalled.
        assert!(f.acts().is_empty(), "{:?}", f.did);
    }

    #[test]
    fn the_tree_is_gone_only_when_no_child_is_left_and_the_cgroup_is_empty() {
        // The leader ends; a grandchild (re-parented to us) lives on, and
        // one process escaped into the cgroup only.
        let mut fake = Fake::new(
            &[JOB, 7],
            vec![
                Then::Ends(JOB, ChildStatus::Exited(0)),
                Then::Ends(7, ChildStatus::Exited(0)),
                // The agent, told the leader ended, stops what is left.
                Then::Ctl(Ctl::Kill.encode()),
            ],
        );
        fake.cgroup_only = vec![55];
        let f = EventLoop::new(fake, JOB, Vec::new()).run();
        let sent = f.sent();
        assert!(matches!(sent[0], Report::Exited { .. }));
        assert_eq!(sent.last(), Some(&Report::TreeGone));
        assert_eq!(sent.iter().filter(|r| **r == Report::TreeGone).count(), 1);
        // The leader, reaped, is no longer signalled without a check.
        assert_eq!(f.acts(), vec![Did::KillRound(None)]);
    }

    #[test]
    fn the_agents_end_kills_the_tree_at_once() {
        let f = run(&[JOB, 8], vec![Then::Eof]);
        assert_eq!(f.acts(), vec![Did::KillRound(Some(JOB))]);
        assert!(f.did.contains(&Did::CloseCtl));
        assert_eq!(
            f.sent(),
            vec![
                Report::Warning(AGENT_DIED.into()),
                Report::Exited {
                    status: ChildStatus::Signaled(9),
                    at_ms: 1_000_000
                },
                Report::TreeGone
            ]
        );
    }

    #[test]
    fn agent_died_is_said_only_when_the_agent_ended_without_done() {
        let died = |f: &Fake| f.sent().contains(&Report::Warning(AGENT_DIED.into()));
        assert!(died(&run(&[JOB, 8], vec![Then::Eof])));
        let failed = run(&[JOB, 8], vec![Then::Fails]);
        assert!(!died(&failed), "{:?}", failed.sent());
    }

    #[test]
    fn a_failed_wait_stops_the_tree_now_without_taking_the_agent_for_gone() {
        // A poll refused (RLIMIT_NOFILE lowered by the job): the tree is
        // killed at once, said once, and the ctl socket is kept.
        let f = run(&[JOB, 8], vec![Then::Fails]);
        assert_eq!(f.acts(), vec![Did::KillRound(Some(JOB))]);
        assert!(!f.did.contains(&Did::CloseCtl), "{:?}", f.did);
        let warnings = f
            .sent()
            .into_iter()
            .filter(|r| matches!(r, Report::Warning(w) if w.contains("stopping the tree now")))
            .count();
        assert_eq!(warnings, 1);
        assert_eq!(f.sent().last(), Some(&Report::TreeGone));
    }

    #[test]
    fn the_tree_is_sampled_and_its_lead_reported_when_it_moves() {
        let mut fake = Fake::new(
            &[JOB],
            vec![
                // No grace: the timer's first time is the kill time.
                Then::Ctl(arm(60_000, 0, 20)),
                Then::Until,
                Then::Ends(JOB, ChildStatus::Exited(0)),
            ],
        );
        fake.size = Some(TreeSize {
            procs: 2_000,
            private_bytes: 0,
            busy_milli: 0,
            late_us: 0,
        });
        let f = EventLoop::new(fake, JOB, Vec::new()).run();
        // Reported once: the second sample sized the same lead.
        let sizes: Vec<Report> = f
            .sent()
            .into_iter()
            .filter(|r| matches!(r, Report::Size { .. }))
            .collect();
        assert_eq!(
            sizes,
            vec![Report::Size {
                procs: 2_000,
                private_kib: 0,
                busy_milli: 0,
                late_us: 0,
            }]
        );
        // The guard's kill time moved by the lead 2,000 processes need.
        let lead = deadline::kill_lead(
            Duration::from_secs(3600),
            TreeSize {
                procs: 2_000,
                private_bytes: 0,
                busy_milli: 0,
                late_us: 0,
            },
        );
        assert!(lead > Duration::from_millis(20));
        assert!(
            f.did.contains(&Did::Timer(Some(t(60_000) - lead))),
            "{:?}",
            f.did
        );
    }

    #[test]
    fn an_arm_then_the_timer_gives_term_and_cont_then_kill_rounds() {
        let f = run(
            &[JOB],
            vec![
                // Deadline at 10 s, grace 3 s, kill lead 20 ms.
                Then::Ctl(arm(10_000, 3_000, 20)),
                Then::Timer,
                Then::Timer,
            ],
        );
        assert_eq!(
            f.acts(),
            vec![
                Did::Signal(Sig::Term, Some(JOB)),
                Did::Signal(Sig::Cont, Some(JOB)),
                Did::KillRound(Some(JOB)),
            ]
        );
        // The timer was set for SIGTERM, then SIGKILL, then disarmed.
        let timers: Vec<Did> = f
            .did
            .iter()
            .filter(|d| matches!(d, Did::Timer(_)))
            .cloned()
            .collect();
        assert_eq!(
            timers,
            vec![
                Did::Timer(Some(t(7_000))),
                Did::Timer(Some(t(9_980))),
                Did::Timer(None)
            ]
        );
        assert!(f.sent().contains(&Report::Info(
            "the keeper's deadline timer fired: SIGTERM to the tree".into()
        )));
        assert_eq!(f.sent().last(), Some(&Report::TreeGone));
    }

    #[test]
    fn the_newest_arm_counts_when_several_are_queued() {
        // A keeper resumed after a stop finds an old deadline (long past)
        // and the renewal's (far ahead) queued: it must not stop the job.
        let mut bytes = arm(500, 100, 20);
        bytes.extend(arm(60_000, 3_000, 20));
        let f = run(
            &[JOB],
            vec![
                Then::Later(Duration::from_secs(5)),
                Then::Ctl(bytes),
                Then::Ends(JOB, ChildStatus::Exited(0)),
            ],
        );
        assert!(f.acts().is_empty(), "{:?}", f.did);
        assert!(f.did.contains(&Did::Timer(Some(t(57_000)))));
    }

    #[test]
    fn sigterm_asked_after_the_timer_sent_it_is_not_repeated() {
        let f = run(
            &[JOB],
            vec![
                Then::Ctl(arm(10_000, 3_000, 20)),
                Then::Timer,
                Then::Ctl(Ctl::Term.encode()),
                Then::Ends(JOB, ChildStatus::Signaled(15)),
            ],
        );
        assert_eq!(
            f.acts(),
            vec![
                Did::Signal(Sig::Term, Some(JOB)),
                Did::Signal(Sig::Cont, Some(JOB)),
            ]
        );
        // Unarmed, every SIGTERM asked for goes out.
        let f = run(
            &[JOB],
            vec![
                Then::Ctl(Ctl::Term.encode()),
                Then::Ctl(Ctl::Term.encode()),
                Then::Ends(JOB, ChildStatus::Signaled(15)),
            ],
        );
        assert_eq!(f.acts().len(), 4);
    }

    #[test]
    fn a_relayed_signal_goes_to_the_jobs_group() {
        let f = run(
            &[JOB, 9],
            vec![
                Then::Ctl(Ctl::Relay(Sig::Hup).encode()),
                Then::Ends(JOB, ChildStatus::Exited(0)),
                Then::Ctl(Ctl::Relay(Sig::Usr1).encode()),
                Then::Ends(9, ChildStatus::Exited(0)),
            ],
        );
        assert_eq!(
            f.acts(),
            vec![
                Did::Relay(Sig::Hup, JOB, Some(JOB)),
                // The leader is reaped: its group's members only, found
                // in the tree.
                Did::Relay(Sig::Usr1, JOB, None),
            ]
        );
    }

    #[test]
    fn done_kills_what_is_left_without_taking_the_agent_for_gone() {
        let mut fake = Fake::new(&[JOB], vec![Then::Ctl(Ctl::Done.encode())]);
        fake.alive.insert(12, false);
        let f = EventLoop::new(fake, JOB, Vec::new()).run();
        assert_eq!(f.acts(), vec![Did::KillRound(Some(JOB))]);
        assert_eq!(
            f.did.iter().filter(|d| **d == Did::CloseCtl).count(),
            1,
            "closed once, for Done"
        );
    }

    #[test]
    fn a_failed_cgroup_kill_is_a_warning_and_the_walk_goes_on() {
        let mut fake = Fake::new(&[JOB], vec![Then::Ctl(Ctl::Kill.encode())]);
        fake.kill_fails = Some("cgroup.kill in /x failed: EACCES".into());
        let f = EventLoop::new(fake, JOB, Vec::new()).run();
        assert_eq!(
            f.sent()[0],
            Report::Warning("cgroup.kill in /x failed: EACCES".into())
        );
        assert_eq!(f.sent().last(), Some(&Report::TreeGone));
    }

    #[test]
    fn commands_sent_right_behind_the_go_frame_are_carried_out() {
        let carry = Ctl::Relay(Sig::Usr2).encode();
        let fake = Fake::new(&[JOB], vec![Then::Ends(JOB, ChildStatus::Exited(0))]);
        let f = EventLoop::new(fake, JOB, carry).run();
        assert_eq!(f.acts(), vec![Did::Relay(Sig::Usr2, JOB, Some(JOB))]);
    }

    #[test]
    fn kill_rounds_back_off_and_survivors_are_reported_once() {
        let mut fake = Fake::new(&[JOB], vec![Then::Eof]);
        // 13 survives SIGKILL (D state) until it finally ends.
        fake.alive.insert(13, true);
        let mut script = vec![Then::Eof];
        script.extend(std::iter::repeat_n(Then::Until, 12));
        script.push(Then::Ends(13, ChildStatus::Signaled(9)));
        fake.script = script.into();
        let f = EventLoop::new(fake, JOB, Vec::new()).run();
        let rounds = f.acts().len();
        assert_eq!(rounds, 13, "{:?}", f.did);
        let survivors: Vec<Report> = f
            .sent()
            .into_iter()
            .filter(|r| matches!(r, Report::Survivor { .. }))
            .collect();
        assert_eq!(
            survivors,
            vec![Report::Survivor {
                pid: 13,
                command: "job 13".into(),
                why: Survival::Uninterruptible
            }]
        );
        // 10, 20, 40, ... 500 ms between rounds, then 5 s once reported.
        assert!(f.now >= t(1_000), "{:?}", f.now);
        assert_eq!(f.sent().last(), Some(&Report::TreeGone));
    }

    #[test]
    fn a_late_wake_brings_the_kill_earlier_and_is_reported() {
        let mut fake = Fake::new(
            &[JOB],
            vec![
                // No grace: the timer's first time is the kill time.
                Then::Ctl(arm(60_000, 0, 20)),
                // The next sample was due at 250 ms; the keeper ran at
                // 265 ms: 15 ms late.
                Then::Later(Duration::from_millis(265)),
                Then::Ends(JOB, ChildStatus::Exited(0)),
            ],
        );
        fake.size = Some(TreeSize::default());
        let f = EventLoop::new(fake, JOB, Vec::new()).run();
        // The 20 ms lead, and twice the lateness on top.
        assert!(
            f.did.contains(&Did::Timer(Some(t(60_000 - 20 - 30)))),
            "{:?}",
            f.did
        );
        let lates: Vec<u32> = f
            .sent()
            .into_iter()
            .filter_map(|r| match r {
                Report::Size { late_us, .. } => Some(late_us),
                _ => None,
            })
            .collect();
        assert_eq!(lates, vec![0, 15_000], "{:?}", f.sent());
    }

    #[test]
    fn an_early_or_punctual_wake_is_no_lateness() {
        // Woken at 100 ms, before the sample due at 250 ms; then at 250 ms
        // and 500 ms exactly: the lead stays the agent's.
        let mut fake = Fake::new(
            &[JOB],
            vec![
                Then::Ctl(arm(60_000, 0, 20)),
                Then::Later(Duration::from_millis(100)),
                Then::Until,
                Then::Until,
                Then::Ends(JOB, ChildStatus::Exited(0)),
            ],
        );
        fake.size = Some(TreeSize::default());
        let f = EventLoop::new(fake, JOB, Vec::new()).run();
        let timers: Vec<&Did> = f
            .did
            .iter()
            .filter(|d| matches!(d, Did::Timer(Some(_))))
            .collect();
        assert!(
            timers.iter().all(|d| **d == Did::Timer(Some(t(59_980)))),
            "{timers:?}"
        );
    }

    #[test]
    fn a_sample_due_while_killing_does_not_make_the_loop_spin() {
        // A survivor of SIGKILL (one the keeper may not signal), the tree
        // sampled: the rounds set the pace of the waits, not the sample
        // that came due meanwhile.
        let mut fake = Fake::new(&[JOB], Vec::new());
        fake.size = Some(TreeSize {
            procs: 2,
            private_bytes: 0,
            busy_milli: 0,
            late_us: 0,
        });
        fake.alive.insert(13, true);
        let mut script = vec![Then::Eof];
        script.extend(std::iter::repeat_n(Then::Until, 30));
        script.push(Then::Ends(13, ChildStatus::Signaled(9)));
        fake.script = script.into();
        let f = EventLoop::new(fake, JOB, Vec::new()).run();
        assert_eq!(f.sent().last(), Some(&Report::TreeGone));
        assert!(f.acts().len() <= 32, "{:?}", f.acts());
    }
}
