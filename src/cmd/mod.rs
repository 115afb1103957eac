//! The command line: argv turned into one validated [`Command`].
//!
//! `leaseagent [OPTIONS] -- COMMAND [ARG...]` runs a command under a lease;
//! a first argument that names a subcommand (`serve`, `publish`, `check`,
//! `leases`, `revoke`, `clear`) selects that instead. Every usage error exits
//! 125 (the agent failed) with one line, `leaseagent[ SUBCOMMAND]: error: ..`,
//! that names the flag; `--help` and `--version` exit 0.
//!
//! One parser for all of it (lexopt, no clap: the agent's resident memory
//! runs next to every job): [`flags`] parses and renders help from the
//! tables in [`defs`] ("what was typed"); the builders here turn that into
//! each command's typed arguments, and the run path's [`RawRun`] into a
//! validated [`RunConfig`].

pub mod check;
mod defs;
pub mod flags;
mod generate;
pub mod operator;
pub mod publish;
pub mod server;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use crate::agent::config::{RawRun, RunConfig};
use crate::time::duration::parse as dur;
use flags::{CommandDef, Matches, Parsed, UsageError, number, text};

/// What `main` is asked to do.
pub enum Command {
    Run(RunConfig),
    Serve(crate::serve::ServeArgs),
    Publish(crate::cmd::publish::PublishArgs),
    Check(crate::cmd::check::CheckArgs),
    Leases(crate::cmd::operator::LeasesArgs),
    Revoke(crate::cmd::operator::RevokeArgs),
    Clear(crate::cmd::operator::ClearArgs),
    History(crate::cmd::operator::HistoryArgs),
    /// `leaseagent token new`: a bearer token for `serve --auth-file`.
    TokenNew,
    /// Internal: the process-group keeper between the agent and the job.
    Keeper(Vec<OsString>),
    /// Help or version was printed, or usage was wrong: exit with this status.
    Exit(u8),
}

/// Turns one command's parsed flags into its [`Command`] (the high stage).
type Build = fn(&mut Matches) -> Result<Command, UsageError>;

/// The subcommands: name (in the table), parser table, builder.
const SUBCOMMANDS: &[(&CommandDef, Build)] = &[
    (&defs::SERVE, serve),
    (&defs::PUBLISH, publish),
    (&defs::CHECK, check),
    (&defs::LEASES, leases),
    (&defs::REVOKE, revoke),
    (&defs::CLEAR, clear),
    (&defs::HISTORY, history),
    (&defs::COMPLETIONS, completions),
    (&defs::MAN, man),
];

/// Turns argv (including `argv[0]`) into a [`Command`].
pub fn parse(argv: Vec<OsString>) -> Command {
    parse_env(argv, &flags::env_value)
}

