//! `/metrics` in the Prometheus text format: the engine's counters, leases
//! by state (an alert on `leaseagent_held_for_operator > 0` finds tasks
//! stuck under policy hold), per task how long it has been held for an
//! operator and when it last succeeded (from the run history: the alerts of
//! `deploy/prometheus/leaseagent-alerts.yml` use them), and a request
//! latency histogram. Task names are safe in label values as they are
//! (the protocol allows no quote, backslash or newline in them).
//!
//! Latency is measured in the server from a fully read request to its
//! answer being ready, so it excludes network and client time.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::auth::AuthStats;
use super::http::ConnStats;
use crate::engine::batched::{BatchedEngine, Counters, StateCounts};

/// Bucket upper bounds, in microseconds.
const BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// The request latency histogram.
#[derive(Default)]
pub struct Latency {
    buckets: [AtomicU64; BUCKETS_US.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Latency {
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        if let Some(i) = BUCKETS_US.iter().position(|b| us <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }
}

/// What the figures are read from, once per scrape.
struct Sources<'a> {
    up: bool,
    c: &'a Counters,
    states: StateCounts,
    conns: &'a ConnStats,
    auth: &'a AuthStats,
}

/// One sample: its label set (`""` for none) and how to read its value.
type Sample = (&'static str, fn(&Sources) -> u64);

/// One metric family: name, type, help line, samples.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: &'static [Sample],
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// Every metric but the latency histogram, in output order.
const FAMILIES: &[Family] = &[
    Family {
        name: "leaseagent_up",
        kind: "gauge",
        help: "1 while the authority can grant.",
        samples: &[("", |s| u64::from(s.up))],
    },
    Family {
        name: "leaseagent_grants_total",
        kind: "counter",
        help: "Leases granted (durable).",
        samples: &[("", |s| load(&s.c.grants))],
    },
    Family {
        name: "leaseagent_renewals_total",
        kind: "counter",
        help: "Leases renewed.",
        samples: &[("", |s| load(&s.c.renewals))],
    },
    Family {
        name: "leaseagent_releases_total",
        kind: "counter",
        help: "Leases released.",
        samples: &[("", |s| load(&s.c.releases))],
    },
    Family {
        name: "leaseagent_refusals_total",
        kind: "counter",
        help: "Renewals and releases refused, by reason.",
        samples: &[
            ("{reason=\"expired\"}", |s| load(&s.c.refused[0])),
            ("{reason=\"superseded\"}", |s| load(&s.c.refused[1])),
            ("{reason=\"revoked\"}", |s| load(&s.c.refused[2])),
            ("{reason=\"unknown_lease\"}", |s| load(&s.c.refused[3])),
        ],
    },
    Family {
        name: "leaseagent_acquire_refused_total",
        kind: "counter",
        help: "Acquires refused, by reason.",
        samples: &[
            ("{reason=\"held\"}", |s| load(&s.c.acquire_held)),
            ("{reason=\"held_for_operator\"}", |s| {
                load(&s.c.acquire_held_for_operator)
            }),
        ],
    },
    Family {
        name: "leaseagent_expiries_total",
        kind: "counter",
        help: "Leases that expired (counted when first observed).",
        samples: &[("", |s| load(&s.c.expiries))],
    },
    Family {
        name: "leaseagent_leases",
        kind: "gauge",
        help: "Leases on record, by state.",
        samples: &[
            ("{state=\"active\"}", |s| s.states.active),
            ("{state=\"grace\"}", |s| s.states.grace),
            ("{state=\"held_for_operator\"}", |s| {
                s.states.held_for_operator
            }),
        ],
    },
    Family {
        name: "leaseagent_held_for_operator",
        kind: "gauge",
        help: "Tasks held for an operator (policy hold): nothing runs until `leaseagent clear`.",
        samples: &[("", |s| s.states.held_for_operator)],
    },
    Family {
        name: "leaseagent_db_commits_total",
        kind: "counter",
        help: "Durable (fsync'd) transactions.",
        samples: &[("", |s| load(&s.c.commits))],
    },
    Family {
        name: "leaseagent_db_committed_changes_total",
        kind: "counter",
        help: "Changes (grants, releases, revokes, clears) in those transactions.",
        samples: &[("", |s| load(&s.c.committed_changes))],
    },
    Family {
        name: "leaseagent_connections",
        kind: "gauge",
        help: "Open client connections.",
        samples: &[("", |s| load(&s.conns.open))],
    },
    Family {
        name: "leaseagent_connections_over_limit_total",
        kind: "counter",
        help: "Connections past --max-connections (answered 503 once, then closed).",
        samples: &[("", |s| load(&s.conns.over_limit))],
    },
    Family {
        name: "leaseagent_connections_refused_total",
        kind: "counter",
        help: "Connections closed at once, before TLS, for being past --max-connections-per-peer.",
        samples: &[("", |s| load(&s.conns.refused_peer))],
    },
    Family {
        name: "leaseagent_auth_reload_failures_total",
        kind: "counter",
        help: "Auth file reloads (SIGHUP) that failed; the principals loaded before were kept.",
        samples: &[("", |s| load(&s.auth.reload_failures))],
    },
    Family {
        name: "leaseagent_auth_last_good_load_timestamp_seconds",
        kind: "gauge",
        help: "Unix time of the last successful load of the auth file.",
        samples: &[("", |s| load(&s.auth.last_good_load_unix))],
    },
];

/// Renders every metric; the per-task ones only for the tasks `covers`
/// accepts (the caller's scope, as for the listing).
pub fn render(
    engine: &BatchedEngine,
    latency: &Latency,
    conns: &ConnStats,
    auth: &AuthStats,
    covers: &dyn Fn(&str) -> bool,
    max_tasks: usize,
) -> String {
    let sources = Sources {
        up: engine.healthy(),
        c: &engine.counters,
        states: engine.state_counts(),
        conns,
        auth,
    };
    let mut out = String::with_capacity(4096);
    for f in FAMILIES {
        write_family(&mut out, f, &sources);
    }
    write_tasks(&mut out, engine, covers, max_tasks);
    write_latency(&mut out, latency);
    out
}

/// The per-task gauges: seconds held for an operator (since the lease
/// expired), and when the task last succeeded. Each names at most
/// `max_tasks` tasks, the most alarming first (held longest, succeeded
/// longest ago); the rest are one series `task="(other)"` carrying their
/// most alarming value, so an alert on either still fires, and a client
/// that makes up task names cannot make the scrape grow without bound.
fn write_tasks(
    out: &mut String,
    engine: &BatchedEngine,
    covers: &dyn Fn(&str) -> bool,
    max_tasks: usize,
) {
    let now = crate::time::wall_ms();
    let mut held: Vec<(String, f64)> = engine
        .held_for_operator()
        .into_iter()
        .filter(|(i, _)| covers(&i.task))
        .map(|(i, since)| {
            let secs = since.map_or(0.0, |s| now.saturating_sub(s) as f64 / 1e3);
            (i.task, secs)
        })
        .collect();
    // Longest held first.
    held.sort_by(|a, b| b.1.total_cmp(&a.1));
    write_task_family(
        out,
        "leaseagent_task_held_for_operator_seconds",
        "Seconds since the lease of a task held for an operator expired.",
        held,
        max_tasks,
    );
    let mut last: Vec<(String, f64)> = engine
        .last_successes()
        .into_iter()
        .filter(|(t, _)| covers(t))
        .map(|(t, ms)| (t, ms as f64 / 1e3))
        .collect();
    // Longest ago first.
    last.sort_by(|a, b| a.1.total_cmp(&b.1));
    write_task_family(
        out,
        "leaseagent_task_last_success_timestamp_seconds",
        "When the task's last attempt reporting `succeeded` was released (Unix time).",
        last,
        max_tasks,
    );
}

/// The series of one per-task family, most alarming first: `max_tasks`
/// named, then the first of the rest (the most alarming of them) as
/// `task="(other)"`.
fn write_task_family(
    out: &mut String,
    name: &str,
    help: &str,
    series: Vec<(String, f64)>,
    max_tasks: usize,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    let mut rest = series.into_iter();
    for (task, v) in rest.by_ref().take(max_tasks) {
        let _ = writeln!(out, "{name}{{task=\"{task}\"}} {v}");
    }
    if let Some((_, v)) = rest.next() {
        let _ = writeln!(out, "{name}{{task=\"{OTHER_TASKS}\"}} {v}");
    }
}

/// The `task` label of the series that stands for the tasks past the
/// bound (not a valid task name, so never a real task's).
pub const OTHER_TASKS: &str = "(other)";

fn write_family(out: &mut String, f: &Family, sources: &Sources) {
    let name = f.name;
    let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {}", f.help, f.kind);
    for (labels, get) in f.samples {
        let _ = writeln!(out, "{name}{labels} {}", get(sources));
    }
}

fn write_latency(out: &mut String, latency: &Latency) {
    let name = "leaseagent_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time from a fully read request to its answer.\n# TYPE {name} histogram"
    );
    let mut cum = 0;
    for (b, n) in BUCKETS_US.iter().zip(&latency.buckets) {
        cum += load(n);
        let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cum}", *b as f64 / 1e6);
    }
    let count = load(&latency.count);
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {}", load(&latency.sum_us) as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {count}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rules::AcquireSpec;
    use crate::lease::ExpiryPolicy;

