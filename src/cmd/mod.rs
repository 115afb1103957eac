//! The command line: argv turned into one validated [`Command`].
//!
//! `leaseagent [OPTIONS] -- COMMAND [ARG...]` runs a command under a lease;
//! a first argument that names a subcommand (`serve`, `publish`, `check`,
//! `leases`, `revoke`, `clear`, `history`, `completions`, `man`, `token`)
//! selects that instead. Every usage error exits 125 (the agent failed)
//! with one line, `leaseagent[ SUBCOMMAND]: error: ..`, that names the
//! flag; `--help` and `--version` exit 0.
//!
//! Every command is one table entry ([`defs`]): its flags with their
//! typed readers, its positionals, its help texts and its rules between
//! flags. [`parse`] reads argv against it into the command's typed
//! arguments, the command's `finish` checks them and makes the
//! [`Command`]; [`help`] and [`generate`] render `--help`, the man pages
//! and the completions from the same entries ([`flags`] has the types).
//! Only the internal `__keeper` argv is not a table entry: it is the
//! agent's own protocol with the keeper, not a command line.

pub mod check;
mod defs;
pub mod flags;
mod generate;
mod help;
pub mod operator;
mod parse;
pub mod publish;
pub mod server;

use std::ffi::OsString;

pub use flags::Command;
use flags::Entry;

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
    let (entry, args): (&dyn Entry, &[OsString]) =
        match defs::SUBCOMMANDS.iter().find(|d| d.name() == first) {
            Some(d) => (*d, &rest[1..]),
            None => (&defs::RUN, rest),
        };
    entry.command(args, env).unwrap_or_else(|e| {
        eprintln!("{}: error: {e}", flags::program(entry.name()));
        Command::Exit(crate::exit::AGENT_FAILED)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::config::RunConfig;
    use defs::SUBCOMMANDS;
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
        let argv = ["serve", "--listen", "127.0.0.1:0", "--db=x.db", "--no-auth"];
        let Command::Serve(a) = cmd(&argv, &no_env) else {
            panic!("not serve")
        };
        assert!(a.no_auth && a.auth_file.is_none());
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
            "--auth-file",
            "a.toml",
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

    /// Every command: the run path, then the subcommands.
    fn entries() -> Vec<&'static dyn Entry> {
        std::iter::once(&defs::RUN as &dyn Entry)
            .chain(SUBCOMMANDS.iter().copied())
            .collect()
    }

    #[test]
    fn help_texts_are_the_golden_files() {
        for entry in entries() {
            let name = match entry.name() {
                "" => "run",
                sub => sub,
            };
            let path = format!(
                "{}/tests/integration/golden/help-{name}.txt",
                env!("CARGO_MANIFEST_DIR")
            );
            let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert_eq!(help::help(&entry.doc(), &no_env), want, "{path}");
        }
    }

    #[test]
    fn the_run_help_ends_with_the_exit_table_in_one_line() {
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let examples = words(defs::RUN.examples);
        assert!(
            examples.ends_with(&words(&crate::exit::summary())),
            "the run path's help must end with crate::exit::summary():\n{}",
            crate::exit::summary()
        );
    }

    #[test]
    fn every_table_entry_is_read() {
        for entry in entries() {
            entry.check_readers();
        }
    }

    #[test]
    fn subcommand_names_are_unique_and_not_the_keepers() {
        let names: Vec<&str> = SUBCOMMANDS.iter().map(|d| d.name()).collect();
        for (i, n) in names.iter().enumerate() {
            assert!(!n.is_empty() && !names[..i].contains(n), "{n}");
            assert_ne!(*n, crate::keeper::KEEPER_ARG);
        }
    }

    #[test]
    fn man_and_completions_refuse_what_they_do_not_know() {
        let err = |args: &[&str]| match cmd(args, &no_env) {
            Command::Exit(c) => c,
            _ => 255,
        };
        assert_eq!(err(&["man", "nope"]), crate::exit::AGENT_FAILED);
        assert_eq!(err(&["completions", "tcsh"]), crate::exit::AGENT_FAILED);
        assert_eq!(err(&["completions"]), crate::exit::AGENT_FAILED);
    }
}
