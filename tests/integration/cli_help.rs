//! The command line, byte for byte: every `--help`/`-h` against its golden
//! file (`golden/help-*.txt`; the run path's was captured from the binary
//! before the parser was rewritten, and every subcommand's help has its
//! layout since), `--version` everywhere, and the usage errors of every
//! subcommand (exit 125, one line that names what is wrong).
//! After a deliberate change to a flag table, `LEASEAGENT_BLESS=1` rewrites
//! the golden files (`support/golden.rs`).

use std::process::Command;

fn run_env(args: &[&str], authority: Option<&str>) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
    c.args(args).env_remove("LEASE_TOKEN");
    // Help shows the current value of every variable a flag reads: none is
    // inherited from the shell that runs the tests.
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("LEASEAGENT_") {
            c.env_remove(var);
        }
    }
    if let Some(a) = authority {
        c.env("LEASEAGENT_AUTHORITY", a);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn run(args: &[&str]) -> (i32, String, String) {
    run_env(args, None)
}

fn golden(name: &str) -> String {
    let path = format!(
        "{}/tests/integration/golden/help-{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const COMMANDS: &[&str] = &[
    "run",
    "serve",
    "publish",
    "check",
    "leases",
    "revoke",
    "clear",
    "completions",
    "man",
    "history",
    "token",
];

#[test]
fn every_help_is_byte_for_byte_the_golden_file() {
    for name in COMMANDS {
        for flag in ["--help", "-h"] {
            let args: Vec<&str> = if *name == "run" {
                vec![flag]
            } else {
                vec![name, flag]
            };
            let (code, out, err) = run(&args);
            assert_eq!(code, 0, "{args:?}: {err}");
            assert_eq!(err, "", "{args:?}");
            crate::support::golden::check(&format!("help-{name}.txt"), &out);
        }
    }
}

#[test]
fn help_wins_over_missing_arguments_and_shows_the_authority_variable() {
    // Required arguments are not asked for when help is.
    let (code, out, _) = run(&["serve", "--listen", "x", "--help"]);
    assert_eq!((code, out), (0, golden("serve")));
    // Help shows a variable's current value when it is set, on the run
    // path as on the operator commands (one layout), never a password.
    for args in [&["leases", "--help"][..], &["--help"]] {
        let (code, out, _) = run_env(args, Some("http://user:pa55w0rd@example.invalid:1"));
        assert_eq!(code, 0);
        assert!(
            out.contains(
                "[env: LEASEAGENT_AUTHORITY=http://example.invalid:1; default: the embedded"
            ),
            "{args:?}: {out}"
        );
        assert!(!out.contains("pa55w0rd"), "{args:?}: {out}");
    }
}

#[test]
fn version_of_every_command() {
    let v = env!("CARGO_PKG_VERSION");
    for flag in ["--version", "-V"] {
        assert_eq!(
            run(&[flag]),
            (0, format!("leaseagent {v}\n"), String::new())
        );
        for sub in &COMMANDS[1..] {
            assert_eq!(
                run(&[sub, flag]),
                (0, format!("leaseagent {sub} {v}\n"), String::new())
            );
        }
    }
}

/// Usage errors: exit 125, nothing on stdout, one line
/// `leaseagent[ SUB]: error: ...` naming the flag or argument at fault.
#[test]
fn usage_errors_exit_125_with_one_line_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        // The run path (its messages predate the one parser).
        (
            &["--bogus"],
            "leaseagent: error: unknown option --bogus (see leaseagent --help)",
        ),
        (&["--task"], "leaseagent: error: --task needs a value"),
        (
            &["--ttl", "5x", "--task", "t", "--", "true"],
            "leaseagent: error: --ttl: `5x` has an unknown unit `x`: use ms, s, m or h",
        ),
        (
            &["--task", "t", "true"],
            "leaseagent: error: unexpected argument `true`: the COMMAND goes after `--` (leaseagent [OPTIONS] -- COMMAND [ARG...])",
        ),
        (
            &["--task", "t"],
            "leaseagent: error: no COMMAND given: usage is leaseagent [OPTIONS] --task NAME -- COMMAND [ARG...]",
        ),
        (
            &["--", "true"],
            "leaseagent: error: --task is required (or set LEASEAGENT_TASK)",
        ),
        // serve
        (
            &["serve", "--bogus"],
            "leaseagent serve: error: unknown option --bogus (see leaseagent serve --help)",
        ),
        (
            &["serve", "--listen"],
            "leaseagent serve: error: --listen needs a value",
        ),
        (
            &["serve"],
            "leaseagent serve: error: --listen ADDR is required: usage is leaseagent serve [OPTIONS] --listen ADDR (--db PATH | --store URL)",
        ),
        (
            &["serve", "--no-auth", "--listen", "127.0.0.1:0"],
            "leaseagent serve: error: give --db PATH (SQLite) or --store URL (PostgreSQL)",
        ),
        (
            &[
                "serve",
                "--listen",
                "x",
                "--db",
                "y",
                "--max-connections",
                "abc",
            ],
            "leaseagent serve: error: --max-connections: `abc` is not a whole number: invalid digit found in string",
        ),
        (
            &["serve", "--listen", "x", "--db", "y", "extra"],
            "leaseagent serve: error: unexpected argument `extra`: usage is leaseagent serve [OPTIONS] --listen ADDR (--db PATH | --store URL)",
        ),
        (
            &["serve", "--listen", "x", "--listen", "y", "--db", "z"],
            "leaseagent serve: error: --listen given more than once (see leaseagent serve --help)",
        ),
        // publish
        (
            &["publish", "--bogus", "a", "b"],
            "leaseagent publish: error: unknown option --bogus (see leaseagent publish --help)",
        ),
        (
            &["publish", "--token"],
            "leaseagent publish: error: --token needs a value",
        ),
        (
            &["publish", "--token", "x", "a", "b"],
            "leaseagent publish: error: --token: `x` is not a whole number: invalid digit found in string",
        ),
        (
            &["publish", "--lock-timeout", "5x", "a", "b"],
            "leaseagent publish: error: --lock-timeout: `5x` has an unknown unit `x`: use ms, s, m or h",
        ),
        (
            &["publish", "a"],
            "leaseagent publish: error: <DEST> is required: usage is leaseagent publish [OPTIONS] <SRC> <DEST>",
        ),
        (
            &["publish"],
            "leaseagent publish: error: <SRC> and <DEST> are required: usage is leaseagent publish [OPTIONS] <SRC> <DEST>",
        ),
        (
            &["publish", "a", "b", "c"],
            "leaseagent publish: error: unexpected argument `c`: usage is leaseagent publish [OPTIONS] <SRC> <DEST>",
        ),
        // check
        (
            &["check", "--min-remaining", "5x"],
            "leaseagent check: error: --min-remaining: `5x` has an unknown unit `x`: use ms, s, m or h",
        ),
        (
            &["check", "--min-remaining"],
            "leaseagent check: error: --min-remaining needs a value",
        ),
        (
            &["check", "-x"],
            "leaseagent check: error: unknown option -x (see leaseagent check --help)",
        ),
        (
            &["check", "foo"],
            "leaseagent check: error: unexpected argument `foo`: usage is leaseagent check [OPTIONS]",
        ),
        (
            &["check", "--json=1"],
            "leaseagent check: error: --json takes no value (given `1`)",
        ),
        // leases, revoke, clear
        (
            &["leases", "--authority"],
            "leaseagent leases: error: --authority needs a value",
        ),
        (
            &["leases", "foo"],
            "leaseagent leases: error: unexpected argument `foo`: usage is leaseagent leases [OPTIONS]",
        ),
        (
            &["leases", "--authority", "gopher://x"],
            "leaseagent leases: --authority: `gopher://x` is not an authority URL: expected http://…, https://…, etcd://host:port[,…], etcds://host:port[,…] or sqlite:PATH",
        ),
        (
            &["revoke"],
            "leaseagent revoke: error: <TASK> is required: usage is leaseagent revoke [OPTIONS] <TASK>",
        ),
        (
            &["revoke", "a", "b"],
            "leaseagent revoke: error: unexpected argument `b`: usage is leaseagent revoke [OPTIONS] <TASK>",
        ),
        (
            &["revoke", "--bogus", "a"],
            "leaseagent revoke: error: unknown option --bogus (see leaseagent revoke --help)",
        ),
        (
            &["clear"],
            "leaseagent clear: error: <TASK> is required: usage is leaseagent clear [OPTIONS] <TASK>",
        ),
        (
            &["clear", "--json", "a", "b"],
            "leaseagent clear: error: unexpected argument `b`: usage is leaseagent clear [OPTIONS] <TASK>",
        ),
        // completions, man, token
        (
            &["completions", "tcsh"],
            "leaseagent completions: error: <SHELL>: unknown shell `tcsh`: use bash, zsh, fish",
        ),
        (
            &["man", "nope"],
            "leaseagent man: error: <SUBCOMMAND>: no subcommand `nope` (see leaseagent --help)",
        ),
        (
            &["man", "serve", "x"],
            "leaseagent man: error: unexpected argument `x`: usage is leaseagent man [SUBCOMMAND]",
        ),
        (
            &["token"],
            "leaseagent token: error: <ACTION> is required: usage is leaseagent token new",
        ),
        (
            &["token", "old"],
            "leaseagent token: error: <ACTION>: unknown action `old`: use new",
        ),
        (
            &["token", "new", "x"],
            "leaseagent token: error: unexpected argument `x`: usage is leaseagent token new",
        ),
        (
            &["token", "--bogus"],
            "leaseagent token: error: unknown option --bogus (see leaseagent token --help)",
        ),
    ];
    for (args, want) in cases {
        let (code, out, err) = run(args);
        assert_eq!(code, 125, "{args:?}: {err}");
        assert_eq!(out, "", "{args:?}");
        assert_eq!(err, format!("{want}\n"), "{args:?}");
    }
}
