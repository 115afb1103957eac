//! The flag tables: every command's flags and positionals in the order help
//! lists them, each with its reader, and each command's rules between flags
//! (its `finish`). Parsing, `--help`, the man pages and the completions are
//! all made from here ([`super::flags`] has the types, [`super::parse`] the
//! rules of the command line).
//!
//! ## Adding a flag
//!
//! One entry in the command's list, ending with its reader:
//!
//! ```text
//! Flag::value("lock-timeout", "DUR", "Longest wait for another publisher of DEST")
//!     .default_value("30s")
//!     .reads(|a, v| { a.lock_timeout = dur(v)?; Ok(()) }),
//! ```
//!
//! and the field it writes in the command's typed arguments (`RawRun` in
//! `agent/config.rs` for the run path, `ServeArgs` in `serve/mod.rs`, the
//! `*Args` of `cmd/`). A value's own rule belongs in its reader (`dur`,
//! `number`, `text`; the error names the flag by itself); a rule between
//! flags in the command's `finish` below (the run path's: `RawRun::validate`).
//! `Flag::switch(..).sets(|a| ..)` for a switch, `Flag::optional` for
//! `--flag [VALUE]`. Builders: `.short('q')`, `.env("VAR")`,
//! `.default_value("30s")` (read when absent, shown), `.default_note("ttl/3")`
//! (shown only), `.required()`, `.complete(Complete::Files)` (what a shell
//! offers; nothing unless said), `.doc("...")` (the man page's text when it
//! says more than the help line). A help text may be broken by hand with
//! `\n`; it is wrapped where it is wider than help's columns anyway. Then
//! `LEASEAGENT_BLESS=1 cargo test --test integration cli_` rewrites the
//! golden help, man pages and completions: read the diff. The test
//! `every_table_entry_is_read` gives each flag two values and checks that
//! the typed arguments change; a new value name (`DUR`, `FILE`, ...) needs
//! two sample values in `parse::check_readers`.

use std::ffi::OsString;
use std::path::PathBuf;

use super::flags::{
    BoxError, Command, CommandDef, Complete, Entry, Flag, Group, Positional, Syntax, UsageError,
    dur, number, print, text,
};
use super::operator::{AuthorityArg, ClearArgs, HistoryArgs, LeasesArgs, RevokeArgs};
use crate::agent::config::RawRun;
use crate::authority::trust::TrustFiles;

/// The subcommands, in the order the man page and the completions list
/// them; the run path is [`RUN`].
pub const SUBCOMMANDS: &[&dyn Entry] = &[
    &SERVE,
    &PUBLISH,
    &CHECK,
    &LEASES,
    &REVOKE,
    &CLEAR,
    &HISTORY,
    &COMPLETIONS,
    &MAN,
    &TOKEN,
];

/// The whole command line as the generators see it.
pub fn cli() -> super::generate::Cli<'static> {
    super::generate::Cli {
        run: RUN.doc(),
        subs: SUBCOMMANDS.iter().map(|d| d.doc()).collect(),
        version: env!("CARGO_PKG_VERSION"),
    }
}

/// Typed arguments that take the trust flags ([`Trusting::TRUST`]).
pub trait Trusting: Sized + 'static {
    fn trust(&mut self) -> &mut TrustFiles;

    /// How every client of an authority trusts it and proves who it is (the
    /// run path and the operator commands; `authority::trust`). Files only:
    /// no secret is ever taken from argv.
    const TRUST: Group<Self> = Group {
        heading: Some("Trust (https://, etcds://, credentials; secrets only in files, mode 0600)"),
        flags: &[
            Flag::value(
                "ca-file",
                "FILE",
                "PEM CAs that sign the authority's certificate",
            )
            .env("LEASEAGENT_CA_FILE")
            .default_note("the system's roots")
            .complete(Complete::Files)
            .reads(|a, v| {
                a.trust().ca_file = Some(v.into());
                Ok(())
            }),
            Flag::value(
                "client-cert",
                "FILE",
                "PEM client certificate for mutual TLS (with --client-key)",
            )
            .env("LEASEAGENT_CLIENT_CERT")
            .complete(Complete::Files)
            .reads(|a, v| {
                a.trust().client_cert = Some(v.into());
                Ok(())
            }),
            Flag::value("client-key", "FILE", "PEM key of --client-cert")
                .env("LEASEAGENT_CLIENT_KEY")
                .complete(Complete::Files)
                .reads(|a, v| {
                    a.trust().client_key = Some(v.into());
                    Ok(())
                }),
            Flag::value(
                "auth-token-file",
                "FILE",
                "Bearer token for leaseagent serve: the file's first line",
            )
            .env("LEASEAGENT_AUTH_TOKEN_FILE")
            .complete(Complete::Files)
            .reads(|a, v| {
                a.trust().auth_token_file = Some(v.into());
                Ok(())
            }),
            Flag::value(
                "etcd-user",
                "NAME",
                "etcd user (etcd's own authentication; with --etcd-password-file)",
            )
            .env("LEASEAGENT_ETCD_USER")
            .reads(|a, v| {
                a.trust().etcd_user = Some(v.to_string_lossy().into_owned());
                Ok(())
            }),
            Flag::value(
                "etcd-password-file",
                "FILE",
                "That etcd user's password: the file's first line",
            )
            .env("LEASEAGENT_ETCD_PASSWORD_FILE")
            .complete(Complete::Files)
            .reads(|a, v| {
                a.trust().etcd_password_file = Some(v.into());
                Ok(())
            }),
        ],
    };
}

