//! The flag tables' types: what one entry says, and what reads it.
//!
//! Every command (the run path and each subcommand) is one [`CommandDef`]
//! in [`super::defs`]. Each of its flags and positionals is one entry that
//! carries, side by side (ripgrep's `Flag` trait, as a table):
//!
//! - what `--help`, the man page and the completions show of it ([`Spec`]:
//!   names, help text, the man page's longer text, default, environment
//!   variable, completion kind);
//! - its typed **reader** ([`Read`]): the function that puts its value into
//!   the command's typed arguments (`RawRun`, `ServeArgs`, ...). Values are
//!   never looked up again by the flag's name, so a flag without a reader
//!   cannot be written, and a misspelt field is a compile error.
//!
//! Three stages, as in ripgrep (`lowargs.rs`, `hiargs.rs`):
//!
//! 1. [`super::parse`]: argv against the table (lexopt), the environment
//!    and defaults applied, every entry's reader called in table order:
//!    the command's typed arguments, or [`Parsed::Help`] / [`Parsed::Version`].
//! 2. The command's `finish` ([`CommandDef::finish`], next to its table in
//!    `defs.rs`): the rules between flags, the one place for them (the run
//!    path's are in `RawRun::validate`, which its `finish` calls), then the
//!    [`Command`] for `main`.
//! 3. [`super::help`] and [`super::generate`] render `--help`, the man pages
//!    and the completions from the same entries ([`Doc`]).
//!
//! How to add a flag: `defs.rs` and `docs/design.md` ("Adding a flag").
//!
//! Inside `cmd/`, imports go one way: `flags` ← `help` ← `parse` (which
//! implements [`Entry`] for every table), and `flags` ← `generate` ← `defs`
//! ← `mod`; `check`, `publish` and `operator` (whose argument types
//! [`Command`] carries) import none of them.

use std::ffi::OsString;
use std::io::Write;
use std::marker::PhantomData;

/// What `main` is asked to do: what a command's `finish` makes.
pub enum Command {
    Run(crate::agent::config::RunConfig),
    Serve(crate::serve::ServeArgs),
    Publish(crate::cmd::publish::PublishArgs),
    Check(crate::cmd::check::CheckArgs),
    Leases(crate::cmd::operator::LeasesArgs),
    Revoke(crate::cmd::operator::RevokeArgs),
    Clear(crate::cmd::operator::ClearArgs),
    History(crate::cmd::operator::HistoryArgs),
    /// `leaseagent token new`: a bearer token for `serve --auth-file`.
    TokenNew,
    /// Internal: the process-group keeper between the agent and the job.
    Keeper(Vec<OsString>),
    /// Help or version was printed, or usage was wrong: exit with this status.
    Exit(u8),
}

/// Help, version, man pages and completions go to stdout; a closed stdout
/// is not worth a panic.
pub fn print(s: &str) -> Command {
    let _ = std::io::stdout().lock().write_all(s.as_bytes());
    Command::Exit(0)
}

/// What a reader may fail with; the parser prefixes the flag's name.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
    /// Read as if typed when the flag is absent, and shown.
    Value(&'static str),
    /// Shown only; the command computes the default itself.
    Note(&'static str),
}

/// What a shell offers for a value (a flag's or a positional's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Complete {
    /// Nothing: the user types it (a duration, a number, an address...).
    Nothing,
    /// File and directory names.
    Files,
    /// One of these words.
    Words(&'static [&'static str]),
    /// The name of a subcommand (from the tables themselves).
    Subcommands,
}

