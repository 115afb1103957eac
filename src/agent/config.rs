//! The run configuration: raw flags turned into a validated [`RunConfig`].
//!
//! Everything a user can get wrong is refused here, before any request is
//! sent, with a message that names the flag: a heartbeat not below the ttl, a
//! grace not below the ttl, a task name the protocol would refuse, a bad
//! authority URL. After this point the supervisor can assume
//! `0 < heartbeat < ttl` and `grace < ttl`.

use std::ffi::OsString;
use std::time::Duration;

use crate::authority::AuthoritySpec;
use crate::authority::trust::TrustFiles;
use crate::lease::ExpiryPolicy;

/// A validated `leaseagent [OPTIONS] -- COMMAND` invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunConfig {
    pub authority: AuthoritySpec,
    pub task: String,
    pub ttl: Duration,
    pub heartbeat: Duration,
    pub grace: Duration,
    pub holder: String,
    pub on_expiry: ExpiryPolicy,
    /// The authority-side grace period sent with `--on-expiry grace`.
    pub expiry_grace: Duration,
    /// `None`: no wait. `Some(None)`: wait forever. `Some(Some(d))`: up to d.
    pub wait: Option<Option<Duration>>,
    /// ρ of the deadline rule, in parts per million (`--clock-drift`).
    pub clock_drift_ppm: u32,
    /// `--remap-exit`: the command's own 124 and 125 become 1.
    pub remap_exit: bool,
    pub command: Vec<OsString>,
    /// The trust flags (files are read when the authority is opened).
    pub trust: TrustFiles,
}

/// The most `--clock-drift` accepts: 10 % (a clock further off is broken,
/// not drifting).
pub const MAX_CLOCK_DRIFT_PPM: u32 = 100_000;

/// The flags as parsed, before validation.
#[derive(Clone, Debug, Default)]
pub struct RawRun {
    pub authority: Option<String>,
    pub task: Option<String>,
    pub ttl: Duration,
    pub heartbeat: Option<Duration>,
    pub grace: Option<Duration>,
    pub holder: Option<String>,
    pub on_expiry: String,
    pub expiry_grace: Option<Duration>,
    pub wait: Option<Option<Duration>>,
    pub clock_drift_ppm: Option<u32>,
    pub remap_exit: bool,
    pub command: Vec<OsString>,
    pub trust: TrustFiles,
}

/// The protocol's task-name rule ([`crate::lease::check_task`]), naming the flag.
pub fn validate_task(task: &str) -> Result<(), String> {
    crate::lease::check_task(task).map_err(|e| format!("--task: `{task}` {e}"))
}

/// The protocol's holder rule ([`crate::lease::check_holder`]), naming the flag.
pub fn validate_holder(holder: &str) -> Result<(), String> {
    crate::lease::check_holder(holder).map_err(|e| format!("--holder: {e}"))
}

/// `HOSTNAME/PID`.
pub fn default_holder() -> String {
    let uname = rustix::system::uname();
    let host = uname.nodename().to_string_lossy().into_owned();
    format!("{host}/{}", std::process::id())
}

impl RawRun {
    pub fn validate(self) -> Result<RunConfig, String> {
        let task = self
            .task
            .ok_or("--task is required (or set LEASEAGENT_TASK)")?;
        validate_task(&task)?;
        let authority = AuthoritySpec::from_flag(self.authority.as_deref())?;
        let ttl = self.ttl;
        if ttl < Duration::from_millis(1) {
            return Err("--ttl must be at least 1ms".into());
        }
        let heartbeat = self.heartbeat.unwrap_or(ttl / 3);
        if heartbeat.is_zero() {
            return Err("--heartbeat must be above 0".into());
        }
        if heartbeat >= ttl {
            return Err(format!(
                "--heartbeat ({}) must be below --ttl ({})",
                crate::time::duration::format(heartbeat),
                crate::time::duration::format(ttl)
            ));
        }
        let grace = self.grace.unwrap_or(ttl / 6);
        if grace >= ttl {
            return Err(format!(
                "--grace ({}) must be below --ttl ({}): the command gets SIGTERM --grace before the lease's deadline",
                crate::time::duration::format(grace),
                crate::time::duration::format(ttl)
            ));
        }
        self.trust.check_usage()?;
        let holder = self.holder.unwrap_or_else(default_holder);
        validate_holder(&holder)?;
        let on_expiry = ExpiryPolicy::parse(&self.on_expiry).ok_or_else(|| {
            format!(
                "--on-expiry: `{}` is not a policy; use redispatch, grace or hold",
                self.on_expiry
            )
        })?;
        if self.expiry_grace.is_some() && on_expiry != ExpiryPolicy::Grace {
            return Err("--expiry-grace only goes with --on-expiry grace".into());
        }
        let expiry_grace = self.expiry_grace.unwrap_or(ttl);
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(
                "no command given: usage is leaseagent [OPTIONS] -- COMMAND [ARG...]".into(),
            );
        }
        let clock_drift_ppm = self
            .clock_drift_ppm
            .unwrap_or(crate::agent::machine::DEFAULT_CLOCK_DRIFT_PPM);
        if clock_drift_ppm > MAX_CLOCK_DRIFT_PPM {
            return Err(format!(
                "--clock-drift: {clock_drift_ppm} ppm is more than {MAX_CLOCK_DRIFT_PPM} (10%)"
            ));
        }
        Ok(RunConfig {
            authority,
            task,
            ttl,
            heartbeat,
            grace,
            holder,
            on_expiry,
            expiry_grace,
            wait: self.wait,
            clock_drift_ppm,
            remap_exit: self.remap_exit,
            command: self.command,
            trust: self.trust,
        })
    }
}

