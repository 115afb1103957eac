//! Man pages and shell completions, generated from the flag tables.
//!
//! `leaseagent man [SUBCOMMAND]` and `leaseagent completions SHELL` read the
//! same table entries the parser parses with and `--help` is rendered from
//! (`defs.rs`, as a [`Doc`] each), so a flag cannot be accepted or shown by
//! `--help` without also being in the man page and in every completion
//! script. What a shell offers for a value is the entry's own
//! [`Complete`]; a flag's man text is its [`Spec::long_doc`]. This is
//! ripgrep's approach (`rg --generate man|complete-bash|...` from its one
//! flag table). It is hand-written because the parser is not clap (see
//! [`super`] for why), so clap_mangen and clap_complete cannot be used; the
//! output formats are small and fixed, and golden tests
//! (`tests/integration/golden/`) pin every byte.
//!
//! Conventions followed: one page per command as git and cargo do
//! (`leaseagent(1)` has the run path and, in a SUBCOMMANDS section, every
//! subcommand; `leaseagent-SUBCOMMAND(1)` has one), no date in `.TH` so the
//! output is reproducible, every `-` escaped as `\-` so options can be
//! copied out of a rendered page. Completions: a `complete -F` function for
//! bash, a `#compdef` function with `_arguments` for zsh, `complete -c` lines
//! for fish. A subcommand is only ever the first word (as the parser reads
//! it); on the run path everything after `--` is the COMMAND and is
//! completed as a command, then as files.

use super::flags::{Complete, Default, Doc, Spec, Value};

/// What the generators read: the run path and every subcommand.
pub struct Cli<'a> {
    pub run: Doc<'a>,
    pub subs: Vec<Doc<'a>>,
    pub version: &'a str,
}

/// The shells `completions` knows.
pub const SHELLS: &[&str] = &["bash", "zsh", "fish"];