/// What help, the man page and the completions show of one flag.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Without the leading `--`.
    pub long: &'static str,
    pub short: Option<char>,
    pub value: Value,
    /// The `--help` text; `\n` breaks a line where the author wants it.
    pub help: &'static str,
    /// The man page's text, when it says more than `help`.
    pub doc: Option<&'static str>,
    pub default: Default,
    /// Environment variable read when the flag is absent or empty.
    pub env: Option<&'static str>,
    /// Usage error when absent (after the environment fallback); listed in
    /// the usage line.
    pub required: bool,
    /// What a shell offers for the value.
    pub complete: Complete,
    /// May be given more than once on a subcommand: the reader is called
    /// for each value, in order.
    pub repeatable: bool,
    /// A URL: one typed on the command line with a `user:password@` part
    /// is refused (argv is visible to every local user in `ps`).
    pub url: bool,
}

impl Spec {
    /// The man page's text: [`Spec::doc`], else the help text.
    pub fn long_doc(&self) -> &'static str {
        self.doc.unwrap_or(self.help)
    }
}

/// How a flag's value reaches the command's typed arguments `A`. The
/// variant matches [`Spec::value`] by construction ([`Draft`]).
pub enum Read<A> {
    /// A switch that was given.
    Switch(fn(&mut A)),
    /// The value as typed (or from the environment or the default); an
    /// error is a usage error prefixed with `--flag: `.
    Value(fn(&mut A, OsString) -> Result<(), BoxError>),
    /// `--flag [VALUE]` that was given: `None` without its value.
    Optional(fn(&mut A, Option<OsString>) -> Result<(), BoxError>),
}

impl<A> Clone for Read<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Read<A> {}

/// One flag of one command: what is shown, and its reader.
pub struct Flag<A> {
    pub spec: Spec,
    pub read: Read<A>,
}

impl<A> Clone for Flag<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Flag<A> {}

/// The kinds of [`Draft`]: which reader ends it.
pub mod kind {
    /// `--flag`: ended by `.sets(|a| ..)`.
    pub struct Switch;
    /// `--flag VALUE`: ended by `.reads(|a, v| ..)`.
    pub struct Required;
    /// `--flag [VALUE]`: ended by `.reads(|a, v: Option<_>| ..)`.
    pub struct Optional;
}

/// A flag being written: what is shown, built up with `.short('q')`,
/// `.env(..)`, ...; its reader ends it and makes it a [`Flag`]. The kind
/// decides which reader fits, so a switch cannot be given a value reader.
pub struct Draft<K> {
    spec: Spec,
    kind: PhantomData<K>,
}

impl Flag<()> {
    /// `--long`, present or not.
    pub const fn switch(long: &'static str, help: &'static str) -> Draft<kind::Switch> {
        Draft {
            spec: Spec {
                long,
                short: None,
                value: Value::None,
                help,
                doc: None,
                default: Default::None,
                env: None,
                required: false,
                repeatable: false,
                url: false,
                complete: Complete::Nothing,
            },
            kind: PhantomData,
        }
    }

    /// `--long VALUE`.
    pub const fn value(
        long: &'static str,
        name: &'static str,
        help: &'static str,
    ) -> Draft<kind::Required> {
        let mut spec = Flag::switch(long, help).spec;
        spec.value = Value::Required(name);
        Draft {
            spec,
            kind: PhantomData,
        }
    }

    /// `--long [VALUE]`: `--long=VALUE`, or the next word when it does not
    /// start with `-`.
    pub const fn optional(
        long: &'static str,
        name: &'static str,
        help: &'static str,
    ) -> Draft<kind::Optional> {
        let mut spec = Flag::switch(long, help).spec;
        spec.value = Value::Optional(name);
        Draft {
            spec,
            kind: PhantomData,
        }
    }
}

impl<K> Draft<K> {
    pub const fn short(mut self, c: char) -> Self {
        self.spec.short = Some(c);
        self
    }

    /// Read `var` when the flag is absent or empty.
    pub const fn env(mut self, var: &'static str) -> Self {
        self.spec.env = Some(var);
        self
    }

    /// Read `v` when the flag is absent (after the environment); shown.
    pub const fn default_value(mut self, v: &'static str) -> Self {
        self.spec.default = Default::Value(v);
        self
    }

