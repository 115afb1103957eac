//! The low stage: argv read against one command's table (lexopt, no clap:
//! the agent's resident memory runs next to every job), then every entry's
//! reader called, in table order, into the command's typed arguments.
//!
//! No I/O but the environment variables the table names. Unknown flags,
//! missing values, stray or missing positionals and missing required flags
//! are a [`UsageError`] that names the flag; so is a value its reader
//! refuses (`--ttl: ...`).
//!
//! ## Rules (the same for every command)
//!
//! - `--flag VALUE` and `--flag=VALUE`; short switches may be grouped (`-qh`).
//! - `-h`/`--help` and `-V`/`--version` exist everywhere and win over any
//!   error that comes later on the line, and over every value a reader
//!   would refuse: values are read only once the whole line was taken in.
//! - A flag with `.env(VAR)` that is absent or given an empty value takes
//!   `VAR` when it is set and not empty ([`super::flags::env_value`]).
//! - A flag with `.default_value(V)` still absent is read as if `V` were
//!   typed. A flag that is not given is not read: its field keeps the
//!   typed arguments' `Default`.
//! - Subcommands: `--` ends the flags (what follows is positional); a flag
//!   given twice is an error unless it is `.repeatable()` (its reader is
//!   then called for each value, in order). The run path ([`Syntax::Run`]): everything
//!   after the first `--` is the COMMAND (required), nothing positional may
//!   come before it, and a flag given twice keeps its last value.
//! - An optional value (`--wait [DUR]`) is `--wait=DUR`, or the next word
//!   when it does not start with `-`.

use std::ffi::OsString;

use super::flags::{
    Command, CommandDef, Doc, Entry, Env, Flag, Parsed, Read, Syntax, UsageError, Value, print,
    usage_error,
};

/// Every table entry is a command: parsed here, its help rendered by
/// [`super::help`], its `finish` called.
impl<A: Default + std::fmt::Debug> Entry for CommandDef<A> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn doc(&self) -> Doc<'_> {
        CommandDef::doc(self)
    }

    fn command(&self, args: &[OsString], env: Env) -> Result<Command, UsageError> {
        match parse(self, args, env)? {
            Parsed::Help => Ok(print(&super::help::help(&self.doc(), env))),
            Parsed::Version => Ok(print(&format!(
                "{} {}\n",
                self.program(),
                env!("CARGO_PKG_VERSION")
            ))),
            Parsed::Args(a) => (self.finish)(a),
        }
    }

    #[cfg(test)]
    fn check_readers(&self) {
        check_readers(self);
    }
}

/// How a flag was given.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Given {
    /// A switch, or an optional-value flag without its value.
    Present,
    Value(OsString),
}

/// What was typed for one command, before the readers run.
struct Typed<'d, A: 'static> {
    def: &'d CommandDef<A>,
    /// Indexed like [`CommandDef::flags`].
    given: Vec<Option<Given>>,
    /// The second and later values of repeatable flags: (flag index, value).
    more: Vec<(usize, Given)>,
    positionals: Vec<OsString>,
}

/// Parses `args` (argv after the program and subcommand name) for `def`
/// into its typed arguments.
pub fn parse<A: Default>(
    def: &CommandDef<A>,
    args: &[OsString],
    env: Env,
) -> Result<Parsed<A>, UsageError> {
    let (opts, trailing) = split_trailing(def, args);
    let mut t = Typed {
        def,
        given: vec![None; def.flags().count()],
        more: Vec::new(),
        positionals: Vec::new(),
    };
    if let Some(special) = take_args(&mut t, opts)? {
        return Ok(special);
    }
    refuse_passwords_in_argv(&t)?;
    apply_env(&mut t, env);
    if let Syntax::Run(_) = def.syntax
        && trailing.is_none()
    {
        return Err(usage_error(format!(
            "no COMMAND given: usage is {}",
            def.usage().lines().next().unwrap_or_default()
        )));
    }
    check_required(&t)?;
    read(t, trailing).map(Parsed::Args)
}

/// The run path: the COMMAND is everything after the first `--`.
fn split_trailing<'a, A>(
    def: &CommandDef<A>,
    args: &'a [OsString],
) -> (&'a [OsString], Option<Vec<OsString>>) {
    if let Syntax::Sub = def.syntax {
        return (args, None);
    }
    match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], Some(args[i + 1..].to_vec())),
        None => (args, None),
    }
}

