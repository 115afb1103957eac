//! The one signal type of the crate: every signal the agent catches,
//! relays or sends, and the keeper relays, is a [`Sig`].
//!
//! There is no "unknown signal" at run time: a number becomes a `Sig` once,
//! at the edge where the kernel hands it over ([`Sig::from_number`]), and
//! everything past that edge works with the enum (the machine's events and
//! actions, the relay list, `kill(2)` through [`Sig::to_rustix`]).

use signal_hook::consts;

/// A signal the agent relays to the job or sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sig {
    Term,
    Int,
    Quit,
    Hup,
    Usr1,
    Usr2,
    Kill,
}

impl Sig {
    /// The signals the agent catches and relays to the job's group.
    pub const RELAYED: [Sig; 6] = [
        Sig::Term,
        Sig::Int,
        Sig::Hup,
        Sig::Quit,
        Sig::Usr1,
        Sig::Usr2,
    ];

    /// The signal's number on Linux.
    pub fn number(self) -> i32 {
        match self {
            Sig::Term => consts::SIGTERM,
            Sig::Int => consts::SIGINT,
            Sig::Quit => consts::SIGQUIT,
            Sig::Hup => consts::SIGHUP,
            Sig::Usr1 => consts::SIGUSR1,
            Sig::Usr2 => consts::SIGUSR2,
            Sig::Kill => consts::SIGKILL,
        }
    }

    /// The signal with this number, if it is one the agent knows.
    pub fn from_number(n: i32) -> Option<Sig> {
        [
            Sig::Term,
            Sig::Int,
            Sig::Quit,
            Sig::Hup,
            Sig::Usr1,
            Sig::Usr2,
            Sig::Kill,
        ]
        .into_iter()
        .find(|s| s.number() == n)
    }

    /// Whether this signal, sent to the agent, asks it to stop the job (not
    /// only to relay).
    pub fn is_stop(self) -> bool {
        matches!(self, Sig::Term | Sig::Int | Sig::Quit)
    }

    /// The same signal for `kill(2)`.
    pub fn to_rustix(self) -> rustix::process::Signal {
        use rustix::process::Signal;
        match self {
            Sig::Term => Signal::TERM,
            Sig::Int => Signal::INT,
            Sig::Quit => Signal::QUIT,
            Sig::Hup => Signal::HUP,
            Sig::Usr1 => Signal::USR1,
            Sig::Usr2 => Signal::USR2,
            Sig::Kill => Signal::KILL,
        }
    }

    /// The exit status of a process killed by this signal (128 + N).
    pub fn exit_status(self) -> u8 {
        (128 + self.number()) as u8
    }
}

impl std::fmt::Display for Sig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The number, as the log lines have always said ("signal 15").
        write!(f, "{}", self.number())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_and_stop_signals() {
        for s in Sig::RELAYED.into_iter().chain([Sig::Kill]) {
            assert_eq!(Sig::from_number(s.number()), Some(s));
            assert_eq!(s.to_rustix().as_raw(), s.number());
        }
        assert_eq!(Sig::from_number(0), None);
        assert_eq!(Sig::Term.exit_status(), 143);
        let stops: Vec<Sig> = Sig::RELAYED.into_iter().filter(|s| s.is_stop()).collect();
        assert_eq!(stops, vec![Sig::Term, Sig::Int, Sig::Quit]);
    }
}
