//! Man pages and shell completions, generated from the flag tables
//! (`leaseagent man`, `leaseagent completions SHELL`): byte for byte the
//! golden files (`LEASEAGENT_BLESS=1` rewrites them, see
//! `support/golden.rs`), every flag `--help` shows is in each of them, the
//! pages render without a groff warning, the zsh and fish scripts parse,
//! the bash script completes flags, subcommands, files and values when a
//! real bash calls it the way readline does, and a real fish completes
//! from its script (`complete -C`). zsh is only parsed (`zsh -n`): driving
//! its completion system needs a pseudo-terminal.

use crate::support::golden;

use std::process::{Command, Stdio};

fn leaseagent(args: &[&str]) -> String {
    // The generated texts read no environment (help shows no values here).
    let mut c = Command::new(crate::support::bin());
    let out = c.args(args).env_clear().output().unwrap();
    assert!(
        out.status.success(),
        "leaseagent {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stderr.is_empty(), "leaseagent {args:?} wrote on stderr");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands, each with a page of its own: the `.SS` headings of the
/// SUBCOMMANDS section of leaseagent(1).
fn subcommands() -> Vec<String> {
    let page = leaseagent(&["man"]);
    let subs: Vec<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix(".SS \"leaseagent "))
        .map(|s| s.trim_end_matches('"').to_string())
        .collect();
    assert!(subs.len() >= 10, "subcommands in leaseagent(1): {subs:?}");
    subs
}

/// The long flags a `--help` lists (the option rows, not the examples).
fn help_flags(args: &[&str]) -> Vec<String> {
    let help = leaseagent(args);
    let mut flags = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        let t = t
            .strip_prefix("-h, ")
            .or(t.strip_prefix("-V, "))
            .unwrap_or(t);
        let t = t.strip_prefix("-q, ").unwrap_or(t);
        if let Some(rest) = t.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !name.is_empty() && line.starts_with("  ") {
                flags.push(name);
            }
        }
    }
    assert!(flags.contains(&"help".to_string()), "{args:?}: {flags:?}");
    flags
}

#[test]
fn man_pages_and_completions_are_the_golden_files() {
    golden::check("man/leaseagent.1", &leaseagent(&["man"]));
    let subs = subcommands();
    for sub in &subs {
        golden::check(
            &format!("man/leaseagent-{sub}.1"),
            &leaseagent(&["man", sub]),
        );
    }
    for shell in ["bash", "zsh", "fish"] {
        golden::check(
            &format!("completions/leaseagent.{shell}"),
            &leaseagent(&["completions", shell]),
        );
    }
    // No page is left behind for a subcommand that is gone.
    let dir = golden::dir().join("man");
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let known =
            name == "leaseagent.1" || subs.iter().any(|s| name == format!("leaseagent-{s}.1"));
        if !known && golden::blessing() {
            std::fs::remove_file(dir.join(&name)).unwrap();
        } else {
            assert!(known, "golden/man/{name}: no such subcommand any more");
        }
    }
}

#[test]
fn every_flag_of_every_help_is_in_the_man_pages_and_the_completions() {
    let main_page = leaseagent(&["man"]);
    let bash = leaseagent(&["completions", "bash"]);
    let zsh = leaseagent(&["completions", "zsh"]);
    let fish = leaseagent(&["completions", "fish"]);
    let mut commands: Vec<Vec<String>> = vec![vec![]];
    commands.extend(subcommands().into_iter().map(|s| vec![s]));
    for cmd in commands {
        let mut args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let page = match args.first() {
            Some(sub) => leaseagent(&["man", sub]),
            None => main_page.clone(),
        };
        args.push("--help");
        for flag in help_flags(&args) {
            let roff = format!("\\-\\-{}", flag.replace('-', "\\-"));
            assert!(
                page.contains(&roff),
                "{args:?}: --{flag} not in its man page"
            );
            assert!(main_page.contains(&roff), "--{flag} not in leaseagent(1)");
            assert!(bash.contains(&format!("--{flag}")), "--{flag} not in bash");
            assert!(zsh.contains(&format!("'--{flag}")), "--{flag} not in zsh");
            assert!(
                fish.contains(&format!(" -l {flag} ")),
                "--{flag} not in fish"
            );
        }
    }
}