/// The lexopt loop: flags and positionals in order; help and version stop it.
fn take_args<A>(t: &mut Typed<A>, opts: &[OsString]) -> Result<Option<Parsed<A>>, UsageError> {
    let def = t.def;
    let mut p = lexopt::Parser::from_args(opts.iter().cloned());
    while let Some(arg) = p.next().map_err(|e| lexopt_error(def, e))? {
        let idx = match arg {
            lexopt::Arg::Short('h') | lexopt::Arg::Long("help") => return Ok(Some(Parsed::Help)),
            lexopt::Arg::Short('V') | lexopt::Arg::Long("version") => {
                return Ok(Some(Parsed::Version));
            }
            lexopt::Arg::Long(name) => def
                .flags()
                .position(|f| f.spec.long == name)
                .ok_or_else(|| unknown(def, &format!("--{name}")))?,
            lexopt::Arg::Short(c) => def
                .flags()
                .position(|f| f.spec.short == Some(c))
                .ok_or_else(|| unknown(def, &format!("-{c}")))?,
            lexopt::Arg::Value(v) => {
                take_positional(t, v)?;
                continue;
            }
        };
        let Some(flag) = def.flags().nth(idx) else {
            continue;
        };
        let given = take_value(&mut p, flag)?;
        if t.given[idx].is_some() && flag.spec.repeatable {
            t.more.push((idx, given));
            continue;
        }
        if t.given[idx].is_some() && matches!(def.syntax, Syntax::Sub) {
            return Err(usage_error(format!(
                "--{} given more than once (see {} --help)",
                flag.spec.long,
                def.program()
            )));
        }
        t.given[idx] = Some(given);
    }
    Ok(None)
}

