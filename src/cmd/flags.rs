//! One command-line parser for the whole binary, driven by flag tables.
//!
//! Every command (the run path and each subcommand) is one [`CommandDef`] in
//! [`super::defs`]: its flags, positionals, about line, notes and examples.
//! From that one table this module both parses argv (with lexopt) and renders
//! `--help`, so a flag cannot be accepted without being documented or
//! documented without being accepted. Two stages, as in ripgrep:
//!
//! - **low** ([`parse`]): what was typed, no I/O except reading the
//!   environment variables the table names. Returns [`Parsed::Help`] /
//!   [`Parsed::Version`] (not errors: they exit 0) or [`Matches`]; unknown
//!   flags, missing values, stray or missing positionals and missing required
//!   flags are a [`UsageError`] that names the flag.
//! - **high** (in [`super`]): [`Matches`] turned into a command's typed
//!   arguments (`ServeArgs`, `RawRun` then `RunConfig`, ...): value parsing
//!   (durations, numbers) and cross-flag rules, errors again naming the flag.
//!
//! ## Adding a flag
//!
//! One entry in the command's flag list in `defs.rs`, e.g.
//! `Flag::value("ca-file", "FILE", "CA certificates to trust")`, plus, where
//! the command's arguments are built (`cmd/mod.rs`), one line reading it
//! (`m.os("ca-file")`, `m.switch("force")`, `m.parse("ttl", dur)?`). Help
//! is generated from the entry. Builders: `.short('q')`, `.env("VAR")`,
//! `.default_value("30s")` (applied when absent, shown), `.default_note("ttl/3")`
//! (shown only), `.required()`, `.optional_value()` (`--wait [DUR]`).
//! A run-path help text is broken by hand with `\n`.
//! Flags shared by several commands are one `const` (see `AUTHORITY`); a
//! set of them that help should show under its own heading is a [`Group`]
//! (`Group { heading: Some("Trust"), flags: &[..] }`) in each command's
//! `groups`.
//!
//! ## Rules (the same for every command)
//!
//! - `--flag VALUE` and `--flag=VALUE`; short switches may be grouped (`-qh`).
//! - `-h`/`--help` and `-V`/`--version` exist everywhere and win over any
//!   error that comes later on the line (they are handled in order).
//! - A flag with `.env(VAR)` that is absent or given an empty value takes
//!   `VAR` when it is set and not empty. The environment is read here and
//!   nowhere else ([`env_value`]); help shows the variable.
//! - Subcommands: `--` ends the flags (what follows is positional); a flag
//!   given twice is an error. The run path: everything after the first `--`
//!   is the COMMAND (required), nothing positional may come before it, and a
//!   flag given twice keeps its last value.
//! - An optional value (`--wait [DUR]`) is `--wait=DUR`, or the next word
//!   when it does not start with `-`.
//!
//! ## Help layout
//!
//! Subcommands keep the layout they had under clap: `<VALUE>` names, columns
//! two spaces after the longest flag, help text word-wrapped at 100 columns,
//! `[default: ..] [env: VAR=current value]` after the text, `-h`/`-V` at the
//! end of "Options:", other groups after it. The run path keeps its
//! hand-made layout: bare `VALUE` names, help at column 25 (a longer flag
//! puts its help on the next line), lines broken only where the table's
//! text has `\n`, `[env: VAR; default: ..]` on the text's last line when
//! the text is broken by hand or the note fits in 100 columns, else on a
//! line of its own, and `-h`/`-V` at the end of the last group.

use std::ffi::OsString;

/// Help is wrapped to this many columns (the width clap used when the
/// output is not a terminal).
pub const HELP_WIDTH: usize = 100;

