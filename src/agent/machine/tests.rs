//! The machine by example: one rule a test, each through `step` as the
//! supervisor loop drives it. The helpers serve `props.rs` too.

use std::time::Duration;

use super::deadline::TREE_GONE_TIMEOUT;
use super::*;
use crate::agent::report::{Loss, Notice, Status};
use crate::agent::state_file::LeaseView;
use crate::exit;
use crate::exit::ChildStatus;
use crate::keeper::protocol::Containment;
use crate::lease::{Outcome, RefusalReason};
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;
use crate::time::deadline::{Deadline, KILL_LEAD};

pub(super) fn at(ms: u64) -> BootInstant {
    BootInstant::from_since_boot(Duration::from_millis(1_000_000 + ms))
}

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) const PIDNS: Containment = Containment::Pidns;
pub(super) const SIGTERM: Sig = Sig::Term;
pub(super) const SIGKILL: Sig = Sig::Kill;
pub(super) const SIGINT: Sig = Sig::Int;

/// No drift budget, no remapping: the deadline is `sent + ttl - 1ms`.
pub(super) fn settings(ttl: u64, grace: u64) -> Settings {
    Settings {
        asked_ttl: ms(ttl),
        heartbeat: ms(ttl / 3),
        grace: ms(grace),
        drift_ppm: 0,
        remap_exit: false,
    }
}

fn machine(ttl: u64, grace: u64) -> Machine {
    Machine::new(at(0), ms(ttl), settings(ttl, grace))
}

pub(super) fn release(outcome: Outcome, exit_code: Option<i32>) -> Action {
    Action::Release { outcome, exit_code }
}

/// The signals that reach the job, in order: SIGTERM and SIGKILL of the
/// tree's stops, and the relayed ones.
pub(super) fn signals(actions: &[Action]) -> Vec<Sig> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Stop(Stop::Term) => Some(Sig::Term),
            Action::Stop(Stop::Kill) => Some(Sig::Kill),
            Action::Relay(s) => Some(*s),
            _ => None,
        })
        .collect()
}

pub(super) fn exit_of(actions: &[Action]) -> Option<u8> {
    actions.iter().find_map(|a| match a {
        Action::Exit(c) => Some(*c),
        _ => None,
    })
}

/// The leader ends at `at` (seen at `seen`), then the keeper reports the
/// tree gone a millisecond later and the agent reaps it: the actions of
/// that last step.
pub(super) fn end(m: &mut Machine, status: ChildStatus, at_ms: u64, seen_ms: u64) -> Vec<Action> {
    m.step(
        Event::ChildExited {
            status,
            at: at(at_ms),
        },
        at(seen_ms),
    );
    gone(m, seen_ms + 1)
}

/// The keeper reports the tree gone, then the agent reaps it and finds
/// nothing left: the actions of both steps.
pub(super) fn gone(m: &mut Machine, at_ms: u64) -> Vec<Action> {
    let mut a = m.step(Event::TreeGone, at(at_ms));
    a.extend(m.step(Event::KeeperReaped { tree_empty: true }, at(at_ms)));
    a
}

fn started(ttl: u64, grace: u64) -> Machine {
    let mut m = machine(ttl, grace);
    m.step(
        Event::ChildStarted {
            pid: 100,
            containment: PIDNS,
        },
        at(1),
    );
    m
}

#[test]
fn silence_gives_term_at_deadline_minus_grace_and_kill_at_deadline() {
    // Deadline: 3000 - 1 ms of rounding margin (no drift budget here).
    let mut m = started(3000, 500);
    assert_eq!(m.deadline(), at(2999));
    assert_eq!(m.next_wake(), Some(at(2499)));
    assert!(signals(&m.step(Event::Tick, at(2498))).is_empty());
    assert_eq!(signals(&m.step(Event::Tick, at(2499))), vec![SIGTERM]);
    // SIGKILL leads the deadline by KILL_LEAD.
    assert_eq!(m.next_wake(), Some(at(2979)));
    assert!(signals(&m.step(Event::Tick, at(2978))).is_empty());
    assert_eq!(signals(&m.step(Event::Tick, at(2979))), vec![SIGKILL]);
    let a = m.step(
        Event::ChildExited {
            status: ChildStatus::Signaled(9),
            at: at(3001),
        },
        at(3001),
    );
    assert!(signals(&a).is_empty());
    let a = gone(&mut m, 3002);
    assert_eq!(exit_of(&a), Some(exit::LEASE_LOST));
    assert!(a.contains(&release(Outcome::Lost, None)));
}