/// A help text on one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Cli<'_> {
    fn sub_names(&self) -> Vec<&str> {
        self.subs.iter().map(|d| d.name).collect()
    }

    /// The words a shell offers for a value of this kind, when they are a
    /// fixed list.
    fn words(&self, complete: Complete) -> Option<Vec<&str>> {
        match complete {
            Complete::Words(w) => Some(w.to_vec()),
            Complete::Subcommands => Some(self.sub_names()),
            Complete::Nothing | Complete::Files => None,
        }
    }

    fn sub(&self, name: &str) -> Option<&Doc<'_>> {
        self.subs.iter().find(|d| d.name == name)
    }

    /// `leaseagent man [SUBCOMMAND]`: roff for man(1); `None` for an
    /// unknown subcommand.
    pub fn man(&self, sub: Option<&str>) -> Option<String> {
        match sub {
            None => Some(self.man_main()),
            Some(name) => self.sub(name).map(|d| self.man_sub(d)),
        }
    }

    fn man_main(&self) -> String {
        let run = &self.run;
        let mut out = th("leaseagent", self.version);
        out.push_str(&format!(
            ".SH NAME\nleaseagent \\- {}\n",
            roff_line(&one_line(run.about))
        ));
        out.push_str(&synopsis(&run.usage));
        out.push_str(&format!(".SH DESCRIPTION\n{}", roff_text(run.about)));
        out.push_str(".SH OPTIONS\n");
        out.push_str(&options(run, ".SS"));
        if let Some(n) = run.notes {
            out.push_str(&format!(".SH NOTES\n{}", roff_text(n)));
        }
        out.push_str(&examples(run.examples, ".SH"));
        out.push_str(".SH SUBCOMMANDS\n");
        for d in &self.subs {
            out.push_str(&format!(".SS \"{}\"\n", roff_line(&d.program())));
            out.push_str(&format!(
                "{}.PP\nUsage: {}\n",
                roff_text(d.about),
                roff_line(&d.usage)
            ));
            out.push_str(&arguments(d, ".PP"));
            out.push_str(&options(d, ".PP"));
            if let Some(n) = d.notes {
                out.push_str(&format!(".PP\n{}", roff_text(n)));
            }
            out.push_str(&examples(d.examples, ".PP"));
        }
        out.push_str(&environment(std::iter::once(run).chain(&self.subs)));
        out.push_str(&exit_status());
        let mut see: Vec<String> = self
            .subs
            .iter()
            .map(|d| format!("leaseagent\\-{}(1)", d.name))
            .collect();
        see.push("systemd.service(5)".into());
        out.push_str(&format!(
            ".SH \"SEE ALSO\"\n{}\n.PP\nThe full documentation: /usr/share/doc/leaseagent/ \
             (README.md and docs/), or docs/ in the source.\n",
            see.join(", ")
        ));
        out
    }

    fn man_sub(&self, d: &Doc) -> String {
        let page = format!("leaseagent-{}", d.name);
        let mut out = th(&page, self.version);
        out.push_str(&format!(
            ".SH NAME\n{} \\- {}\n",
            roff_line(&page),
            roff_line(&one_line(d.about))
        ));
        out.push_str(&synopsis(&d.usage));
        out.push_str(&format!(".SH DESCRIPTION\n{}", roff_text(d.about)));
        if !d.positionals.is_empty() {
            out.push_str(".SH ARGUMENTS\n");
            out.push_str(&arguments(d, ""));
        }
        out.push_str(".SH OPTIONS\n");
        out.push_str(&options(d, ".SS"));
        if let Some(n) = d.notes {
            out.push_str(&format!(".SH NOTES\n{}", roff_text(n)));
        }
        out.push_str(&examples(d.examples, ".SH"));
        out.push_str(&environment(std::iter::once(d)));
        out.push_str(".SH \"SEE ALSO\"\nleaseagent(1)\n");
        out
    }

    /// `leaseagent completions SHELL`; `None` for an unknown shell.
    pub fn completions(&self, shell: &str) -> Option<String> {
        match shell {
            "bash" => Some(self.bash()),
            "zsh" => Some(self.zsh()),
            "fish" => Some(self.fish()),
            _ => None,
        }
    }

    /// The commands with their completion key: `run` for the run path.
    fn keyed(&self) -> Vec<(&str, &Doc<'_>)> {
        std::iter::once(("run", &self.run))
            .chain(self.subs.iter().map(|d| (d.name, d)))
            .collect()
    }

    fn bash(&self) -> String {
        let subs = self.sub_names().join(" ");
        let mut path_values = Vec::new();
        let mut other_values = Vec::new();
        for (key, d) in self.keyed() {
            for f in d.all_flags() {
                let pattern = format!("\"{key} --{}\"", f.long);
                match (f.value, f.complete) {
                    (Value::Required(_), Complete::Files) => path_values.push(pattern),
                    (Value::Required(_), _) => other_values.push(pattern),
                    (Value::None | Value::Optional(_), _) => {}
                }
            }
        }
        let mut out = format!(
            "# bash completion for leaseagent {v}; generated by `leaseagent completions bash`\n\
             # from the flag tables the binary parses with: regenerate, never edit.\n\
             _leaseagent() {{\n\
             \x20   local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} sub=run i\n\
             \x20   COMPREPLY=()\n\
             \x20   # --flag=VALUE: bash splits at '='\n\
             \x20   if [[ $prev == = ]] && ((COMP_CWORD > 2)); then prev=${{COMP_WORDS[COMP_CWORD-2]}}; fi\n\
             \x20   if ((COMP_CWORD > 1)); then\n\
             \x20       case ${{COMP_WORDS[1]}} in\n\
             \x20           {alts}) sub=${{COMP_WORDS[1]}} ;;\n\
             \x20       esac\n\
             \x20   fi\n\
             \x20   if [[ $sub == run ]]; then\n\
             \x20       # everything after the first -- is the COMMAND and its arguments\n\
             \x20       for ((i = 1; i < COMP_CWORD; i++)); do\n\
             \x20           if [[ ${{COMP_WORDS[i]}} == -- ]]; then\n\
             \x20               if ((i + 1 == COMP_CWORD)); then\n\
             \x20                   mapfile -t COMPREPLY < <(compgen -c -- \"$cur\" | sort -u)\n\
             \x20               else\n\
             \x20                   compopt -o filenames 2>/dev/null\n\
             \x20                   mapfile -t COMPREPLY < <(compgen -f -- \"$cur\")\n\
             \x20               fi\n\
             \x20               return 0\n\
             \x20           fi\n\
             \x20       done\n\
             \x20   fi\n",
            v = self.version,
            alts = subs.replace(' ', "|"),
        );
        out.push_str("    case \"$sub $prev\" in\n");
        if !path_values.is_empty() {
            out.push_str(&format!(
                "        {})\n            compopt -o filenames 2>/dev/null\n            \
                 mapfile -t COMPREPLY < <(compgen -f -- \"$cur\")\n            return 0 ;;\n",
                path_values.join(" | ")
            ));
        }
        if !other_values.is_empty() {
            out.push_str(&format!(
                "        {})\n            return 0 ;; # a value: nothing to offer\n",
                other_values.join(" | ")
            ));
        }
        out.push_str("    esac\n    case $sub in\n");
        for (key, d) in self.keyed() {
            let flags: Vec<String> = d
                .all_flags()
                .iter()
                .flat_map(|f| {
                    f.short
                        .map(|c| format!("-{c}"))
                        .into_iter()
                        .chain([format!("--{}", f.long)])
                })
                .collect();
            out.push_str(&format!(
                "        {key})\n            if [[ $cur == -* ]]; then\n                \
                 mapfile -t COMPREPLY < <(compgen -W \"{}\" -- \"$cur\")\n",
                flags.join(" ")
            ));
            if key == "run" {
                out.push_str(&format!(
                    "            elif ((COMP_CWORD == 1)); then\n                \
                     mapfile -t COMPREPLY < <(compgen -W \"{subs}\" -- \"$cur\")\n"
                ));
            } else {
                out.push_str(&bash_positionals(self, d));
            }
            out.push_str("            fi ;;\n");
        }
        out.push_str("    esac\n    return 0\n}\ncomplete -F _leaseagent leaseagent\n");
        out
    }

    fn zsh(&self) -> String {
        let mut out = format!(
            "#compdef leaseagent\n\
             # zsh completion for leaseagent {}; generated by `leaseagent completions zsh`\n\
             # from the flag tables the binary parses with: regenerate, never edit.\n\n\
             _leaseagent_subcommands() {{\n    local -a subcommands=(\n",
            self.version
        );
        for d in &self.subs {
            out.push_str(&format!(
                "        {}\n",
                zsh_quote(&format!("{}:{}", d.name, one_line(d.about)))
            ));
        }
        out.push_str("    )\n    _describe -t subcommands subcommand subcommands\n}\n\n");
        out.push_str("_leaseagent() {\n    local i\n    case ${words[2]} in\n");
        for d in &self.subs {
            out.push_str(&format!(
                "        {})\n            shift words\n            (( CURRENT-- ))\n            \
                 _arguments -s -S \\\n",
                d.name
            ));
            for spec in zsh_specs(self, d) {
                out.push_str(&format!("                {spec} \\\n"));
            }
            out.push_str("                && return 0\n            return 1 ;;\n");
        }
        out.push_str(
            "    esac\n    \
             # the run path: after the first --, the COMMAND and its arguments\n    \
             for (( i = 2; i < CURRENT; i++ )); do\n        \
             if [[ ${words[i]} == -- ]]; then\n            \
             shift $i words\n            (( CURRENT -= i ))\n            \
             _normal\n            return\n        fi\n    done\n    \
             _arguments -s -S \\\n",
        );
        for spec in zsh_specs(self, &self.run) {
            out.push_str(&format!("        {spec} \\\n"));
        }
        out.push_str(
            "        '1: :_leaseagent_subcommands' \\\n        && return 0\n}\n\n\
             _leaseagent \"$@\"\n",
        );
        out
    }

    fn fish(&self) -> String {
        let subs = self.sub_names().join(" ");
        let mut out = format!(
            "# fish completion for leaseagent {v}; generated by `leaseagent completions fish`\n\
             # from the flag tables the binary parses with: regenerate, never edit.\n\n\
             # The command whose flags apply: the first word when it is a subcommand, else run.\n\
             function __fish_leaseagent_using -a name\n    \
             set -l words (commandline -opc)\n    \
             if test (count $words) -ge 2; and contains -- $words[2] {subs}\n        \
             test \"$words[2]\" = \"$name\"\n        return\n    end\n    \
             contains -- -- $words; and return 1\n    \
             test \"$name\" = run\nend\n\n\
             complete -c leaseagent -f\n",
            v = self.version,
        );
        for d in &self.subs {
            out.push_str(&format!(
                "complete -c leaseagent -n '__fish_is_first_token' -a {} -d {}\n",
                d.name,
                fish_quote(&one_line(d.about))
            ));
        }
        for (key, d) in self.keyed() {
            let cond = format!("-n '__fish_leaseagent_using {key}'");
            for f in d.all_flags() {
                let mut line = format!("complete -c leaseagent {cond}");
                if let Some(c) = f.short {
                    line.push_str(&format!(" -s {c}"));
                }
                line.push_str(&format!(" -l {}", f.long));
                match (f.value, f.complete) {
                    (Value::Required(_) | Value::Optional(_), Complete::Files) => {
                        line.push_str(" -r -F")
                    }
                    (Value::Required(_), _) => line.push_str(" -x"),
                    _ => {}
                }
                line.push_str(&format!(" -d {}\n", fish_quote(&one_line(f.help))));
                out.push_str(&line);
            }
            for p in &d.positionals {
                if p.complete == Complete::Files {
                    out.push_str(&format!("complete -c leaseagent {cond} -F\n"));
                } else if let Some(words) = self.words(p.complete) {
                    out.push_str(&format!(
                        "complete -c leaseagent {cond} -a {}\n",
                        fish_quote(&words.join(" "))
                    ));
                }
            }
        }
        out
    }
}

