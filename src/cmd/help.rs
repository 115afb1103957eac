//! `--help`: one layout for every command, the run path's.
//!
//! ```text
//! ABOUT
//!
//! Usage: USAGE
//!
//! Arguments:                        (a command's positionals, if any)
//!   <NAME>                 help
//!
//! Options:                          (then each later group under its heading)
//!   -q, --long VALUE       help text [env: VAR=its value; default: D]
//!       --a-longer-flag VALUE
//!                          help text on the next line
//!   -h, --help             Print help         (-h and -V end the last group)
//!   -V, --version          Print version
//!
//! NOTES
//!
//! EXAMPLES
//! ```
//!
//! Help starts at column [`COLUMN`]; a longer flag puts it on the next line.
//! A help text keeps the line breaks its author wrote (`\n`) and is wrapped
//! at word boundaries where a line is still wider than [`WIDTH`]. The note
//! `[env: ..; default: ..]` closes the text's last line when it fits there
//! within [`WIDTH`] or the author broke the text by hand (and so placed it);
//! otherwise it is a line of its own. `VAR=value` shows the variable's
//! current value when it is set (a URL's `user:password@` never shown).

use super::flags::{Default, Doc, Env, Spec, positional_text, value_text};

/// Help lines end before this column (the width clap used when the output
/// is not a terminal).
pub const WIDTH: usize = 100;

/// Where help texts start.
pub const COLUMN: usize = 25;

/// `--help` of a command, exactly as printed (ends with a newline). `env`
/// supplies the current value of a flag's variable, which help shows.
pub fn help(doc: &Doc, env: Env) -> String {
    let mut out = format!("{}\n\nUsage: {}\n", doc.about, doc.usage);
    if !doc.positionals.is_empty() {
        out.push_str("\nArguments:\n");
        for p in &doc.positionals {
            out.push_str(&row(&format!("  {}", positional_text(p)), p.help, None));
        }
    }
    let last = doc.groups.len().saturating_sub(1);
    for (i, (heading, flags)) in doc.groups.iter().enumerate() {
        out.push_str(&format!("\n{}:\n", heading.unwrap_or("Options")));
        let builtin: &[&Spec] = if i == last {
            &[&super::flags::HELP, &super::flags::VERSION]
        } else {
            &[]
        };
        for f in flags.iter().chain(builtin) {
            let short = f.short.map_or("    ".to_string(), |c| format!("-{c}, "));
            let spec = format!("  {short}--{}{}", f.long, value_text(f.value));
            out.push_str(&row(&spec, f.help, note(f, env).as_deref()));
        }
    }
    if let Some(notes) = doc.notes {
        out.push_str(&format!("\n{notes}\n"));
    }
    out.push_str(&format!("\n{}\n", doc.examples));
    out
}

/// `[env: VAR; default: D]`, or `None` when the flag has neither.
fn note(f: &Spec, env: Env) -> Option<String> {
    let var = f.env.map(|var| match env(var).filter(|v| !v.is_empty()) {
        Some(now) => format!(
            "env: {var}={}",
            crate::authority::trust::redact_url(&now.to_string_lossy())
        ),
        None => format!("env: {var}"),
    });
    let default = match f.default {
        Default::Value(d) | Default::Note(d) => Some(format!("default: {d}")),
        Default::None => None,
    };
    let notes: Vec<String> = var.into_iter().chain(default).collect();
    (!notes.is_empty()).then(|| format!("[{}]", notes.join("; ")))
}

/// One row: `spec`, then `text` (and `note`) from [`COLUMN`] on.
fn row(spec: &str, text: &str, note: Option<&str>) -> String {
    let width = WIDTH - COLUMN;
    let mut lines: Vec<String> = text.lines().flat_map(|l| wrap_words(l, width)).collect();
    if let Some(note) = note {
        let by_hand = text.contains('\n');
        match lines.last_mut() {
            Some(last) if by_hand || last.chars().count() + 1 + note.chars().count() <= width => {
                last.push(' ');
                last.push_str(note);
            }
            _ => lines.extend(wrap_words(note, width)),
        }
    }
    let mut out = String::new();
    let mut lead = spec;
    if spec.len() >= COLUMN {
        out.push_str(spec);
        out.push('\n');
        lead = "";
    }
    for line in lines {
        out.push_str(&format!("{lead:<COLUMN$}{line}\n"));
        lead = "";
    }
    out
}