#[test]
fn every_renewal_sets_the_deadline_from_its_send_time_lower_or_higher() {
    let mut m = started(3000, 500);
    m.step(
        Event::Renewed {
            sent_at: at(1000),
            ttl: ms(3000),
        },
        at(1900),
    );
    assert_eq!(m.deadline(), at(3999));
    // A renewal that grants less moves the deadline down, and grace
    // shrinks to fit the new ttl (a sixth of it).
    let a = m.step(
        Event::Renewed {
            sent_at: at(2000),
            ttl: ms(600),
        },
        at(2010),
    );
    assert_eq!(m.deadline(), at(2599));
    assert_eq!(m.grace(), ms(100));
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Report(Notice::TtlChanged { .. })))
    );
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Publish(LeaseView::Valid, _)))
    );
    assert_eq!(m.next_wake(), Some(at(2499)));
    // And one that grants more moves it up again, grace back to --grace.
    m.step(
        Event::Renewed {
            sent_at: at(2100),
            ttl: ms(3000),
        },
        at(2110),
    );
    assert_eq!(m.deadline(), at(5099));
    assert_eq!(m.grace(), ms(500));
}

#[test]
fn after_a_loss_a_late_renewal_can_only_bring_the_deadline_forward() {
    let mut m = started(3000, 500);
    m.step(Event::Tick, at(2499));
    assert_eq!(m.deadline(), at(2999));
    m.step(
        Event::Renewed {
            sent_at: at(2400),
            ttl: ms(3000),
        },
        at(2500),
    );
    assert_eq!(m.deadline(), at(2999), "once lost, always lost");
    m.step(
        Event::Renewed {
            sent_at: at(2400),
            ttl: ms(500),
        },
        at(2510),
    );
    assert_eq!(
        m.deadline(),
        at(2899),
        "the authority's word on expiry still counts"
    );
    assert_eq!(signals(&m.step(Event::Tick, at(2879))), vec![SIGKILL]);
}

fn released(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::Release { .. }))
}

fn arms(actions: &[Action]) -> Vec<BootInstant> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ArmKeeper(d) => Some(d.at),
            _ => None,
        })
        .collect()
}

#[test]
fn a_tree_not_reported_gone_after_sigkill_is_never_released_and_exits_125() {
    let mut m = started(3000, 500);
    m.step(Event::Tick, at(2499));
    assert_eq!(signals(&m.step(Event::Tick, at(2979))), vec![SIGKILL]);
    // No exit, no tree-gone report: the next wake is the timeout, in the future.
    assert_eq!(m.next_wake(), Some(at(2979) + TREE_GONE_TIMEOUT));
    let a = m.step(Event::Tick, at(2979) + TREE_GONE_TIMEOUT);
    assert!(m.is_finished());
    assert_eq!(m.next_wake(), None);
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(!released(&a), "{a:?}");
    assert!(a.contains(&Action::Report(Notice::NotReleasing)));
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Report(Notice::GroupNotGone { .. })))
    );
    // The job ended by itself with 0, a descendant survives: not
    // `succeeded`, not released, 125.
    let mut m = started(30_000, 1000);
    m.step(
        Event::ChildExited {
            status: ChildStatus::Exited(0),
            at: at(100),
        },
        at(100),
    );
    assert_eq!(signals(&m.step(Event::Tick, at(1100))), vec![SIGKILL]);
    let a = m.step(Event::Tick, at(1100) + TREE_GONE_TIMEOUT);
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(!released(&a));
    assert!(a.contains(&Action::Finished {
        outcome: Outcome::Failed,
        status: exit::AGENT_FAILED
    }));
}

#[test]
fn keeper_loss_kills_and_never_releases() {
    let mut m = started(30_000, 1000);
    let a = m.step(Event::KeeperReaped { tree_empty: false }, at(100));
    assert_eq!(signals(&a), vec![SIGKILL]);
    assert!(!m.is_finished());
    let a = m.step(Event::Tick, at(100) + TREE_GONE_TIMEOUT);
    // A last sweep for the keeper's orphans re-parented since, then the end.
    assert_eq!(signals(&a), vec![SIGKILL]);
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(!released(&a));
    // Keeper lost before its start report: the agent still kills what
    // it can reach, and nothing is released.
    let mut m = machine(30_000, 1000);
    let a = m.step(Event::KeeperReaped { tree_empty: false }, at(5));
    assert_eq!(signals(&a), vec![SIGKILL]);
    let a = m.step(Event::Tick, at(5) + TREE_GONE_TIMEOUT);
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(!released(&a));
}