/// The positional part of a subcommand's bash branch (inside `if`).
fn bash_positionals(cli: &Cli, d: &Doc) -> String {
    if d.positionals.iter().any(|p| p.complete == Complete::Files) {
        return "            else\n                compopt -o filenames 2>/dev/null\n                \
                mapfile -t COMPREPLY < <(compgen -f -- \"$cur\")\n"
            .to_string();
    }
    let words: Vec<&str> = d
        .positionals
        .iter()
        .filter_map(|p| cli.words(p.complete))
        .flatten()
        .collect();
    if words.is_empty() {
        return String::new();
    }
    format!(
        "            else\n                mapfile -t COMPREPLY < <(compgen -W \"{}\" -- \"$cur\")\n",
        words.join(" ")
    )
}

/// `_arguments` specs of one command.
fn zsh_specs(cli: &Cli, d: &Doc) -> Vec<String> {
    let mut specs = Vec::new();
    for f in d.all_flags() {
        let help = zsh_bracket(&one_line(f.help));
        let (colons, n) = match f.value {
            Value::None => ("", ""),
            Value::Required(n) => (":", n),
            Value::Optional(n) => ("::", n),
        };
        let arg = match f.value {
            Value::None => String::new(),
            _ => format!("{colons}{n}:{}", zsh_action(cli, f.complete)),
        };
        let eq = match f.value {
            Value::None => "",
            Value::Required(_) => "=",
            Value::Optional(_) => "=-",
        };
        let names: Vec<String> = f
            .short
            .map(|c| format!("-{c}"))
            .into_iter()
            .chain([format!("--{}", f.long)])
            .collect();
        for name in names {
            let own_eq = if name.starts_with("--") { eq } else { "" };
            specs.push(zsh_quote(&format!("{name}{own_eq}[{help}]{arg}")));
        }
    }
    for (i, p) in d.positionals.iter().enumerate() {
        let action = zsh_action(cli, p.complete);
        specs.push(zsh_quote(&format!("{}:{}:{action}", i + 1, p.name)));
    }
    specs
}