    /// Shown as the default; the command computes it.
    pub const fn default_note(mut self, n: &'static str) -> Self {
        self.spec.default = Default::Note(n);
        self
    }

    /// A URL: a password in it is refused on the command line.
    pub const fn url(mut self) -> Self {
        self.spec.url = true;
        self
    }

    /// May be given more than once: its reader sees each value in order.
    pub const fn repeatable(mut self) -> Self {
        self.spec.repeatable = true;
        self
    }

    /// A usage error when absent.
    pub const fn required(mut self) -> Self {
        self.spec.required = true;
        self
    }

    /// What a shell offers for the value ([`Complete::Nothing`] unless said).
    pub const fn complete(mut self, c: Complete) -> Self {
        self.spec.complete = c;
        self
    }

    /// The man page's text, when it says more than the help text.
    pub const fn doc(mut self, text: &'static str) -> Self {
        self.spec.doc = Some(text);
        self
    }
}

impl Draft<kind::Switch> {
    /// The switch's reader: called when the flag is given.
    pub const fn sets<A>(self, f: fn(&mut A)) -> Flag<A> {
        Flag {
            spec: self.spec,
            read: Read::Switch(f),
        }
    }
}

impl Draft<kind::Required> {
    /// The value's reader.
    pub const fn reads<A>(self, f: fn(&mut A, OsString) -> Result<(), BoxError>) -> Flag<A> {
        Flag {
            spec: self.spec,
            read: Read::Value(f),
        }
    }
}

impl Draft<kind::Optional> {
    /// The reader: `None` when the flag came without its value.
    pub const fn reads<A>(
        self,
        f: fn(&mut A, Option<OsString>) -> Result<(), BoxError>,
    ) -> Flag<A> {
        Flag {
            spec: self.spec,
            read: Read::Optional(f),
        }
    }
}

/// What help, the man page and the completions show of a positional.
#[derive(Clone, Copy, Debug)]
pub struct PositionalSpec {
    pub name: &'static str,
    pub help: &'static str,
    /// Optional ones come last.
    pub optional: bool,
    pub complete: Complete,
}

/// A positional argument and its reader (called when it was given).
pub struct Positional<A> {
    pub spec: PositionalSpec,
    pub read: fn(&mut A, OsString) -> Result<(), BoxError>,
}

impl Positional<()> {
    /// A required positional, shown as `<NAME>`.
    pub const fn required(name: &'static str, help: &'static str) -> PositionalDraft {
        PositionalDraft(PositionalSpec {
            name,
            help,
            optional: false,
            complete: Complete::Nothing,
        })
    }

    /// An optional positional, shown as `[NAME]`.
    pub const fn optional(name: &'static str, help: &'static str) -> PositionalDraft {
        let mut d = Positional::required(name, help);
        d.0.optional = true;
        d
    }
}

/// A positional being written; its reader ends it.
pub struct PositionalDraft(PositionalSpec);

impl PositionalDraft {
    pub const fn complete(mut self, c: Complete) -> Self {
        self.0.complete = c;
        self
    }

    pub const fn reads<A>(self, f: fn(&mut A, OsString) -> Result<(), BoxError>) -> Positional<A> {
        Positional {
            spec: self.0,
            read: f,
        }
    }
}

/// Flags listed together in help; the first group of a command has no
/// heading (it is "Options:"), later ones may have one (say, "Trust").
pub struct Group<A: 'static> {
    /// Shown as `HEADING:` above the group.
    pub heading: Option<&'static str>,
    pub flags: &'static [Flag<A>],
}

/// How argv is read (help is the same for both).
pub enum Syntax<A> {
    /// `leaseagent [OPTIONS] -- COMMAND [ARG...]`: everything after the
    /// first `--` is the COMMAND (required, given to the reader), nothing
    /// positional comes before it, and a flag given twice keeps its last
    /// value.
    Run(fn(&mut A, Vec<OsString>)),
    /// `leaseagent SUBCOMMAND ...`: `--` ends the flags, a flag given twice
    /// is an error.
    Sub,
}