impl RunConfig {
    /// The timing the supervisor and the heartbeat work from.
    pub fn settings(&self) -> crate::agent::machine::Settings {
        crate::agent::machine::Settings {
            asked_ttl: self.ttl,
            heartbeat: self.heartbeat,
            grace: self.grace,
            drift_ppm: self.clock_drift_ppm,
            remap_exit: self.remap_exit,
        }
    }
}

/// Heartbeat and grace that fit a ttl the authority clamped below what was
/// asked. Each keeps its value when it still fits the default proportions of
/// the granted ttl (heartbeat at most a third, grace at most a sixth), and
/// otherwise shrinks no further than in proportion to the ttl.
pub fn fit_to_granted(
    cfg_ttl: Duration,
    heartbeat: Duration,
    grace: Duration,
    granted: Duration,
) -> (Duration, Duration) {
    if granted >= cfg_ttl {
        return (heartbeat, grace);
    }
    let scale = |d: Duration| -> Duration {
        let ns = d.as_nanos() * granted.as_nanos() / cfg_ttl.as_nanos().max(1);
        Duration::from_nanos(ns as u64)
    };
    let heartbeat = scale(heartbeat).max(heartbeat.min(granted / 3));
    let grace = scale(grace).max(grace.min(granted / 6));
    (heartbeat.max(Duration::from_millis(1)), grace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawRun {
        RawRun {
            authority: Some("http://127.0.0.1:1".into()),
            task: Some("t".into()),
            ttl: Duration::from_secs(30),
            on_expiry: "redispatch".into(),
            command: vec!["true".into()],
            ..Default::default()
        }
    }

    #[test]
    fn defaults_follow_the_ttl() {
        let c = raw().validate().unwrap();
        assert_eq!(c.heartbeat, Duration::from_secs(10));
        assert_eq!(c.grace, Duration::from_secs(5));
        assert!(c.holder.ends_with(&format!("/{}", std::process::id())));
    }

    #[test]
    fn errors_name_the_flag() {
        let mut r = raw();
        r.heartbeat = Some(Duration::from_secs(30));
        assert!(r.validate().unwrap_err().starts_with("--heartbeat"));
        let mut r = raw();
        r.grace = Some(Duration::from_secs(31));
        assert!(r.validate().unwrap_err().starts_with("--grace"));
        let mut r = raw();
        r.task = Some("a b".into());
        assert!(r.validate().unwrap_err().starts_with("--task"));
        let mut r = raw();
        r.on_expiry = "never".into();
        assert!(r.validate().unwrap_err().starts_with("--on-expiry"));
        let mut r = raw();
        r.authority = Some("ftp://x".into());
        assert!(r.validate().unwrap_err().starts_with("--authority"));
        let mut r = raw();
        r.command.clear();
        assert!(r.validate().unwrap_err().contains("no command"));
        let mut r = raw();
        r.task = None;
        assert!(r.validate().unwrap_err().starts_with("--task"));
        let mut r = raw();
        r.clock_drift_ppm = Some(MAX_CLOCK_DRIFT_PPM + 1);
        assert!(r.validate().unwrap_err().starts_with("--clock-drift"));
    }

    #[test]
    fn clock_drift_defaults_to_1000_ppm_and_takes_a_value() {
        assert_eq!(raw().validate().unwrap().clock_drift_ppm, 1_000);
        let mut r = raw();
        r.clock_drift_ppm = Some(0);
        let c = r.validate().unwrap();
        assert_eq!(c.settings().drift_ppm, 0);
    }

    #[test]
    fn clamped_ttl_scales_heartbeat_and_grace() {
        let (h, g) = fit_to_granted(
            Duration::from_secs(30),
            Duration::from_secs(10),
            Duration::from_secs(5),
            Duration::from_secs(3),
        );
        assert_eq!((h, g), (Duration::from_secs(1), Duration::from_millis(500)));
        // Values that still fit are kept.
        let (h, g) = fit_to_granted(
            Duration::from_secs(30),
            Duration::from_millis(200),
            Duration::from_millis(100),
            Duration::from_secs(3),
        );
        assert_eq!(
            (h, g),
            (Duration::from_millis(200), Duration::from_millis(100))
        );
    }
}