/// Typed arguments of an operator command: `--authority` and the trust
/// flags ([`AuthorityArg`]).
pub trait Operating: Sized + 'static {
    fn target(&mut self) -> &mut AuthorityArg;

    /// The operator commands' `--authority`.
    const AUTHORITY: Flag<Self> = Flag::value("authority", "URL", "Lease authority")
        .url()
        .env("LEASEAGENT_AUTHORITY")
        .default_note("the embedded per-host authority")
        .reads(|a, v| {
            a.target().authority = Some(text(v)?);
            Ok(())
        });
}

impl<T: Operating> Trusting for T {
    fn trust(&mut self) -> &mut TrustFiles {
        &mut self.target().trust
    }
}

impl Trusting for RawRun {
    fn trust(&mut self) -> &mut TrustFiles {
        &mut self.trust
    }
}

/// `leaseagent [OPTIONS] -- COMMAND [ARG...]`.
pub static RUN: CommandDef<RawRun> = CommandDef {
    name: "",
    about: "\
Run a command under a lease: renewed from a dedicated thread, stopped before
the lease could be granted to anyone else, fenced by LEASE_TOKEN.",
    usage: Some(
        "leaseagent [OPTIONS] --task NAME -- COMMAND [ARG...]\n       leaseagent SUBCOMMAND [ARGS]",
    ),
    groups: &[
        Group {
            heading: None,
            flags: &[
                Flag::value(
                    "authority",
                    "URL",
                    "Lease authority: http(s)://HOST:PORT[,URL...] (serve, or its replicas),\n\
                     etcd(s)://HOST:PORT[,HOST:PORT...], sqlite:PATH",
                )
                .doc(
                    "Lease authority. http(s)://HOST:PORT is lease protocol v1 (leaseagent serve); \
                     several such URLs separated by commas are the replicas of one authority: a \
                     call answered not_leader, refused or timed out goes on to the leader named \
                     (if it is one of these URLs) or the next URL within the same try, and the log \
                     says which replica answered. etcd(s)://HOST:PORT[,HOST:PORT...] is etcd; \
                     sqlite:PATH an embedded database file.",
                )
                .url()
                .env("LEASEAGENT_AUTHORITY")
                .default_note("the embedded per-host authority")
                .reads(|a, v| {
                    a.authority = Some(text(v)?);
                    Ok(())
                }),
                Flag::value(
                    "task",
                    "NAME",
                    "What the lease is for (1-200 bytes of A-Z a-z 0-9 . _ - : / @)",
                )
                .env("LEASEAGENT_TASK")
                .reads(|a, v| {
                    a.task = Some(text(v)?);
                    Ok(())
                }),
                Flag::value("ttl", "DUR", "Lease duration asked for (1s to 24h)")
                    .default_value("30s")
                    .reads(|a, v| {
                        a.ttl = dur(v)?;
                        Ok(())
                    }),
                Flag::value(
                    "heartbeat",
                    "DUR",
                    "Renewal interval: at least 100ms, with room for a retry before the\ncommand's SIGTERM at ttl - grace",
                )
                .default_note("ttl/3")
                .reads(|a, v| {
                    a.heartbeat = Some(dur(v)?);
                    Ok(())
                }),
                Flag::value(
                    "grace",
                    "DUR",
                    "SIGTERM -> SIGKILL grace when the command is stopped",
                )
                .default_note("ttl/6")
                .reads(|a, v| {
                    a.grace = Some(dur(v)?);
                    Ok(())
                }),
                Flag::value(
                    "holder",
                    "NAME",
                    "Who holds the lease, as the authority shows it",
                )
                .default_note("HOSTNAME/PID")
                .reads(|a, v| {
                    a.holder = Some(text(v)?);
                    Ok(())
                }),
                Flag::value(
                    "on-expiry",
                    "P",
                    "What the authority does when this lease expires: redispatch, grace, hold",
                )
                .default_value("redispatch")
                .reads(|a, v| {
                    a.on_expiry = text(v)?;
                    Ok(())
                }),
                Flag::value(
                    "expiry-grace",
                    "DUR",
                    "With --on-expiry grace: how long after expiry the task stays blocked",
                )
                .default_note("ttl")
                .reads(|a, v| {
                    a.expiry_grace = Some(dur(v)?);
                    Ok(())
                }),
                Flag::optional(
                    "wait",
                    "DUR",
                    "Wait up to DUR (forever without DUR) while another holder has the task",
                )
                .reads(|a, v| {
                    a.wait = Some(v.map(dur).transpose()?);
                    Ok(())
                }),
                Flag::value(
                    "clock-drift",
                    "PPM",
                    "Clock-rate difference budgeted between this host and the authority:\nthe deadline is sent + ttl*(1 - PPM/1e6) - 1ms",
                )
                .default_value("1000")
                .reads(|a, v| {
                    a.clock_drift_ppm = Some(ppm(v)?);
                    Ok(())
                }),
                Flag::value(
                    "renew-priority",
                    "DSCP,PRIO",
                    "How renewal packets are marked, so that a host or link that honours\npriority sends them ahead of the command's own traffic: DSCP (0-63,\ncs0-cs7, ef, af11-af43) and SO_PRIORITY (0-7, 7 needs CAP_NET_ADMIN),\nor off",
                )
                .env("LEASEAGENT_RENEW_PRIORITY")
                .default_value(crate::authority::netpath::DEFAULT_MARKS)
                .reads(|a, v| {
                    a.renew_marks = crate::authority::netpath::parse_marks(&text(v)?)?;
                    Ok(())
                }),
                Flag::switch(
                    "remap-exit",
                    "The command's own exit codes 124 and 125 become 1, so 124/125 always\nmean the agent's (lease lost / agent failed)",
                )
                .sets(|a| a.remap_exit = true),
                Flag::switch(
                    "no-pid-namespace",
                    "Run the command in the agent's own PID namespace, for a command that\nmust see the host's processes; its tree is then held by a cgroup or the\nprocess tree alone (LEASE_CONTAINMENT=cgroup|tree), and a command that\nsignals its own supervisors can outlive them",
                )
                .sets(|a| a.no_pid_namespace = true),
                Flag::value(
                    "user",
                    "NAME[:GROUP]",
                    "Run the command as this user (and group), with its supplementary groups\nand HOME, USER, LOGNAME as runuser sets them (root only); the agent and\nits keeper keep their own",
                )
                .default_note("the agent's own")
                .doc("Run the command as the user NAME, with NAME's primary group or GROUP, NAME's supplementary groups (as initgroups(3) sets them) and HOME, USER and LOGNAME as runuser(1) -u sets them. NAME and GROUP are names, or numbers when no entry has that name. Only root (CAP_SETUID and CAP_SETGID) may name another user; the agent and its keeper keep their own ids, so the command can neither signal nor trace them. An unknown user or group, or another user asked for by an unprivileged agent, is refused before anything is acquired (exit 125).")
                .reads(|a, v| {
                    a.user = Some(text(v)?);
                    Ok(())
                }),
                Flag::switch(
                    "allow-new-privs",
                    "With --user: let the command gain privileges through set-uid programs and\nfile capabilities (sudo, su, ping on some systems); without it the command\nruns with NoNewPrivs and such programs run without their extra privileges",
                )
                .doc("With --user, the command runs with the kernel's NoNewPrivs flag set: a set-uid or set-gid program (sudo, su, passwd, mount) or one with file capabilities runs with the command's own ids and no extra privilege, so such helpers fail. This flag leaves NoNewPrivs unset, for a command that needs them; it then holds only what those programs themselves allow.")
                .sets(|a| a.allow_new_privs = true),
                Flag::switch(
                    "full-root",
                    "A command run as root keeps every capability. Without it a root command\nkeeps root over its own work but not CAP_SYS_ADMIN, CAP_SYS_PTRACE,\nCAP_SYS_RESOURCE, CAP_SYS_NICE and the others that reach its guardians;\nwith it the command can trace, limit and unmount its way past them: the\nguarantee that the guardians are out of the command's reach is given up",
                )
                .doc("Without this flag a command that runs as root (a root agent without --user, or --user root) loses, from its bounding, effective, permitted, inheritable and ambient sets, the capabilities that reach outside its namespaces and so its guardians: CAP_SYS_ADMIN (mounts, such as unmounting its /proc), CAP_SYS_PTRACE, CAP_SYS_RESOURCE, CAP_SYS_NICE, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_BOOT, CAP_DAC_READ_SEARCH, CAP_BPF, CAP_PERFMON, CAP_CHECKPOINT_RESTORE, CAP_MAC_ADMIN and CAP_MAC_OVERRIDE; its /proc shows only the processes it may trace. With --full-root it keeps them all, and gives up the guarantee that the agent and the keeper are out of its reach: it can trace, limit or unmount its way past them.")
                .sets(|a| a.full_root = true),
            ],
        },
        RawRun::TRUST,
        Group {
            heading: Some("Logging and exit status (cron, systemd)"),
            flags: &[
                Flag::switch(
                    "quiet",
                    "Log errors only: a run that succeeds, or finds the task held\nelsewhere, prints nothing (for cron)",
                )
                .short('q')
                .sets(|a| a.quiet = true),
                Flag::switch(
                    "verbose",
                    "Log more: -v debug, -vv trace",
                )
                .short('v')
                .repeatable()
                .sets(|a| a.verbose = a.verbose.saturating_add(1)),
                Flag::value(
                    "log-level",
                    "L",
                    "The agent's log level: error, warn, info, debug, trace (never below\nerror; RUST_LOG still sets the other crates')",
                )
                .env("LEASEAGENT_LOG")
                .default_note("info")
                .complete(Complete::Words(&["error", "warn", "info", "debug", "trace"]))
                .reads(|a, v| {
                    a.log_level = Some(crate::agent::logging::parse_level(&text(v)?)?);
                    Ok(())
                }),
                Flag::value(
                    "log-format",
                    "F",
                    "text (the journal's native protocol under systemd), or json: one\nobject a line on stderr, for log shippers",
                )
                .default_note("text")
                .complete(Complete::Words(&["text", "json"]))
                .reads(|a, v| {
                    let s = text(v)?;
                    a.log_format = crate::agent::logging::Format::parse(&s)
                        .ok_or_else(|| format!("`{s}` is not a log format; use text or json"))?;
                    Ok(())
                }),
                Flag::value(
                    "held-exit",
                    "CODE",
                    "Exit status when the task is held elsewhere (0 for cron, as flock -E 0:\nheld is a normal night)",
                )
                .default_note("75")
                .reads(|a, v| {
                    a.held_exit = Some(number(v)?);
                    Ok(())
                }),
            ],
        },
    ],
    positionals: &[],
    syntax: Syntax::Run(|a, command| a.command = command),
    notes: Some("DUR is a whole number with a unit: 250ms, 2s, 5m, 1h."),
    examples: "\
Examples:
  # run a job under a lease from the embedded per-host authority
  leaseagent --task nightly-export -- ./export.sh --full

  # against a lease server, waiting up to 10 minutes if another worker holds the task
  leaseagent --authority http://leases.internal:7878 --task nightly-export --wait 10m -- ./export.sh

  # against etcd (interoperates with `etcdctl lock nightly-export`)
  leaseagent --authority etcd://10.0.0.1:2379,10.0.0.2:2379 --task nightly-export -- ./export.sh

  # etcd with TLS and etcd's own login; a lease server with TLS and a token
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
  history   past attempts of tasks: who held them, how each ended
  completions SHELL, man [SUBCOMMAND]   shell completions and man pages
  (`leaseagent SUBCOMMAND --help` for each)

Exit status: the command's own; 128+N killed by signal N; 124 lease lost;
75 task held elsewhere; 125 agent failed; 126 cannot execute; 127 not found.",
    // The run path's rules between flags: `RawRun::validate` (with
    // `agent::timing`).
    finish: |raw| Ok(Command::Run(raw.validate()?)),
};