/// Whether and how a flag takes a value; the name is what help shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// A switch: present or not.
    None,
    /// `--flag VALUE`.
    Required(&'static str),
    /// `--flag [VALUE]`.
    Optional(&'static str),
}

/// What a flag's help says about its default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Default {
    None,
    /// Parsed as if typed when the flag is absent, and shown.
    Value(&'static str),
    /// Shown only; the command computes the default itself.
    Note(&'static str),
}

/// One flag of one command.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    /// Without the leading `--`.
    pub long: &'static str,
    pub short: Option<char>,
    pub value: Value,
    pub help: &'static str,
    pub default: Default,
    /// Environment variable read when the flag is absent or empty.
    pub env: Option<&'static str>,
    /// Usage error when absent (after the environment fallback); listed in
    /// the usage line.
    pub required: bool,
}

impl Flag {
    /// `--long`, present or not.
    pub const fn switch(long: &'static str, help: &'static str) -> Flag {
        Flag {
            long,
            short: None,
            value: Value::None,
            help,
            default: Default::None,
            env: None,
            required: false,
        }
    }

    /// `--long VALUE`.
    pub const fn value(long: &'static str, name: &'static str, help: &'static str) -> Flag {
        Flag {
            value: Value::Required(name),
            ..Flag::switch(long, help)
        }
    }

    pub const fn short(self, c: char) -> Flag {
        Flag {
            short: Some(c),
            ..self
        }
    }

    pub const fn env(self, var: &'static str) -> Flag {
        Flag {
            env: Some(var),
            ..self
        }
    }

    pub const fn default_value(self, v: &'static str) -> Flag {
        Flag {
            default: Default::Value(v),
            ..self
        }
    }

    pub const fn default_note(self, n: &'static str) -> Flag {
        Flag {
            default: Default::Note(n),
            ..self
        }
    }

    pub const fn required(self) -> Flag {
        Flag {
            required: true,
            ..self
        }
    }

    /// `--long [VALUE]` instead of `--long VALUE`.
    pub const fn optional_value(self) -> Flag {
        let value = match self.value {
            Value::Required(n) | Value::Optional(n) => Value::Optional(n),
            Value::None => Value::None,
        };
        Flag { value, ..self }
    }
}

/// A positional argument (required unless `optional`; optional ones come last).
#[derive(Clone, Copy, Debug)]
pub struct Positional {
    pub name: &'static str,
    pub help: &'static str,
    pub optional: bool,
}

/// Flags listed together in help; the first group of a command has no
/// heading (it is "Options:"), later ones may have one (say, "Trust").
#[derive(Debug)]
pub struct Group {
    /// Shown as `HEADING:` above the group.
    pub heading: Option<&'static str>,
    pub flags: &'static [Flag],
}

/// How a command's help is laid out and a few parsing rules (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// `leaseagent [OPTIONS] -- COMMAND [ARG...]`.
    Run,
    /// `leaseagent SUBCOMMAND ...`.
    Sub,
}

/// One command: everything its parser and its help are made from.
#[derive(Debug)]
pub struct CommandDef {
    /// The subcommand's name; empty for the run path.
    pub name: &'static str,
    /// First paragraph of the help.
    pub about: &'static str,
    /// The usage line after `Usage: `; generated when `None`.
    pub usage: Option<&'static str>,
    pub groups: &'static [Group],
    pub positionals: &'static [Positional],
    /// Text after the options.
    pub notes: Option<&'static str>,
    /// The help's last paragraph.
    pub examples: &'static str,
    pub style: Style,
}

const HELP: Flag = Flag::switch("help", "Print help").short('h');
const VERSION: Flag = Flag::switch("version", "Print version").short('V');

impl CommandDef {
    /// `leaseagent` or `leaseagent NAME`: prefix of messages and versions.
    pub fn program(&self) -> String {
        if self.name.is_empty() {
            "leaseagent".to_string()
        } else {
            format!("leaseagent {}", self.name)
        }
    }

    /// Every flag of every group, in order: [`Matches`] indexes this.
    fn flags(&self) -> impl Iterator<Item = &'static Flag> + use<> {
        self.groups.iter().flat_map(|g| g.flags.iter())
    }

    fn flag(&self, long: &str) -> Option<usize> {
        self.flags().position(|f| f.long == long)
    }

    fn short_flag(&self, c: char) -> Option<usize> {
        self.flags().position(|f| f.short == Some(c))
    }

    fn flag_at(&self, i: usize) -> Option<&'static Flag> {
        self.flags().nth(i)
    }

    /// The usage line (without `Usage: `).
    pub fn usage(&self) -> String {
        if let Some(u) = self.usage {
            return u.to_string();
        }
        let mut u = format!("{} [OPTIONS]", self.program());
        for f in self.flags().filter(|f| f.required) {
            u.push_str(&format!(" --{}{}", f.long, self.value_text(f.value)));
        }
        for p in self.positionals {
            if p.optional {
                u.push_str(&format!(" [{}]", p.name));
            } else {
                u.push_str(&format!(" <{}>", p.name));
            }
        }
        u
    }

    fn value_text(&self, v: Value) -> String {
        match (v, self.style) {
            (Value::None, _) => String::new(),
            (Value::Required(n), Style::Run) => format!(" {n}"),
            (Value::Optional(n), Style::Run) => format!(" [{n}]"),
            (Value::Required(n), Style::Sub) => format!(" <{n}>"),
            (Value::Optional(n), Style::Sub) => format!(" [<{n}>]"),
        }
    }
}

