//! The command line, byte for byte: every `--help`/`-h` against a golden
//! file captured from the binary before the parser was rewritten
//! (`golden/help-*.txt`), `--version` everywhere, and the usage errors of
//! every subcommand (exit 125, one line that names what is wrong).

use std::process::Command;

fn run_env(args: &[&str], authority: Option<&str>) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leaseagent"));
    c.args(args)
        .env_remove("LEASEAGENT_AUTHORITY")
        .env_remove("LEASEAGENT_TASK")
        .env_remove("LEASEAGENT_STATE_FILE")
        .env_remove("LEASE_TOKEN");
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

const COMMANDS: &[&str] = &["run", "serve", "publish", "check", "leases", "revoke", "clear"];

#[test]
fn every_help_is_byte_for_byte_the_golden_file() {
    for name in COMMANDS {
        let want = golden(name);
        for flag in ["--help", "-h"] {
            let args: Vec<&str> = if *name == "run" {
                vec![flag]
            } else {
                vec![name, flag]
            };
            let (code, out, err) = run(&args);
            assert_eq!(code, 0, "{args:?}: {err}");
            assert_eq!(err, "", "{args:?}");
            assert!(
                out == want,
                "{args:?} differs from golden/help-{name}.txt:\n--- got\n{out}\n--- want\n{want}"
            );
        }
    }
}

#[test]
fn help_wins_over_missing_arguments_and_shows_the_authority_variable() {
    // Required arguments are not asked for when help is.
    let (code, out, _) = run(&["serve", "--listen", "x", "--help"]);
    assert_eq!((code, out), (0, golden("serve")));
    // The operator commands show the variable's current value, as before.
    let (code, out, _) = run_env(&["leases", "--help"], Some("http://example.invalid:1"));
    assert_eq!(code, 0);
    assert!(
        out.contains(
            "[default: the embedded per-host authority] [env:\n                         LEASEAGENT_AUTHORITY=http://example.invalid:1]\n"
        ),
        "{out}"
    );
}

#[test]
fn version_of_every_command() {
    let v = env!("CARGO_PKG_VERSION");
    for flag in ["--version", "-V"] {
        assert_eq!(run(&[flag]), (0, format!("leaseagent {v}\n"), String::new()));
        for sub in &COMMANDS[1..] {
            assert_eq!(
                run(&[sub, flag]),
                (0, format!("leaseagent {sub} {v}\n"), String::new())
            );
        }
    }
}