#[test]
fn sigkill_goes_out_at_the_kill_time_even_without_a_start_report() {
    // The job stopped its keeper before the keeper reported it started.
    let mut m = machine(3000, 500);
    m.step(Event::Tick, at(2499));
    assert_eq!(signals(&m.step(Event::Tick, at(2979))), vec![SIGKILL]);
    let a = m.step(Event::Tick, at(2979) + TREE_GONE_TIMEOUT);
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(!released(&a));
}

#[test]
fn the_keeper_is_armed_on_start_and_after_every_renewal() {
    let mut m = machine(3000, 500);
    let a = m.step(
        Event::ChildStarted {
            pid: 4,
            containment: PIDNS,
        },
        at(1),
    );
    assert_eq!(arms(&a), vec![at(2999)]);
    assert_eq!(
        m.arm_keeper(),
        Action::ArmKeeper(Deadline {
            at: at(2999),
            grace: ms(500),
            kill_lead: KILL_LEAD,
            ttl: ms(3000),
        })
    );
    let a = m.step(
        Event::Renewed {
            sent_at: at(1000),
            ttl: ms(3000),
        },
        at(1010),
    );
    assert_eq!(arms(&a), vec![at(3999)]);
    // Lower ttl: lower deadline, handed over too.
    let a = m.step(
        Event::Renewed {
            sent_at: at(1500),
            ttl: ms(1000),
        },
        at(1510),
    );
    assert_eq!(arms(&a), vec![at(2499)]);
    // Once lost, only an earlier deadline is handed over.
    m.step(Event::Tick, at(2400));
    let a = m.step(
        Event::Renewed {
            sent_at: at(2300),
            ttl: ms(3000),
        },
        at(2410),
    );
    assert!(arms(&a).is_empty());
}

#[test]
fn a_stopped_job_changes_nothing_for_the_lease() {
    let mut m = started(30_000, 1000);
    let wake = m.next_wake();
    let a = m.step(Event::JobStopped, at(100));
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(m.next_wake(), wake);
    let a = m.step(
        Event::Renewed {
            sent_at: at(200),
            ttl: ms(30_000),
        },
        at(210),
    );
    assert_eq!(arms(&a).len(), 1, "renewals still count while stopped");
}

#[test]
fn job_control_signals_are_relayed_and_change_nothing_else() {
    let mut m = started(30_000, 1000);
    for sig in Sig::JOB_CONTROL {
        let a = m.step(Event::Signal(sig), at(100));
        assert_eq!(signals(&a), vec![sig]);
        assert!(exit_of(&a).is_none());
    }
    let a = m.step(
        Event::Renewed {
            sent_at: at(200),
            ttl: ms(30_000),
        },
        at(210),
    );
    assert_eq!(arms(&a).len(), 1, "renewals still count while paused");
    assert_eq!(m.next_wake(), Some(at(200 + 30_000 - 1 - 1000)));
}

#[test]
fn a_second_sigint_or_sigterm_kills_at_once() {
    for second in [SIGINT, SIGTERM] {
        let mut m = started(30_000, 5000);
        let a = m.step(Event::Signal(SIGINT), at(100));
        assert_eq!(signals(&a), vec![SIGINT]);
        let a = m.step(Event::Signal(second), at(200));
        assert_eq!(signals(&a), vec![second, SIGKILL]);
    }
    // A second SIGHUP is only relayed.
    let mut m = started(30_000, 5000);
    m.step(Event::Signal(SIGTERM), at(100));
    assert_eq!(
        signals(&m.step(Event::Signal(Sig::Hup), at(200))),
        vec![Sig::Hup]
    );
}

#[test]
fn a_signal_that_would_end_the_agent_stops_and_releases_like_sigterm() {
    for sig in Sig::FATAL {
        let mut m = started(30_000, 1000);
        let a = m.step(Event::Signal(sig), at(100));
        assert_eq!(signals(&a), vec![SIGTERM], "{sig:?}");
        assert!(a.contains(&Action::Report(Notice::Cancelling { sig })));
        assert_eq!(signals(&m.step(Event::Tick, at(1100))), vec![SIGKILL]);
        let a = end(&mut m, ChildStatus::Exited(3), 1101, 1101);
        assert!(a.contains(&release(Outcome::Cancelled, Some(3))), "{a:?}");
    }
}