/// Wrong usage: the message names the flag (or argument) at fault.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// What was typed does not fit the command's table (unknown or repeated
    /// flag, missing value or argument, stray argument, not UTF-8) or its
    /// cross-flag rules. Kept as the finished message: each is built once,
    /// where the fault is found, from the table's own names, and nothing
    /// but the reader ever looks at it, so variants would only restate the
    /// text.
    #[error("{0}")]
    Words(String),
    /// A flag's value did not parse (a duration, a number, ...).
    #[error("--{flag}: {source}")]
    Value {
        flag: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The run path's flags parsed but do not make a valid run.
    #[error(transparent)]
    Run(#[from] crate::agent::config::ConfigError),
}

fn usage_error(msg: impl Into<String>) -> UsageError {
    UsageError::Words(msg.into())
}

/// The low stage's answer.
#[derive(Debug)]
pub enum Parsed {
    Help,
    Version,
    Args(Matches),
}

/// How a flag was given.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Given {
    /// A switch, or an optional-value flag without its value.
    Present,
    Value(OsString),
}

/// What was typed for one command, defaults and environment applied.
#[derive(Debug)]
pub struct Matches {
    def: &'static CommandDef,
    given: Vec<Option<Given>>,
    positionals: Vec<OsString>,
    /// The run path's COMMAND (after `--`).
    trailing: Vec<OsString>,
}

/// Reads a flag's environment variable: the one place the command line
/// looks at the environment.
pub fn env_value(var: &str) -> Option<OsString> {
    std::env::var_os(var)
}

/// The environment as the parser sees it: [`env_value`], or a stand-in in
/// tests (which must not change the process environment).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// Parses `args` (argv after the program and subcommand name) for `def`.
pub fn parse(def: &'static CommandDef, args: &[OsString], env: Env) -> Result<Parsed, UsageError> {
    let (opts, trailing) = split_trailing(def, args);
    let has_trailing = trailing.is_some();
    let mut m = Matches {
        def,
        given: vec![None; def.flags().count()],
        positionals: Vec::new(),
        trailing: trailing.unwrap_or_default(),
    };
    if let Some(special) = read_args(&mut m, opts)? {
        return Ok(special);
    }
    apply_env(&mut m, env);
    if def.style == Style::Run && !has_trailing {
        return Err(usage_error(format!(
            "no COMMAND given: usage is {}",
            def.usage().lines().next().unwrap_or_default()
        )));
    }
    check_required(&m)?;
    Ok(Parsed::Args(m))
}

/// The run path: the COMMAND is everything after the first `--`.
fn split_trailing<'a>(
    def: &CommandDef,
    args: &'a [OsString],
) -> (&'a [OsString], Option<Vec<OsString>>) {
    if def.style != Style::Run {
        return (args, None);
    }
    match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], Some(args[i + 1..].to_vec())),
        None => (args, None),
    }
}

/// The lexopt loop: flags and positionals in order; help and version stop it.
fn read_args(m: &mut Matches, opts: &[OsString]) -> Result<Option<Parsed>, UsageError> {
    let def = m.def;
    let mut p = lexopt::Parser::from_args(opts.iter().cloned());
    while let Some(arg) = p.next().map_err(|e| lexopt_error(def, e))? {
        let idx = match arg {
            lexopt::Arg::Short('h') | lexopt::Arg::Long("help") => return Ok(Some(Parsed::Help)),
            lexopt::Arg::Short('V') | lexopt::Arg::Long("version") => {
                return Ok(Some(Parsed::Version));
            }
            lexopt::Arg::Long(name) => def
                .flag(name)
                .ok_or_else(|| unknown(def, &format!("--{name}")))?,
            lexopt::Arg::Short(c) => def
                .short_flag(c)
                .ok_or_else(|| unknown(def, &format!("-{c}")))?,
            lexopt::Arg::Value(v) => {
                take_positional(m, v)?;
                continue;
            }
        };
        let Some(flag) = def.flag_at(idx) else {
            continue;
        };
        let given = read_value(&mut p, flag)?;
        if m.given[idx].is_some() && def.style == Style::Sub {
            return Err(usage_error(format!(
                "--{} given more than once (see {} --help)",
                flag.long,
                def.program()
            )));
        }
        m.given[idx] = Some(given);
    }
    Ok(None)
}