/// [`parse`] with the environment as `env` sees it.
fn parse_env(argv: Vec<OsString>, env: flags::Env) -> Command {
    let rest = &argv[1.min(argv.len())..];
    let first = rest.first().and_then(|a| a.to_str()).unwrap_or("");
    if first == crate::keeper::KEEPER_ARG {
        return Command::Keeper(rest[1..].to_vec());
    }
    if first == "token" {
        return token(&rest[1..]);
    }
    // `man` without a SUBCOMMAND: the page of them all.
    if first == defs::MAN.name && rest.len() == 1 {
        return print(&cli().man(None).unwrap_or_default());
    }
    let (def, build, args): (&'static CommandDef, Build, &[OsString]) =
        match SUBCOMMANDS.iter().find(|(d, _)| d.name == first) {
            Some((d, b)) => (d, *b, &rest[1..]),
            None => (&defs::RUN, run, rest),
        };
    let parsed = flags::parse(def, args, env).and_then(|p| match p {
        Parsed::Help => Ok(print(&flags::help(def, env))),
        Parsed::Version => Ok(print(&format!(
            "{} {}\n",
            def.program(),
            env!("CARGO_PKG_VERSION")
        ))),
        Parsed::Args(mut m) => build(&mut m),
    });
    parsed.unwrap_or_else(|e| {
        eprintln!("{}: error: {e}", def.program());
        Command::Exit(crate::exit::AGENT_FAILED)
    })
}

/// Help and version go to stdout; a closed stdout is not worth a panic.
fn print(s: &str) -> Command {
    let _ = std::io::stdout().lock().write_all(s.as_bytes());
    Command::Exit(0)
}

/// The run path: flags into [`RawRun`], then validated.
fn run(m: &mut Matches) -> Result<Command, UsageError> {
    let raw = raw_run(m)?;
    Ok(Command::Run(raw.validate()?))
}

/// What was typed on the run path, defaults and environment applied.
fn raw_run(m: &mut Matches) -> Result<RawRun, UsageError> {
    Ok(RawRun {
        authority: m.string("authority")?,
        task: m.string("task")?,
        ttl: m.get("ttl", dur)?,
        heartbeat: m.parse("heartbeat", dur)?,
        grace: m.parse("grace", dur)?,
        holder: m.string("holder")?,
        on_expiry: m.get("on-expiry", text)?,
        expiry_grace: m.parse("expiry-grace", dur)?,
        wait: m.parse_optional("wait", dur)?,
        clock_drift_ppm: m.parse("clock-drift", ppm)?,
        remap_exit: m.switch("remap-exit"),
        renew_marks: m.get("renew-priority", crate::authority::netpath::parse_marks)?,
        command: m.take_trailing(),
        trust: trust(m),
    })
}

/// The trust flags (`defs::TRUST`), environment applied.
fn trust(m: &Matches) -> crate::authority::trust::TrustFiles {
    let path = |long: &str| m.os(long).map(PathBuf::from);
    crate::authority::trust::TrustFiles {
        ca_file: path("ca-file"),
        client_cert: path("client-cert"),
        client_key: path("client-key"),
        auth_token_file: path("auth-token-file"),
        etcd_user: m.os("etcd-user").map(|u| u.to_string_lossy().into_owned()),
        etcd_password_file: path("etcd-password-file"),
    }
}

/// A `--clock-drift` value that is not a whole number of parts per million.
#[derive(Debug, thiserror::Error)]
#[error("`{value}` is not a whole number of parts per million")]
struct NotPpm {
    value: String,
    #[source]
    source: std::num::ParseIntError,
}

/// `--clock-drift`: a whole number of parts per million.
fn ppm(s: &str) -> Result<u32, NotPpm> {
    s.parse().map_err(|source| NotPpm {
        value: s.to_string(),
        source,
    })
}

fn serve(m: &mut Matches) -> Result<Command, UsageError> {
    let path = |m: &Matches, long: &str| m.os(long).map(PathBuf::from);
    let args = crate::serve::ServeArgs {
        listen: m.get("listen", text)?,
        db: PathBuf::from(m.get_os("db")?),
        tls_cert: path(m, "tls-cert"),
        tls_key: path(m, "tls-key"),
        client_ca: path(m, "client-ca"),
        auth_file: path(m, "auth-file"),
        insecure_listen: m.switch("insecure-listen"),
        max_connections: m.get("max-connections", number)?,
        max_connections_per_peer: m.get("max-connections-per-peer", number)?,
        max_leases: Some(m.get("max-leases", number)?),
        max_leases_per_principal: m.get("max-leases-per-principal", number)?,
        history: crate::engine::history::Bounds {
            max_age: m.get("history-max-age", dur)?,
            max_rows: m.get("history-max-rows", number)?,
        },
        status_listen: m.string("status-listen")?,
        status_held_alert: m.get("status-held-alert", dur)?,
    };
    if args.history.max_rows == 0 {
        return Err(UsageError::Words(
            "--history-max-rows must be at least 1".into(),
        ));
    }
    if args.tls_cert.is_some() != args.tls_key.is_some() {
        return Err(UsageError::Words(
            "--tls-cert and --tls-key go together: give both or neither".into(),
        ));
    }
    if args.client_ca.is_some() && args.tls_cert.is_none() {
        return Err(UsageError::Words(
            "--client-ca needs --tls-cert and --tls-key (mutual TLS is TLS)".into(),
        ));
    }
    Ok(Command::Serve(args))
}

/// What `token` does, for the man page and the completions.
const TOKEN_ABOUT: &str = "Print a new random bearer token for serve --auth-file";

const TOKEN_HELP: &str = "\
Usage: leaseagent token new

Prints a fresh random bearer token (256 bits) on stdout, and on stderr the
`token_sha256 = \"...\"` line to paste into `leaseagent serve --auth-file`.

Example:
  leaseagent token new > agent.token 2> agent.sha
";

/// `leaseagent token new` (and its help).
fn token(args: &[OsString]) -> Command {
    let words: Vec<Option<&str>> = args.iter().map(|a| a.to_str()).collect();
    match words.as_slice() {
        [Some("new")] => Command::TokenNew,
        [Some("--help" | "-h")] | [Some("new"), Some("--help" | "-h")] => print(TOKEN_HELP),
        [Some("--version" | "-V")] | [Some("new"), Some("--version" | "-V")] => {
            print(&format!("leaseagent token {}\n", env!("CARGO_PKG_VERSION")))
        }
        _ => {
            eprintln!("leaseagent token: error: usage is `leaseagent token new`");
            Command::Exit(crate::exit::AGENT_FAILED)
        }
    }
}

/// The whole command line as the generators see it.
fn cli() -> generate::Cli<'static> {
    static SUBS: std::sync::OnceLock<Vec<&'static CommandDef>> = std::sync::OnceLock::new();
    generate::Cli {
        run: &defs::RUN,
        subs: SUBS.get_or_init(|| SUBCOMMANDS.iter().map(|(d, _)| *d).collect()),
        token_about: TOKEN_ABOUT,
        token_help: TOKEN_HELP,
        version: env!("CARGO_PKG_VERSION"),
    }
}