#[test]
fn remap_exit_turns_the_jobs_own_124_and_125_into_1() {
    for (code, plain, remapped) in [(124, 124, 1), (125, 125, 1), (3, 3, 3), (0, 0, 0)] {
        for remap in [false, true] {
            let s = Settings {
                remap_exit: remap,
                ..settings(30_000, 1000)
            };
            let mut m = Machine::new(at(0), ms(30_000), s);
            m.step(
                Event::ChildStarted {
                    pid: 3,
                    containment: PIDNS,
                },
                at(1),
            );
            let a = end(&mut m, ChildStatus::Exited(code), 10, 10);
            assert_eq!(exit_of(&a), Some(if remap { remapped } else { plain }));
            // The authority still hears the job's real code.
            assert!(
                a.iter()
                    .any(|x| matches!(x, Action::Release { exit_code: Some(c), .. } if *c == code))
            );
        }
    }
}

#[test]
fn refusal_terms_at_once_and_kills_after_grace() {
    let mut m = started(30_000, 2000);
    let a = m.step(
        Event::Refused {
            reason: RefusalReason::Revoked,
            message: String::new(),
        },
        at(100),
    );
    assert_eq!(signals(&a), vec![SIGTERM]);
    assert!(a.contains(&Action::StopHeartbeat));
    assert!(signals(&m.step(Event::Tick, at(2099))).is_empty());
    assert_eq!(signals(&m.step(Event::Tick, at(2100))), vec![SIGKILL]);
    let a = end(&mut m, ChildStatus::Signaled(9), 2101, 2101);
    assert_eq!(exit_of(&a), Some(exit::LEASE_LOST));
    assert!(
        !a.iter().any(|x| matches!(x, Action::Release { .. })),
        "no release after a refusal"
    );
}

#[test]
fn cancel_relays_the_signal_and_releases_cancelled() {
    let mut m = started(30_000, 1000);
    let a = m.step(Event::Signal(SIGINT), at(10));
    assert_eq!(signals(&a), vec![SIGINT]);
    assert_eq!(signals(&m.step(Event::Tick, at(1010))), vec![SIGKILL]);
    let a = end(&mut m, ChildStatus::Exited(3), 1011, 1011);
    assert_eq!(exit_of(&a), Some(3));
    assert!(a.contains(&release(Outcome::Cancelled, Some(3))));
}

#[test]
fn a_job_that_ended_before_the_deadline_keeps_its_status_even_if_seen_late() {
    let mut m = started(3000, 500);
    // The agent was paused; it wakes at 5000 and learns the job ended at 2000.
    let a = end(&mut m, ChildStatus::Exited(0), 2000, 5000);
    assert_eq!(exit_of(&a), Some(0));
    // One that ended after the deadline is a lost lease.
    let mut m = started(3000, 500);
    let a = end(&mut m, ChildStatus::Exited(0), 3200, 5000);
    assert_eq!(exit_of(&a), Some(exit::LEASE_LOST));
}

#[test]
fn wake_after_pause_past_deadline_kills_in_the_same_step() {
    let mut m = started(3000, 500);
    let a = m.step(
        Event::Renewed {
            sent_at: at(100),
            ttl: ms(3000),
        },
        at(9000),
    );
    assert_eq!(signals(&a), vec![SIGTERM, SIGKILL]);
}

#[test]
fn stop_decided_before_the_group_exists_is_carried_out_on_start() {
    let mut m = machine(3000, 500);
    let a = m.step(
        Event::Refused {
            reason: RefusalReason::Expired,
            message: String::new(),
        },
        at(10),
    );
    assert!(signals(&a).is_empty());
    let a = m.step(
        Event::ChildStarted {
            pid: 5,
            containment: PIDNS,
        },
        at(20),
    );
    assert_eq!(signals(&a), vec![SIGTERM]);
}

