//! The flag tables: every command's flags, positionals and help texts, in
//! the order help lists them. Parsing and `--help` are both driven from
//! here (see [`super::flags`] for the rules and how to add a flag).

use super::flags::{CommandDef, Flag, Group, Positional, Style};

/// The operator commands' `--authority`.
const AUTHORITY: Flag = Flag::value("authority", "URL", "Lease authority")
    .env("LEASEAGENT_AUTHORITY")
    .default_note("the embedded per-host authority");

/// How every client of an authority trusts it and proves who it is (the run
/// path and the operator commands; `authority::trust`). Files only: no
/// secret is ever taken from argv.
const TRUST: Group = Group {
    heading: Some("Trust (https://, etcds://, credentials; secrets only in files, mode 0600)"),
    flags: &[
        Flag::value(
            "ca-file",
            "FILE",
            "PEM CAs that sign the authority's certificate",
        )
        .env("LEASEAGENT_CA_FILE")
        .default_note("the system's roots"),
        Flag::value(
            "client-cert",
            "FILE",
            "PEM client certificate for mutual TLS (with --client-key)",
        )
        .env("LEASEAGENT_CLIENT_CERT"),
        Flag::value("client-key", "FILE", "PEM key of --client-cert").env("LEASEAGENT_CLIENT_KEY"),
        Flag::value(
            "auth-token-file",
            "FILE",
            "Bearer token for leaseagent serve: the file's first line",
        )
        .env("LEASEAGENT_AUTH_TOKEN_FILE"),
        Flag::value(
            "etcd-user",
            "NAME",
            "etcd user (etcd's own authentication; with --etcd-password-file)",
        )
        .env("LEASEAGENT_ETCD_USER"),
        Flag::value(
            "etcd-password-file",
            "FILE",
            "That etcd user's password: the file's first line",
        )
        .env("LEASEAGENT_ETCD_PASSWORD_FILE"),
    ],
};

/// `leaseagent [OPTIONS] -- COMMAND [ARG...]`.
pub static RUN: CommandDef = CommandDef {
    name: "",
    about: "\
Run a command under a lease: renewed from a dedicated thread, stopped before
the lease could be granted to anyone else, fenced by LEASE_TOKEN.",
    usage: Some(
        "leaseagent [OPTIONS] --task NAME -- COMMAND [ARG...]\n       leaseagent SUBCOMMAND [ARGS]",
    ),
    groups: &[Group {
        heading: None,
        flags: &[
        Flag::value(
            "authority",
            "URL",
            "Lease authority: http(s)://HOST:PORT, etcd(s)://HOST:PORT[,HOST:PORT...],\nsqlite:PATH",
        )
        .env("LEASEAGENT_AUTHORITY")
        .default_note("the embedded per-host authority"),
        Flag::value(
            "task",
            "NAME",
            "What the lease is for (1-200 bytes of A-Z a-z 0-9 . _ - : / @)",
        )
        .env("LEASEAGENT_TASK"),
        Flag::value("ttl", "DUR", "Lease duration asked for (1s to 24h)").default_value("30s"),
        Flag::value(
            "heartbeat",
            "DUR",
            "Renewal interval: at least 100ms, with room for a retry before the\ncommand's SIGTERM at ttl - grace",
        )
        .default_note("ttl/3"),
        Flag::value(
            "grace",
            "DUR",
            "SIGTERM -> SIGKILL grace when the command is stopped",
        )
        .default_note("ttl/6"),
        Flag::value(
            "holder",
            "NAME",
            "Who holds the lease, as the authority shows it",
        )
        .default_note("HOSTNAME/PID"),
        Flag::value(
            "on-expiry",
            "P",
            "What the authority does when this lease expires: redispatch, grace, hold",
        )
        .default_value("redispatch"),
        Flag::value(
            "expiry-grace",
            "DUR",
            "With --on-expiry grace: how long after expiry the task stays blocked",
        )
        .default_note("ttl"),
        Flag::value(
            "wait",
            "DUR",
            "Wait up to DUR (forever without DUR) while another holder has the task",
        )
        .optional_value(),
        Flag::value(
            "clock-drift",
            "PPM",
            "Clock-rate difference budgeted between this host and the authority:\nthe deadline is sent + ttl*(1 - PPM/1e6) - 1ms",
        )
        .default_value("1000"),
        Flag::value(
            "renew-priority",
            "DSCP,PRIO",
            "How renewal packets are marked, so that a host or link that honours\npriority sends them ahead of the command's own traffic: DSCP (0-63,\ncs0-cs7, ef, af11-af43) and SO_PRIORITY (0-7, 7 needs CAP_NET_ADMIN),\nor off",
        )
        .env("LEASEAGENT_RENEW_PRIORITY")
        .default_value(crate::authority::netpath::DEFAULT_MARKS),
        Flag::switch(
            "remap-exit",
            "The command's own exit codes 124 and 125 become 1, so 124/125 always\nmean the agent's (lease lost / agent failed)",
        ),
    ],
    }, TRUST],
    positionals: &[],
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
    style: Style::Run,
};