/// A `--clock-drift` value that is not a whole number of parts per million.
#[derive(Debug, thiserror::Error)]
#[error("`{value}` is not a whole number of parts per million")]
struct NotPpm {
    value: String,
    #[source]
    source: std::num::ParseIntError,
}

/// `--clock-drift`: a whole number of parts per million.
fn ppm(v: OsString) -> Result<u32, BoxError> {
    let s = text(v)?;
    s.parse().map_err(|source| {
        NotPpm {
            value: s.clone(),
            source,
        }
        .into()
    })
}

/// `leaseagent serve`.
pub static SERVE: CommandDef<crate::serve::ServeArgs> = CommandDef {
    name: "serve",
    about: "The reference lease authority (lease protocol v1) with its state in SQLite or PostgreSQL",
    usage: Some("leaseagent serve [OPTIONS] --listen ADDR (--db PATH | --store URL)"),
    groups: &[Group {
        heading: None,
        flags: &[
            Flag::value(
                "listen",
                "ADDR",
                "Address to listen on, e.g. 127.0.0.1:7878 or [::]:7878 (port 0: any free port)",
            )
            .required()
            .reads(|a, v| {
                a.listen = text(v)?;
                Ok(())
            }),
            Flag::value(
                "db",
                "PATH",
                "SQLite database file holding tokens and leases (created if missing); or --store",
            )
            .complete(Complete::Files)
            .reads(|a, v| {
                a.db = v.into();
                Ok(())
            }),
            Flag::value(
                "store",
                "URL",
                "PostgreSQL store that several replicas share, one leading\n\
                 (postgresql://USER@HOST[:PORT][,HOST[:PORT]...]/DB?sslmode=verify-full&sslrootcert=FILE)",
            )
            .doc(
                "A PostgreSQL database (15 or later) in libpq's URL form that several \
                 `leaseagent serve` replicas share; one of them leads and answers lease calls, the \
                 others answer them `503 not_leader` naming the leader. The schema `leaseagent` is \
                 created and migrated on start. The password never comes from the URL: see \
                 --store-password-file and PGPASSFILE. A host that is not a loopback address or a \
                 Unix socket needs `sslmode=verify-full` with `sslrootcert=FILE`. A store whose \
                 standbys are not synchronous is refused (see --store-allow-async).",
            )
            .reads(|a, v| {
                a.store = Some(text(v)?);
                Ok(())
            }),
            Flag::value(
                "store-password-file",
                "FILE",
                "The --store password (first line; mode 0600); else PGPASSFILE or ~/.pgpass",
            )
            .complete(Complete::Files)
            .reads(|a, v| {
                a.store_password_file = Some(v.into());
                Ok(())
            }),
            Flag::switch(
                "store-allow-async",
                "Run on a --store whose standbys are asynchronous (a PostgreSQL failover may then \
                 lose answered grants and issue their tokens again)",
            )
            .sets(|a| a.store_allow_async = true),
            Flag::value(
                "advertise",
                "URL",
                "The URL clients reach this replica at, which standbys name as the leader \
                 (default: the --listen address)",
            )
            .reads(|a, v| {
                a.advertise = Some(text(v)?);
                Ok(())
            }),
            Flag::value(
                "leader-ttl",
                "DUR",
                "With --store: how long leadership outlives its last confirmed renewal; a standby \
                 takes over a silent leader after about this long",
            )
            .default_value("5s")
            .reads(|a, v| {
                a.leader_ttl = dur(v)?;
                Ok(())
            }),
            Flag::value(
                "tls-cert",
                "FILE",
                "Serve HTTPS with this PEM certificate chain (with --tls-key)",
            )
            .complete(Complete::Files)
            .reads(|a, v| {
                a.tls_cert = Some(v.into());
                Ok(())
            }),
            Flag::value("tls-key", "FILE", "The PEM private key of --tls-cert")
                .complete(Complete::Files)
                .reads(|a, v| {
                    a.tls_key = Some(v.into());
                    Ok(())
                }),
            Flag::value(
                "client-ca",
                "FILE",
                "Require client certificates signed by these PEM CAs (mutual TLS)",
            )
            .complete(Complete::Files)
            .reads(|a, v| {
                a.client_ca = Some(v.into());
                Ok(())
            }),
            Flag::value(
                "auth-file",
                "FILE",
                "The principals (TOML; re-read on SIGHUP); required unless --no-auth",
            )
            .complete(Complete::Files)
            .reads(|a, v| {
                a.auth_file = Some(v.into());
                Ok(())
            }),
            Flag::switch(
                "no-auth",
                "Run without --auth-file: every client that reaches the listener (every local \
                 user on loopback) may take, revoke and clear any lease",
            )
            .sets(|a| a.no_auth = true),
            Flag::switch(
                "insecure-listen",
                "Allow a non-loopback --listen without TLS and an auth file",
            )
            .sets(|a| a.insecure_listen = true),
            Flag::value(
                "max-connections",
                "N",
                "Most open connections; past this, one answer (503) and closed",
            )
            .default_value("16384")
            .reads(|a, v| {
                a.max_connections = number(v)?;
                Ok(())
            }),
            Flag::value(
                "max-connections-per-peer",
                "N",
                "Most open connections from one IP address; past this, closed at once (before TLS)",
            )
            .default_value("1024")
            .reads(|a, v| {
                a.max_connections_per_peer = number(v)?;
                Ok(())
            }),
            Flag::value(
                "max-unauthenticated-connections",
                "N",
                "Most open connections that made no authenticated request yet (/healthz, \
                 probes), at most half of --max-connections; past this, one answer, then closed",
            )
            .default_value("1024")
            .reads(|a, v| {
                a.max_unauthenticated = number(v)?;
                Ok(())
            }),
            Flag::value(
                "server-name",
                "NAME",
                "A name clients reach this server by (the Host header), besides the listen \
                 address and the certificate's names; repeatable",
            )
            .repeatable()
            .reads(|a, v| {
                a.server_names.push(text(v)?);
                Ok(())
            }),
            Flag::value(
                "max-leases",
                "N",
                "Most live leases overall; past this, acquires get 503 unavailable",
            )
            .default_value("100000")
            .reads(|a, v| {
                a.max_leases = Some(number(v)?);
                Ok(())
            }),
            Flag::value(
                "max-leases-per-principal",
                "N",
                "Most live leases of one principal without `max_leases` in the auth file (all \
                 clients are one principal without an auth file); past this, 429",
            )
            .default_value("25000")
            .reads(|a, v| {
                a.max_leases_per_principal = number(v)?;
                Ok(())
            }),
            Flag::value(
                "max-new-tasks-per-hour",
                "N",
                "Most distinct tasks one principal may create (acquire a task that has no \
                 row) in an hour; past this, 429 (with an auth file)",
            )
            .default_value("10000")
            .reads(|a, v| {
                a.max_new_tasks_per_hour = number(v)?;
                Ok(())
            }),
            Flag::value(
                "history-max-age",
                "DUR",
                "Run history: finished attempts older than this are deleted",
            )
            .default_value("720h")
            .reads(|a, v| {
                a.history.max_age = dur(v)?;
                Ok(())
            }),
            Flag::value(
                "history-max-rows",
                "N",
                "Run history: at most this many attempts are kept",
            )
            .default_value("100000")
            .reads(|a, v| {
                a.history.max_rows = number(v)?;
                Ok(())
            }),
            Flag::value(
                "history-max-rows-per-principal",
                "N",
                "Run history: at most this many attempts of one principal are kept, so one \
                 principal's churn cannot push out another's (without an auth file: \
                 --history-max-rows)",
            )
            .default_value("25000")
            .reads(|a, v| {
                a.history.max_rows_per_principal = number(v)?;
                Ok(())
            }),
            Flag::value(
                "metrics-max-tasks",
                "N",
                "/metrics names at most this many tasks per per-task metric, the most alarming \
                 first; the rest are one series with task=\"(other)\"",
            )
            .default_value("1000")
            .reads(|a, v| {
                a.metrics_max_tasks = number(v)?;
                Ok(())
            }),
            Flag::value(
                "status-listen",
                "ADDR",
                "Also serve the status page (GET /, read-only, no credentials) on this\nloopback address, e.g. 127.0.0.1:7879",
            )
            .reads(|a, v| {
                a.status_listen = Some(text(v)?);
                Ok(())
            }),
            Flag::value(
                "status-held-alert",
                "DUR",
                "The status page shows a task held for an operator longer than this in red",
            )
            .default_value("15m")
            .reads(|a, v| {
                a.status_held_alert = dur(v)?;
                Ok(())
            }),
        ],
    }],
    positionals: &[],
    syntax: Syntax::Sub,
    notes: None,
    examples: "\
Examples:
  # the lease authority for a fleet: TLS, and principals with tokens
  leaseagent serve --listen 0.0.0.0:7878 --db /var/lib/leaseagent-serve/leases.sqlite3 \\
    --tls-cert /etc/leaseagent/server.pem --tls-key /etc/leaseagent/server.key \\
    --auth-file /etc/leaseagent/auth.toml

  # on each worker
  leaseagent --authority https://leases.internal:7878 --ca-file /etc/leaseagent/ca.pem \\
    --auth-token-file /etc/leaseagent/token --task nightly-export -- ./export.sh

  # as a systemd service (systemd/leaseagent-serve.service)
  systemctl enable --now leaseagent-serve.service

  # replicas on one PostgreSQL store (one leads; agents are given every URL)
  leaseagent serve --listen 0.0.0.0:7878 --advertise https://a.internal:7878 \\
    --store 'postgresql://leases@db1,db2,db3/leases?sslmode=verify-full&sslrootcert=/etc/leaseagent/pg-ca.pem' \\
    --store-password-file /etc/leaseagent/pg-password --tls-cert CERT --tls-key KEY --auth-file AUTH
  leaseagent --authority https://a.internal:7878,https://b.internal:7878 --task nightly-export -- ./export.sh",
    finish: serve,
};