#[test]
fn signals_before_the_start_report_are_relayed_once_the_group_is_known() {
    let mut m = machine(30_000, 500);
    assert!(signals(&m.step(Event::Signal(Sig::Usr1), at(1))).is_empty());
    assert!(signals(&m.step(Event::Signal(Sig::Hup), at(2))).is_empty());
    let a = m.step(
        Event::ChildStarted {
            pid: 7,
            containment: PIDNS,
        },
        at(3),
    );
    assert_eq!(signals(&a), vec![Sig::Usr1, Sig::Hup]);
    assert!(
        signals(&m.step(Event::Tick, at(4))).is_empty(),
        "relayed once"
    );
}

#[test]
fn spawn_failure_maps_to_127_and_126() {
    for (not_found, code) in [(true, 127), (false, 126)] {
        let mut m = machine(3000, 500);
        let event = Event::SpawnFailed {
            not_found,
            message: "x".into(),
        };
        let a = m.step(event, at(1));
        // Decided, but released only once the agent has reaped the keeper.
        assert!(a.contains(&Action::Finished {
            outcome: Outcome::Failed,
            status: code
        }));
        assert!(!released(&a) && exit_of(&a).is_none(), "{a:?}");
        let a = m.step(Event::KeeperReaped { tree_empty: true }, at(2));
        assert_eq!(exit_of(&a), Some(code));
        assert!(a.contains(&release(Outcome::Failed, Some(code as i32))));
        assert!(m.is_finished());
    }
}

#[test]
fn a_spawn_failure_without_the_keepers_reaping_is_never_released() {
    let mut m = machine(3000, 500);
    m.step(
        Event::SpawnFailed {
            not_found: true,
            message: "x".into(),
        },
        at(1),
    );
    assert_eq!(m.next_wake(), Some(at(1) + TREE_GONE_TIMEOUT));
    let a = m.step(Event::Tick, at(1) + TREE_GONE_TIMEOUT);
    assert_eq!(exit_of(&a), Some(127));
    assert!(!released(&a));
    assert!(a.contains(&Action::Report(Notice::NotReleasing)));
    // And where something is left below the agent: killed, never released.
    let mut m = machine(3000, 500);
    m.step(
        Event::SpawnFailed {
            not_found: false,
            message: "x".into(),
        },
        at(1),
    );
    let a = m.step(Event::KeeperReaped { tree_empty: false }, at(2));
    assert_eq!(signals(&a), vec![SIGKILL]);
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(!released(&a));
}

#[test]
fn a_tree_gone_report_alone_never_releases() {
    let mut m = started(30_000, 1000);
    m.step(
        Event::ChildExited {
            status: ChildStatus::Exited(0),
            at: at(100),
        },
        at(100),
    );
    let a = m.step(Event::TreeGone, at(101));
    assert!(!released(&a) && exit_of(&a).is_none(), "{a:?}");
    assert!(!m.is_finished());
    // Nothing but the claim, for as long as it takes: the drain's SIGKILL
    // and then the end without a release.
    assert_eq!(signals(&m.step(Event::Tick, at(1100))), vec![SIGKILL]);
    let a = m.step(Event::Tick, at(1100) + TREE_GONE_TIMEOUT);
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(!released(&a));
    // The agent's own finding releases, with the job's status.
    let mut m = started(30_000, 1000);
    let a = end(&mut m, ChildStatus::Exited(0), 100, 100);
    assert_eq!(exit_of(&a), Some(0));
    assert!(a.contains(&release(Outcome::Succeeded, Some(0))));
}

#[test]
fn a_keeper_that_died_on_its_own_taking_the_tree_along_fails_but_releases() {
    // A PID namespace: nobody killed the keeper, it said nothing, and the
    // agent found nothing left after reaping it.
    let mut m = started(30_000, 1000);
    let a = m.step(Event::KeeperReaped { tree_empty: true }, at(500));
    assert!(a.contains(&Action::Report(Notice::KeeperLost { tree_gone: true })));
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(a.contains(&release(Outcome::Failed, None)));
}

#[test]
fn the_agents_own_sigkill_of_the_namespace_ends_the_leader_with_sigkill() {
    // Cancelled, grace over, SIGKILL (to the namespace's init): the keeper
    // never reports the leader's end, the agent reaps it and finds nothing.
    let mut m = started(30_000, 1000);
    m.step(Event::Signal(Sig::Term), at(100));
    assert_eq!(signals(&m.step(Event::Tick, at(1100))), vec![SIGKILL]);
    let a = m.step(Event::KeeperReaped { tree_empty: true }, at(1105));
    assert_eq!(exit_of(&a), Some(137));
    assert!(a.contains(&release(Outcome::Cancelled, None)));
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::Report(Notice::KeeperLost { .. })))
    );
    // For the deadline: lost, 124.
    let mut m = started(3000, 500);
    m.step(Event::Tick, at(2499));
    assert_eq!(signals(&m.step(Event::Tick, at(2979))), vec![SIGKILL]);
    let a = m.step(Event::KeeperReaped { tree_empty: true }, at(2990));
    assert_eq!(exit_of(&a), Some(exit::LEASE_LOST));
}

