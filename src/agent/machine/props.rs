//! The machine's properties over generated runs: every order and timing of
//! events (renewals lower or higher, failures, refusals, signals, pauses,
//! the job's end) against the rules of `mod.rs`.

use proptest::prelude::*;

use super::outcome::floor_ms;
use super::state::StopReason;
use super::tests::{PIDNS, SIGKILL, at, exit_of, gone, ms, settings, signals};
use super::*;
use crate::exit::{self, ChildStatus};
use crate::lease::RefusalReason;
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;
use crate::time::deadline::{KILL_LEAD, TreeSize};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The agent is paused before it had any reason to act; meanwhile
    /// the job ends by itself (stamped `end`) and the agent resumes
    /// later. Whether the loop sees the clock or the keeper's report
    /// first, the status is 124 exactly when the job ended at or after
    /// the deadline, and the job's own status otherwise.
    #[test]
    fn exit_status_follows_the_exit_stamp_not_the_event_order(
        ttl in 1000u64..10_000,
        grace_frac in 0u64..100,
        pause_frac in 0u64..100,
        end_after_pause in 0u64..12_000,
        resume_after_end in 1u64..5000,
        drift_ppm in prop::sample::select(vec![0u32, 1_000, 50_000]),
        clock_first in any::<bool>(),
        code in 0i32..3,
    ) {
        let grace = ttl * grace_frac / 100;
        let st = Settings { drift_ppm, ..settings(ttl, grace) };
        let mut m = Machine::new(at(0), ms(ttl), st);
        m.step(Event::ChildStarted { pid: 4, containment: PIDNS }, at(1));
        let term = (m.term_time().since_boot().as_millis() as u64).saturating_sub(1_000_000);
        prop_assume!(term > 2);
        let pause = 2 + (term - 2) * pause_frac / 100;
        prop_assert!(m.next_wake().is_some_and(|w| w > at(pause)));
        let end = pause + end_after_pause;
        let resume = at(end + resume_after_end);
        let exited = Event::ChildExited { status: ChildStatus::Exited(code), at: at(end) };
        let mut actions = Vec::new();
        if clock_first {
            actions.extend(m.step(Event::Tick, resume));
            actions.extend(m.step(exited, resume));
        } else {
            actions.extend(m.step(exited, resume));
            actions.extend(m.step(Event::Tick, resume));
        }
        if !m.is_finished() {
            let t = (resume + ms(1)).since_boot().as_millis() as u64 - 1_000_000;
            actions.extend(gone(&mut m, t));
        }
        // The keeper's timer stops the job at the term time even while
        // the agent is paused: an end from then on counts as lost.
        let expected = if at(end) >= floor_ms(m.term_time()) { exit::LEASE_LOST } else { code as u8 };
        prop_assert_eq!(exit_of(&actions), Some(expected));
    }
}

