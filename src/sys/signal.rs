//! The one signal type of the crate: every signal the agent catches,
//! relays or sends, and the keeper relays, is a [`Sig`].
//!
//! There is no "unknown signal" at run time: a number becomes a `Sig` once,
//! at the edge where the kernel hands it over ([`Sig::from_number`]), and
//! everything past that edge works with the enum (the machine's events and
//! actions, the relay list, `kill(2)` through [`Sig::to_rustix`]).

/// A signal the agent catches, relays to the job or sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sig {
    Term,
    Int,
    Quit,
    Hup,
    Usr1,
    Usr2,
    Kill,
    /// Job control: relayed, never obeyed by the agent itself.
    Tstp,
    Ttin,
    Ttou,
    Cont,
    /// Signals whose default action would end the agent: they end it
    /// through the stop-and-release path instead.
    Alrm,
    Xcpu,
    Xfsz,
    Vtalrm,
    Prof,
    Io,
    Pwr,
    Stkflt,
    Sys,
    Trap,
    Abrt,
}

/// Every variant, for lookups by number: the lists below and SIGKILL, put
/// together at compile time (a list that grows without `ALL` growing with
/// it fails the build).
const ALL: [Sig; 22] = concat(&[&Sig::RELAYED, &[Sig::Kill], &Sig::JOB_CONTROL, &Sig::FATAL]);

/// `parts` one after the other; the length must come out exactly `N`.
const fn concat<const N: usize>(parts: &[&[Sig]]) -> [Sig; N] {
    let mut out = [Sig::Kill; N];
    let (mut k, mut i) = (0, 0);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            out[k] = parts[i][j];
            k += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(k == N, "ALL must list every signal once");
    out
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

    /// Job control: relayed to the job's group, the agent keeps running
    /// (and renewing).
    pub const JOB_CONTROL: [Sig; 4] = [Sig::Tstp, Sig::Ttin, Sig::Ttou, Sig::Cont];

    /// The other catchable signals whose default action ends a process.
    /// SIGPIPE is not one: the agent ignores it (Rust's runtime does), so a
    /// reader of stderr going away never stops the job. Synchronous fault
    /// signals (SIGSEGV, SIGBUS, SIGILL, SIGFPE) cannot be caught safely,
    /// and real-time signals keep their default: either way the keeper sees
    /// the agent's end (EOF) and kills the tree, and the lease expires.
    pub const FATAL: [Sig; 11] = [
        Sig::Alrm,
        Sig::Xcpu,
        Sig::Xfsz,
        Sig::Vtalrm,
        Sig::Prof,
        Sig::Io,
        Sig::Pwr,
        Sig::Stkflt,
        Sig::Sys,
        Sig::Trap,
        Sig::Abrt,
    ];

    /// Every signal the agent (and the keeper) catches.
    pub fn caught() -> impl Iterator<Item = Sig> {
        Self::RELAYED
            .into_iter()
            .chain(Self::JOB_CONTROL)
            .chain(Self::FATAL)
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
            Sig::Tstp => Signal::TSTP,
            Sig::Ttin => Signal::TTIN,
            Sig::Ttou => Signal::TTOU,
            Sig::Cont => Signal::CONT,
            Sig::Alrm => Signal::ALARM,
            Sig::Xcpu => Signal::XCPU,
            Sig::Xfsz => Signal::XFSZ,
            Sig::Vtalrm => Signal::VTALARM,
            Sig::Prof => Signal::PROF,
            Sig::Io => Signal::IO,
            Sig::Pwr => Signal::POWER,
            Sig::Stkflt => Signal::STKFLT,
            Sig::Sys => Signal::SYS,
            Sig::Trap => Signal::TRAP,
            Sig::Abrt => Signal::ABORT,
        }
    }

    /// The signal's number on Linux.
    pub fn number(self) -> i32 {
        self.to_rustix().as_raw()
    }

    /// The signal with this number, if it is one the agent knows.
    pub fn from_number(n: i32) -> Option<Sig> {
        ALL.into_iter().find(|s| s.number() == n)
    }

    /// Whether this signal, sent to the agent, asks it to stop the job (not
    /// only to relay).
    pub fn is_stop(self) -> bool {
        matches!(self, Sig::Term | Sig::Int | Sig::Quit)
    }

    /// Whether the agent, sent this signal, stops the job and releases:
    /// a stop signal, or one whose default would end the agent.
    pub fn ends_run(self) -> bool {
        self.is_stop() || Self::FATAL.contains(&self)
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
        for s in ALL {
            assert_eq!(Sig::from_number(s.number()), Some(s));
        }
        // Each signal once: 22 distinct numbers.
        let distinct: std::collections::HashSet<i32> = ALL.iter().map(|s| s.number()).collect();
        assert_eq!(distinct.len(), ALL.len());
        assert!(Sig::Alrm.ends_run() && !Sig::Tstp.ends_run() && !Sig::Hup.ends_run());
        assert_eq!(Sig::from_number(signal_hook::consts::SIGPIPE), None);
    }
}