/// Greedy word wrap: as many words per line as fit in `width` columns.
fn wrap_words(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::flags::{CommandDef, Flag, Group, Positional, Syntax, text};
    use std::ffi::OsString;

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    fn ignore<A>(_: &mut A, _: OsString) -> Result<(), crate::cmd::flags::BoxError> {
        Ok(())
    }

    static T: CommandDef<()> = CommandDef {
        name: "t",
        about: "A command to lay out",
        usage: None,
        groups: &[
            Group {
                heading: None,
                flags: &[
                    Flag::value("listen", "ADDR", "Address")
                        .required()
                        .reads(ignore),
                    Flag::value("ttl", "DUR", "Time")
                        .default_value("30s")
                        .reads(ignore),
                    Flag::value("authority", "URL", "Authority")
                        .env("T_AUTHORITY")
                        .default_note("none")
                        .reads(ignore),
                    Flag::switch("quiet", "Quiet").short('q').sets(|_| {}),
                    Flag::value(
                        "long-winded",
                        "N",
                        "A help text that is much longer than the seventy-five columns \
                         that are left of a line after the flag column, so it wraps",
                    )
                    .default_value("1")
                    .reads(ignore),
                    Flag::value("broken", "N", "Broken by hand here,\nand not wrapped again")
                        .env("T_BROKEN")
                        .reads(ignore),
                ],
            },
            Group {
                heading: Some("Output"),
                flags: &[Flag::switch("json", "JSON").sets(|_| {})],
            },
        ],
        positionals: &[
            Positional::required("TASK", "The task").reads(|_: &mut (), v| {
                text(v)?;
                Ok(())
            }),
        ],
        syntax: Syntax::Sub,
        notes: Some("Notes."),
        examples: "Examples:\n  leaseagent t",
        finish: |_| Ok(crate::cmd::flags::Command::Exit(0)),
    };

    #[test]
    fn every_part_in_its_place() {
        assert_eq!(
            help(&T.doc(), &no_env),
            "\
A command to lay out

Usage: leaseagent t [OPTIONS] --listen ADDR <TASK>

Arguments:
  <TASK>                 The task

Options:
      --listen ADDR      Address
      --ttl DUR          Time [default: 30s]
      --authority URL    Authority [env: T_AUTHORITY; default: none]
  -q, --quiet            Quiet
      --long-winded N    A help text that is much longer than the seventy-five columns that are left
                         of a line after the flag column, so it wraps [default: 1]
      --broken N         Broken by hand here,
                         and not wrapped again [env: T_BROKEN]

Output:
      --json             JSON
  -h, --help             Print help
  -V, --version          Print version

Notes.

Examples:
  leaseagent t
"
        );
    }

    #[test]
    fn the_variable_shows_its_value_when_set_without_a_password() {
        let env = |v: &str| (v == "T_AUTHORITY").then(|| OsString::from("https://u:pw@h:1"));
        let h = help(&T.doc(), &env);
        assert!(
            h.contains(
                "      --authority URL    Authority [env: T_AUTHORITY=https://h:1; default: none]\n"
            ),
            "{h}"
        );
        assert!(!h.contains("pw"), "{h}");
    }

    #[test]
    fn a_note_that_does_not_fit_is_a_line_of_its_own_and_wraps_too() {
        let out = row(
            "      --x N",
            "Sixty-six columns of text, so that the note cannot fit behind it.",
            Some(
                "[env: A_VARIABLE_WITH_A_LONG_NAME=and a long value; default: also long enough to wrap]",
            ),
        );
        assert_eq!(
            out,
            "      --x N              Sixty-six columns of text, so that the note cannot fit behind it.\n\
             \x20                        [env: A_VARIABLE_WITH_A_LONG_NAME=and a long value; default: also long\n\
             \x20                        enough to wrap]\n"
        );
    }

    #[test]
    fn a_long_spec_puts_its_text_on_the_next_line() {
        assert_eq!(
            row("      --max-connections-per-peer N", "Most", None),
            "      --max-connections-per-peer N\n                         Most\n"
        );
        // 24 columns still leave one space.
        assert_eq!(
            row("      --expiry-grace DUR", "With", None),
            "      --expiry-grace DUR With\n"
        );
    }

    #[test]
    fn words_wrap_within_the_width() {
        assert_eq!(wrap_words("aa bb cc", 5), vec!["aa bb", "cc"]);
        assert_eq!(wrap_words("aaaaaaa b", 5), vec!["aaaaaaa", "b"]);
        assert_eq!(wrap_words("a", 5), vec!["a"]);
    }
}