    /// Pins the exact text for a fixed state: every figure distinct, so a
    /// swapped getter or label shows.
    #[test]
    fn render_is_pinned_for_a_fixed_state() {
        let d = tempfile::tempdir().unwrap();
        let e = BatchedEngine::open(&d.path().join("s.db")).unwrap();
        e.acquire(&AcquireSpec {
            task: "t".into(),
            principal: String::new(),
            holder: "h".into(),
            ttl_ms: 600_000,
            policy: ExpiryPolicy::Redispatch,
            grace_ms: 0,
            max_leases: None,
        })
        .unwrap();
        let c = &e.counters;
        let all = [
            &c.grants,
            &c.renewals,
            &c.releases,
            &c.acquire_held,
            &c.acquire_held_for_operator,
            &c.refused[0],
            &c.refused[1],
            &c.refused[2],
            &c.refused[3],
            &c.expiries,
            &c.commits,
            &c.committed_changes,
        ];
        for (i, a) in all.iter().enumerate() {
            a.store(101 + i as u64, Ordering::Relaxed);
        }
        let conns = ConnStats::default();
        conns.open.store(7, Ordering::Relaxed);
        conns.over_limit.store(9, Ordering::Relaxed);
        conns.refused_peer.store(11, Ordering::Relaxed);
        let auth = AuthStats::default();
        auth.reload_failures.store(2, Ordering::Relaxed);
        auth.last_good_load_unix
            .store(1_700_000_000, Ordering::Relaxed);
        let latency = Latency::default();
        for us in [10, 60, 300, 300, 4_000, 2_000_000] {
            latency.observe(Duration::from_micros(us));
        }
        let got = render(&e, &latency, &conns, &auth, &|_| true, 1000);
        e.shutdown();
        assert_eq!(got, EXPECTED);
    }

