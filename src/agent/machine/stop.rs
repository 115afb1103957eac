//! The machine stopping the job's tree: SIGTERM, then SIGKILL when due
//! (never after the kill time), and the signals sent to the agent itself
//! (relayed, or a stop; a second SIGINT or SIGTERM kills at once).

use super::events::{Action, Stop, passed_on};
use super::state::{Machine, Phase, StopReason, Stopping};
use crate::agent::report::{Notice, Status};
use crate::agent::state_file::LeaseView;
use crate::sys::signal::Sig;
use crate::time::clock::BootInstant;

impl Machine {
    /// SIGTERM to the tree now (or once the group is known), SIGKILL at
    /// `kill_at` (never after the kill time).
    pub(super) fn begin_stop(
        &mut self,
        reason: StopReason,
        kill_at: BootInstant,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        let kill_at = kill_at.min(self.kill_time());
        self.stop = Some(Stopping {
            reason,
            phase: Phase::Terming { kill_at },
        });
        if self.group_known() {
            out.push(Action::Stop(Stop::Term));
        }
        if reason != StopReason::Drain {
            out.push(Action::Stopping(Status::StoppingCommand));
            out.push(Action::Report(Notice::Stopping {
                kill_in: now.until(kill_at),
            }));
        }
    }

    /// SIGKILL, even before the keeper reported the job started: a keeper
    /// stopped before its first report still gets SIGCONT, and the agent
    /// walks the tree itself.
    pub(super) fn kill(&mut self, now: BootInstant, out: &mut Vec<Action>) {
        if let Some(stop) = self.stop.as_mut() {
            if let Phase::Terming { .. } = stop.phase {
                stop.phase = Phase::Killed { at: now };
                out.push(Action::Stop(Stop::Kill));
            }
        }
    }

    pub(super) fn on_signal(&mut self, sig: Sig, now: BootInstant, out: &mut Vec<Action>) {
        if !self.job_alive() {
            return;
        }
        if self.group_known() {
            out.push(passed_on(sig));
        } else if !sig.ends_run() {
            // The job may already run while its start report is still on
            // the way: relay once the group is known, never drop it. (Stop
            // signals are carried out by the stop itself, on start.)
            self.early_signals.push(sig);
        }
        if !sig.ends_run() {
            return;
        }
        if self.cancel.is_some() {
            // A second SIGINT or SIGTERM: SIGKILL now.
            if matches!(sig, Sig::Int | Sig::Term) && self.stop.is_some() && !self.killed() {
                self.kill(now, out);
            }
            return;
        }
        self.cancel = Some(sig);
        out.push(Action::Report(Notice::Cancelling { sig }));
        match self.stop {
            Some(ref mut s) => {
                if let Phase::Terming { kill_at } = &mut s.phase {
                    *kill_at = (*kill_at).min(now + self.grace);
                }
            }
            None => {
                // The relayed signal is the stop signal; SIGKILL follows.
                self.stop = Some(Stopping {
                    reason: StopReason::Cancelled(sig),
                    phase: Phase::Terming {
                        kill_at: (now + self.grace).min(self.kill_time()),
                    },
                });
                out.push(Action::Stopping(Status::StoppingForSignal(sig)));
                out.push(Action::Publish(
                    LeaseView::Stopping,
                    Status::SignalStop(sig),
                ));
            }
        }
    }
}