/// `serve`'s rules between flags.
fn serve(args: crate::serve::ServeArgs) -> Result<Command, UsageError> {
    let refuse = |msg: &str| Err(UsageError::Words(msg.to_string()));
    match (&args.auth_file, args.no_auth) {
        (None, false) => {
            return refuse(
                "serve needs --auth-file FILE (principals with roles and tokens; `leaseagent \
                 token new` makes tokens), or --no-auth to let every client that reaches it, every \
                 local user on loopback, take, revoke and clear any lease",
            );
        }
        (Some(_), true) => return refuse("--auth-file and --no-auth: give one of them"),
        _ => {}
    }
    if args.history.max_rows == 0 {
        return refuse("--history-max-rows must be at least 1");
    }
    if args.history.max_rows_per_principal == 0 {
        return refuse("--history-max-rows-per-principal must be at least 1");
    }
    if args.tls_cert.is_some() != args.tls_key.is_some() {
        return refuse("--tls-cert and --tls-key go together: give both or neither");
    }
    if args.client_ca.is_some() && args.tls_cert.is_none() {
        return refuse("--client-ca needs --tls-cert and --tls-key (mutual TLS is TLS)");
    }
    match (args.db.as_os_str().is_empty(), args.store.is_some()) {
        (true, false) => return refuse("give --db PATH (SQLite) or --store URL (PostgreSQL)"),
        (false, true) => return refuse("--db and --store are two stores: give one"),
        _ => {}
    }
    if args.store.is_none() && (args.store_password_file.is_some() || args.store_allow_async) {
        return refuse("--store-password-file and --store-allow-async go with --store");
    }
    if !(1..=600).contains(&args.leader_ttl.as_secs()) {
        return refuse("--leader-ttl must be from 1s to 10m");
    }
    if let Some(a) = &args.advertise {
        if !(a.starts_with("http://") || a.starts_with("https://")) || a.contains(',') {
            return refuse("--advertise must be one http:// or https:// URL");
        }
    }
    Ok(Command::Serve(args))
}