/// One command: everything its parser, its help, its man page and its
/// completions are made from, and its rules.
pub struct CommandDef<A: 'static> {
    /// The subcommand's name; empty for the run path.
    pub name: &'static str,
    /// First paragraph of the help.
    pub about: &'static str,
    /// The usage line after `Usage: `; generated when `None`.
    pub usage: Option<&'static str>,
    pub groups: &'static [Group<A>],
    pub positionals: &'static [Positional<A>],
    pub syntax: Syntax<A>,
    /// Text after the options.
    pub notes: Option<&'static str>,
    /// The help's last paragraph.
    pub examples: &'static str,
    /// The typed arguments, read from every entry, checked against each
    /// other (the command's one place for rules between flags) and made
    /// the [`Command`] to run.
    pub finish: fn(A) -> Result<Command, UsageError>,
}

/// The built-in flags, handled by the parser itself and listed last.
pub const HELP: Spec = Flag::switch("help", "Print help").short('h').spec;
pub const VERSION: Spec = Flag::switch("version", "Print version").short('V').spec;

/// `leaseagent` or `leaseagent NAME`: prefix of messages and versions.
pub fn program(name: &str) -> String {
    if name.is_empty() {
        "leaseagent".to_string()
    } else {
        format!("leaseagent {name}")
    }
}

impl<A> CommandDef<A> {
    pub fn program(&self) -> String {
        program(self.name)
    }

    /// Every flag of every group, in table order (the order readers run in).
    pub fn flags(&self) -> impl Iterator<Item = &'static Flag<A>> + use<A> {
        self.groups.iter().flat_map(|g| g.flags.iter())
    }

    /// The usage line (without `Usage: `).
    pub fn usage(&self) -> String {
        usage(
            self.name,
            self.usage,
            self.flags().map(|f| &f.spec),
            self.positionals.iter().map(|p| &p.spec),
        )
    }

    /// What help, the man page and the completions read.
    pub fn doc(&self) -> Doc<'_> {
        Doc {
            name: self.name,
            about: self.about,
            usage: self.usage(),
            positionals: self.positionals.iter().map(|p| &p.spec).collect(),
            groups: self
                .groups
                .iter()
                .map(|g| (g.heading, g.flags.iter().map(|f| &f.spec).collect()))
                .collect(),
            notes: self.notes,
            examples: self.examples,
        }
    }
}

/// `VALUE` after a flag, as help and the usage line show it.
pub fn value_text(v: Value) -> String {
    match v {
        Value::None => String::new(),
        Value::Required(n) => format!(" {n}"),
        Value::Optional(n) => format!(" [{n}]"),
    }
}

/// `<NAME>` or `[NAME]`.
pub fn positional_text(p: &PositionalSpec) -> String {
    if p.optional {
        format!("[{}]", p.name)
    } else {
        format!("<{}>", p.name)
    }
}

fn usage<'a>(
    name: &str,
    fixed: Option<&str>,
    flags: impl Iterator<Item = &'a Spec>,
    positionals: impl Iterator<Item = &'a PositionalSpec>,
) -> String {
    if let Some(u) = fixed {
        return u.to_string();
    }
    let mut u = format!("{} [OPTIONS]", program(name));
    for f in flags.filter(|f| f.required) {
        u.push_str(&format!(" --{}{}", f.long, value_text(f.value)));
    }
    for p in positionals {
        u.push(' ');
        u.push_str(&positional_text(p));
    }
    u
}