/// One input of a generated run.
#[derive(Clone, Debug)]
enum Op {
    /// Time passes with the loop awake (it ticks at every `next_wake`).
    Advance(u64),
    /// Time passes with the agent paused (no ticks).
    Pause(u64),
    /// A renewal sent `lag` ms ago (but not before the previous one:
    /// renewals are sequential) is answered.
    Renewed {
        lag: u64,
        ttl: u64,
    },
    RenewFailed,
    Refused,
    Signal(Sig),
    Exit(i32),
    /// The keeper's claim that the tree is gone (only once it is).
    TreeGone,
    /// The agent reaps the keeper: nothing left (only once the tree is
    /// gone, or the agent killed it), or orphans left.
    Reaped(bool),
    /// The keeper's sample of the tree: processes, MiB.
    Sized(u32, u64),
    /// The job's leader stopped (Ctrl-Z): nothing changes for the lease.
    Stopped,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..4000).prop_map(Op::Advance),
        1 => (0u64..8000).prop_map(Op::Pause),
        4 => ((0u64..3000), (500u64..6000)).prop_map(|(lag, ttl)| Op::Renewed { lag, ttl }),
        2 => Just(Op::RenewFailed),
        1 => Just(Op::Refused),
        1 => prop::sample::select(Sig::caught().collect::<Vec<_>>()).prop_map(Op::Signal),
        1 => (0i32..3).prop_map(Op::Exit),
        1 => Just(Op::TreeGone),
        1 => any::<bool>().prop_map(Op::Reaped),
        1 => ((0u32..5_000), (0u64..8_192)).prop_map(|(p, m)| Op::Sized(p, m)),
        1 => Just(Op::Stopped),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever the order and timing of events:
    /// - SIGKILL is never later than the deadline (the loop wakes at
    ///   `next_wake`; after a pause, the first step kills);
    /// - the job is never stopped while the lease is provably valid
    ///   with more than grace left (no refusal, no stop signal, leader
    ///   still running);
    /// - the local deadline never exceeds what the renewals prove, and
    ///   is the latest renewal's `sent + ttl·(1 − ρ) − ε` while the
    ///   lease is held (lower or higher than before);
    /// - whatever the tree's size, the kill time keeps its lead, and a
    ///   size that moves it into the past kills in that same step;
    /// - the lease is released only after the agent reaped the keeper and
    ///   found nothing left: a `TreeGone` report alone never releases.
    #[test]
    fn kill_never_late_and_never_early(
        ttl in 1000u64..10_000,
        grace_frac in 0u64..100,
        start_delay in 0u64..200,
        drift_ppm in prop::sample::select(vec![0u32, 1_000, 50_000]),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let grace = ttl * grace_frac / 100;
        let st = Settings { drift_ppm, ..settings(ttl, grace) };
        let mut m = Machine::new(at(0), ms(ttl), st);
        let mut now = at(start_delay);
        // What the authority's answers prove: the latest renewal's send
        // time + ttl (its expiry is no earlier), and the budgeted deadline.
        let mut proven = at(0) + ms(ttl);
        let mut budget = st.deadline(at(0), ms(ttl));
        let mut last_sent = at(0);
        let mut killed = false;
        let mut justified_stop = false;
        let mut leader_running = true;
        let mut pending_exit = None;
        let mut exit_seen = false;
        let mut stopping = false;
        let mut reaped = None;
        let first = m.step(Event::ChildStarted { pid: 10, containment: PIDNS }, now);

        let check = |m: &Machine, actions: &[Action], now: BootInstant, relay: Option<Sig>,
                         killed: &mut bool, stopping: &mut bool, justified: bool, (proven, budget): (BootInstant, BootInstant), leader_running: bool| {
            for s in signals(actions) {
                if Some(s) == relay { continue; }
                let first_stop = !*stopping;
                *stopping = true;
                if s == SIGKILL { *killed = true; }
                // Judge the decision to stop; its SIGKILL follows from it.
                let lead = m.deadline().saturating_since(m.kill_time()).max(KILL_LEAD);
                prop_assert!(
                    !first_stop || justified || !leader_running || now >= budget - ms(grace).max(lead),
                    "signal {s:?} at {now:?} with the lease provably valid until {budget:?} (grace {grace})"
                );
            }
            prop_assert!(m.deadline() <= proven);
            prop_assert_eq!(m.deadline(), budget);
            if leader_running && !m.is_finished() {
                if now >= m.kill_time() {
                    prop_assert!(*killed, "past the kill time at {now:?} ({:?}) without SIGKILL", m.kill_time());
                } else if !*killed {
                    let w = m.next_wake();
                    prop_assert!(w.is_some_and(|w| w <= m.kill_time()), "next wake {w:?} after kill time {:?}", m.kill_time());
                }
                prop_assert!(m.kill_time() < m.deadline());
            }
            Ok(())
        };

        check(&m, &first, now, None, &mut killed, &mut stopping, justified_stop, (proven, budget), leader_running)?;
        for op in ops {
            if m.is_finished() { break; }
            let (event, relay) = match op {
                Op::Advance(d) => {
                    let target = now + ms(d);
                    while let Some(w) = m.next_wake() {
                        if w > target || m.is_finished() { break; }
                        now = now.max(w);
                        let a = m.step(Event::Tick, now);
                        exit_seen |= exit_of(&a).is_some();
                        check(&m, &a, now, None, &mut killed, &mut stopping, justified_stop, (proven, budget), leader_running)?;
                        if killed && leader_running && pending_exit.is_none() {
                            // SIGKILL ends the leader.
                            pending_exit = Some(ChildStatus::Signaled(9));
                        }
                        if let Some(w2) = m.next_wake() { if w2 <= now { break; } }
                    }
                    now = target;
                    (Event::Tick, None)
                }
                Op::Pause(d) => { now = now + ms(d); (Event::Tick, None) }
                Op::Renewed { lag, ttl: t } => {
                    let sent = now.saturating_sub(ms(lag)).max(last_sent);
                    last_sent = sent;
                    // The machine's own view of "lost" decides which rule
                    // applies; the model then checks the deadline it keeps.
                    let frozen = m.lease_lost()
                        || m.stop.is_some_and(|s| s.reason == StopReason::DeadlineNear)
                        || m.keeper_acted(now);
                    if !frozen {
                        proven = sent + ms(t);
                        budget = st.deadline(sent, ms(t));
                    } else {
                        proven = proven.min(sent + ms(t));
                        budget = budget.min(st.deadline(sent, ms(t)));
                    }
                    (Event::Renewed { sent_at: sent, ttl: ms(t) }, None)
                }
                Op::RenewFailed => (Event::RenewFailed { error: "x".into() }, None),
                Op::Refused => {
                    justified_stop = true;
                    (Event::Refused { reason: RefusalReason::Superseded, message: String::new() }, None)
                }
                Op::Signal(s) => {
                    if s.ends_run() { justified_stop = true; }
                    (Event::Signal(s), Some(s))
                }
                Op::Exit(c) => {
                    if !leader_running { continue; }
                    leader_running = false;
                    (Event::ChildExited { status: ChildStatus::Exited(c), at: now }, None)
                }
                Op::TreeGone => {
                    if leader_running { continue; }
                    (Event::TreeGone, None)
                }
                Op::Reaped(tree_empty) => {
                    if reaped.is_some() || (tree_empty && leader_running && !killed) { continue; }
                    reaped = Some(tree_empty);
                    // Orphans of a lost keeper are killed at once.
                    if !tree_empty { justified_stop = true; }
                    if tree_empty { leader_running = false; }
                    (Event::KeeperReaped { tree_empty }, None)
                }
                Op::Sized(procs, mib) => {
                    (Event::TreeSized(TreeSize { procs, private_bytes: mib << 20, ..TreeSize::default() }), None)
                }
                Op::Stopped => (Event::JobStopped, None),
            };
            let a = m.step(event, now);
            let released = a.iter().any(|x| matches!(x, Action::Release { .. }));
            prop_assert!(!released || reaped == Some(true), "released without the agent's own finding: {a:?}");
            exit_seen |= exit_of(&a).is_some();
            check(&m, &a, now, relay, &mut killed, &mut stopping, justified_stop, (proven, budget), leader_running)?;
            if let Some(status) = pending_exit.take() {
                if leader_running {
                    leader_running = false;
                    let a = m.step(Event::ChildExited { status, at: now }, now);
                    exit_seen |= exit_of(&a).is_some();
                    check(&m, &a, now, None, &mut killed, &mut stopping, justified_stop, (proven, budget), leader_running)?;
                }
            }
            prop_assert_eq!(m.is_finished(), exit_seen, "finished exactly when an exit was decided");
        }
    }
}
