//! The command line: argv turned into one validated [`Command`].
//!
//! `leaseagent [OPTIONS] -- COMMAND [ARG...]` runs a command under a lease;
//! a first argument that names a subcommand (`serve`, `publish`, `check`,
//! `leases`, `revoke`, `clear`) selects that instead. Every usage error exits
//! 125 (the agent failed) with a message that names the flag; `--help` and
//! `--version` exit 0. The run path is parsed with lexopt (see [`parse_run`]),
//! the subcommands with clap.

pub mod check;
pub mod operator;
pub mod publish;

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser};

use crate::agent::config::{RawRun, RunConfig};

/// What `main` is asked to do.
pub enum Command {
    Run(RunConfig),
    Serve(crate::serve::ServeArgs),
    Publish(crate::cmd::publish::PublishArgs),
    Check(crate::cmd::check::CheckArgs),
    Leases(crate::cmd::operator::LeasesArgs),
    Revoke(crate::cmd::operator::RevokeArgs),
    Clear(crate::cmd::operator::ClearArgs),
    /// Internal: the process-group keeper between the agent and the job.
    Keeper(Vec<OsString>),
    /// Help or version was printed, or usage was wrong: exit with this status.
    Exit(u8),
}

fn dur(s: &str) -> Result<Duration, String> {
    crate::time::duration::parse(s)
}

const RUN_EXAMPLES: &str = "\
Examples:
  # run a job under a lease from the embedded per-host authority
  leaseagent --task nightly-export -- ./export.sh --full

  # against a lease server, waiting up to 10 minutes if another worker holds the task
  leaseagent --authority http://leases.internal:7878 --task nightly-export --wait 10m -- ./export.sh

  # against etcd (interoperates with `etcdctl lock nightly-export`)
  leaseagent --authority etcd://10.0.0.1:2379,10.0.0.2:2379 --task nightly-export -- ./export.sh

  # etcd with TLS and etcd's own login; a lease server with TLS and a token (files, mode 0600)
  leaseagent --authority etcds://10.0.0.1:2379 --ca-file ca.pem --etcd-user batch \\
             --etcd-password-file etcd-pw --task nightly-export -- ./export.sh
  leaseagent --authority https://leases.internal:7878 --ca-file ca.pem \\
             --auth-token-file token --task nightly-export -- ./export.sh

  # inside the job: the fencing token, and a cheap validity check
  echo \"$LEASE_TOKEN\"; leaseagent check --min-remaining 5s && leaseagent publish out.tmp out

Subcommands:
  serve     the reference lease authority (lease protocol v1) on SQLite
  publish   move a job's output into place only if its token is not superseded
  check     exit 0 while this job's lease is valid for at least --min-remaining
  leases    list leases of an authority;  revoke TASK;  clear TASK
  (`leaseagent SUBCOMMAND --help` for each)

Exit status: the command's own; 128+N killed by signal N; 124 lease lost;
75 task held elsewhere; 125 agent failed; 126 cannot execute; 127 not found.";

/// `leaseagent --help`.
const RUN_HELP: &str = "\
Run a command under a lease: renewed from a dedicated thread, stopped before
the lease could be granted to anyone else, fenced by LEASE_TOKEN.

Usage: leaseagent [OPTIONS] --task NAME -- COMMAND [ARG...]
       leaseagent SUBCOMMAND [ARGS]

Options:
      --authority URL    Lease authority: http(s)://HOST:PORT, etcd(s)://HOST:PORT[,HOST:PORT...],
                         sqlite:PATH [env: LEASEAGENT_AUTHORITY; default: the embedded per-host authority]
      --task NAME        What the lease is for (1-200 bytes of A-Z a-z 0-9 . _ - : / @)
                         [env: LEASEAGENT_TASK]
      --ttl DUR          Lease duration asked for [default: 30s]
      --heartbeat DUR    Renewal interval; must be below --ttl [default: ttl/3]
      --grace DUR        SIGTERM -> SIGKILL grace when the command is stopped [default: ttl/6]
      --holder NAME      Who holds the lease, as the authority shows it [default: HOSTNAME/PID]
      --on-expiry P      What the authority does when this lease expires: redispatch, grace, hold
                         [default: redispatch]
      --expiry-grace DUR With --on-expiry grace: how long after expiry the task stays blocked
                         [default: ttl]
      --wait [DUR]       Wait up to DUR (forever without DUR) while another holder has the task

