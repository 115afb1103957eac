//! `cargo install --path .` gives one binary with every subcommand; each
//! one's `--help` shows examples, and `--version` works everywhere.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leaseagent"))
        .args(args)
        .env_remove("LEASEAGENT_AUTHORITY")
        .env_remove("LEASEAGENT_TASK")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const SUBCOMMANDS: &[&str] = &[
    "serve",
    "publish",
    "check",
    "leases",
    "revoke",
    "clear",
    "completions",
    "man",
];

#[test]
fn every_help_shows_examples_that_use_the_command() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Examples:\n  # "), "{out}");
    assert!(
        out.contains("leaseagent --task nightly-export -- "),
        "{out}"
    );
    let listed = out.split_once("Subcommands:").expect("subcommand list").1;
    for sub in SUBCOMMANDS {
        assert!(
            listed.contains(&format!(" {sub} ")),
            "`{sub}` not listed: {out}"
        );
        for flag in ["--help", "-h"] {
            let (code, out, err) = run(&[sub, flag]);
            assert_eq!(code, 0, "{sub} {flag}: {err}");
            let examples = out
                .split_once("\nExamples:\n")
                .unwrap_or_else(|| panic!("{sub} {flag} has no examples:\n{out}"))
                .1;
            assert!(
                examples.contains(&format!("leaseagent {sub}")),
                "{sub} examples do not show `leaseagent {sub}`:\n{examples}"
            );
            assert!(out.contains(&format!("Usage: leaseagent {sub}")), "{out}");
        }
    }
    // The subcommand's own notes stay, the examples come after them.
    let (_, out, _) = run(&["publish", "--help"]);
    let notes = out.find("Exit status: 0 published").expect("publish notes");
    assert!(notes < out.find("Examples:").unwrap(), "{out}");
}

#[test]
fn version_everywhere() {
    let want = format!("leaseagent {}\n", env!("CARGO_PKG_VERSION"));
    for flag in ["--version", "-V"] {
        let (code, out, _) = run(&[flag]);
        assert_eq!((code, out.as_str()), (0, want.as_str()));
    }
    for sub in SUBCOMMANDS {
        let (code, out, _) = run(&[sub, "--version"]);
        assert_eq!(code, 0);
        assert_eq!(
            out,
            format!("leaseagent {sub} {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn usage_errors_in_subcommands_exit_125_and_name_the_flag() {
    let (code, _, err) = run(&["check", "--min-remaining", "5x"]);
    assert_eq!(code, 125);
    assert!(err.contains("--min-remaining"), "{err}");
    let (code, _, err) = run(&["publish", "--bogus", "a", "b"]);
    assert_eq!(code, 125);
    assert!(err.contains("--bogus"), "{err}");
}