/// The action of an `_arguments` spec: what zsh offers for a value.
fn zsh_action(cli: &Cli, complete: Complete) -> String {
    match complete {
        Complete::Files => "_files".to_string(),
        _ => match cli.words(complete) {
            Some(words) => format!("({})", words.join(" ")),
            None => " ".to_string(),
        },
    }
}

/// A word in single quotes for zsh and bash.
fn zsh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Text inside an `_arguments` `[...]` description.
fn zsh_bracket(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('[', "\\[")
        .replace(']', "\\]")
}

/// A word in single quotes for fish.
fn fish_quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The `.TH` line and the man macros' preamble.
fn th(page: &str, version: &str) -> String {
    format!(
        ".\\\" Generated by `leaseagent man` from the flag tables the binary parses with.\n\
         .TH \"{}\" \"1\" \"\" \"leaseagent {}\" \"User Commands\"\n.nh\n.ad l\n",
        page.to_uppercase().replace('-', "\\-"),
        roff_line(version)
    )
}

fn synopsis(usage: &str) -> String {
    let lines: Vec<String> = usage
        .lines()
        .map(|l| format!("\\fB{}\\fR", roff_line(l.trim())))
        .collect();
    format!(".SH SYNOPSIS\n{}\n", lines.join("\n.br\n"))
}

