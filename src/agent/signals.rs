//! The signal thread: turns every caught signal into an event.
//!
//! Handlers are installed (by signal-hook, which only writes to a self-pipe
//! in the handler) before the lease is acquired, so a SIGTERM during acquire
//! or `--wait` is seen too. The thread only forwards; the supervisor loop
//! decides what each signal means:
//! - SIGTERM, SIGINT, SIGQUIT: relayed to the job's group, then the job is
//!   stopped (grace, SIGKILL) and the lease released as `cancelled`;
//! - SIGHUP, SIGUSR1, SIGUSR2: relayed only;
//! - SIGTSTP, SIGTTIN, SIGTTOU, SIGCONT: relayed only; the agent itself
//!   never stops, so renewals go on while the job is paused (at a
//!   terminal, Ctrl-Z goes to the job's group directly, and the front
//!   process is what stops for the shell: `agent/front.rs`);
//! - the other signals whose default would end the agent (`Sig::FATAL`):
//!   stop and release, like SIGTERM;
//! - any of them before the job exists (during acquire): a stop signal ends
//!   the agent without starting the job, the others are dropped.
//!
//! Signals not listed keep their default action; SIGKILL and SIGSTOP cannot be
//! caught, and are what the keeper's own deadline timer and its EOF rule
//! exist for.

use crossbeam_channel::Sender;
use signal_hook::iterator::Signals;

use crate::agent::machine::Event;
use crate::sys::signal::Sig;

/// Installs the handlers and starts the forwarding thread.
pub fn spawn(events: Sender<Event>) -> std::io::Result<()> {
    let numbers: Vec<i32> = Sig::caught().map(Sig::number).collect();
    let mut signals = Signals::new(numbers)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for n in signals.forever() {
                // Only `Sig::caught()` is registered.
                let Some(sig) = Sig::from_number(n) else {
                    continue;
                };
                if events.send(Event::Signal(sig)).is_err() {
                    break;
                }
            }
        })?;
    Ok(())
}