#[test]
fn the_kill_lead_follows_the_trees_size() {
    use crate::time::deadline::{KILL_LEAD, LEAD_PER_PROCESS, TreeSize};
    let mut m = started(30_000, 5_000);
    assert_eq!(m.kill_time(), m.deadline() - KILL_LEAD);
    let big = TreeSize {
        procs: 2_000,
        private_bytes: 0,
        busy_milli: 0,
        late_us: 0,
    };
    assert!(m.step(Event::TreeSized(big), at(10)).is_empty());
    assert_eq!(
        m.kill_time(),
        m.deadline() - KILL_LEAD - LEAD_PER_PROCESS * 2_000
    );
    // The keeper is handed the lead with the next renewal's deadline.
    let a = m.step(
        Event::Renewed {
            sent_at: at(10_000),
            ttl: ms(30_000),
        },
        at(10_010),
    );
    let lead = a.iter().find_map(|x| match x {
        Action::ArmKeeper(d) => Some(d.kill_lead),
        _ => None,
    });
    assert_eq!(lead, Some(KILL_LEAD + LEAD_PER_PROCESS * 2_000));
    // A sample that moves the kill time into the past kills at once.
    let mut m = started(4_000, 500);
    m.step(Event::Tick, at(3_499));
    let huge = TreeSize {
        procs: 100_000,
        private_bytes: 0,
        busy_milli: 0,
        late_us: 0,
    };
    let a = m.step(Event::TreeSized(huge), at(3_500));
    assert_eq!(signals(&a), vec![SIGKILL]);
    // Capped at a quarter of the ttl.
    assert_eq!(m.kill_time(), m.deadline() - ms(1_000));
}

#[test]
fn a_grant_with_less_than_grace_left_is_released_as_lost_and_never_started() {
    // ttl 2 s, grace 1.5 s: SIGTERM would be due at 499 ms.
    let settings = Settings {
        heartbeat: ms(600),
        ..settings(2000, 1500)
    };
    let mut m = Machine::new(at(0), ms(2000), settings);
    assert!(m.step(Event::Granted, at(400)).is_empty(), "in time");
    let mut m = Machine::new(at(0), ms(2000), settings);
    let a = m.step(Event::Granted, at(900));
    assert_eq!(
        a,
        vec![
            Action::Report(Notice::GrantTooLate),
            Action::StopHeartbeat,
            Action::Finished {
                outcome: Outcome::Lost,
                status: exit::LEASE_LOST
            },
            release(Outcome::Lost, None),
            Action::Exit(exit::LEASE_LOST),
        ]
    );
    assert!(m.is_finished());
    assert_eq!(m.next_wake(), None);
    // Nothing the keeper could still say changes that.
    assert!(
        m.step(
            Event::ChildStarted {
                pid: 3,
                containment: PIDNS
            },
            at(901)
        )
        .is_empty()
    );
}

#[test]
fn a_keeper_that_cannot_be_handed_the_job_ends_the_run_with_125_and_a_failed_release() {
    let mut m = machine(30_000, 1000);
    assert!(m.step(Event::Granted, at(1)).is_empty());
    let a = m.step(
        Event::KeeperNotStarted {
            error: "broken".into(),
        },
        at(2),
    );
    assert_eq!(
        a,
        vec![
            Action::Report(Notice::KeeperNotStarted {
                error: "broken".into()
            }),
            Action::StopHeartbeat,
            Action::Finished {
                outcome: Outcome::Failed,
                status: exit::AGENT_FAILED
            },
            release(Outcome::Failed, None),
            Action::Exit(exit::AGENT_FAILED),
        ]
    );
    // Once the job started, the event means nothing.
    let mut m = started(30_000, 1000);
    assert!(
        m.step(
            Event::KeeperNotStarted {
                error: "late".into()
            },
            at(2)
        )
        .is_empty()
    );
}

