//! `leaseagent check [--min-remaining DUR]`: the job asks whether its lease
//! is, as far as its agent knows, valid for at least DUR more.
//!
//! Why a file and not a call to the agent: the job may call this in a tight
//! loop (before every batch), and it must answer even when the agent is
//! paused. The agent rewrites the state file named by
//! `LEASEAGENT_STATE_FILE` atomically on every change of its view and after
//! every renewal ([`crate::agent::state_file`]); `check` reads it and compares the
//! recorded deadline with `CLOCK_BOOTTIME` now. So a paused agent's stale
//! file still expires on time: the deadline, not the freshness of the file,
//! decides. A file from another boot is never valid; one written in another
//! time namespace of this boot (the job unshared one, or was restored by
//! CRIU) is read through the two namespaces' boot-clock offsets.
//!
//! Advisory only. Between `check` answering 0 and the write, the process can
//! be paused past the lease; the sink's fence (`publish`, [`crate::fence`])
//! is the real protection.
//!
//! Exit status: 0 valid for at least `--min-remaining`; 1 otherwise, with a
//! one-line reason on stderr (unless `--quiet`). `--json` prints the view on
//! stdout either way.

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use crate::agent::state_file::{ENV_STATE_FILE, LeaseStateFile, LeaseView};
use crate::time::clock::BootInstant;
use crate::time::ms;

/// Exit status when the lease is not (or not long enough) valid.
pub const EXIT_NOT_VALID: u8 = 1;

/// `leaseagent check` (flags and help: `cmd::defs::CHECK`).
#[derive(Debug, Clone, Default)]
pub struct CheckArgs {
    /// `--min-remaining`.
    pub min_remaining: Duration,
    /// `-q`, `--quiet`: nothing on stderr.
    pub quiet: bool,
    /// `--json`: the view on stdout.
    pub json: bool,
}

/// The answer, also what `--json` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<LeaseView>,
    pub remaining_ms: u64,
    /// Why not, when `ok` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Verdict {
    fn no(reason: impl Into<String>) -> Self {
        Verdict {
            ok: false,
            token: None,
            state: None,
            remaining_ms: 0,
            reason: Some(reason.into()),
        }
    }
}

/// Judges a state file: `env_token` is this job's `LEASE_TOKEN`, if set.
pub fn evaluate(
    file: &LeaseStateFile,
    now: BootInstant,
    boot_id: &str,
    offset_ns: i128,
    env_token: Option<u64>,
    min: Duration,
) -> Verdict {
    let remaining = file.remaining(now, boot_id, offset_ns);
    let mut v = Verdict {
        ok: false,
        token: Some(file.token),
        state: Some(file.state),
        remaining_ms: ms(remaining),
        reason: None,
    };
    let fmt = crate::time::duration::format;
    let reason = if env_token.is_some_and(|t| t != file.token) {
        Some(format!(
            "the lease state file is for token {}, this job's LEASE_TOKEN is {}",
            file.token,
            env_token.unwrap_or_default()
        ))
    } else if file.boot_id != boot_id {
        Some("the lease state file is from a previous boot".to_string())
    } else {
        match file.state {
            LeaseView::Lost => Some(format!("lease lost (token {})", file.token)),
            LeaseView::Stopping => Some("the agent is stopping this job".to_string()),
            LeaseView::Valid | LeaseView::Renewing if remaining.is_zero() => Some(format!(
                "lease expired (token {}): the agent could not renew it in time",
                file.token
            )),
            LeaseView::Valid | LeaseView::Renewing if remaining < min => Some(format!(
                "only {} left, less than --min-remaining {}",
                fmt(remaining),
                fmt(min)
            )),
            LeaseView::Valid | LeaseView::Renewing => None,
        }
    };
    v.ok = reason.is_none();
    v.reason = reason;
    v
}

