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
