//! The command line: argv turned into one validated [`Command`].
//!
//! `leaseagent [OPTIONS] -- COMMAND [ARG...]` runs a command under a lease;
//! a first argument that names a subcommand (`serve`, `publish`, `check`,
//! `leases`, `revoke`, `clear`) selects that instead. Every usage error exits
//! 125 (the agent failed) with clap's message, which names the flag; `--help`
//! and `--version` exit 0.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser};

use crate::config::{RawRun, RunConfig};

/// What `main` is asked to do.
pub enum Command {
    Run(RunConfig),
    Serve(crate::serve::ServeArgs),
    Publish(crate::publish::PublishArgs),
    Check(crate::check::CheckArgs),
    Leases(crate::opcmd::LeasesArgs),
    Revoke(crate::opcmd::RevokeArgs),
    Clear(crate::opcmd::ClearArgs),
    /// Internal: the process-group keeper between the agent and the job.
    Keeper(Vec<OsString>),
    /// Help or version was printed, or usage was wrong: exit with this status.
    Exit(u8),
}

fn dur(s: &str) -> Result<Duration, String> {
    crate::duration::parse(s)
}

const RUN_EXAMPLES: &str = "\
Examples:
  # run a job under a lease from the embedded per-host authority
  leaseagent --task nightly-export -- ./export.sh --full

  # against a lease server, waiting up to 10 minutes if another worker holds the task
  leaseagent --authority http://leases.internal:7878 --task nightly-export --wait 10m -- ./export.sh

  # against etcd (interoperates with `etcdctl lock nightly-export`)
  leaseagent --authority etcd://10.0.0.1:2379,10.0.0.2:2379 --task nightly-export -- ./export.sh

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

/// Run a command under a lease: renewed from a dedicated thread, stopped
/// before the lease could be granted to anyone else, fenced by LEASE_TOKEN.
#[derive(Parser, Debug)]
#[command(
    name = "leaseagent",
    version,
    after_help = RUN_EXAMPLES,
    override_usage = "leaseagent [OPTIONS] --task NAME -- COMMAND [ARG...]\n       leaseagent SUBCOMMAND [ARGS]"
)]
struct RunArgs {
    /// Lease authority: http(s)://HOST:PORT, etcd://HOST:PORT[,HOST:PORT...], sqlite:PATH [default: the embedded per-host authority]
    #[arg(long, env = "LEASEAGENT_AUTHORITY", value_name = "URL")]
    authority: Option<String>,
    /// What the lease is for (1-200 bytes of A-Z a-z 0-9 . _ - : / @)
    #[arg(long, env = "LEASEAGENT_TASK", value_name = "NAME")]
    task: Option<String>,
    /// Lease duration asked for
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = dur)]
    ttl: Duration,
    /// Renewal interval; must be below --ttl [default: ttl/3]
    #[arg(long, value_name = "DUR", value_parser = dur)]
    heartbeat: Option<Duration>,
    /// SIGTERM -> SIGKILL grace when the command is stopped [default: ttl/6]
    #[arg(long, value_name = "DUR", value_parser = dur)]
    grace: Option<Duration>,
    /// Who holds the lease, as the authority shows it [default: HOSTNAME/PID]
    #[arg(long, value_name = "NAME")]
    holder: Option<String>,
    /// What the authority does when this lease expires: redispatch, grace, hold
    #[arg(long = "on-expiry", value_name = "P", default_value = "redispatch")]
    on_expiry: String,
    /// With --on-expiry grace: how long after expiry the task stays blocked [default: ttl]
    #[arg(long = "expiry-grace", value_name = "DUR", value_parser = dur)]
    expiry_grace: Option<Duration>,
    /// Wait up to DUR (forever without DUR) while another holder has the task
    #[arg(long, value_name = "DUR", num_args = 0..=1, value_parser = dur)]
    wait: Option<Option<Duration>>,
    /// The command to run, after `--`
    #[arg(value_name = "COMMAND", last = true, required = true)]
    command: Vec<OsString>,
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
  leaseagent leases --authority http://leases.internal:7878 --json";

const REVOKE_EXAMPLES: &str = "\
Examples:
  # take the task away from its holder (its agent stops the job at the next renewal)
  leaseagent revoke --authority http://leases.internal:7878 nightly-export

  # and make the task available again at once
  leaseagent revoke --force nightly-export";

const CLEAR_EXAMPLES: &str = "\
Examples:
  # a lease with --on-expiry hold expired: after checking the job's side effects,
  # let the task be granted again
  leaseagent clear --authority http://leases.internal:7878 nightly-export";

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
    args: crate::publish::PublishArgs,
}

/// Exit 0 while this job's lease is valid for at least --min-remaining.
#[derive(Parser, Debug)]
#[command(name = "leaseagent check", version)]
struct CheckCli {
    #[command(flatten)]
    args: crate::check::CheckArgs,
}

/// List the leases an authority holds.
#[derive(Parser, Debug)]
#[command(name = "leaseagent leases", version)]
struct LeasesCli {
    #[command(flatten)]
    args: crate::opcmd::LeasesArgs,
}

/// Revoke a task's current lease.
#[derive(Parser, Debug)]
#[command(name = "leaseagent revoke", version)]
struct RevokeCli {
    #[command(flatten)]
    args: crate::opcmd::RevokeArgs,
}

/// Free a task held for an operator (after an expiry with --on-expiry hold).
#[derive(Parser, Debug)]
#[command(name = "leaseagent clear", version)]
struct ClearCli {
    #[command(flatten)]
    args: crate::opcmd::ClearArgs,
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
        _ => RunArgs::try_parse_from(&argv)
            .map_err(report)
            .and_then(|a| {
                let raw = RawRun {
                    authority: a.authority,
                    task: a.task,
                    ttl: a.ttl,
                    heartbeat: a.heartbeat,
                    grace: a.grace,
                    holder: a.holder,
                    on_expiry: a.on_expiry,
                    expiry_grace: a.expiry_grace,
                    wait: a.wait,
                    command: a.command,
                };
                raw.validate().map(Command::Run).map_err(|msg| {
                    eprintln!("leaseagent: error: {msg}");
                    crate::exit::AGENT_FAILED
                })
            }),
    };
    parsed.unwrap_or_else(Command::Exit)
}

/// Shared `--authority` flag of the operator subcommands.
#[derive(Args, Debug, Clone)]
pub struct AuthorityArg {
    /// Lease authority [default: the embedded per-host authority]
    #[arg(long, env = "LEASEAGENT_AUTHORITY", value_name = "URL")]
    pub authority: Option<String>,
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