    const EXPECTED: &str = r##"# HELP leaseagent_up 1 while the authority can grant.
# TYPE leaseagent_up gauge
leaseagent_up 1
# HELP leaseagent_grants_total Leases granted (durable).
# TYPE leaseagent_grants_total counter
leaseagent_grants_total 101
# HELP leaseagent_renewals_total Leases renewed.
# TYPE leaseagent_renewals_total counter
leaseagent_renewals_total 102
# HELP leaseagent_releases_total Leases released.
# TYPE leaseagent_releases_total counter
leaseagent_releases_total 103
# HELP leaseagent_refusals_total Renewals and releases refused, by reason.
# TYPE leaseagent_refusals_total counter
leaseagent_refusals_total{reason="expired"} 106
leaseagent_refusals_total{reason="superseded"} 107
leaseagent_refusals_total{reason="revoked"} 108
leaseagent_refusals_total{reason="unknown_lease"} 109
# HELP leaseagent_acquire_refused_total Acquires refused, by reason.
# TYPE leaseagent_acquire_refused_total counter
leaseagent_acquire_refused_total{reason="held"} 104
leaseagent_acquire_refused_total{reason="held_for_operator"} 105
# HELP leaseagent_expiries_total Leases that expired (counted when first observed).
# TYPE leaseagent_expiries_total counter
leaseagent_expiries_total 110
# HELP leaseagent_leases Leases on record, by state.
# TYPE leaseagent_leases gauge
leaseagent_leases{state="active"} 1
leaseagent_leases{state="grace"} 0
leaseagent_leases{state="held_for_operator"} 0
# HELP leaseagent_held_for_operator Tasks held for an operator (policy hold): nothing runs until `leaseagent clear`.
# TYPE leaseagent_held_for_operator gauge
leaseagent_held_for_operator 0
# HELP leaseagent_db_commits_total Durable (fsync'd) transactions.
# TYPE leaseagent_db_commits_total counter
leaseagent_db_commits_total 111
# HELP leaseagent_db_committed_changes_total Changes (grants, releases, revokes, clears) in those transactions.
# TYPE leaseagent_db_committed_changes_total counter
leaseagent_db_committed_changes_total 112
# HELP leaseagent_connections Open client connections.
# TYPE leaseagent_connections gauge
leaseagent_connections 7
# HELP leaseagent_connections_over_limit_total Connections past --max-connections (answered 503 once, then closed).
# TYPE leaseagent_connections_over_limit_total counter
leaseagent_connections_over_limit_total 9
# HELP leaseagent_connections_refused_total Connections closed at once, before TLS, for being past --max-connections-per-peer.
# TYPE leaseagent_connections_refused_total counter
leaseagent_connections_refused_total 11
# HELP leaseagent_auth_reload_failures_total Auth file reloads (SIGHUP) that failed; the principals loaded before were kept.
# TYPE leaseagent_auth_reload_failures_total counter
leaseagent_auth_reload_failures_total 2
# HELP leaseagent_auth_last_good_load_timestamp_seconds Unix time of the last successful load of the auth file.
# TYPE leaseagent_auth_last_good_load_timestamp_seconds gauge
leaseagent_auth_last_good_load_timestamp_seconds 1700000000
# HELP leaseagent_task_held_for_operator_seconds Seconds since the lease of a task held for an operator expired.
# TYPE leaseagent_task_held_for_operator_seconds gauge
# HELP leaseagent_task_last_success_timestamp_seconds When the task's last attempt reporting `succeeded` was released (Unix time).
# TYPE leaseagent_task_last_success_timestamp_seconds gauge
# HELP leaseagent_request_duration_seconds Time from a fully read request to its answer.
# TYPE leaseagent_request_duration_seconds histogram
leaseagent_request_duration_seconds_bucket{le="0.00005"} 1
leaseagent_request_duration_seconds_bucket{le="0.0001"} 2
leaseagent_request_duration_seconds_bucket{le="0.00025"} 2
leaseagent_request_duration_seconds_bucket{le="0.0005"} 4
leaseagent_request_duration_seconds_bucket{le="0.001"} 4
leaseagent_request_duration_seconds_bucket{le="0.0025"} 4
leaseagent_request_duration_seconds_bucket{le="0.005"} 5
leaseagent_request_duration_seconds_bucket{le="0.01"} 5
leaseagent_request_duration_seconds_bucket{le="0.025"} 5
leaseagent_request_duration_seconds_bucket{le="0.05"} 5
leaseagent_request_duration_seconds_bucket{le="0.1"} 5
leaseagent_request_duration_seconds_bucket{le="0.25"} 5
leaseagent_request_duration_seconds_bucket{le="0.5"} 5
leaseagent_request_duration_seconds_bucket{le="1"} 5
leaseagent_request_duration_seconds_bucket{le="+Inf"} 6
leaseagent_request_duration_seconds_sum 2.00467
leaseagent_request_duration_seconds_count 6
"##;

    #[test]
    fn a_per_task_family_names_the_most_alarming_and_sums_up_the_rest() {
        let series: Vec<(String, f64)> = (0..5).map(|i| (format!("t{i}"), f64::from(i))).collect();
        let mut out = String::new();
        write_task_family(&mut out, "m", "h", series.clone(), 2);
        assert_eq!(
            out,
            "# HELP m h\n# TYPE m gauge\nm{task=\"t0\"} 0\nm{task=\"t1\"} 1\n\
             m{task=\"(other)\"} 2\n"
        );
        let mut all = String::new();
        write_task_family(&mut all, "m", "h", series, 5);
        assert!(!all.contains("(other)"), "{all}");
        assert_eq!(all.lines().count(), 7);
    }
}
