//! The run configuration: raw flags turned into a validated [`RunConfig`].
//!
//! Everything a user can get wrong is refused here, before any request is
//! sent, with a message that names the flag: a task name the protocol would
//! refuse, a bad authority URL, and timing flags that cannot work (the rules
//! are `timing.rs`'s, checked once every flag is known). After this point
//! the supervisor can assume `0 < heartbeat < ttl` and `grace < ttl`.

use std::ffi::OsString;
use std::time::Duration;

use crate::authority::trust::{TrustFiles, TrustPairError};
use crate::authority::{AuthorityFlagError, AuthoritySpec};
use crate::lease::{ExpiryPolicy, NameError};

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
    /// `--no-pid-namespace`: the command shares the agent's PID namespace.
    pub no_pid_namespace: bool,
    /// `--renew-priority`: how renewal packets are marked.
    pub renew_marks: crate::authority::netpath::Marks,
    pub command: Vec<OsString>,
    /// The trust flags (files are read when the authority is opened).
    pub trust: TrustFiles,
    /// `--user`: who the command runs as; `None`: the agent's own user.
    pub user: Option<RunAs>,
    /// `--full-root`: a root command keeps every capability (guarantee 7
    /// given up; see `sys/confine.rs`).
    pub full_root: bool,
    /// `--allow-new-privs`: a `--user` command may gain privileges through
    /// set-uid and file-capability programs (no NoNewPrivs).
    pub allow_new_privs: bool,
    /// `-q`, `-v`, `--log-level`, `--log-format`.
    pub log: crate::agent::logging::Settings,
    /// `--held-exit`: the exit status when the task is held elsewhere.
    pub held_exit: u8,
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
    pub no_pid_namespace: bool,
    pub renew_marks: crate::authority::netpath::Marks,
    pub command: Vec<OsString>,
    pub trust: TrustFiles,
    pub user: Option<String>,
    pub full_root: bool,
    pub allow_new_privs: bool,
    /// `-q`: errors only.
    pub quiet: bool,
    /// `-v`, once per step above `info`.
    pub verbose: u8,
    /// `--log-level` (or `LEASEAGENT_LOG`), checked by its reader.
    pub log_level: Option<log::LevelFilter>,
    pub log_format: crate::agent::logging::Format,
    pub held_exit: Option<u8>,
}