fn read_value(p: &mut lexopt::Parser, flag: &Flag) -> Result<Given, UsageError> {
    match flag.value {
        Value::None => Ok(Given::Present),
        Value::Required(_) => p
            .value()
            .map(Given::Value)
            .map_err(|_| usage_error(format!("--{} needs a value", flag.long))),
        Value::Optional(_) => {
            let next = match p.optional_value() {
                Some(v) => Some(v),
                None => p
                    .try_raw_args()
                    .and_then(|mut raw| raw.next_if(|a| !a.to_string_lossy().starts_with('-'))),
            };
            Ok(next.map_or(Given::Present, Given::Value))
        }
    }
}

fn take_positional(m: &mut Matches, v: OsString) -> Result<(), UsageError> {
    let def = m.def;
    if m.positionals.len() < def.positionals.len() {
        m.positionals.push(v);
        return Ok(());
    }
    Err(usage_error(match def.style {
        Style::Run => format!(
            "unexpected argument `{}`: the COMMAND goes after `--` (leaseagent [OPTIONS] -- COMMAND [ARG...])",
            v.to_string_lossy()
        ),
        Style::Sub => format!(
            "unexpected argument `{}`: usage is {}",
            v.to_string_lossy(),
            def.usage()
        ),
    }))
}

fn unknown(def: &CommandDef, flag: &str) -> UsageError {
    usage_error(format!(
        "unknown option {flag} (see {} --help)",
        def.program()
    ))
}

fn lexopt_error(def: &CommandDef, e: lexopt::Error) -> UsageError {
    match e {
        lexopt::Error::UnexpectedValue { option, value } => usage_error(format!(
            "{option} takes no value (given `{}`)",
            value.to_string_lossy()
        )),
        lexopt::Error::MissingValue { option: Some(o) } => {
            usage_error(format!("{o} needs a value"))
        }
        other => usage_error(format!("{other} (see {} --help)", def.program())),
    }
}

/// Absent or empty flags with an environment variable take its value when
/// it is set and not empty.
fn apply_env(m: &mut Matches, env: Env) {
    for (flag, given) in m.def.flags().zip(m.given.iter_mut()) {
        let Some(var) = flag.env else { continue };
        let empty = match given {
            None => true,
            Some(Given::Value(v)) => v.is_empty(),
            Some(Given::Present) => false,
        };
        if empty {
            if let Some(v) = env(var).filter(|v| !v.is_empty()) {
                *given = Some(Given::Value(v));
            }
        }
    }
}

fn check_required(m: &Matches) -> Result<(), UsageError> {
    let def = m.def;
    let mut missing: Vec<String> = def
        .flags()
        .zip(&m.given)
        .filter(|(f, g)| f.required && g.is_none())
        .map(|(f, _)| format!("--{}{}", f.long, def.value_text(f.value)))
        .collect();
    missing.extend(
        def.positionals[m.positionals.len().min(def.positionals.len())..]
            .iter()
            .filter(|p| !p.optional)
            .map(|p| format!("<{}>", p.name)),
    );
    match missing.len() {
        0 => Ok(()),
        1 => Err(usage_error(format!(
            "{} is required: usage is {}",
            missing[0],
            def.usage()
        ))),
        _ => Err(usage_error(format!(
            "{} are required: usage is {}",
            missing.join(" and "),
            def.usage()
        ))),
    }
}

impl Matches {
    fn index(&self, long: &str) -> Option<usize> {
        let i = self.def.flag(long);
        debug_assert!(
            i.is_some(),
            "--{long} is not in the table of {}",
            self.def.program()
        );
        i
    }

    fn raw(&self, long: &str) -> Option<Given> {
        let i = self.index(long)?;
        match (&self.given[i], self.def.flag_at(i)?.default) {
            (Some(g), _) => Some(g.clone()),
            (None, Default::Value(d)) => Some(Given::Value(d.into())),
            (None, _) => None,
        }
    }

    /// Whether the flag was given (a switch, or a flag with a value).
    pub fn switch(&self, long: &str) -> bool {
        self.index(long).is_some_and(|i| self.given[i].is_some())
    }

    /// The flag's value as typed (or its default / environment value).
    pub fn os(&self, long: &str) -> Option<OsString> {
        match self.raw(long)? {
            Given::Value(v) => Some(v),
            Given::Present => None,
        }
    }