/// `leaseagent serve`.
pub static SERVE: CommandDef = CommandDef {
    name: "serve",
    about: "The reference lease authority (lease protocol v1) with its state in SQLite",
    usage: None,
    groups: &[Group {
        heading: None,
        flags: &[
            Flag::value(
                "listen",
                "ADDR",
                "Address to listen on, e.g. 127.0.0.1:7878 or [::]:7878 (port 0: any free port)",
            )
            .required(),
            Flag::value(
                "db",
                "PATH",
                "SQLite database file holding tokens and leases (created if missing)",
            )
            .required(),
            Flag::value(
                "tls-cert",
                "FILE",
                "Serve HTTPS with this PEM certificate chain (with --tls-key)",
            ),
            Flag::value("tls-key", "FILE", "The PEM private key of --tls-cert"),
            Flag::value(
                "client-ca",
                "FILE",
                "Require client certificates signed by these PEM CAs (mutual TLS)",
            ),
            Flag::value(
                "auth-file",
                "FILE",
                "The principals (TOML; re-read on SIGHUP); without it, anyone may do anything",
            ),
            Flag::switch(
                "insecure-listen",
                "Allow a non-loopback --listen without TLS and an auth file",
            ),
            Flag::value(
                "max-connections",
                "N",
                "Most open connections; past this, one answer (503) and closed",
            )
            .default_value("16384"),
            Flag::value(
                "max-connections-per-peer",
                "N",
                "Most open connections from one IP address; past this, closed at once (before TLS)",
            )
            .default_value("1024"),
            Flag::value(
                "max-leases",
                "N",
                "Most live leases overall; past this, acquires get 503 unavailable",
            )
            .default_value("100000"),
            Flag::value(
                "max-leases-per-principal",
                "N",
                "Most live leases of one principal without `max_leases` in the auth file (all \
                 clients are one principal without an auth file); past this, 429",
            )
            .default_value("25000"),
            Flag::value(
                "history-max-age",
                "DUR",
                "Run history: finished attempts older than this are deleted",
            )
            .default_value("720h"),
            Flag::value(
                "history-max-rows",
                "N",
                "Run history: at most this many attempts are kept",
            )
            .default_value("100000"),
            Flag::value(
                "status-listen",
                "ADDR",
                "Also serve the status page (GET /, read-only, no credentials) on this\nloopback address, e.g. 127.0.0.1:7879",
            ),
            Flag::value(
                "status-held-alert",
                "DUR",
                "The status page shows a task held for an operator longer than this in red",
            )
            .default_value("15m"),
        ],
    }],
    positionals: &[],
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
  systemctl enable --now leaseagent-serve.service",
    style: Style::Sub,
};

/// `leaseagent publish`.
pub static PUBLISH: CommandDef = CommandDef {
    name: "publish",
    about: "Move a job's output into place only if its fencing token is not superseded",
    usage: None,
    groups: &[Group {
        heading: None,
        flags: &[
            Flag::value("token", "N", "Fencing token of this attempt").default_note("$LEASE_TOKEN"),
            Flag::value(
                "lock-timeout",
                "DUR",
                "Longest wait for another publisher of DEST",
            )
            .default_value("30s"),
        ],
    }],
    positionals: &[
        Positional {
            name: "SRC",
            help: "The file or directory to publish",
            optional: false,
        },
        Positional {
            name: "DEST",
            help: "Where it becomes visible",
            optional: false,
        },
    ],
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
    style: Style::Sub,
};