/// Why the run path's flags do not make a valid run. Every message names
/// the flag at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--task is required (or set LEASEAGENT_TASK)")]
    NoTask,
    #[error("--task: `{task}` {source}")]
    Task {
        task: String,
        #[source]
        source: NameError,
    },
    #[error(transparent)]
    Authority(#[from] AuthorityFlagError),
    #[error(transparent)]
    Timing(#[from] crate::agent::timing::TimingError),
    #[error(transparent)]
    Trust(#[from] TrustPairError),
    #[error("--holder: {0}")]
    Holder(#[source] NameError),
    #[error("--on-expiry: `{0}` is not a policy; use redispatch, grace or hold")]
    Policy(String),
    #[error("--expiry-grace only goes with --on-expiry grace")]
    ExpiryGraceWithoutGrace,
    #[error("no command given: usage is leaseagent [OPTIONS] -- COMMAND [ARG...]")]
    NoCommand,
    #[error("--clock-drift: {0} ppm is more than {MAX_CLOCK_DRIFT_PPM} (10%)")]
    ClockDrift(u32),
    #[error(transparent)]
    User(#[from] UserError),
    #[error("-q/--quiet and -v/--verbose contradict each other; give one of them")]
    QuietAndVerbose,
}

/// Why `--user` cannot be honoured. Every message names the flag.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("--user: `{0}` is not NAME or NAME:GROUP")]
    Syntax(String),
    #[error("--user: no such user `{0}`")]
    NoUser(String),
    #[error("--user: no such group `{0}`")]
    NoGroup(String),
    #[error("--user: {0}")]
    Lookup(#[from] crate::sys::user::LookupFailed),
    #[error("--user {user}: its {what} is not UTF-8")]
    NotUtf8 { user: String, what: &'static str },
    #[error(
        "--user {user}: running the command as another user needs root (CAP_SETUID and CAP_SETGID); this agent runs as uid {me} without them"
    )]
    NotPermitted { user: String, me: u32 },
}

/// `--user NAME[:GROUP]`, resolved before anything is acquired: the ids
/// the job's child switches to and the variables `runuser` sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// The user's name, as the password database spells it.
    pub name: String,
    /// The ids to switch to; `None` when the user and group are the
    /// agent's own: nothing to switch, only the variables.
    pub switch: Option<crate::sys::user::Identity>,
    /// `HOME`, and for a user other than root `USER` and `LOGNAME`, as
    /// `runuser -u NAME` sets them (it leaves `SHELL` alone).
    pub env: Vec<(String, String)>,
}

impl RunAs {
    /// Looks `spec` up: `NAME` (the user's primary group) or `NAME:GROUP`,
    /// each a name or, when no entry has that name, a number (as `chown`
    /// reads them). Supplementary groups as `initgroups(NAME, gid)`.
    pub fn resolve(spec: &str) -> Result<RunAs, UserError> {
        use crate::sys::user::{Identity, group_by_name, group_list, user_by_name, user_by_uid};
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        if user.is_empty() || group.is_some_and(str::is_empty) {
            return Err(UserError::Syntax(spec.to_string()));
        }
        let account = match user_by_name(user)? {
            Some(a) => a,
            None => match user.parse::<u32>() {
                Ok(uid) => user_by_uid(uid)?,
                Err(_) => None,
            }
            .ok_or_else(|| UserError::NoUser(user.to_string()))?,
        };
        let gid = match group {
            None => account.gid,
            Some(g) => match group_by_name(g)? {
                Some(gid) => gid,
                None => g
                    .parse::<u32>()
                    .map_err(|_| UserError::NoGroup(g.to_string()))?,
            },
        };
        let groups = group_list(&account.name, gid)?;
        let target = Identity::new(account.uid, gid, groups);
        let home = account.home.to_str().ok_or_else(|| UserError::NotUtf8 {
            user: account.name.clone(),
            what: "home directory",
        })?;
        let mut env = vec![("HOME".to_string(), home.to_string())];
        if account.uid != 0 {
            env.push(("USER".to_string(), account.name.clone()));
            env.push(("LOGNAME".to_string(), account.name.clone()));
        }
        // The agent's own user and group: nothing to switch (its current
        // groups stay; an unprivileged agent could not set others).
        let me = Identity::current();
        let switch = if target.uid == me.uid && target.gid == me.gid {
            None
        } else if may_switch() {
            Some(target)
        } else {
            return Err(UserError::NotPermitted {
                user: account.name.clone(),
                me: me.uid,
            });
        };
        Ok(RunAs {
            name: account.name,
            switch,
            env,
        })
    }
}

/// Whether this process may switch ids (CAP_SETUID and CAP_SETGID).
fn may_switch() -> bool {
    use rustix::thread::CapabilitySet;
    rustix::thread::capabilities(None).is_ok_and(|caps| {
        caps.effective
            .contains(CapabilitySet::SETGID | CapabilitySet::SETUID)
    })
}

/// The protocol's task-name rule ([`crate::lease::check_task`]), naming the flag.
pub fn validate_task(task: &str) -> Result<(), ConfigError> {
    crate::lease::check_task(task).map_err(|source| ConfigError::Task {
        task: task.to_string(),
        source,
    })
}

/// The protocol's holder rule ([`crate::lease::check_holder`]), naming the flag.
pub fn validate_holder(holder: &str) -> Result<(), ConfigError> {
    crate::lease::check_holder(holder).map_err(ConfigError::Holder)
}

/// `HOSTNAME/PID`.
pub fn default_holder() -> String {
    let uname = rustix::system::uname();
    let host = uname.nodename().to_string_lossy().into_owned();
    format!("{host}/{}", std::process::id())
}

impl RawRun {
    pub fn validate(self) -> Result<RunConfig, ConfigError> {
        let task = self.task.ok_or(ConfigError::NoTask)?;
        validate_task(&task)?;
        let authority = AuthoritySpec::from_flag(self.authority.as_deref())?;
        let ttl = self.ttl;
        let heartbeat = self.heartbeat.unwrap_or(ttl / 3);
        let grace = self.grace.unwrap_or(ttl / 6);
        self.trust.check_usage()?;
        let holder = self.holder.unwrap_or_else(default_holder);
        validate_holder(&holder)?;
        let on_expiry = ExpiryPolicy::parse(&self.on_expiry)
            .ok_or_else(|| ConfigError::Policy(self.on_expiry.clone()))?;
        if self.expiry_grace.is_some() && on_expiry != ExpiryPolicy::Grace {
            return Err(ConfigError::ExpiryGraceWithoutGrace);
        }
        let expiry_grace = self.expiry_grace.unwrap_or(ttl);
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(ConfigError::NoCommand);
        }
        let clock_drift_ppm = self
            .clock_drift_ppm
            .unwrap_or(crate::time::deadline::DEFAULT_CLOCK_DRIFT_PPM);
        if clock_drift_ppm > MAX_CLOCK_DRIFT_PPM {
            return Err(ConfigError::ClockDrift(clock_drift_ppm));
        }
        let mut cfg = RunConfig {
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
            no_pid_namespace: self.no_pid_namespace,
            renew_marks: self.renew_marks,
            command: self.command,
            trust: self.trust,
            user: None,
            full_root: self.full_root,
            allow_new_privs: self.allow_new_privs,
            log: crate::agent::logging::Settings {
                level: log_level(self.quiet, self.verbose, self.log_level)?,
                format: self.log_format,
            },
            held_exit: self.held_exit.unwrap_or(crate::exit::HELD),
        };
        crate::agent::timing::check(&cfg.settings())?;
        // Last: the only check that reads the user databases.
        cfg.user = self.user.as_deref().map(RunAs::resolve).transpose()?;
        Ok(cfg)
    }
}

/// The agent's own log level: `-q` (errors only), `-v` (`debug`, `-vv`
/// `trace`), else `--log-level`/`LEASEAGENT_LOG`; `None` leaves it to
/// `RUST_LOG`, else `info`.
fn log_level(
    quiet: bool,
    verbose: u8,
    level: Option<log::LevelFilter>,
) -> Result<Option<log::LevelFilter>, ConfigError> {
    match (quiet, verbose) {
        (true, 0) => Ok(Some(log::LevelFilter::Error)),
        (true, _) => Err(ConfigError::QuietAndVerbose),
        (false, 0) => Ok(level),
        (false, 1) => Ok(Some(log::LevelFilter::Debug)),
        (false, _) => Ok(Some(log::LevelFilter::Trace)),
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

    /// The message `raw()` changed by `f` is refused with.
    fn refused(f: impl FnOnce(&mut RawRun)) -> String {
        let mut r = raw();
        f(&mut r);
        r.validate().unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_flag() {
        assert_eq!(
            refused(|r| r.heartbeat = Some(Duration::from_secs(30))),
            "--heartbeat (30s) must be below --ttl (30s)"
        );
        assert_eq!(
            refused(|r| r.grace = Some(Duration::from_secs(31))),
            "--grace (31s) must be below --ttl (30s): the command gets SIGTERM --grace before the lease's deadline"
        );
        // One rule each, in the words each case has always had.
        assert_eq!(
            refused(|r| r.heartbeat = Some(Duration::ZERO)),
            "--heartbeat must be above 0"
        );
        assert!(
            refused(|r| r.heartbeat = Some(Duration::from_millis(50)))
                .starts_with("--heartbeat (50ms) is below the smallest accepted, 100ms")
        );
        assert!(
            refused(|r| r.grace = Some(Duration::from_millis(29_990)))
                .starts_with("--grace (29990ms) must be below the lease's local deadline (29969ms")
        );
        assert_eq!(
            refused(|r| r.ttl = Duration::from_millis(999)),
            "--ttl (999ms) must be between 1s and 24h (the lease protocol's bounds)"
        );
        assert_eq!(
            refused(|r| r.task = Some("a b".into())),
            "--task: `a b` contains ' '; task names use only A-Z a-z 0-9 . _ - : / @"
        );
        assert_eq!(
            refused(|r| r.on_expiry = "never".into()),
            "--on-expiry: `never` is not a policy; use redispatch, grace or hold"
        );
        assert!(
            refused(|r| r.authority = Some("ftp://x".into())).starts_with("--authority: `ftp://x`")
        );
        assert_eq!(
            refused(|r| r.command.clear()),
            "no command given: usage is leaseagent [OPTIONS] -- COMMAND [ARG...]"
        );
        assert_eq!(
            refused(|r| r.task = None),
            "--task is required (or set LEASEAGENT_TASK)"
        );
        assert_eq!(
            refused(|r| r.clock_drift_ppm = Some(MAX_CLOCK_DRIFT_PPM + 1)),
            "--clock-drift: 100001 ppm is more than 100000 (10%)"
        );
        assert_eq!(
            refused(|r| r.holder = Some("a\nb".into())),
            "--holder: must be printable (no control characters)"
        );
        assert_eq!(
            refused(|r| r.expiry_grace = Some(Duration::from_secs(1))),
            "--expiry-grace only goes with --on-expiry grace"
        );
    }

    #[test]
    fn user_is_resolved_with_runusers_variables_and_named_in_errors() {
        let mut r = raw();
        r.user = Some("nobody".into());
        let c = r.validate().unwrap();
        let u = c.user.unwrap();
        assert_eq!(u.name, "nobody");
        assert_eq!(
            u.env,
            vec![
                ("HOME".to_string(), "/nonexistent".to_string()),
                ("USER".to_string(), "nobody".to_string()),
                ("LOGNAME".to_string(), "nobody".to_string()),
            ]
        );
        let me = rustix::process::geteuid().as_raw();
        if me != 65534 {
            let id = u.switch.expect("another user: a switch");
            assert_eq!((id.uid, id.gid), (65534, 65534));
        }
        // root gets HOME only, as from `runuser -u root`.
        let root = RunAs::resolve("root").unwrap();
        assert_eq!(root.env, vec![("HOME".to_string(), "/root".to_string())]);
        assert_eq!(
            refused(|r| r.user = Some("no-such-user-la".into())),
            "--user: no such user `no-such-user-la`"
        );
        assert_eq!(
            refused(|r| r.user = Some("nobody:no-such-group-la".into())),
            "--user: no such group `no-such-group-la`"
        );
        assert_eq!(
            refused(|r| r.user = Some(":root".into())),
            "--user: `:root` is not NAME or NAME:GROUP"
        );
        // The user databases are read last: a bad flag is named first.
        assert_eq!(
            refused(|r| {
                r.user = Some("no-such-user-la".into());
                r.task = None;
            }),
            "--task is required (or set LEASEAGENT_TASK)"
        );
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
        let fitted = |heartbeat, grace| {
            let s = crate::agent::machine::Settings {
                asked_ttl: Duration::from_secs(30),
                heartbeat,
                grace,
                drift_ppm: 0,
                remap_exit: false,
            };
            s.fitted(Duration::from_secs(3))
        };
        let (h, g) = fitted(Duration::from_secs(10), Duration::from_secs(5));
        assert_eq!((h, g), (Duration::from_secs(1), Duration::from_millis(500)));
        // Values that still fit are kept.
        let (h, g) = fitted(Duration::from_millis(200), Duration::from_millis(100));
        assert_eq!(
            (h, g),
            (Duration::from_millis(200), Duration::from_millis(100))
        );
    }
}
