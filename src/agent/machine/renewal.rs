//! The machine and the authority's answers: a renewal sets the deadline
//! (later or earlier), a failed one only counts the time left, a refusal
//! loses the lease for good. Once lost, always lost.

use std::time::Duration;

use super::events::Action;
use super::state::{Lease, Machine, Phase, StopReason};
use crate::agent::report::{Loss, LostWhy, Notice, Status};
use crate::agent::state_file::LeaseView;
use crate::lease::RefusalReason;
use crate::time::clock::BootInstant;

impl Machine {
    pub(super) fn on_renewed(
        &mut self,
        sent_at: BootInstant,
        ttl: Duration,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        let deadline = self.settings.deadline(sent_at, ttl);
        if self.lease_lost()
            || self
                .stop
                .is_some_and(|s| s.reason == StopReason::DeadlineNear)
            || self.keeper_acted(now)
        {
            // Once lost, always lost; but an answer saying the lease ends
            // even sooner still brings SIGKILL forward.
            if deadline < self.deadline {
                self.deadline = deadline;
                if self.job_alive() {
                    out.push(self.arm_keeper());
                }
            }
            return;
        }
        // Renewals are sequential: this answer is the authority's latest
        // word, whether it granted more or less than before.
        self.deadline = deadline;
        if ttl != self.ttl {
            let was = self.ttl;
            self.ttl = ttl;
            self.grace = self.settings.fitted(ttl).1;
            out.push(Action::Report(Notice::TtlChanged {
                ttl,
                was,
                grace: self.grace,
            }));
        }
        if let Lease::Failing { since } = self.lease {
            out.push(Action::Report(Notice::RenewalsRecovered {
                after: now.saturating_since(since),
                left: now.until(self.deadline),
            }));
        }
        self.lease = Lease::Valid;
        if self.job_alive() {
            out.push(self.arm_keeper());
        }
        out.push(Action::Publish(LeaseView::Valid, Status::Holding));
    }

    pub(super) fn on_renew_failed(
        &mut self,
        error: String,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        match self.lease {
            Lease::Valid => {
                self.lease = Lease::Failing { since: now };
                out.push(Action::Report(Notice::RenewalFailing {
                    error,
                    left: now.until(self.deadline),
                }));
                out.push(Action::Publish(
                    LeaseView::Renewing,
                    Status::RenewalsFailing,
                ));
            }
            Lease::Failing { since } => {
                let since = now.saturating_since(since);
                out.push(Action::Report(Notice::RenewalStillFailing { error, since }));
                out.push(Action::Publish(
                    LeaseView::Renewing,
                    Status::RenewalsFailingFor(since),
                ));
            }
            Lease::Refused(_) | Lease::Expired => {}
        }
    }

    pub(super) fn on_refused(
        &mut self,
        reason: RefusalReason,
        message: String,
        now: BootInstant,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::StopHeartbeat);
        if matches!(self.lease, Lease::Refused(_)) {
            return;
        }
        if self.lose(Lease::Refused(reason), now) {
            out.push(Action::Report(Notice::LeaseLost(LostWhy::Refused {
                reason,
                message,
            })));
            out.push(Action::Publish(
                LeaseView::Lost,
                Status::Lost(Loss::Refused(reason)),
            ));
        }
        if self.job_alive() && !self.killed() {
            match self.stop {
                // Already stopping for another reason: only bring SIGKILL forward.
                Some(ref mut s) => {
                    if let Phase::Terming { kill_at } = &mut s.phase {
                        *kill_at = (*kill_at).min(now + self.grace);
                    }
                }
                None => self.begin_stop(StopReason::Refused(reason), now + self.grace, now, out),
            }
        }
    }
}