Trust (https://, etcds://, authorities with credentials; files only, never secrets in argv):
      --ca-file FILE     PEM CAs that sign the authority's certificate [env: LEASEAGENT_CA_FILE;
                         default: the system's roots]
      --client-cert FILE PEM client certificate for mutual TLS [env: LEASEAGENT_CLIENT_CERT]
      --client-key FILE  Its key, mode 0600 [env: LEASEAGENT_CLIENT_KEY]
      --auth-token-file FILE
                         Bearer token for leaseagent serve (first line), mode 0600
                         [env: LEASEAGENT_AUTH_TOKEN_FILE]
      --etcd-user NAME   etcd user [env: LEASEAGENT_ETCD_USER]
      --etcd-password-file FILE
                         That user's password (first line), mode 0600
                         [env: LEASEAGENT_ETCD_PASSWORD_FILE]
  -h, --help             Print help
  -V, --version          Print version

DUR is a whole number with a unit: 250ms, 2s, 5m, 1h.
";

/// Why the run-path arguments did not give a [`RawRun`].
enum RunParse {
    Help,
    Version,
    Error(String),
}

fn flag_value(p: &mut lexopt::Parser, flag: &str) -> Result<String, RunParse> {
    let v = p
        .value()
        .map_err(|_| RunParse::Error(format!("{flag} needs a value")))?;
    v.into_string().map_err(|v| {
        RunParse::Error(format!(
            "{flag}: `{}` is not valid UTF-8",
            v.to_string_lossy()
        ))
    })
}

fn flag_dur(p: &mut lexopt::Parser, flag: &str) -> Result<Duration, RunParse> {
    let v = flag_value(p, flag)?;
    dur(&v).map_err(|e| RunParse::Error(format!("{flag}: {e}")))
}

/// Parses `leaseagent [OPTIONS] -- COMMAND [ARG...]` (argv without argv[0]).
///
/// A small hand-off to lexopt rather than clap: this is the path every job
/// start takes, and the agent's memory is what runs next to every job (clap
/// costs about half a MiB of resident code; the subcommands keep it).
fn parse_run(args: &[OsString]) -> Result<RawRun, RunParse> {
    let split = args.iter().position(|a| a == "--");
    let (opts, command) = match split {
        Some(i) => (&args[..i], args[i + 1..].to_vec()),
        None => (args, Vec::new()),
    };
    let mut raw = RawRun {
        ttl: Duration::from_secs(30),
        on_expiry: "redispatch".into(),
        command,
        ..Default::default()
    };
    let mut p = lexopt::Parser::from_args(opts.iter().cloned());
    loop {
        let arg = p.next().map_err(|e| RunParse::Error(e.to_string()))?;
        let Some(arg) = arg else { break };
        use lexopt::Arg::{Long, Short, Value};
        match arg {
            Short('h') | Long("help") => return Err(RunParse::Help),
            Short('V') | Long("version") => return Err(RunParse::Version),
            Long("authority") => raw.authority = Some(flag_value(&mut p, "--authority")?),
            Long("task") => raw.task = Some(flag_value(&mut p, "--task")?),
            Long("ttl") => raw.ttl = flag_dur(&mut p, "--ttl")?,
            Long("heartbeat") => raw.heartbeat = Some(flag_dur(&mut p, "--heartbeat")?),
            Long("grace") => raw.grace = Some(flag_dur(&mut p, "--grace")?),
            Long("holder") => raw.holder = Some(flag_value(&mut p, "--holder")?),
            Long("on-expiry") => raw.on_expiry = flag_value(&mut p, "--on-expiry")?,
            Long("expiry-grace") => raw.expiry_grace = Some(flag_dur(&mut p, "--expiry-grace")?),
            Long("ca-file") => raw.trust.ca_file = Some(flag_value(&mut p, "--ca-file")?.into()),
            Long("client-cert") => {
                raw.trust.client_cert = Some(flag_value(&mut p, "--client-cert")?.into());
            }
            Long("client-key") => {
                raw.trust.client_key = Some(flag_value(&mut p, "--client-key")?.into());
            }
            Long("auth-token-file") => {
                raw.trust.auth_token_file = Some(flag_value(&mut p, "--auth-token-file")?.into());
            }
            Long("etcd-user") => raw.trust.etcd_user = Some(flag_value(&mut p, "--etcd-user")?),
            Long("etcd-password-file") => {
                raw.trust.etcd_password_file =
                    Some(flag_value(&mut p, "--etcd-password-file")?.into());
            }
            Long("wait") => {
                // `--wait=DUR`, `--wait DUR`, or `--wait` alone (forever).
                let attached = p.optional_value();
                let next = match attached {
                    Some(v) => Some(v),
                    None => p
                        .try_raw_args()
                        // The COMMAND only comes after `--`, so a word that is
                        // not an option can only be meant as the duration.
                        .and_then(|mut raw| raw.next_if(|a| !a.to_string_lossy().starts_with('-'))),
                };
                let d = match next {
                    Some(v) => Some(
                        dur(&v.to_string_lossy())
                            .map_err(|e| RunParse::Error(format!("--wait: {e}")))?,
                    ),
                    None => None,
                };
                raw.wait = Some(d);
            }
            Long(other) => {
                return Err(RunParse::Error(format!(
                    "unknown option --{other} (see leaseagent --help)"
                )));
            }
            Short(c) => {
                return Err(RunParse::Error(format!(
                    "unknown option -{c} (see leaseagent --help)"
                )));
            }
            Value(v) => {
                return Err(RunParse::Error(format!(
                    "unexpected argument `{}`: the COMMAND goes after `--` (leaseagent [OPTIONS] -- COMMAND [ARG...])",
                    v.to_string_lossy()
                )));
            }
        }
    }
    if raw.authority.as_deref().is_none_or(str::is_empty) {
        raw.authority = std::env::var("LEASEAGENT_AUTHORITY")
            .ok()
            .filter(|v| !v.is_empty());
    }
    if raw.task.is_none() {
        raw.task = std::env::var("LEASEAGENT_TASK").ok();
    }
    raw.trust.fill_from_env();
    if split.is_none() {
        return Err(RunParse::Error(
            "no COMMAND given: usage is leaseagent [OPTIONS] --task NAME -- COMMAND [ARG...]"
                .into(),
        ));
    }
    Ok(raw)
}

const SERVE_EXAMPLES: &str = "\
Examples:
  # the lease authority for a fleet of workers, its state in one SQLite file
  leaseagent serve --listen 0.0.0.0:7878 --db /var/lib/leaseagent-serve/leases.sqlite3

  # on each worker
  leaseagent --authority http://leases.internal:7878 --task nightly-export -- ./export.sh

  # as a systemd service (systemd/leaseagent-serve.service)
  systemctl enable --now leaseagent-serve.service";

const PUBLISH_EXAMPLES: &str = "\
Examples:
  # in a job run by leaseagent (the token comes from $LEASE_TOKEN):
  # write next to the destination, then move it into place if not superseded
  ./export.sh > /srv/exports/.report.csv.tmp &&
    leaseagent publish /srv/exports/.report.csv.tmp /srv/exports/report.csv

  # a whole directory, with an explicit token
  leaseagent publish --token 42 /srv/site.new /srv/site";

const CHECK_EXAMPLES: &str = "\
Examples:
  # in a job run by leaseagent: stop between batches when the lease runs short
  for b in batches/*; do leaseagent check --min-remaining 10s || exit 1; ./process \"$b\"; done

  # the agent's view of the lease, as JSON
  leaseagent check --json";

const LEASES_EXAMPLES: &str = "\
Examples:
  # leases of the embedded per-host authority
  leaseagent leases

  # of a lease server, as JSON
  leaseagent leases --authority http://leases.internal:7878 --json

  # of a TLS lease server with a token, and of etcd with TLS and etcd's own login
  leaseagent leases --authority https://leases.internal:7878 --ca-file ca.pem --auth-token-file ~/.leaseagent-token
  leaseagent leases --authority etcds://10.0.0.1:2379 --ca-file ca.pem --etcd-user ops --etcd-password-file ~/.etcd-pw

With etcd, every lock key is listed (leaseagent's and `etcdctl lock`'s): the first of each
task is `active`, the others `waiting` in queue order; TOKEN is the key's create revision.";

const REVOKE_EXAMPLES: &str = "\
Examples:
  # take the task away from its holder (its agent stops the job at the next renewal)
  leaseagent revoke --authority http://leases.internal:7878 nightly-export

  # and make the task available again at once
  leaseagent revoke --force nightly-export

With etcd, revoke revokes the holder's etcd lease: its key is deleted at once and the next
waiter (leaseagent or `etcdctl lock`) gets the task; --force changes nothing.";

const CLEAR_EXAMPLES: &str = "\
Examples:
  # a lease with --on-expiry hold expired: after checking the job's side effects,
  # let the task be granted again
  leaseagent clear --authority http://leases.internal:7878 nightly-export

etcd has no held-for-operator state (it frees a task when its lease expires, and leaseagent
refuses --on-expiry hold with etcd): clear there always exits 1, nothing to clear.";

/// The reference lease authority (lease protocol v1) with its state in SQLite.
#[derive(Parser, Debug)]
#[command(name = "leaseagent serve", version)]
struct ServeCli {
    #[command(flatten)]
    args: crate::serve::ServeArgs,
}

/// Move a job's output into place only if its fencing token is not superseded.
#[derive(Parser, Debug)]
#[command(name = "leaseagent publish", version)]
struct PublishCli {
    #[command(flatten)]
    args: crate::cmd::publish::PublishArgs,
}

/// Exit 0 while this job's lease is valid for at least --min-remaining.
#[derive(Parser, Debug)]
#[command(name = "leaseagent check", version)]
struct CheckCli {
    #[command(flatten)]
    args: crate::cmd::check::CheckArgs,
}

/// List the leases an authority holds.
#[derive(Parser, Debug)]
#[command(name = "leaseagent leases", version)]
struct LeasesCli {
    #[command(flatten)]
    args: crate::cmd::operator::LeasesArgs,
}

/// Revoke a task's current lease.
#[derive(Parser, Debug)]
#[command(name = "leaseagent revoke", version)]
struct RevokeCli {
    #[command(flatten)]
    args: crate::cmd::operator::RevokeArgs,
}

/// Free a task held for an operator (after an expiry with --on-expiry hold).
#[derive(Parser, Debug)]
#[command(name = "leaseagent clear", version)]
struct ClearCli {
    #[command(flatten)]
    args: crate::cmd::operator::ClearArgs,
}

/// Parses one subcommand's arguments (`argv[0]` is the subcommand name).
/// `examples` go at the end of its `--help`, after any text the subcommand's
/// own `Args` put there.
fn sub<P: Parser, T>(
    argv: &[OsString],
    name: &str,
    examples: &str,
    pick: impl FnOnce(P) -> T,
) -> Result<T, u8> {
    let mut full = vec![OsString::from(format!("leaseagent {name}"))];
    full.extend(argv.iter().skip(1).cloned());
    let mut cmd = P::command();
    let help = match cmd.get_after_help() {
        Some(own) => format!("{own}\n\n{examples}"),
        None => examples.to_string(),
    };
    cmd = cmd.after_help(help);
    let mut matches = cmd.try_get_matches_from_mut(full).map_err(report)?;
    P::from_arg_matches_mut(&mut matches)
        .map(pick)
        .map_err(|e| report(e.format(&mut cmd)))
}

fn report(e: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    let _ = e.print();
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => 0,
        _ => crate::exit::AGENT_FAILED,
    }
}

/// Turns argv (including `argv[0]`) into a [`Command`].
pub fn parse(argv: Vec<OsString>) -> Command {
    let rest = &argv[1.min(argv.len())..];
    let first = rest.first().and_then(|a| a.to_str()).unwrap_or("");
    let parsed = match first {
        "serve" => sub(rest, first, SERVE_EXAMPLES, |c: ServeCli| {
            Command::Serve(c.args)
        }),
        "publish" => sub(rest, first, PUBLISH_EXAMPLES, |c: PublishCli| {
            Command::Publish(c.args)
        }),
        "check" => sub(rest, first, CHECK_EXAMPLES, |c: CheckCli| {
            Command::Check(c.args)
        }),
        "leases" => sub(rest, first, LEASES_EXAMPLES, |c: LeasesCli| {
            Command::Leases(c.args)
        }),
        "revoke" => sub(rest, first, REVOKE_EXAMPLES, |c: RevokeCli| {
            Command::Revoke(c.args)
        }),
        "clear" => sub(rest, first, CLEAR_EXAMPLES, |c: ClearCli| {
            Command::Clear(c.args)
        }),
        crate::keeper::KEEPER_ARG => Ok(Command::Keeper(rest[1..].to_vec())),
        _ => match parse_run(rest) {
            Ok(raw) => raw.validate().map(Command::Run).map_err(|msg| {
                eprintln!("leaseagent: error: {msg}");
                crate::exit::AGENT_FAILED
            }),
            Err(RunParse::Help) => {
                println!("{RUN_HELP}\n{RUN_EXAMPLES}");
                Err(0)
            }
            Err(RunParse::Version) => {
                println!("leaseagent {}", env!("CARGO_PKG_VERSION"));
                Err(0)
            }
            Err(RunParse::Error(msg)) => {
                eprintln!("leaseagent: error: {msg}");
                Err(crate::exit::AGENT_FAILED)
            }
        },
    };
    parsed.unwrap_or_else(Command::Exit)
}

/// Shared `--authority` flag (and the trust flags) of the operator subcommands.
#[derive(Args, Debug, Clone)]
pub struct AuthorityArg {
    /// Lease authority: http(s)://HOST:PORT, etcd(s)://HOST:PORT[,...], sqlite:PATH
    /// [default: the embedded per-host authority]
    #[arg(
        long,
        env = "LEASEAGENT_AUTHORITY",
        value_name = "URL",
        hide_env_values = true
    )]
    pub authority: Option<String>,
    #[command(flatten)]
    pub trust: crate::authority::trust::TrustFiles,
}

impl AuthorityArg {
    pub fn spec(&self) -> Result<crate::authority::AuthoritySpec, String> {
        match self.authority.as_deref() {
            None | Some("") => crate::authority::AuthoritySpec::default_local(),
            Some(u) => {
                crate::authority::AuthoritySpec::parse(u).map_err(|e| format!("--authority: {e}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<RunConfig, u8> {
        let argv = std::iter::once("leaseagent")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        match parse(argv) {
            Command::Run(c) => Ok(c),
            Command::Exit(code) => Err(code),
            _ => Err(255),
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
}
