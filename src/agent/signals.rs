//! The signal thread: turns the six relayed signals into events.
//!
//! Handlers are installed (by signal-hook, which only writes to a self-pipe
//! in the handler) before the lease is acquired, so a SIGTERM during acquire
//! or `--wait` is seen too. The thread only forwards; the supervisor loop
//! decides what each signal means:
//! - SIGTERM, SIGINT, SIGQUIT: relayed to the job's group, then the job is
//!   stopped (grace, SIGKILL) and the lease released as `cancelled`;
//! - SIGHUP, SIGUSR1, SIGUSR2: relayed only.
//!
//! Signals not listed keep their default action; SIGKILL and SIGSTOP cannot be
//! caught, and are what the keeper (SIGKILL) and the deadline-on-wake rule
//! (SIGSTOP) exist for.

use crossbeam_channel::Sender;
use signal_hook::iterator::Signals;

use crate::agent::machine::Event;
use crate::keeper::RELAYED;

/// Installs the handlers and starts the forwarding thread.
pub fn spawn(events: Sender<Event>) -> std::io::Result<()> {
    let mut signals = Signals::new(RELAYED)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if events.send(Event::Signal(sig)).is_err() {
                    break;
                }
            }
        })?;
    Ok(())
}

/// Whether a signal asks the agent to stop (not only to relay).
pub fn is_stop_signal(sig: i32) -> bool {
    matches!(
        sig,
        signal_hook::consts::SIGTERM | signal_hook::consts::SIGINT | signal_hook::consts::SIGQUIT
    )
}