/// The options of every group; a later group under `heading` (`.SS` on a
/// page of its own, a bold paragraph inside SUBCOMMANDS).
fn options(d: &Doc, heading: &str) -> String {
    let mut out = String::new();
    let last = d.groups.len().saturating_sub(1);
    for (i, (h, flags)) in d.groups.iter().enumerate() {
        if let Some(h) = h {
            if heading == ".SS" {
                out.push_str(&format!(".SS \"{}\"\n", roff_line(h)));
            } else {
                out.push_str(&format!(".PP\n\\fB{}\\fR\n", roff_line(h)));
            }
        }
        let builtin: &[&Spec] = if i == last {
            &[&super::flags::HELP, &super::flags::VERSION]
        } else {
            &[]
        };
        for f in flags.iter().chain(builtin) {
            out.push_str(&option(f));
        }
    }
    out
}

fn option(f: &Spec) -> String {
    let mut tag = String::new();
    if let Some(c) = f.short {
        tag.push_str(&format!("\\fB\\-{c}\\fR, "));
    }
    tag.push_str(&format!("\\fB\\-\\-{}\\fR", roff_line(f.long)));
    match f.value {
        Value::None => {}
        Value::Required(n) => tag.push_str(&format!(" \\fI{}\\fR", roff_line(n))),
        Value::Optional(n) => tag.push_str(&format!(" [\\fI{}\\fR]", roff_line(n))),
    }
    let mut text = one_line(f.long_doc());
    match f.default {
        Default::Value(v) | Default::Note(v) => text.push_str(&format!(" (default: {v})")),
        Default::None => {}
    }
    if let Some(var) = f.env {
        text.push_str(&format!(" (environment: {var})"));
    }
    if f.required {
        text.push_str(" (required)");
    }
    format!(".TP\n{tag}\n{}\n", roff_line(&text))
}

fn arguments(d: &Doc, lead: &str) -> String {
    let mut out = String::new();
    if !d.positionals.is_empty() && !lead.is_empty() {
        out.push_str(&format!("{lead}\n\\fBArguments:\\fR\n"));
    }
    for p in &d.positionals {
        out.push_str(&format!(
            ".TP\n\\fI{}\\fR\n{}\n",
            roff_line(p.name),
            roff_line(&one_line(p.help))
        ));
    }
    out
}