fn completions(m: &mut Matches) -> Result<Command, UsageError> {
    let shell = m.positional_string(0)?;
    match cli().completions(&shell) {
        Some(script) => Ok(print(&script)),
        None => Err(UsageError::Words(format!(
            "<SHELL>: unknown shell `{shell}`: use {}",
            generate::SHELLS.join(", ")
        ))),
    }
}

fn man(m: &mut Matches) -> Result<Command, UsageError> {
    let sub = m.positional_string(0)?;
    match cli().man(Some(&sub)) {
        Some(page) => Ok(print(&page)),
        None => Err(UsageError::Words(format!(
            "<SUBCOMMAND>: no subcommand `{sub}` (see leaseagent --help)"
        ))),
    }
}

fn publish(m: &mut Matches) -> Result<Command, UsageError> {
    Ok(Command::Publish(publish::PublishArgs {
        token: m.parse("token", number)?,
        lock_timeout: m.get("lock-timeout", dur)?,
        src: PathBuf::from(m.positional(0)),
        dest: PathBuf::from(m.positional(1)),
    }))
}

fn check(m: &mut Matches) -> Result<Command, UsageError> {
    Ok(Command::Check(check::CheckArgs {
        min_remaining: m.get("min-remaining", dur)?,
        quiet: m.switch("quiet"),
        json: m.switch("json"),
    }))
}

fn authority(m: &Matches) -> Result<operator::AuthorityArg, UsageError> {
    Ok(operator::AuthorityArg {
        authority: m.string("authority")?,
        trust: trust(m),
    })
}

fn leases(m: &mut Matches) -> Result<Command, UsageError> {
    Ok(Command::Leases(operator::LeasesArgs {
        authority: authority(m)?,
        json: m.switch("json"),
    }))
}

fn revoke(m: &mut Matches) -> Result<Command, UsageError> {
    Ok(Command::Revoke(operator::RevokeArgs {
        authority: authority(m)?,
        task: m.positional_string(0)?,
        force: m.switch("force"),
        json: m.switch("json"),
    }))
}

fn history(m: &mut Matches) -> Result<Command, UsageError> {
    Ok(Command::History(operator::HistoryArgs {
        authority: authority(m)?,
        task: m.optional_positional_string(0)?,
        since: m.parse("since", dur)?,
        json: m.switch("json"),
    }))
}