#[test]
fn man_pages_render_without_warnings() {
    let mut pages = vec![leaseagent(&["man"])];
    pages.extend(subcommands().iter().map(|s| leaseagent(&["man", s])));
    for page in pages {
        let mut child = Command::new("groff")
            .args(["-man", "-ww", "-z", "-Tutf8"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("groff (Debian groff-base) must be installed: scripts/test installs it");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(page.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let first = page.lines().nth(1).unwrap_or_default().to_string();
        assert!(out.status.success(), "{first}: groff {}", out.status);
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{first}");
    }
}

#[test]
fn zsh_and_fish_scripts_parse() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [("zsh", "-n"), ("fish", "--no-execute")] {
        let path = dir.path().join(format!("leaseagent.{shell}"));
        std::fs::write(&path, leaseagent(&["completions", shell])).unwrap();
        let out = Command::new(shell)
            .arg(check)
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("{shell} must be installed (scripts/test does): {e}"));
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{shell} {check}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// What the generated bash function offers for the words typed so far (the
/// last one being completed), as readline would ask: COMP_WORDS and
/// COMP_CWORD set, the function `complete -p leaseagent` names called.
fn bash_complete(words: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("leaseagent.bash");
    std::fs::write(&script, leaseagent(&["completions", "bash"])).unwrap();
    let quoted: Vec<String> = words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
        .collect();
    let driver = format!(
        "source '{}'\n\
         spec=$(complete -p leaseagent) || exit 3\n\
         fn=${{spec#*-F }}; fn=${{fn%% *}}\n\
         COMP_WORDS=({})\n\
         COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n\
         COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}\n\
         COMPREPLY=()\n\
         \"$fn\" leaseagent \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script.display(),
        quoted.join(" ")
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &driver])
        .current_dir(dir.path())
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{words:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_flags_subcommands_values_and_files() {
    let c = |w: &[&str]| bash_complete(w);
    assert_eq!(c(&["leaseagent", "--ta"]), ["--task"]);
    assert_eq!(c(&["leaseagent", "--clock"]), ["--clock-drift"]);
    assert_eq!(c(&["leaseagent", "se"]), ["serve"]);
    let all = c(&["leaseagent", ""]);
    for sub in subcommands().iter().map(String::as_str) {
        assert!(all.iter().any(|s| s == sub), "{sub} not offered: {all:?}");
    }
    assert_eq!(c(&["leaseagent", "serve", "--li"]), ["--listen"]);
    assert_eq!(c(&["leaseagent", "check", "--m"]), ["--min-remaining"]);
    // A subcommand only as the first word; elsewhere the run path's flags.
    assert_eq!(c(&["leaseagent", "--task", "serve", "--ttl"]), ["--ttl"]);
    assert_eq!(
        c(&["leaseagent", "completions", ""]),
        ["bash", "zsh", "fish"]
    );
    assert_eq!(c(&["leaseagent", "man", "pub"]), ["publish"]);
    assert_eq!(c(&["leaseagent", "token", "n"]), ["new"]);
    // A value that is a file, as --flag VALUE and as --flag=VALUE.
    assert_eq!(c(&["leaseagent", "--ca-file", "/et"]), ["/etc"]);
    assert_eq!(
        c(&["leaseagent", "leases", "--ca-file", "=", "/et"]),
        ["/etc"]
    );
    assert_eq!(c(&["leaseagent", "publish", "/et"]), ["/etc"]);
    // A value that is not: nothing (not the flags, not files).
    assert!(c(&["leaseagent", "--ttl", ""]).is_empty());
    // After --, the COMMAND: a command name, then its arguments as files.
    let cmd = c(&["leaseagent", "--task", "t", "--", "bas"]);
    assert!(cmd.iter().any(|s| s == "bash"), "{cmd:?}");
    assert_eq!(
        c(&["leaseagent", "--task", "t", "--", "ls", "/et"]),
        ["/etc"]
    );
}

/// What fish offers for a command line (`complete -C`), the generated
/// script sourced: the candidates, without their descriptions.
fn fish_complete(line: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("leaseagent.fish");
    std::fs::write(&script, leaseagent(&["completions", "fish"])).unwrap();
    let out = Command::new("fish")
        .arg("--no-config")
        .arg("-c")
        .arg(format!(
            "source {}; complete -C {}",
            script.display(),
            format_args!("'{}'", line.replace('\'', "\\'"))
        ))
        .output()
        .expect("fish must be installed (scripts/test does)");
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn fish_completes_flags_subcommands_and_values() {
    assert_eq!(fish_complete("leaseagent --ta"), ["--task"]);
    assert_eq!(fish_complete("leaseagent se"), ["serve"]);
    assert_eq!(fish_complete("leaseagent serve --li"), ["--listen"]);
    // The run path's flags after a flag value; a subcommand's only after it.
    assert_eq!(fish_complete("leaseagent --task x --tt"), ["--ttl"]);
    assert!(fish_complete("leaseagent serve --tt").is_empty());
    assert_eq!(
        fish_complete("leaseagent completions "),
        ["bash", "fish", "zsh"]
    );
    assert_eq!(fish_complete("leaseagent token "), ["new"]);
}