/// Reads the environment and the state file and judges them.
pub fn verdict(min: Duration) -> Verdict {
    let Some(path) = std::env::var_os(ENV_STATE_FILE).filter(|p| !p.is_empty()) else {
        return Verdict::no(format!(
            "not running under leaseagent: {ENV_STATE_FILE} is not set"
        ));
    };
    let path = std::path::PathBuf::from(path);
    let file = match LeaseStateFile::read(&path) {
        Ok(f) => f,
        Err(e) => {
            return Verdict::no(format!(
                "cannot read the lease state file {}: {e}",
                path.display()
            ));
        }
    };
    let boot_id = match crate::time::clock::boot_id() {
        Ok(b) => b,
        Err(e) => return Verdict::no(format!("cannot read this boot's id: {e}")),
    };
    let offset = match crate::time::clock::boottime_offset() {
        Ok(o) => o,
        Err(e) => return Verdict::no(format!("cannot read this time namespace's offsets: {e}")),
    };
    let env_token = match crate::fence::token_from_env() {
        Ok(t) => Some(t),
        Err(crate::fence::TokenEnvError::Unset) => None,
        Err(e) => return Verdict::no(e.to_string()),
    };
    evaluate(&file, BootInstant::now(), &boot_id, offset, env_token, min)
}

pub fn main(a: CheckArgs) -> ExitCode {
    let v = verdict(a.min_remaining);
    if a.json {
        match serde_json::to_string(&v) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("leaseagent check: {e}"),
        }
    }
    if v.ok {
        return ExitCode::SUCCESS;
    }
    if !a.quiet {
        if let Some(r) = &v.reason {
            eprintln!("leaseagent check: {r}");
        }
    }
    ExitCode::from(EXIT_NOT_VALID)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(state: LeaseView, left: Duration, now: BootInstant) -> LeaseStateFile {
        LeaseStateFile {
            task: "t".into(),
            lease_id: "l".into(),
            token: 9,
            state,
            deadline_boot_ms: ms((now + left).since_boot()),
            boot_id: "b".into(),
            agent_pid: 1,
            boot_offset_ns: 0,
            outcome: None,
            containment: None,
        }
    }

    #[test]
    fn verdicts() {
        let now = BootInstant::from_since_boot(Duration::from_secs(1000));
        let s = Duration::from_secs;
        let ok = evaluate(
            &file(LeaseView::Valid, s(10), now),
            now,
            "b",
            0,
            Some(9),
            s(5),
        );
        assert!(ok.ok, "{ok:?}");
        assert_eq!(ok.remaining_ms, 10_000);
        assert!(
            evaluate(
                &file(LeaseView::Renewing, s(10), now),
                now,
                "b",
                0,
                None,
                s(5)
            )
            .ok
        );

        let short = evaluate(&file(LeaseView::Valid, s(3), now), now, "b", 0, None, s(5));
        assert!(!short.ok);
        assert_eq!(
            short.reason.as_deref(),
            Some("only 3s left, less than --min-remaining 5s")
        );
        let lost = evaluate(&file(LeaseView::Lost, s(10), now), now, "b", 0, None, s(0));
        assert!(lost.reason.unwrap().starts_with("lease lost"));
        let expired = evaluate(&file(LeaseView::Valid, s(0), now), now, "b", 0, None, s(0));
        assert!(expired.reason.unwrap().starts_with("lease expired"));
        let boot = evaluate(&file(LeaseView::Valid, s(10), now), now, "c", 0, None, s(0));
        assert!(boot.reason.unwrap().contains("previous boot"));
        let other = evaluate(
            &file(LeaseView::Valid, s(10), now),
            now,
            "b",
            0,
            Some(8),
            s(0),
        );
        assert!(other.reason.unwrap().contains("LEASE_TOKEN is 8"));
        let stopping = evaluate(
            &file(LeaseView::Stopping, s(10), now),
            now,
            "b",
            0,
            None,
            s(0),
        );
        assert!(!stopping.ok);

        // A reader in a time namespace a day ahead (a job that unshared
        // one): the same 10 s left, read through the two offsets; on the
        // raw numbers the lease would have "ended" a day ago.
        let day: i128 = 86_400 * 1_000_000_000;
        let ahead = now + s(86_400);
        let v = evaluate(
            &file(LeaseView::Valid, s(10), now),
            ahead,
            "b",
            day,
            None,
            s(5),
        );
        assert!(v.ok, "{v:?}");
        assert_eq!(v.remaining_ms, 10_000);
        // Written in that namespace and read on the host's clock: the same.
        let mut f = file(LeaseView::Valid, s(10), ahead);
        f.boot_offset_ns = day as i64;
        let v = evaluate(&f, now, "b", 0, None, s(5));
        assert_eq!(v.remaining_ms, 10_000, "{v:?}");
        // An offset that puts the deadline before the reader's zero: over.
        f.boot_offset_ns = (day * 2) as i64;
        let v = evaluate(&f, now, "b", 0, None, s(0));
        assert!(!v.ok);
    }
}