/// `leaseagent check`.
pub static CHECK: CommandDef = CommandDef {
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
            .default_value("0s"),
            Flag::switch(
                "quiet",
                "Print nothing on stderr; the exit status alone answers",
            )
            .short('q'),
            Flag::switch("json", "Print the lease view as one JSON object on stdout"),
        ],
    }],
    positionals: &[],
    notes: None,
    examples: "\
Examples:
  # in a job run by leaseagent: stop between batches when the lease runs short
  for b in batches/*; do leaseagent check --min-remaining 10s || exit 1; ./process \"$b\"; done

  # the agent's view of the lease, as JSON
  leaseagent check --json",
    style: Style::Sub,
};

/// `leaseagent leases`.
pub static LEASES: CommandDef = CommandDef {
    name: "leases",
    about: "List the leases an authority holds",
    usage: None,
    groups: &[Group {
        heading: None,
        flags: &[
            AUTHORITY,
            Flag::switch("json", "Print JSON instead of a table"),
        ],
    }, TRUST],
    positionals: &[],
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
    style: Style::Sub,
};

/// `leaseagent revoke`.
pub static REVOKE: CommandDef = CommandDef {
    name: "revoke",
    about: "Revoke a task's current lease",
    usage: None,
    groups: &[
        Group {
            heading: None,
            flags: &[
                AUTHORITY,
                Flag::switch(
                    "force",
                    "Free the task at once instead of after the lease's current expiry",
                ),
                Flag::switch("json", "Print JSON instead of text"),
            ],
        },
        TRUST,
    ],
    positionals: &[Positional {
        name: "TASK",
        help: "The task whose current lease is revoked",
        optional: false,
    }],
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
    style: Style::Sub,
};

/// `leaseagent clear`.
pub static CLEAR: CommandDef = CommandDef {
    name: "clear",
    about: "Free a task held for an operator (after an expiry with --on-expiry hold)",
    usage: None,
    groups: &[
        Group {
            heading: None,
            flags: &[
                AUTHORITY,
                Flag::switch("json", "Print JSON instead of text"),
            ],
        },
        TRUST,
    ],
    positionals: &[Positional {
        name: "TASK",
        help: "The task held for an operator",
        optional: false,
    }],
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
    style: Style::Sub,
};

/// `leaseagent history`.
pub static HISTORY: CommandDef = CommandDef {
    name: "history",
    about: "Show past attempts of tasks: who held them, with which token, how each ended",
    usage: None,
    groups: &[
        Group {
            heading: None,
            flags: &[
                AUTHORITY,
                Flag::value("since", "DUR", "Only attempts started within this long ago")
                    .default_note("all that are kept"),
                Flag::switch("json", "Print JSON instead of a table"),
            ],
        },
        TRUST,
    ],
    positionals: &[Positional {
        name: "TASK",
        help: "Only this task's attempts",
        optional: true,
    }],
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
    style: Style::Sub,
};

/// `leaseagent completions`.
pub static COMPLETIONS: CommandDef = CommandDef {
    name: "completions",
    about: "Print a shell completion script, generated from these flag tables",
    usage: None,
    groups: &[Group {
        heading: None,
        flags: &[],
    }],
    positionals: &[Positional {
        name: "SHELL",
        help: "bash, zsh or fish",
        optional: false,
    }],
    notes: None,
    examples: "\
Examples:
  # for this shell session, or for every user (the Debian package installs them)
  source <(leaseagent completions bash)
  leaseagent completions bash > /etc/bash_completion.d/leaseagent
  leaseagent completions zsh > /usr/local/share/zsh/site-functions/_leaseagent
  leaseagent completions fish > ~/.config/fish/completions/leaseagent.fish",
    style: Style::Sub,
};

/// `leaseagent man`.
pub static MAN: CommandDef = CommandDef {
    name: "man",
    about: "Print a man page (roff), generated from these flag tables",
    usage: Some("leaseagent man [SUBCOMMAND]"),
    groups: &[Group {
        heading: None,
        flags: &[],
    }],
    positionals: &[Positional {
        name: "SUBCOMMAND",
        help: "Print leaseagent-SUBCOMMAND(1) instead of leaseagent(1), which has them all",
        optional: true,
    }],
    notes: None,
    examples: "\
Examples:
  # read it, or install it
  leaseagent man | man -l -
  leaseagent man > /usr/local/share/man/man1/leaseagent.1
  leaseagent man serve > /usr/local/share/man/man1/leaseagent-serve.1",
    style: Style::Sub,
};