/// A command's table without its readers: what help, the man page and
/// the completions are rendered from, whatever the command's argument type.
pub struct Doc<'a> {
    pub name: &'static str,
    pub about: &'static str,
    pub usage: String,
    pub positionals: Vec<&'a PositionalSpec>,
    /// Heading and flags of each group.
    pub groups: Vec<(Option<&'static str>, Vec<&'a Spec>)>,
    pub notes: Option<&'static str>,
    pub examples: &'static str,
}

impl Doc<'_> {
    pub fn program(&self) -> String {
        program(self.name)
    }

    /// Every flag, `-h` and `-V` last, as help lists them.
    pub fn all_flags(&self) -> Vec<&Spec> {
        self.groups
            .iter()
            .flat_map(|(_, flags)| flags.iter().copied())
            .chain([&HELP, &VERSION])
            .collect()
    }
}

/// A command as the dispatcher and the generators see it, whatever its
/// argument type (`CommandDef<A>` for every `A`).
pub trait Entry: Sync {
    fn name(&self) -> &'static str;
    fn doc(&self) -> Doc<'_>;
    /// Parses `args` (argv after the program and subcommand name), prints
    /// help or the version, or makes the [`Command`].
    fn command(&self, args: &[OsString], env: Env) -> Result<Command, UsageError>;
    /// Test: every entry's reader puts its value into the typed arguments.
    #[cfg(test)]
    fn check_readers(&self);
}

/// The low stage's answer.
#[derive(Debug)]
pub enum Parsed<A> {
    Help,
    Version,
    Args(A),
}

/// Reads a flag's environment variable: the one place the command line
/// looks at the environment.
pub fn env_value(var: &str) -> Option<OsString> {
    std::env::var_os(var)
}

/// The environment as the parser sees it: [`env_value`], or a stand-in in
/// tests (which must not change the process environment).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// Wrong usage: the message names the flag (or argument) at fault.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// What was typed does not fit the command's table (unknown or repeated
    /// flag, missing value or argument, stray argument) or its rules
    /// between flags. Kept as the finished message: each is built once,
    /// where the fault is found, from the table's own names, and nothing
    /// but the reader ever looks at it, so variants would only restate the
    /// text.
    #[error("{0}")]
    Words(String),
    /// A flag's reader refused its value (a duration, a number, ...).
    #[error("--{flag}: {source}")]
    Value {
        flag: &'static str,
        #[source]
        source: BoxError,
    },
    /// A positional's reader refused it.
    #[error("<{name}>: {source}")]
    Argument {
        name: &'static str,
        #[source]
        source: BoxError,
    },
    /// The run path's flags were read but do not make a valid run.
    #[error(transparent)]
    Run(#[from] crate::agent::config::ConfigError),
}

pub fn usage_error(msg: impl Into<String>) -> UsageError {
    UsageError::Words(msg.into())
}

// What readers convert values with. Each error says what is wrong with the
// value; the parser names the flag.

/// A value that is not UTF-8 where text is needed.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not valid UTF-8")]
pub struct NotUtf8(String);

/// The value as UTF-8 text.
pub fn text(v: OsString) -> Result<String, NotUtf8> {
    v.into_string()
        .map_err(|v| NotUtf8(v.to_string_lossy().into_owned()))
}

/// A duration in the `DUR` grammar (`250ms`, `2s`, `5m`, `1h`).
pub fn dur(v: OsString) -> Result<std::time::Duration, BoxError> {
    Ok(crate::time::duration::parse(&text(v)?)?)
}

/// A value that is not a whole number of the flag's type.
#[derive(Debug, thiserror::Error)]
#[error("`{value}` is not a whole number: {source}")]
pub struct NotANumber<E: std::error::Error + 'static> {
    pub value: String,
    #[source]
    pub source: E,
}

/// A whole number.
pub fn number<T: std::str::FromStr>(v: OsString) -> Result<T, BoxError>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let s = text(v)?;
    s.parse::<T>().map_err(|source| {
        NotANumber {
            value: s.clone(),
            source,
        }
        .into()
    })
}