fn take_value<A>(p: &mut lexopt::Parser, flag: &Flag<A>) -> Result<Given, UsageError> {
    match flag.spec.value {
        Value::None => Ok(Given::Present),
        Value::Required(_) => p
            .value()
            .map(Given::Value)
            .map_err(|_| usage_error(format!("--{} needs a value", flag.spec.long))),
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

fn take_positional<A>(t: &mut Typed<A>, v: OsString) -> Result<(), UsageError> {
    let def = t.def;
    if t.positionals.len() < def.positionals.len() {
        t.positionals.push(v);
        return Ok(());
    }
    Err(usage_error(match def.syntax {
        Syntax::Run(_) => format!(
            "unexpected argument `{}`: the COMMAND goes after `--` (leaseagent [OPTIONS] -- COMMAND [ARG...])",
            v.to_string_lossy()
        ),
        Syntax::Sub => format!(
            "unexpected argument `{}`: usage is {}",
            v.to_string_lossy(),
            def.usage()
        ),
    }))
}

fn unknown<A>(def: &CommandDef<A>, flag: &str) -> UsageError {
    usage_error(format!(
        "unknown option {flag} (see {} --help)",
        def.program()
    ))
}

fn lexopt_error<A>(def: &CommandDef<A>, e: lexopt::Error) -> UsageError {
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

/// A URL flag typed with a `user:password@` part: refused before anything
/// is read, since every local user sees argv (`ps`, `/proc/PID/cmdline`)
/// for as long as the process runs. (From the environment, readable only
/// by the same user and root, the part is dropped with a warning.)
fn refuse_passwords_in_argv<A>(t: &Typed<A>) -> Result<(), UsageError> {
    let more = t.more.iter().map(|(i, g)| (*i, Some(g)));
    let given = t.given.iter().enumerate().map(|(i, g)| (i, g.as_ref()));
    for (i, g) in given.chain(more) {
        let (Some(flag), Some(Given::Value(v))) = (t.def.flags().nth(i), g) else {
            continue;
        };
        let v = v.to_string_lossy();
        if flag.spec.url && has_password(&v) {
            return Err(usage_error(format!(
                "--{}: `{}` carries a password, which every local user could read in ps; give \
                 credentials in files: --auth-token-file, or --etcd-user with \
                 --etcd-password-file",
                flag.spec.long,
                crate::authority::trust::redact_url(&v)
            )));
        }
    }
    Ok(())
}

/// A `user:password@` part (not a bare `user@`) before the URL's host.
fn has_password(url: &str) -> bool {
    let redacted = crate::authority::trust::redact_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    let host = redacted.get(scheme.len() + 3..).unwrap_or("");
    // What redaction took away: `user:password@`.
    let userinfo = rest.strip_suffix(host).unwrap_or("");
    userinfo.contains(':')
}

#[cfg(test)]
#[test]
fn a_password_is_told_from_a_user_and_from_an_at_in_a_path() {
    for (url, pw) in [
        ("https://u:pw@h:1/", true),
        ("etcds://u:p@ss@a:1,b:2", true),
        ("http://user:pa/ss@127.0.0.1:1", true),
        ("http://user@h:1", false),
        ("http://h:1", false),
        ("sqlite:/a@b", false),
    ] {
        assert_eq!(has_password(url), pw, "{url}");
    }
}

/// Absent or empty flags with an environment variable take its value when
/// it is set and not empty.
fn apply_env<A>(t: &mut Typed<A>, env: Env) {
    for (flag, given) in t.def.flags().zip(t.given.iter_mut()) {
        let Some(var) = flag.spec.env else { continue };
        let empty = match given {
            None => true,
            Some(Given::Value(v)) => v.is_empty(),
            Some(Given::Present) => false,
        };
        if empty && let Some(v) = env(var).filter(|v| !v.is_empty()) {
            *given = Some(Given::Value(v));
        }
    }
}

fn check_required<A>(t: &Typed<A>) -> Result<(), UsageError> {
    let def = t.def;
    let mut missing: Vec<String> = def
        .flags()
        .zip(&t.given)
        .filter(|(f, g)| f.spec.required && g.is_none())
        .map(|(f, _)| {
            format!(
                "--{}{}",
                f.spec.long,
                super::flags::value_text(f.spec.value)
            )
        })
        .collect();
    missing.extend(
        def.positionals[t.positionals.len().min(def.positionals.len())..]
            .iter()
            .filter(|p| !p.spec.optional)
            .map(|p| super::flags::positional_text(&p.spec)),
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

/// Every entry's reader, in table order: flags (given, from the
/// environment, or their default value), positionals, the run path's
/// COMMAND. The first value refused is the error.
fn read<A: Default>(t: Typed<A>, trailing: Option<Vec<OsString>>) -> Result<A, UsageError> {
    let def = t.def;
    let mut a = A::default();
    for (idx, (flag, given)) in def.flags().zip(t.given).enumerate() {
        let given = match (given, flag.spec.default) {
            (Some(g), _) => g,
            (None, super::flags::Default::Value(d)) => Given::Value(d.into()),
            (None, _) => continue,
        };
        let more = t
            .more
            .iter()
            .filter(|(i, _)| *i == idx)
            .map(|(_, g)| g.clone());
        for given in std::iter::once(given).chain(more) {
            read_one(&mut a, flag, given)?;
        }
    }
    for (p, v) in def.positionals.iter().zip(t.positionals) {
        (p.read)(&mut a, v).map_err(|source| UsageError::Argument {
            name: p.spec.name,
            source,
        })?;
    }
    if let (Syntax::Run(f), Some(command)) = (&def.syntax, trailing) {
        f(&mut a, command);
    }
    Ok(a)
}

/// One value of one flag into the typed arguments.
fn read_one<A>(a: &mut A, flag: &Flag<A>, given: Given) -> Result<(), UsageError> {
    let long = flag.spec.long;
    let wrap = |source| UsageError::Value { flag: long, source };
    match (flag.read, given) {
        (Read::Switch(f), _) => f(a),
        (Read::Value(f), Given::Value(v)) => f(a, v).map_err(wrap)?,
        (Read::Optional(f), Given::Value(v)) => f(a, Some(v)).map_err(wrap)?,
        (Read::Optional(f), Given::Present) => f(a, None).map_err(wrap)?,
        // `take_value` gives a value to every `Value::Required` flag,
        // and `Draft` gives those a `Read::Value`.
        (Read::Value(_), Given::Present) => {
            return Err(usage_error(format!("--{long} needs a value")));
        }
    }
    Ok(())
}

/// Test: every flag and positional of `def` reaches the typed arguments.
///
/// Each is given two different values (a switch: given and not), each
/// alone on top of the command's required arguments; the typed arguments
/// must differ (the reader used its value), and every entry's result must
/// differ from every other's (no two readers write the same field). A
/// flag's environment variable must give what the flag gives. Compared
/// through `Debug`, so the argument types need nothing else.
#[cfg(test)]
pub fn check_readers<A: Default + std::fmt::Debug>(def: &CommandDef<A>) {
    use super::flags::Complete;
    // Two values each flag's value name accepts at the low stage (rules
    // between flags are `finish`'s, not checked here).
    fn samples(name: &str, complete: Complete) -> [&'static str; 2] {
        match complete {
            Complete::Words(w) if !w.is_empty() => return [w[0], w[w.len() - 1]],
            Complete::Subcommands => return ["serve", "leases"],
            _ => {}
        }
        match name {
            "DUR" => ["7s", "8s"],
            "N" | "PPM" => ["7", "8"],
            "FILE" | "PATH" | "SRC" | "DEST" => ["/sample/a", "/sample/b"],
            "ADDR" => ["127.0.0.1:7", "127.0.0.1:8"],
            "URL" => ["http://a.invalid:7", "http://b.invalid:8"],
            "NAME" | "TASK" => ["sample-a", "sample-b"],
            "NAME[:GROUP]" => ["sample-a", "sample-b:sample-g"],
            "P" => ["grace", "hold"],
            "DSCP,PRIO" => ["off", "ef,5"],
            "CODE" => ["0", "1"],
            other => panic!("no sample values for {other}: add two to `samples`"),
        }
    }
    let name = |f: &Flag<A>| match f.spec.value {
        Value::Required(n) | Value::Optional(n) => n,
        Value::None => "",
    };
    let no_env = |_: &str| -> Option<OsString> { None };
    let low = |args: &[OsString], env: Env| match parse(def, args, env) {
        Ok(Parsed::Args(a)) => format!("{a:?}"),
        Ok(_) => panic!("{}: {args:?}: not arguments", def.program()),
        Err(e) => panic!("{}: {args:?}: {e}", def.program()),
    };
    let os = |v: &str| OsString::from(v);
    // The required arguments, `except` one flag or positional.
    let base = |except: Option<&str>| -> Vec<OsString> {
        let mut args = Vec::new();
        for f in def.flags().filter(|f| f.spec.required) {
            if Some(f.spec.long) != except {
                args.push(os(&format!(
                    "--{}={}",
                    f.spec.long,
                    samples(name(f), f.spec.complete)[0]
                )));
            }
        }
        args
    };
    let positionals = |which: Option<(&str, &str)>| -> Vec<OsString> {
        let mut args = vec![os("--")];
        for p in def.positionals {
            match which {
                Some((n, v)) if n == p.spec.name => args.push(os(v)),
                _ if p.spec.optional => {}
                _ => args.push(os(samples(p.spec.name, p.spec.complete)[0])),
            }
        }
        if let Syntax::Run(_) = def.syntax {
            args.truncate(1);
            args.push(os("true"));
        }
        args
    };
    let with = |flag: Option<String>, pos: Option<(&str, &str)>| {
        let except = flag.as_deref().and_then(|f| {
            f.trim_start_matches("--")
                .split('=')
                .next()
                .map(str::to_string)
        });
        let mut args = base(except.as_deref());
        args.extend(flag.map(OsString::from));
        args.extend(positionals(pos));
        args
    };
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut distinct = |what: String, read: String| {
        if let Some((other, _)) = seen.iter().find(|(_, l)| *l == read) {
            panic!("{}: `{what}` reads the same as `{other}`", def.program());
        }
        seen.push((what, read));
    };
    for f in def.flags() {
        let long = f.spec.long;
        let results: Vec<(String, String)> = match f.spec.value {
            Value::None => vec![
                (String::new(), low(&with(None, None), &no_env)),
                (
                    format!("--{long}"),
                    low(&with(Some(format!("--{long}")), None), &no_env),
                ),
            ],
            Value::Required(n) | Value::Optional(n) => {
                let [x, y] = samples(n, f.spec.complete);
                let mut r = vec![
                    (
                        format!("--{long}={x}"),
                        low(&with(Some(format!("--{long}={x}")), None), &no_env),
                    ),
                    (
                        format!("--{long}={y}"),
                        low(&with(Some(format!("--{long}={y}")), None), &no_env),
                    ),
                ];
                if let Value::Optional(_) = f.spec.value {
                    r.push((
                        format!("--{long}"),
                        low(&with(Some(format!("--{long}")), None), &no_env),
                    ));
                }
                if let Some(var) = f.spec.env {
                    let env = move |v: &str| (v == var).then(|| os(y));
                    let from_env = if f.spec.required {
                        low(&with(Some(format!("--{long}=")), None), &env)
                    } else {
                        low(&with(None, None), &env)
                    };
                    assert_eq!(
                        from_env,
                        r[1].1,
                        "{}: {var} is not read as --{long}",
                        def.program()
                    );
                }
                r
            }
        };
        for (i, (what, l)) in results.iter().enumerate() {
            for (other, o) in &results[..i] {
                assert_ne!(
                    l,
                    o,
                    "{}: `{what}` reads the same as `{other}`",
                    def.program()
                );
            }
        }
        // The last one is the flag's own (a switch given, a value of its
        // own, an optional flag without its value).
        if let Some((what, l)) = results.into_iter().next_back() {
            distinct(what, l);
        }
    }
    for p in def.positionals {
        let [x, y] = samples(p.spec.name, p.spec.complete);
        let a = low(&with(None, Some((p.spec.name, x))), &no_env);
        let b = low(&with(None, Some((p.spec.name, y))), &no_env);
        // (A positional of one word only can only be read, not varied.)
        if x != y {
            assert_ne!(a, b, "{}: <{}> is not read", def.program(), p.spec.name);
        }
        distinct(format!("<{}>={y}", p.spec.name), b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::flags::{Complete, Group, Positional, dur, number, text};
    use std::time::Duration;

    #[derive(Debug, Default, PartialEq)]
    struct T {
        listen: String,
        ttl: Option<Duration>,
        count: Option<u64>,
        authority: Option<String>,
        quiet: bool,
        json: bool,
        wait: Option<Option<Duration>>,
        task: String,
        extra: Option<String>,
    }

    static DEF: CommandDef<T> = CommandDef {
        name: "t",
        about: "A test command",
        usage: None,
        groups: &[
            Group {
                heading: None,
                flags: &[
                    Flag::value("listen", "ADDR", "Address")
                        .required()
                        .reads(|a: &mut T, v| {
                            a.listen = text(v)?;
                            Ok(())
                        }),
                    Flag::value("ttl", "DUR", "Time")
                        .default_value("30s")
                        .reads(|a, v| {
                            a.ttl = Some(dur(v)?);
                            Ok(())
                        }),
                    Flag::value("count", "N", "Count").reads(|a, v| {
                        a.count = Some(number(v)?);
                        Ok(())
                    }),
                    Flag::value("authority", "URL", "Authority")
                        .env("T_AUTHORITY")
                        .reads(|a, v| {
                            a.authority = Some(text(v)?);
                            Ok(())
                        }),
                    Flag::switch("quiet", "Quiet")
                        .short('q')
                        .sets(|a| a.quiet = true),
                    Flag::optional("wait", "DUR", "Wait").reads(|a, v| {
                        a.wait = Some(v.map(dur).transpose()?);
                        Ok(())
                    }),
                ],
            },
            Group {
                heading: Some("Output"),
                flags: &[Flag::switch("json", "JSON").sets(|a| a.json = true)],
            },
        ],
        positionals: &[
            Positional::required("TASK", "The task").reads(|a: &mut T, v| {
                a.task = text(v)?;
                Ok(())
            }),
            Positional::optional("EXTRA", "More")
                .complete(Complete::Words(&["x", "y"]))
                .reads(|a, v| {
                    a.extra = Some(text(v)?);
                    Ok(())
                }),
        ],
        syntax: Syntax::Sub,
        notes: None,
        examples: "Examples:\n  leaseagent t",
        finish: |_| Ok(crate::cmd::flags::Command::Exit(0)),
    };

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    fn parse_t(args: &[&str]) -> Result<T, UsageError> {
        parse_env_t(args, &no_env)
    }

    fn parse_env_t(args: &[&str], env: Env) -> Result<T, UsageError> {
        match parse(&DEF, &os(args), env)? {
            Parsed::Args(a) => Ok(a),
            other => panic!("not arguments: {other:?}"),
        }
    }

    /// The message of a usage error, as printed.
    fn msg(r: Result<T, UsageError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn values_switches_and_defaults_reach_the_typed_arguments() {
        let a = parse_t(&["--listen", "a:1", "-q", "x"]).unwrap();
        assert_eq!(a.listen, "a:1");
        assert_eq!(a.ttl, Some(Duration::from_secs(30)));
        assert!(a.quiet && !a.json);
        assert_eq!((a.task.as_str(), a.extra, a.wait), ("x", None, None));
        let a = parse_t(&[
            "--listen=a:2",
            "--ttl=5s",
            "--json",
            "--count",
            "3",
            "x",
            "y",
        ])
        .unwrap();
        assert_eq!(a.listen, "a:2");
        assert_eq!(a.ttl, Some(Duration::from_secs(5)));
        assert_eq!(a.count, Some(3));
        assert_eq!(a.extra.as_deref(), Some("y"));
        assert!(a.json);
    }

    #[test]
    fn an_optional_value_is_attached_or_the_next_word_not_starting_with_a_dash() {
        let wait = |args: &[&str]| parse_t(args).unwrap().wait;
        assert_eq!(wait(&["--listen=a", "x"]), None);
        assert_eq!(wait(&["--listen=a", "--wait", "--json", "x"]), Some(None));
        assert_eq!(
            wait(&["--listen=a", "--wait=2s", "x"]),
            Some(Some(Duration::from_secs(2)))
        );
        assert_eq!(
            wait(&["--listen=a", "--wait", "3s", "x"]),
            Some(Some(Duration::from_secs(3)))
        );
    }

    #[test]
    fn dashdash_makes_the_rest_positional() {
        let a = parse_t(&["--listen", "a", "--", "--json"]).unwrap();
        assert_eq!(a.task, "--json");
        assert!(!a.json);
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
            "<TASK> is required: usage is leaseagent t [OPTIONS] --listen ADDR <TASK> [EXTRA]"
        );
        let e = msg(parse_t(&[]));
        assert!(
            e.starts_with("--listen ADDR and <TASK> are required"),
            "{e}"
        );
        let e = msg(parse_t(&["--listen", "a", "x", "y", "z"]));
        assert!(e.starts_with("unexpected argument `z`: usage is"), "{e}");
        let e = msg(parse_t(&["--listen", "a", "--json=1", "x"]));
        assert_eq!(e, "--json takes no value (given `1`)");
        let e = msg(parse_t(&["--listen", "a", "--listen", "b", "x"]));
        assert_eq!(e, "--listen given more than once (see leaseagent t --help)");
        let e = parse_t(&["--listen", "a", "--ttl", "5x", "x"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--ttl: `5x` has an unknown unit `x`: use ms, s, m or h"
        );
        assert!(matches!(e, UsageError::Value { flag: "ttl", .. }));
        let e = msg(parse_t(&["--listen", "a", "--count", "q", "x"]));
        assert_eq!(
            e,
            "--count: `q` is not a whole number: invalid digit found in string"
        );
        // Readers run in table order, whatever the order on the line.
        let e = msg(parse_t(&["--count", "q", "--ttl", "5x", "--listen=a", "x"]));
        assert!(e.starts_with("--ttl: "), "{e}");
    }

    #[test]
    fn non_utf8_values_are_refused_where_text_is_read() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'a', 0xff]);
        let args = vec![OsString::from("--listen"), bad.clone(), OsString::from("x")];
        let e = parse(&DEF, &args, &no_env).unwrap_err();
        assert_eq!(e.to_string(), "--listen: `a\u{fffd}` is not valid UTF-8");
        let args = vec![OsString::from("--listen=a"), bad];
        let e = parse(&DEF, &args, &no_env).unwrap_err();
        assert_eq!(e.to_string(), "<TASK>: `a\u{fffd}` is not valid UTF-8");
    }

    #[test]
    fn help_and_version_win_over_later_errors_missing_arguments_and_bad_values() {
        let p = |args: &[&str]| parse(&DEF, &os(args), &no_env);
        assert!(matches!(p(&["-h", "--bogus"]), Ok(Parsed::Help)));
        assert!(matches!(p(&["--version"]), Ok(Parsed::Version)));
        assert!(matches!(p(&["-qh"]), Ok(Parsed::Help)));
        assert!(matches!(p(&["--ttl", "5x", "--help"]), Ok(Parsed::Help)));
        assert!(p(&["--bogus", "-h"]).is_err());
    }

    #[test]
    fn environment_fills_absent_or_empty_flags() {
        let env = |v: &str| (v == "T_AUTHORITY").then(|| OsString::from("http://e:1"));
        let authority = |args: &[&str], env: Env| parse_env_t(args, env).unwrap().authority;
        assert_eq!(
            authority(&["--listen", "a", "x"], &env).as_deref(),
            Some("http://e:1")
        );
        assert_eq!(
            authority(&["--listen", "a", "--authority", "", "x"], &env).as_deref(),
            Some("http://e:1")
        );
        assert_eq!(
            authority(&["--listen", "a", "--authority", "http://f:1", "x"], &env).as_deref(),
            Some("http://f:1")
        );
        // An empty variable counts as unset.
        let empty = |_: &str| Some(OsString::new());
        assert_eq!(authority(&["--listen", "a", "x"], &empty), None);
    }

    static RUN: CommandDef<T> = CommandDef {
        name: "",
        about: "Run",
        usage: Some("leaseagent [OPTIONS] -- COMMAND"),
        groups: &[Group {
            heading: None,
            flags: &[
                Flag::value("task", "NAME", "The task").reads(|a: &mut T, v| {
                    a.task = text(v)?;
                    Ok(())
                }),
            ],
        }],
        positionals: &[],
        syntax: Syntax::Run(|a, command| {
            a.extra = Some(
                command
                    .iter()
                    .map(|c| c.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        }),
        notes: None,
        examples: "Examples:",
        finish: |_| Ok(crate::cmd::flags::Command::Exit(0)),
    };

    #[test]
    fn run_syntax_takes_the_command_after_the_first_dashdash() {
        let p = |args: &[&str]| parse(&RUN, &os(args), &no_env);
        let Ok(Parsed::Args(a)) = p(&["--task", "t", "--", "a", "--", "-b"]) else {
            panic!("no args")
        };
        assert_eq!(a.extra.as_deref(), Some("a -- -b"));
        // The last of a repeated flag wins on the run path.
        let Ok(Parsed::Args(a)) = p(&["--task", "a", "--task", "b", "--"]) else {
            panic!("no args")
        };
        assert_eq!(a.task, "b");
        let e = p(&["--task", "t", "x"]).unwrap_err().to_string();
        assert!(
            e.starts_with("unexpected argument `x`: the COMMAND goes after `--`"),
            "{e}"
        );
        let e = p(&["--task", "t"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no COMMAND given: usage is leaseagent [OPTIONS] -- COMMAND"
        );
    }

    #[test]
    fn the_reader_check_passes_for_a_table_whose_readers_all_read() {
        check_readers(&DEF);
        check_readers(&RUN);
    }

    #[derive(Debug, Default)]
    struct Lost {
        a: Option<String>,
        b: Option<String>,
    }

    /// A subcommand of these flags, nothing else.
    const fn sub(name: &'static str, groups: &'static [Group<Lost>]) -> CommandDef<Lost> {
        CommandDef {
            name,
            about: "",
            usage: None,
            groups,
            positionals: &[],
            syntax: Syntax::Sub,
            notes: None,
            examples: "",
            finish: |_| Ok(crate::cmd::flags::Command::Exit(0)),
        }
    }

    static FORGETFUL: CommandDef<Lost> = sub(
        "forgetful",
        &[Group {
            heading: None,
            flags: &[
                Flag::value("a", "NAME", "A").reads(|a: &mut Lost, v| {
                    a.a = Some(text(v)?);
                    Ok(())
                }),
                // Reads its value, but into --a's field.
                Flag::value("b", "NAME", "B").reads(|a: &mut Lost, v| {
                    a.a = Some(text(v)?);
                    Ok(())
                }),
            ],
        }],
    );

    static DEAF: CommandDef<Lost> = sub(
        "deaf",
        &[Group {
            heading: None,
            flags: &[Flag::value("b", "NAME", "B").reads(|a: &mut Lost, v| {
                // Reads its value, then drops it.
                let _ = text(v)?;
                a.b = Some("always the same".into());
                Ok(())
            })],
        }],
    );

    #[test]
    fn the_reader_check_catches_a_reader_that_writes_elsewhere_or_drops_its_value() {
        let caught = |def: &'static CommandDef<Lost>| {
            std::panic::catch_unwind(|| check_readers(def))
                .expect_err("not caught")
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default()
        };
        let e = caught(&FORGETFUL);
        assert!(
            e.contains("--b=sample-b` reads the same as `--a=sample-b"),
            "{e}"
        );
        let e = caught(&DEAF);
        assert!(
            e.contains("`--b=sample-b` reads the same as `--b=sample-a`"),
            "{e}"
        );
    }
}
