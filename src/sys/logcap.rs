//! One rule for every log line leaseagent writes, the agent's
//! (`agent::logging`, through its writer thread) and `serve`'s: records of
//! the crates that see wire bytes are never shown above `info`, whatever
//! `RUST_LOG` asks for, so no log level prints a bearer token, an etcd
//! token or a PostgreSQL password that passed through them.

/// Crates whose own log records may carry what goes over the wire (ureq's
/// request dumps and hex traces, TLS internals, the PostgreSQL client's
/// statements and parameters): never above `info`, whatever `RUST_LOG`
/// says, so no level shows a bearer token, an etcd token or a stored
/// lease's key. leaseagent's own records never hold a secret (the agent's
/// `authority::trust::Secret` has no `Display`).
const CAPPED: &[&str] = &[
    "ureq",
    "ureq_proto",
    "rustls",
    "webpki",
    "hyper",
    "h2",
    "tokio_postgres",
    "postgres_protocol",
];

/// `env_logger` with [`CAPPED`] applied on every record: a filter of its
/// own rather than `filter_module` directives, because a more specific
/// directive in `RUST_LOG` (`ureq::unversioned=trace`) would win over those.
struct Capped(env_logger::Logger);

fn capped(m: &log::Metadata<'_>) -> bool {
    m.level() > log::Level::Info
        && CAPPED.iter().any(|c| {
            m.target()
                .strip_prefix(c)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
}

impl log::Log for Capped {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        !capped(m) && self.0.enabled(m)
    }

    fn log(&self, r: &log::Record<'_>) {
        if !capped(r.metadata()) {
            self.0.log(r);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

/// Makes `logger`, capped, the process's logger (once; later calls do
/// nothing).
pub fn install(logger: env_logger::Logger) {
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(Capped(logger))).is_ok() {
        log::set_max_level(max);
    }
}

/// The filter of every process of leaseagent's: leaseagent's own records
/// at `explicit` (`-q`, `-v`, `--log-level`, `LEASEAGENT_LOG`), else at
/// the level `RUST_LOG` gives leaseagent (a bare level or `leaseagent=L`),
/// else at `default`; the wire crates and the rest as `RUST_LOG` says.
///
/// Never below `error` for leaseagent's own records: a `RUST_LOG` meant
/// for another program (`RUST_LOG=warning`, which `env_logger` reads as the
/// name of a module and so turns everything else off, or `off`) must not
/// hide why the agent failed.
pub fn builder(
    explicit: Option<log::LevelFilter>,
    default: log::LevelFilter,
) -> env_logger::Builder {
    let rust_log = std::env::var("RUST_LOG").ok();
    let (ours, others) = split_rust_log(explicit, default, rust_log.as_deref());
    let mut builder = env_logger::Builder::new();
    builder.filter_level(ours);
    if !others.is_empty() {
        builder.parse_filters(&others);
    }
    builder.filter_module("leaseagent", ours);
    builder
}

/// leaseagent's own level, and the `RUST_LOG` directives left for the other
/// crates (and leaseagent's modules, without an explicit level), each of
/// leaseagent's at `error` at least.
fn split_rust_log(
    explicit: Option<log::LevelFilter>,
    default: log::LevelFilter,
    rust_log: Option<&str>,
) -> (log::LevelFilter, String) {
    let ours_named = |name: &str| name == "leaseagent" || name.starts_with("leaseagent::");
    let spec = rust_log.unwrap_or("");
    // `env_logger`'s `/regex` suffix filters messages; leaseagent ignores it.
    let spec = spec.split('/').next().unwrap_or("");
    let (mut bare, mut named) = (None, None);
    let mut kept = Vec::new();
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        match d.split_once('=') {
            Some((name, level)) if ours_named(name) => {
                let level: log::LevelFilter = level.parse().unwrap_or(log::LevelFilter::Trace);
                if name == "leaseagent" {
                    named = Some(level);
                } else if explicit.is_none() {
                    kept.push(format!("{name}={}", level.max(log::LevelFilter::Error)));
                }
            }
            Some(_) => kept.push(d.to_string()),
            None if d == "leaseagent" => named = Some(log::LevelFilter::Trace),
            None => match d.parse::<log::LevelFilter>() {
                Ok(level) => {
                    bare = Some(level);
                    kept.push(d.to_string());
                }
                // A module name: everything of that module, as env_logger
                // reads it; leaseagent's own level is not touched.
                Err(_) => kept.push(d.to_string()),
            },
        }
    }
    let ours = explicit
        .or(named)
        .or(bare)
        .unwrap_or(default)
        .max(log::LevelFilter::Error);
    (ours, kept.join(","))
}

#[cfg(test)]
mod tests {
    use super::split_rust_log;
    use log::LevelFilter::{Debug, Error, Info, Trace, Warn};

    #[test]
    fn rust_log_never_hides_leaseagents_errors_and_flags_win() {
        let s = |e, r| split_rust_log(e, Info, r);
        assert_eq!(s(None, None), (Info, String::new()));
        // A word env_logger takes for a module name: ours stays at the default.
        assert_eq!(s(None, Some("warning")), (Info, "warning".into()));
        assert_eq!(s(None, Some("err")).0, Info);
        assert_eq!(s(None, Some("off")), (Error, "off".into()));
        assert_eq!(s(None, Some("leaseagent=off")).0, Error);
        assert_eq!(s(None, Some("warn")), (Warn, "warn".into()));
        assert_eq!(
            s(None, Some("ureq=debug,leaseagent=debug")),
            (Debug, "ureq=debug".into())
        );
        assert_eq!(
            s(None, Some("leaseagent::agent=off,info")),
            (Info, "leaseagent::agent=ERROR,info".into())
        );
        // An explicit level wins over RUST_LOG for leaseagent, not for the rest.
        assert_eq!(
            s(Some(Error), Some("trace,leaseagent::agent=trace")),
            (Error, "trace".into())
        );
        assert_eq!(s(Some(Trace), Some("leaseagent=warn")).0, Trace);
    }
}