/// `leaseagent publish`.
pub static PUBLISH: CommandDef<super::publish::PublishArgs> = CommandDef {
    name: "publish",
    about: "Move a job's output into place only if its fencing token is not superseded",
    usage: None,
    groups: &[Group {
        heading: None,
        flags: &[
            Flag::value("token", "N", "Fencing token of this attempt")
                .default_note("$LEASE_TOKEN")
                .reads(|a, v| {
                    a.token = Some(number(v)?);
                    Ok(())
                }),
            Flag::value(
                "lock-timeout",
                "DUR",
                "Longest wait for another publisher of DEST",
            )
            .default_value("30s")
            .reads(|a, v| {
                a.lock_timeout = dur(v)?;
                Ok(())
            }),
        ],
    }],
    positionals: &[
        Positional::required("SRC", "The file or directory to publish")
            .complete(Complete::Files)
            .reads(|a, v| {
                a.src = PathBuf::from(v);
                Ok(())
            }),
        Positional::required("DEST", "Where it becomes visible")
            .complete(Complete::Files)
            .reads(|a, v| {
                a.dest = PathBuf::from(v);
                Ok(())
            }),
    ],
    syntax: Syntax::Sub,
    notes: Some(
        "\
The highest token published to DEST is kept in DEST's directory, in the hidden file
.NAME.leaseagent-fence (NAME = DEST's file name), with the lock file .NAME.leaseagent-fence.lock.
SRC must be on the same filesystem as DEST (write it next to DEST).

Exit status: 0 published; 1 refused (token superseded), DEST untouched;
2 could not publish (no token, missing SRC, another filesystem, I/O); 125 usage.",
    ),
    examples: "\
Examples:
  # in a job run by leaseagent (the token comes from $LEASE_TOKEN):
  # write next to the destination, then move it into place if not superseded
  ./export.sh > /srv/exports/.report.csv.tmp &&
    leaseagent publish /srv/exports/.report.csv.tmp /srv/exports/report.csv

  # a whole directory, with an explicit token
  leaseagent publish --token 42 /srv/site.new /srv/site",
    finish: |a| Ok(Command::Publish(a)),
};

/// `leaseagent check`.
pub static CHECK: CommandDef<super::check::CheckArgs> = CommandDef {
    name: "check",
    about: "Exit 0 while this job's lease is valid for at least --min-remaining",
    usage: None,
    groups: &[Group {
        heading: None,
        flags: &[
            Flag::value(
                "min-remaining",
                "DUR",
                "Succeed only if the lease is valid for at least this much longer",
            )
            .default_value("0s")
            .reads(|a, v| {
                a.min_remaining = dur(v)?;
                Ok(())
            }),
            Flag::switch(
                "quiet",
                "Print nothing on stderr; the exit status alone answers",
            )
            .short('q')
            .sets(|a| a.quiet = true),
            Flag::switch("json", "Print the lease view as one JSON object on stdout")
                .sets(|a| a.json = true),
        ],
    }],
    positionals: &[],
    syntax: Syntax::Sub,
    notes: None,
    examples: "\
Examples:
  # in a job run by leaseagent: stop between batches when the lease runs short
  for b in batches/*; do leaseagent check --min-remaining 10s || exit 1; ./process \"$b\"; done

  # the agent's view of the lease, as JSON
  leaseagent check --json",
    finish: |a| Ok(Command::Check(a)),
};

macro_rules! operating {
    ($($args:ty),*) => {$(
        impl Operating for $args {
            fn target(&mut self) -> &mut AuthorityArg {
                &mut self.authority
            }
        }
    )*};
}
operating!(LeasesArgs, RevokeArgs, ClearArgs, HistoryArgs);

/// `leaseagent leases`.
pub static LEASES: CommandDef<LeasesArgs> = CommandDef {
    name: "leases",
    about: "List the leases an authority holds",
    usage: None,
    groups: &[
        Group {
            heading: None,
            flags: &[
                LeasesArgs::AUTHORITY,
                Flag::switch("json", "Print JSON instead of a table").sets(|a| a.json = true),
            ],
        },
        LeasesArgs::TRUST,
    ],
    positionals: &[],
    syntax: Syntax::Sub,
    notes: Some(
        "\
With etcd, every lock key is listed (leaseagent's and `etcdctl lock`'s): the first of each
task is `active`, the others `waiting` in queue order; TOKEN is the key's create revision.",
    ),
    examples: "\
Examples:
  # leases of the embedded per-host authority
  leaseagent leases

  # of a lease server, as JSON
  leaseagent leases --authority http://leases.internal:7878 --json

  # of a TLS lease server with a token; of etcd with TLS and etcd's own login
  leaseagent leases --authority https://leases.internal:7878 --ca-file ca.pem --auth-token-file token
  leaseagent leases --authority etcds://10.0.0.1:2379 --ca-file ca.pem --etcd-user root \\
                    --etcd-password-file etcd-pw",
    finish: |a| Ok(Command::Leases(a)),
};

/// `leaseagent revoke`.
pub static REVOKE: CommandDef<RevokeArgs> = CommandDef {
    name: "revoke",
    about: "Revoke a task's current lease",
    usage: None,
    groups: &[
        Group {
            heading: None,
            flags: &[
                RevokeArgs::AUTHORITY,
                Flag::switch(
                    "force",
                    "Free the task at once instead of after the lease's current expiry",
                )
                .sets(|a| a.force = true),
                Flag::switch("json", "Print JSON instead of text").sets(|a| a.json = true),
            ],
        },
        RevokeArgs::TRUST,
    ],
    positionals: &[
        Positional::required("TASK", "The task whose current lease is revoked").reads(|a, v| {
            a.task = text(v)?;
            Ok(())
        }),
    ],
    syntax: Syntax::Sub,
    notes: Some(
        "\
With etcd, revoke revokes the holder's etcd lease: its key is deleted at once and the next
waiter (leaseagent or `etcdctl lock`) gets the task; --force changes nothing.",
    ),
    examples: "\
Examples:
  # take the task away from its holder (its agent stops the job at the next renewal)
  leaseagent revoke --authority http://leases.internal:7878 nightly-export

  # and make the task available again at once
  leaseagent revoke --force nightly-export",
    finish: |a| Ok(Command::Revoke(a)),
};

/// `leaseagent clear`.
pub static CLEAR: CommandDef<ClearArgs> = CommandDef {
    name: "clear",
    about: "Free a task held for an operator (after an expiry with --on-expiry hold)",
    usage: None,
    groups: &[
        Group {
            heading: None,
            flags: &[
                ClearArgs::AUTHORITY,
                Flag::switch("json", "Print JSON instead of text").sets(|a| a.json = true),
            ],
        },
        ClearArgs::TRUST,
    ],
    positionals: &[
        Positional::required("TASK", "The task held for an operator").reads(|a, v| {
            a.task = text(v)?;
            Ok(())
        }),
    ],
    syntax: Syntax::Sub,
    notes: Some(
        "\
etcd has no held-for-operator state (it frees a task when its lease expires, and leaseagent
refuses --on-expiry hold with etcd): clear there always exits 1, nothing to clear.",
    ),
    examples: "\
Examples:
  # a lease with --on-expiry hold expired: after checking the job's side effects,
  # let the task be granted again
  leaseagent clear --authority http://leases.internal:7878 nightly-export",
    finish: |a| Ok(Command::Clear(a)),
};

/// `leaseagent history`.
pub static HISTORY: CommandDef<HistoryArgs> = CommandDef {
    name: "history",
    about: "Show past attempts of tasks: who held them, with which token, how each ended",
    usage: None,
    groups: &[
        Group {
            heading: None,
            flags: &[
                HistoryArgs::AUTHORITY,
                Flag::value("since", "DUR", "Only attempts started within this long ago")
                    .default_note("all that are kept")
                    .reads(|a, v| {
                        a.since = Some(dur(v)?);
                        Ok(())
                    }),
                Flag::switch("json", "Print JSON instead of a table").sets(|a| a.json = true),
            ],
        },
        HistoryArgs::TRUST,
    ],
    positionals: &[
        Positional::optional("TASK", "Only this task's attempts").reads(|a, v| {
            a.task = Some(text(v)?);
            Ok(())
        }),
    ],
    syntax: Syntax::Sub,
    notes: Some(
        "\
Newest first. ENDED is released, expired (its holder stopped renewing), revoked, cleared
(held for an operator, then cleared), or running. OUTCOME and EXIT are what the agent reported
on release. etcd keeps no history (its keys are gone once released): exit 125 there.",
    ),
    examples: "\
Examples:
  # what happened to nightly-export in the last two days
  leaseagent history --since 48h nightly-export

  # every task of a lease server, as JSON for scripts
  leaseagent history --authority http://leases.internal:7878 --json",
    finish: |a| Ok(Command::History(a)),
};

/// `leaseagent completions SHELL`.
#[derive(Debug, Default)]
pub struct CompletionsArgs {
    shell: String,
}

fn unknown_shell(shell: &str) -> UsageError {
    UsageError::Argument {
        name: "SHELL",
        source: format!(
            "unknown shell `{shell}`: use {}",
            super::generate::SHELLS.join(", ")
        )
        .into(),
    }
}

/// `leaseagent completions`.
pub static COMPLETIONS: CommandDef<CompletionsArgs> = CommandDef {
    name: "completions",
    about: "Print a shell completion script, generated from these flag tables",
    usage: None,
    groups: &[Group {
        heading: None,
        flags: &[],
    }],
    positionals: &[Positional::required("SHELL", "bash, zsh or fish")
        .complete(Complete::Words(super::generate::SHELLS))
        .reads(|a, v| {
            a.shell = text(v)?;
            Ok(())
        })],
    syntax: Syntax::Sub,
    notes: None,
    examples: "\
Examples:
  # for this shell session, or for every user (the Debian package installs them)
  source <(leaseagent completions bash)
  leaseagent completions bash > /etc/bash_completion.d/leaseagent
  leaseagent completions zsh > /usr/local/share/zsh/site-functions/_leaseagent
  leaseagent completions fish > ~/.config/fish/completions/leaseagent.fish",
    finish: |a| match cli().completions(&a.shell) {
        Some(script) => Ok(print(&script)),
        None => Err(unknown_shell(&a.shell)),
    },
};

/// `leaseagent man [SUBCOMMAND]`.
#[derive(Debug, Default)]
pub struct ManArgs {
    /// `None`: leaseagent(1), the page of them all.
    sub: Option<String>,
}

/// `leaseagent man`.
pub static MAN: CommandDef<ManArgs> = CommandDef {
    name: "man",
    about: "Print a man page (roff), generated from these flag tables",
    usage: Some("leaseagent man [SUBCOMMAND]"),
    groups: &[Group {
        heading: None,
        flags: &[],
    }],
    positionals: &[Positional::optional(
        "SUBCOMMAND",
        "Print leaseagent-SUBCOMMAND(1) instead of leaseagent(1), which has them all",
    )
    .complete(Complete::Subcommands)
    .reads(|a, v| {
        a.sub = Some(text(v)?);
        Ok(())
    })],
    syntax: Syntax::Sub,
    notes: None,
    examples: "\
Examples:
  # read it, or install it
  leaseagent man | man -l -
  leaseagent man > /usr/local/share/man/man1/leaseagent.1
  leaseagent man serve > /usr/local/share/man/man1/leaseagent-serve.1",
    finish: |a| match cli().man(a.sub.as_deref()) {
        Some(page) => Ok(print(&page)),
        None => Err(UsageError::Argument {
            name: "SUBCOMMAND",
            source: format!(
                "no subcommand `{}` (see leaseagent --help)",
                a.sub.unwrap_or_default()
            )
            .into(),
        }),
    },
};

/// `leaseagent token new`.
#[derive(Debug, Default)]
pub struct TokenArgs {
    new: bool,
}

/// `leaseagent token`.
pub static TOKEN: CommandDef<TokenArgs> = CommandDef {
    name: "token",
    about: "Print a new random bearer token for serve --auth-file",
    usage: Some("leaseagent token new"),
    groups: &[Group {
        heading: None,
        flags: &[],
    }],
    positionals: &[Positional::required("ACTION", "new (the only one)")
        .complete(Complete::Words(&["new"]))
        .reads(|a, v| {
            let action = text(v)?;
            if action != "new" {
                return Err(format!("unknown action `{action}`: use new").into());
            }
            a.new = true;
            Ok(())
        })],
    syntax: Syntax::Sub,
    notes: Some(
        "\
Prints a fresh random bearer token (256 bits) on stdout, and on stderr the
`token_sha256 = \"...\"` line to paste into `leaseagent serve --auth-file`.",
    ),
    examples: "\
Examples:
  leaseagent token new > agent.token 2> agent.sha",
    finish: |a| match a.new {
        true => Ok(Command::TokenNew),
        false => Err(super::flags::usage_error("usage is leaseagent token new")),
    },
};