    /// The flag's value as UTF-8 text.
    pub fn string(&self, long: &str) -> Result<Option<String>, UsageError> {
        self.os(long).map(|v| utf8(long, v)).transpose()
    }

    /// A required flag's or a defaulted flag's value through `f` (always
    /// there once parsed; absent reads as "required").
    pub fn get<T, E: Into<BoxError>>(
        &self,
        long: &str,
        f: impl Fn(&str) -> Result<T, E>,
    ) -> Result<T, UsageError> {
        self.parse(long, f)?
            .ok_or_else(|| usage_error(format!("--{long} is required")))
    }

    /// A required flag's value as typed, not necessarily UTF-8 (paths).
    pub fn get_os(&self, long: &str) -> Result<OsString, UsageError> {
        self.os(long)
            .ok_or_else(|| usage_error(format!("--{long} is required")))
    }

    /// The flag's value through `f`; an error is prefixed with the flag.
    pub fn parse<T, E: Into<BoxError>>(
        &self,
        long: &str,
        f: impl Fn(&str) -> Result<T, E>,
    ) -> Result<Option<T>, UsageError> {
        match self.string(long)? {
            Some(s) => f(&s).map(Some).map_err(|e| UsageError::Value {
                flag: long.to_string(),
                source: e.into(),
            }),
            None => Ok(None),
        }
    }

    /// An optional-value flag: `None` absent, `Some(None)` without a value.
    pub fn parse_optional<T, E: Into<BoxError>>(
        &self,
        long: &str,
        f: impl Fn(&str) -> Result<T, E>,
    ) -> Result<Option<Option<T>>, UsageError> {
        match self.raw(long) {
            None => Ok(None),
            Some(Given::Present) => Ok(Some(None)),
            Some(Given::Value(_)) => self.parse(long, f).map(Some),
        }
    }