/// The examples paragraph (and, on the run path, the subcommand list and
/// exit status that follow it), kept as laid out.
fn examples(text: &str, heading: &str) -> String {
    let body = text.strip_prefix("Examples:\n").unwrap_or(text);
    let head = if heading == ".SH" {
        ".SH EXAMPLES\n".to_string()
    } else {
        format!("{heading}\n\\fBExamples:\\fR\n.PP\n")
    };
    format!("{head}.nf\n.RS 4\n{}.RE\n.fi\n", roff_lines(body))
}

/// The EXIT STATUS section: the one table of `crate::exit`.
fn exit_status() -> String {
    let mut out = ".SH \"EXIT STATUS\"\n".to_string();
    for s in crate::exit::TABLE {
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            roff_line(s.status),
            roff_line(&s.when.replace('`', ""))
        ));
    }
    out
}

/// The ENVIRONMENT section: every variable a flag reads.
fn environment<'a, 'b: 'a>(docs: impl Iterator<Item = &'a Doc<'b>>) -> String {
    let mut vars: Vec<(&str, &str)> = Vec::new();
    for d in docs {
        for f in d.groups.iter().flat_map(|(_, flags)| flags.iter()) {
            if let Some(var) = f.env
                && !vars.iter().any(|(v, _)| *v == var)
            {
                vars.push((var, f.long));
            }
        }
    }
    if vars.is_empty() {
        return String::new();
    }
    let mut out = ".SH ENVIRONMENT\n".to_string();
    for (var, long) in vars {
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\nUsed when \\fB\\-\\-{}\\fR is not given or empty.\n",
            roff_line(var),
            roff_line(long)
        ));
    }
    out
}

/// Prose for a filled paragraph: lines kept (roff joins them).
fn roff_text(s: &str) -> String {
    let mut out = String::new();
    for para in s.split("\n\n") {
        if !out.is_empty() {
            out.push_str(".PP\n");
        }
        out.push_str(&roff_lines(para.trim_end()));
    }
    out
}

/// Every line escaped, each ending in a newline.
fn roff_lines(s: &str) -> String {
    s.lines().map(|l| format!("{}\n", roff_line(l))).collect()
}

/// One line of text escaped for roff: backslashes and minus signs, and a
/// control character (`.` or `'`) at the start of the line.
fn roff_line(s: &str) -> String {
    let e = s.replace('\\', "\\e").replace('-', "\\-");
    if e.starts_with('.') || e.starts_with('\'') {
        format!("\\&{e}")
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roff_escapes_what_roff_would_read_as_markup() {
        assert_eq!(roff_line("--task"), "\\-\\-task");
        assert_eq!(roff_line(".hidden"), "\\&.hidden");
        assert_eq!(roff_line("'quoted'"), "\\&'quoted'");
        assert_eq!(roff_line("a\\b"), "a\\eb");
        assert_eq!(roff_text("a\nb\n\nc"), "a\nb\n.PP\nc\n");
    }

    #[test]
    fn a_flag_s_man_text_is_its_long_doc_when_it_has_one() {
        let short: crate::cmd::flags::Flag<()> =
            crate::cmd::flags::Flag::value("ttl", "DUR", "Lease duration")
                .default_value("30s")
                .reads(|_, _| Ok(()));
        assert_eq!(
            option(&short.spec),
            ".TP\n\\fB\\-\\-ttl\\fR \\fIDUR\\fR\nLease duration (default: 30s)\n"
        );
        let long: crate::cmd::flags::Flag<()> =
            crate::cmd::flags::Flag::value("ttl", "DUR", "Lease duration")
                .doc("How long the lease\nis asked for.")
                .reads(|_, _| Ok(()));
        assert_eq!(
            option(&long.spec),
            ".TP\n\\fB\\-\\-ttl\\fR \\fIDUR\\fR\nHow long the lease is asked for.\n"
        );
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(zsh_quote("it's"), "'it'\\''s'");
        assert_eq!(fish_quote("it's \\"), "'it\\'s \\\\'");
        assert_eq!(zsh_bracket("a [b]"), "a \\[b\\]");
    }
}