#[test]
fn what_a_signal_to_the_agent_becomes_for_the_job() {
    // SIGTERM and the signals that would end the agent stop the whole tree.
    for sig in std::iter::once(SIGTERM).chain(Sig::FATAL) {
        let mut m = started(30_000, 1000);
        let a = m.step(Event::Signal(sig), at(10));
        assert_eq!(a[0], Action::Stop(Stop::Term), "{sig:?}");
    }
    // SIGINT, SIGQUIT and everything else go to the job's group as they are.
    for sig in [SIGINT, Sig::Quit, Sig::Hup, Sig::Usr1, Sig::Usr2]
        .into_iter()
        .chain(Sig::JOB_CONTROL)
    {
        let mut m = started(30_000, 1000);
        let a = m.step(Event::Signal(sig), at(10));
        assert_eq!(a[0], Action::Relay(sig), "{sig:?}");
    }
    // The machine's own stops and kills are never relays.
    let mut m = started(3000, 500);
    let a = m.step(Event::Tick, at(2499));
    assert!(a.contains(&Action::Stop(Stop::Term)), "{a:?}");
    let a = m.step(Event::Tick, at(2979));
    assert!(a.contains(&Action::Stop(Stop::Kill)), "{a:?}");
    assert!(!a.iter().any(|x| matches!(x, Action::Relay(_))));
}

#[test]
fn a_keeper_lost_after_sigkill_gives_up_counting_from_the_first_sigkill() {
    let mut m = started(3000, 500);
    m.step(Event::Tick, at(2499));
    assert_eq!(signals(&m.step(Event::Tick, at(2979))), vec![SIGKILL]);
    let a = m.step(Event::KeeperReaped { tree_empty: false }, at(3500));
    assert_eq!(signals(&a), vec![SIGKILL], "killed again, by the agent");
    assert!(
        !a.iter().any(|x| matches!(x, Action::Stopping(_))),
        "already stopping"
    );
    assert!(
        m.step(Event::KeeperReaped { tree_empty: false }, at(3600))
            .is_empty(),
        "said once"
    );
    assert_eq!(m.next_wake(), Some(at(2979) + TREE_GONE_TIMEOUT));
    let a = m.step(Event::Tick, at(2979) + TREE_GONE_TIMEOUT);
    // No "not reported gone" notice: the keeper's loss said it already.
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::Report(Notice::GroupNotGone { .. })))
    );
    assert_eq!(signals(&a), vec![SIGKILL]);
    assert_eq!(exit_of(&a), Some(exit::AGENT_FAILED));
    assert!(!released(&a));
}

#[test]
fn statuses_are_typed_for_the_reporter_to_word() {
    let mut m = machine(3000, 500);
    let a = m.step(
        Event::ChildStarted {
            pid: 4,
            containment: PIDNS,
        },
        at(1),
    );
    assert!(a.contains(&Action::Ready(Status::CommandRunning)));
    assert!(a.contains(&Action::Publish(LeaseView::Valid, Status::Holding)));
    let a = m.step(Event::RenewFailed { error: "x".into() }, at(1000));
    assert!(a.contains(&Action::Publish(
        LeaseView::Renewing,
        Status::RenewalsFailing
    )));
    let a = m.step(Event::RenewFailed { error: "x".into() }, at(1500));
    assert!(a.contains(&Action::Publish(
        LeaseView::Renewing,
        Status::RenewalsFailingFor(ms(500))
    )));
    let a = m.step(Event::Tick, at(2499));
    assert!(a.contains(&Action::Publish(
        LeaseView::Lost,
        Status::Lost(Loss::RenewalsFailed)
    )));
    assert!(a.contains(&Action::Stopping(Status::StoppingCommand)));
    let mut m = started(30_000, 1000);
    let a = m.step(Event::Signal(SIGINT), at(10));
    assert!(a.contains(&Action::Stopping(Status::StoppingForSignal(SIGINT))));
    assert!(a.contains(&Action::Publish(
        LeaseView::Stopping,
        Status::SignalStop(SIGINT)
    )));
    let mut m = started(30_000, 1000);
    let a = m.step(
        Event::Refused {
            reason: RefusalReason::Revoked,
            message: String::new(),
        },
        at(10),
    );
    assert!(a.contains(&Action::Publish(
        LeaseView::Lost,
        Status::Lost(Loss::Refused(RefusalReason::Revoked))
    )));
}