fn clear(m: &mut Matches) -> Result<Command, UsageError> {
    Ok(Command::Clear(operator::ClearArgs {
        authority: authority(m)?,
        task: m.positional_string(0)?,
        json: m.switch("json"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    /// Parses `leaseagent ARGS` with `env` as the environment.
    fn cmd(args: &[&str], env: flags::Env) -> Command {
        let argv = std::iter::once("leaseagent")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        parse_env(argv, env)
    }

    fn run(args: &[&str]) -> Result<RunConfig, u8> {
        match cmd(args, &no_env) {
            Command::Run(c) => Ok(c),
            Command::Exit(code) => Err(code),
            _ => Err(255),
        }
    }

    #[test]
    fn token_new_with_help_prints_help_and_anything_else_is_usage() {
        let code = |args: &[&str]| match cmd(args, &no_env) {
            Command::TokenNew => None,
            Command::Exit(c) => Some(c),
            _ => Some(255),
        };
        assert_eq!(code(&["token", "new"]), None);
        for help in [
            &["token", "--help"][..],
            &["token", "-h"],
            &["token", "new", "--help"],
            &["token", "new", "-h"],
            &["token", "new", "--version"],
        ] {
            assert_eq!(code(help), Some(0), "{help:?}");
        }
        for bad in [&["token"][..], &["token", "old"], &["token", "new", "x"]] {
            assert_eq!(code(bad), Some(crate::exit::AGENT_FAILED), "{bad:?}");
        }
    }

    #[test]
    fn wait_takes_an_optional_duration() {
        let c = run(&[
            "--authority",
            "http://h:1",
            "--task",
            "t",
            "--wait",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(c.wait, Some(None));
        let c = run(&[
            "--authority",
            "http://h:1",
            "--task",
            "t",
            "--wait",
            "5s",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(c.wait, Some(Some(Duration::from_secs(5))));
        let c = run(&["--authority", "http://h:1", "--task", "t", "--", "true"]).unwrap();
        assert_eq!(c.wait, None);
    }

    #[test]
    fn options_take_attached_values_and_the_command_needs_dashdash() {
        let c = run(&[
            "--authority=http://h:1",
            "--task=t",
            "--ttl=5s",
            "--wait=2s",
            "--",
            "echo",
            "--x",
        ])
        .unwrap();
        assert_eq!(c.ttl, Duration::from_secs(5));
        assert_eq!(c.wait, Some(Some(Duration::from_secs(2))));
        assert_eq!(
            c.command,
            vec![OsString::from("echo"), OsString::from("--x")]
        );
        // A COMMAND before `--` is refused, not silently taken.
        assert_eq!(
            run(&["--authority", "http://h:1", "--task", "t", "true"]).err(),
            Some(125)
        );
        assert_eq!(
            run(&[
                "--authority",
                "http://h:1",
                "--task",
                "t",
                "-x",
                "--",
                "true"
            ])
            .err(),
            Some(125)
        );
        assert_eq!(
            run(&["--authority", "http://h:1", "--task", "t", "--ttl"]).err(),
            Some(125)
        );
        assert_eq!(run(&["-h"]).err(), Some(0));
        assert_eq!(run(&["-V"]).err(), Some(0));
    }

    #[test]
    fn usage_errors_exit_125() {
        assert_eq!(
            run(&["--task", "t", "--ttl", "5x", "--", "true"]).err(),
            Some(125)
        );
        assert_eq!(
            run(&["--authority", "http://h:1", "--task", "t"]).err(),
            Some(125)
        );
        assert_eq!(run(&["--version"]).err(), Some(0));
    }

    fn test_env(var: &str) -> Option<OsString> {
        match var {
            "LEASEAGENT_TASK" => Some("from-env".into()),
            "LEASEAGENT_AUTHORITY" => Some("http://e:1".into()),
            _ => None,
        }
    }

    #[test]
    fn run_path_takes_task_and_authority_from_the_environment() {
        use crate::authority::AuthoritySpec;
        let Command::Run(c) = cmd(&["--", "true"], &test_env) else {
            panic!("not a run")
        };
        assert_eq!(c.task, "from-env");
        assert_eq!(c.authority, AuthoritySpec::Http("http://e:1".into()));
        // Flags win over the environment; an empty --authority takes it.
        let argv = ["--task", "t", "--authority", "http://f:1", "--", "true"];
        let Command::Run(c) = cmd(&argv, &test_env) else {
            panic!("not a run")
        };
        assert_eq!(c.task, "t");
        assert_eq!(c.authority, AuthoritySpec::Http("http://f:1".into()));
        let Command::Run(c) = cmd(&["--authority=", "--task=t", "--", "true"], &test_env) else {
            panic!("not a run")
        };
        assert_eq!(c.authority, AuthoritySpec::Http("http://e:1".into()));
        // Without the environment the task is required.
        assert!(matches!(cmd(&["--", "true"], &no_env), Command::Exit(125)));
    }

    #[test]
    fn run_path_flags_reach_the_config() {
        let c = run(&[
            "--authority",
            "http://h:1",
            "--task",
            "t",
            "--ttl",
            "9s",
            "--heartbeat",
            "2s",
            "--grace",
            "1s",
            "--holder",
            "me",
            "--on-expiry",
            "grace",
            "--expiry-grace",
            "4s",
            "--",
            "cmd",
            "--",
            "x",
        ])
        .unwrap();
        let s = Duration::from_secs;
        assert_eq!((c.ttl, c.heartbeat, c.grace), (s(9), s(2), s(1)));
        assert_eq!(c.holder, "me");
        assert_eq!(c.on_expiry, crate::authority::ExpiryPolicy::Grace);
        assert_eq!(c.expiry_grace, s(4));
        // Only the first `--` ends the flags.
        assert_eq!(c.command, ["cmd", "--", "x"].map(OsString::from));
        // The last of a repeated run flag wins, as it always did.
        let c = run(&[
            "--authority",
            "http://h:1",
            "--task",
            "a",
            "--task",
            "b",
            "--",
            "x",
        ])
        .unwrap();
        assert_eq!(c.task, "b");
    }

    #[test]
    fn operator_commands_take_the_authority_from_the_environment() {
        let Command::Leases(a) = cmd(&["leases"], &test_env) else {
            panic!("not leases")
        };
        assert_eq!(a.authority.authority.as_deref(), Some("http://e:1"));
        assert!(!a.json);
        let Command::Leases(a) = cmd(&["leases", "--json"], &no_env) else {
            panic!("not leases")
        };
        assert_eq!(a.authority.authority, None);
        assert!(a.json);
        let argv = ["revoke", "--force", "--authority=http://f:1", "t"];
        let Command::Revoke(a) = cmd(&argv, &test_env) else {
            panic!("not revoke")
        };
        assert_eq!(a.authority.authority.as_deref(), Some("http://f:1"));
        assert_eq!((a.task.as_str(), a.force, a.json), ("t", true, false));
        let Command::Clear(a) = cmd(&["clear", "--json", "--", "-t"], &no_env) else {
            panic!("not clear")
        };
        assert_eq!((a.task.as_str(), a.json), ("-t", true));
    }

    #[test]
    fn serve_publish_and_check_build_their_arguments() {
        let Command::Serve(a) = cmd(&["serve", "--listen", "127.0.0.1:0", "--db=x.db"], &no_env)
        else {
            panic!("not serve")
        };
        assert_eq!(a.listen, "127.0.0.1:0");
        assert_eq!(a.db, std::path::PathBuf::from("x.db"));
        assert_eq!(a.max_connections, 16384);
        assert_eq!(a.max_connections_per_peer, 1024);
        assert_eq!(a.max_leases, Some(100_000));
        assert_eq!(a.max_leases_per_principal, 25_000);
        assert!(a.tls_cert.is_none() && !a.insecure_listen);
        let argv = [
            "serve",
            "--max-connections",
            "5",
            "--db",
            "d",
            "--listen",
            "l",
        ];
        let Command::Serve(a) = cmd(&argv, &no_env) else {
            panic!("not serve")
        };
        assert_eq!(a.max_connections, 5);

        let Command::Publish(a) = cmd(&["publish", "a", "b"], &no_env) else {
            panic!("not publish")
        };
        assert_eq!(a.token, None);
        assert_eq!(a.lock_timeout, Duration::from_secs(30));
        assert_eq!((a.src.to_str(), a.dest.to_str()), (Some("a"), Some("b")));
        let argv = ["publish", "--token", "7", "--lock-timeout", "2s", "a", "b"];
        let Command::Publish(a) = cmd(&argv, &no_env) else {
            panic!("not publish")
        };
        assert_eq!((a.token, a.lock_timeout), (Some(7), Duration::from_secs(2)));

        let Command::Check(a) = cmd(&["check"], &no_env) else {
            panic!("not check")
        };
        assert_eq!(
            (a.min_remaining, a.quiet, a.json),
            (Duration::ZERO, false, false)
        );
        let argv = ["check", "-q", "--json", "--min-remaining", "5s"];
        let Command::Check(a) = cmd(&argv, &no_env) else {
            panic!("not check")
        };
        assert_eq!(
            (a.min_remaining, a.quiet, a.json),
            (Duration::from_secs(5), true, true)
        );
    }

    #[test]
    fn help_texts_are_the_golden_files() {
        let golden = [
            (
                &defs::RUN,
                include_str!("../../tests/integration/golden/help-run.txt"),
            ),
            (
                &defs::SERVE,
                include_str!("../../tests/integration/golden/help-serve.txt"),
            ),
            (
                &defs::PUBLISH,
                include_str!("../../tests/integration/golden/help-publish.txt"),
            ),
            (
                &defs::CHECK,
                include_str!("../../tests/integration/golden/help-check.txt"),
            ),
            (
                &defs::LEASES,
                include_str!("../../tests/integration/golden/help-leases.txt"),
            ),
            (
                &defs::REVOKE,
                include_str!("../../tests/integration/golden/help-revoke.txt"),
            ),
            (
                &defs::CLEAR,
                include_str!("../../tests/integration/golden/help-clear.txt"),
            ),
            (
                &defs::HISTORY,
                include_str!("../../tests/integration/golden/help-history.txt"),
            ),
        ];
        for (def, want) in golden {
            assert_eq!(flags::help(def, &no_env), want, "{}", def.program());
        }
    }
}