    /// Positional `i` as UTF-8 text if it was given (an optional one).
    pub fn optional_positional_string(&self, i: usize) -> Result<Option<String>, UsageError> {
        if i < self.positionals.len() {
            self.positional_string(i).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Positional `i` (required ones are present once parsed).
    pub fn positional(&self, i: usize) -> OsString {
        self.positionals.get(i).cloned().unwrap_or_default()
    }

    /// Positional `i` as UTF-8 text, named in the error.
    pub fn positional_string(&self, i: usize) -> Result<String, UsageError> {
        let name = self.def.positionals.get(i).map_or("", |p| p.name);
        self.positional(i).into_string().map_err(|v| {
            usage_error(format!(
                "<{name}>: `{}` is not valid UTF-8",
                v.to_string_lossy()
            ))
        })
    }

    /// The run path's COMMAND.
    pub fn take_trailing(&mut self) -> Vec<OsString> {
        std::mem::take(&mut self.trailing)
    }
}

fn utf8(long: &str, v: OsString) -> Result<String, UsageError> {
    v.into_string().map_err(|v| {
        usage_error(format!(
            "--{long}: `{}` is not valid UTF-8",
            v.to_string_lossy()
        ))
    })
}

/// What a value parser passed to [`Matches::parse`] may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The value as text, for [`Matches::get`]: cannot fail.
pub fn text(s: &str) -> Result<String, std::convert::Infallible> {
    Ok(s.to_string())
}

/// A value that is not a whole number of the flag's type.
#[derive(Debug, thiserror::Error)]
#[error("`{value}` is not a whole number: {source}")]
pub struct NotANumber<E: std::error::Error + 'static> {
    pub value: String,
    #[source]
    pub source: E,
}

/// A whole number, for [`Matches::parse`].
pub fn number<T: std::str::FromStr>(s: &str) -> Result<T, NotANumber<T::Err>>
where
    T::Err: std::error::Error + 'static,
{
    s.parse::<T>().map_err(|source| NotANumber {
        value: s.to_string(),
        source,
    })
}

/// `--help` of `def`, exactly as printed (ends with a newline). `env`
/// supplies the current value of a flag's variable, which help shows.
pub fn help(def: &CommandDef, env: Env) -> String {
    let mut out = format!("{}\n\nUsage: {}\n", def.about, def.usage());
    if !def.positionals.is_empty() {
        out.push_str("\nArguments:\n");
        let rows: Vec<(String, String)> = def
            .positionals
            .iter()
            .map(|p| {
                let name = if p.optional {
                    format!("  [{}]", p.name)
                } else {
                    format!("  <{}>", p.name)
                };
                (name, p.help.to_string())
            })
            .collect();
        let col = rows.iter().map(|(s, _)| s.len()).max().unwrap_or(0) + 2;
        out.push_str(&table(&rows, col, true));
    }
    let last = def.groups.len().saturating_sub(1);
    for (i, group) in def.groups.iter().enumerate() {
        out.push_str(&format!("\n{}:\n", group.heading.unwrap_or("Options")));
        // -h and -V close "Options:" (as clap had them) in subcommands, and
        // the whole list on the run path.
        let builtin = match def.style {
            Style::Sub => i == 0,
            Style::Run => i == last,
        };
        let extra: &[&Flag] = if builtin { &[&HELP, &VERSION] } else { &[] };
        let flags: Vec<&Flag> = group.flags.iter().chain(extra.iter().copied()).collect();
        out.push_str(&flag_rows(def, &flags, env));
    }
    if let Some(notes) = def.notes {
        out.push_str(&format!("\n{notes}\n"));
    }
    out.push_str(&format!("\n{}\n", def.examples));
    out
}

/// The rows of one group of flags.
fn flag_rows(def: &CommandDef, flags: &[&Flag], env: Env) -> String {
    let specs: Vec<String> = flags
        .iter()
        .map(|f| {
            let short = f.short.map_or("    ".to_string(), |c| format!("-{c}, "));
            format!("  {short}--{}{}", f.long, def.value_text(f.value))
        })
        .collect();
    let col = match def.style {
        Style::Sub => specs.iter().map(String::len).max().unwrap_or(0) + 2,
        Style::Run => RUN_COLUMN,
    };
    let rows: Vec<(String, String)> = specs
        .into_iter()
        .zip(flags)
        .map(|(spec, f)| (spec, flag_help(def.style, f, col, env)))
        .collect();
    table(&rows, col, def.style == Style::Sub)
}

/// Where the run path's flag help starts; a longer flag puts its help on
/// the next line.
const RUN_COLUMN: usize = 25;

/// A flag's help text with its default and environment notes.
/// `col` is the help column (where the run path's note must fit).
fn flag_help(style: Style, f: &Flag, col: usize, env: Env) -> String {
    let default = match f.default {
        Default::Value(d) | Default::Note(d) => Some(d),
        Default::None => None,
    };
    match style {
        Style::Sub => {
            let mut h = f.help.to_string();
            if let Some(d) = default {
                h.push_str(&format!(" [default: {d}]"));
            }
            if let Some(var) = f.env {
                let now = env(var).unwrap_or_default();
                // A URL's `user:password@` is never shown.
                let now = crate::authority::trust::redact_url(&now.to_string_lossy());
                h.push_str(&format!(" [env: {var}={now}]"));
            }
            h
        }
        Style::Run => {
            let notes: Vec<String> = f
                .env
                .map(|v| format!("env: {v}"))
                .into_iter()
                .chain(default.map(|d| format!("default: {d}")))
                .collect();
            if notes.is_empty() {
                return f.help.to_string();
            }
            let note = format!("[{}]", notes.join("; "));
            let fits = col + f.help.len() + 1 + note.len() <= HELP_WIDTH;
            if f.help.contains('\n') || fits {
                format!("{} {note}", f.help)
            } else {
                format!("{}\n{note}", f.help)
            }
        }
    }
}

/// Two columns, the help starting at column `col`; a spec that leaves no
/// space before it is a line of its own. `wrap`: word-wrap the help at
/// [`HELP_WIDTH`]; otherwise break only at the text's own newlines.
fn table(rows: &[(String, String)], col: usize, wrap: bool) -> String {
    let mut out = String::new();
    for (spec, help) in rows {
        if spec.len() >= col {
            out.push_str(spec);
            out.push('\n');
        }
        let spec = if spec.len() >= col { "" } else { spec.as_str() };
        let lines = if wrap {
            wrap_words(help, HELP_WIDTH.saturating_sub(col))
        } else {
            help.lines().map(str::to_string).collect()
        };
        for (i, line) in lines.iter().enumerate() {
            let lead = if i == 0 { spec } else { "" };
            out.push_str(&format!("{lead:<col$}{line}\n"));
        }
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

    static T: CommandDef = CommandDef {
        name: "t",
        about: "A test command",
        usage: None,
        groups: &[
            Group {
                heading: None,
                flags: &[
                    Flag::value("listen", "ADDR", "Address").required(),
                    Flag::value("ttl", "DUR", "Time").default_value("30s"),
                    Flag::value("authority", "URL", "Authority").env("T_AUTHORITY"),
                    Flag::switch("quiet", "Quiet").short('q'),
                ],
            },
            Group {
                heading: Some("Output"),
                flags: &[Flag::switch("json", "JSON")],
            },
        ],
        positionals: &[Positional {
            name: "TASK",
            help: "The task",
            optional: false,
        }],
        notes: None,
        examples: "Examples:\n  leaseagent t",
        style: Style::Sub,
    };

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    fn parse_t(args: &[&str]) -> Result<Matches, UsageError> {
        parse_env_t(args, &no_env)
    }

    fn parse_env_t(args: &[&str], env: Env) -> Result<Matches, UsageError> {
        match parse(&T, &os(args), env)? {
            Parsed::Args(m) => Ok(m),
            other => panic!("not arguments: {other:?}"),
        }
    }

    /// The message of a usage error, as printed.
    fn msg(r: Result<Matches, UsageError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn values_switches_and_defaults() {
        let m = parse_t(&["--listen", "a:1", "-q", "x"]).unwrap();
        assert_eq!(m.string("listen").unwrap().as_deref(), Some("a:1"));
        assert_eq!(m.string("ttl").unwrap().as_deref(), Some("30s"));
        assert!(m.switch("quiet"));
        assert!(!m.switch("json"));
        assert_eq!(m.positional_string(0).unwrap(), "x");
        let m = parse_t(&["--listen=a:2", "--ttl=5s", "--json", "x"]).unwrap();
        assert_eq!(m.string("listen").unwrap().as_deref(), Some("a:2"));
        let ttl = m.parse("ttl", crate::time::duration::parse).unwrap();
        assert_eq!(ttl, Some(std::time::Duration::from_secs(5)));
        assert!(m.switch("json"));
    }

    #[test]
    fn dashdash_makes_the_rest_positional() {
        let m = parse_t(&["--listen", "a", "--", "--json"]).unwrap();
        assert_eq!(m.positional_string(0).unwrap(), "--json");
        assert!(!m.switch("json"));
    }

    #[test]
    fn errors_name_the_flag() {
        let e = msg(parse_t(&["--listen", "a", "--bogus", "x"]));
        assert_eq!(e, "unknown option --bogus (see leaseagent t --help)");
        let e = msg(parse_t(&["-x", "--listen", "a", "x"]));
        assert_eq!(e, "unknown option -x (see leaseagent t --help)");
        let e = msg(parse_t(&["x", "--listen"]));
        assert_eq!(e, "--listen needs a value");
        let e = msg(parse_t(&["--listen", "a"]));
        assert_eq!(
            e,
            "<TASK> is required: usage is leaseagent t [OPTIONS] --listen <ADDR> <TASK>"
        );
        let e = msg(parse_t(&[]));
        assert!(
            e.starts_with("--listen <ADDR> and <TASK> are required"),
            "{e}"
        );
        let e = msg(parse_t(&["--listen", "a", "x", "y"]));
        assert!(e.starts_with("unexpected argument `y`: usage is"), "{e}");
        let e = msg(parse_t(&["--listen", "a", "--json=1", "x"]));
        assert_eq!(e, "--json takes no value (given `1`)");
        let e = msg(parse_t(&["--listen", "a", "--listen", "b", "x"]));
        assert_eq!(e, "--listen given more than once (see leaseagent t --help)");
        let m = parse_t(&["--listen", "a", "--ttl", "5x", "x"]).unwrap();
        let e = m.parse("ttl", crate::time::duration::parse).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--ttl: `5x` has an unknown unit `x`: use ms, s, m or h"
        );
        assert!(matches!(e, UsageError::Value { .. }));
        let m = parse_t(&["--listen", "a", "--ttl", "q", "x"]).unwrap();
        let e = m.parse::<u64, _>("ttl", number).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--ttl: `q` is not a whole number: invalid digit found in string"
        );
    }

    #[test]
    fn help_and_version_win_over_later_errors_and_missing_arguments() {
        assert!(matches!(
            parse(&T, &os(&["-h", "--bogus"]), &no_env),
            Ok(Parsed::Help)
        ));
        assert!(matches!(
            parse(&T, &os(&["--version"]), &no_env),
            Ok(Parsed::Version)
        ));
        assert!(matches!(
            parse(&T, &os(&["-qh"]), &no_env),
            Ok(Parsed::Help)
        ));
        assert!(parse(&T, &os(&["--bogus", "-h"]), &no_env).is_err());
    }

    #[test]
    fn environment_fills_absent_or_empty_flags() {
        let env = |v: &str| (v == "T_AUTHORITY").then(|| OsString::from("http://e:1"));
        let m = parse_env_t(&["--listen", "a", "x"], &env).unwrap();
        assert_eq!(
            m.string("authority").unwrap().as_deref(),
            Some("http://e:1")
        );
        let m = parse_env_t(&["--listen", "a", "--authority", "", "x"], &env).unwrap();
        assert_eq!(
            m.string("authority").unwrap().as_deref(),
            Some("http://e:1")
        );
        let m = parse_env_t(&["--listen", "a", "--authority", "http://f:1", "x"], &env).unwrap();
        assert_eq!(
            m.string("authority").unwrap().as_deref(),
            Some("http://f:1")
        );
        // An empty variable counts as unset.
        let empty = |_: &str| Some(OsString::new());
        let m = parse_env_t(&["--listen", "a", "x"], &empty).unwrap();
        assert_eq!(m.string("authority").unwrap(), None);
    }

    #[test]
    fn help_is_rendered_from_the_table() {
        let h = help(&T, &no_env);
        assert!(h.starts_with("A test command\n\nUsage: leaseagent t [OPTIONS] --listen <ADDR> <TASK>\n\nArguments:\n  <TASK>  The task\n\nOptions:\n"), "{h}");
        assert!(
            h.contains("\n      --ttl <DUR>        Time [default: 30s]\n"),
            "{h}"
        );
        assert!(h.contains("\n  -q, --quiet            Quiet\n"), "{h}");
        assert!(h.contains("Authority [env: T_AUTHORITY=]\n"), "{h}");
        assert!(
            h.ends_with("  -V, --version          Print version\n\nOutput:\n      --json  JSON\n\nExamples:\n  leaseagent t\n"),
            "{h}"
        );
    }

    static R: CommandDef = CommandDef {
        name: "",
        about: "Run",
        usage: Some("leaseagent [OPTIONS] -- COMMAND"),
        groups: &[
            Group {
                heading: None,
                flags: &[Flag::value("task", "NAME", "The task").env("T_TASK")],
            },
            Group {
                heading: Some("Trust"),
                flags: &[Flag::value("auth-token-file", "FILE", "Token file").default_note("none")],
            },
        ],
        positionals: &[],
        notes: None,
        examples: "Examples:",
        style: Style::Run,
    };

    #[test]
    fn run_style_help_has_a_fixed_column_and_help_version_last() {
        let h = help(&R, &no_env);
        assert_eq!(
            h,
            "Run\n\nUsage: leaseagent [OPTIONS] -- COMMAND\n\nOptions:\n      \
             --task NAME        The task [env: T_TASK]\n\nTrust:\n      --auth-token-file FILE\n                         \
             Token file [default: none]\n  -h, --help             Print help\n  -V, --version          \
             Print version\n\nExamples:\n"
        );
    }

    #[test]
    fn run_style_takes_the_command_after_the_first_dashdash() {
        let Ok(Parsed::Args(mut m)) =
            parse(&R, &os(&["--task", "t", "--", "a", "--", "-b"]), &no_env)
        else {
            panic!("no args")
        };
        assert_eq!(m.take_trailing(), os(&["a", "--", "-b"]));
        // The last of a repeated flag wins on the run path.
        let Ok(Parsed::Args(m)) = parse(&R, &os(&["--task", "a", "--task", "b", "--"]), &no_env)
        else {
            panic!("no args")
        };
        assert_eq!(m.string("task").unwrap().as_deref(), Some("b"));
        let e = parse(&R, &os(&["--task", "t", "x"]), &no_env)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("unexpected argument `x`: the COMMAND goes after `--`"),
            "{e}"
        );
        let e = parse(&R, &os(&["--task", "t"]), &no_env).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no COMMAND given: usage is leaseagent [OPTIONS] -- COMMAND"
        );
    }

    #[test]
    fn words_wrap_within_the_width() {
        assert_eq!(wrap_words("aa bb cc", 5), vec!["aa bb", "cc"]);
        assert_eq!(wrap_words("aaaaaaa b", 5), vec!["aaaaaaa", "b"]);
        assert_eq!(wrap_words("a", 5), vec!["a"]);
    }
}
