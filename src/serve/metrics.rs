//! `/metrics` in the Prometheus text format: the engine's counters, leases
//! by state (an alert on `leaseagent_held_for_operator > 0` finds tasks
//! stuck under policy hold), and a request latency histogram.
//!
//! Latency is measured in the server from a fully read request to its
//! answer being ready, so it excludes network and client time.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::engine::batched::ServeEngine;

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

fn metric(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

/// Renders every metric.
pub fn render(engine: &ServeEngine, latency: &Latency) -> String {
    let c = &engine.counters;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let states = engine.state_counts();
    let mut out = String::with_capacity(4096);
    metric(
        &mut out,
        "leaseagent_up",
        "gauge",
        "1 while the authority can grant.",
        &[("", u64::from(engine.healthy()))],
    );
    metric(
        &mut out,
        "leaseagent_grants_total",
        "counter",
        "Leases granted (durable).",
        &[("", g(&c.grants))],
    );
    metric(
        &mut out,
        "leaseagent_renewals_total",
        "counter",
        "Leases renewed.",
        &[("", g(&c.renewals))],
    );
    metric(
        &mut out,
        "leaseagent_releases_total",
        "counter",
        "Leases released.",
        &[("", g(&c.releases))],
    );
    metric(
        &mut out,
        "leaseagent_refusals_total",
        "counter",
        "Renewals and releases refused, by reason.",
        &[
            ("{reason=\"expired\"}", g(&c.refused[0])),
            ("{reason=\"superseded\"}", g(&c.refused[1])),
            ("{reason=\"revoked\"}", g(&c.refused[2])),
            ("{reason=\"unknown_lease\"}", g(&c.refused[3])),
        ],
    );
    metric(
        &mut out,
        "leaseagent_acquire_refused_total",
        "counter",
        "Acquires refused, by reason.",
        &[
            ("{reason=\"held\"}", g(&c.acquire_held)),
            (
                "{reason=\"held_for_operator\"}",
                g(&c.acquire_held_for_operator),
            ),
        ],
    );
    metric(
        &mut out,
        "leaseagent_expiries_total",
        "counter",
        "Leases that expired (counted when first observed).",
        &[("", g(&c.expiries))],
    );
    metric(
        &mut out,
        "leaseagent_leases",
        "gauge",
        "Leases on record, by state.",
        &[
            ("{state=\"active\"}", states.active),
            ("{state=\"grace\"}", states.grace),
            ("{state=\"held_for_operator\"}", states.held_for_operator),
        ],
    );
    metric(
        &mut out,
        "leaseagent_held_for_operator",
        "gauge",
        "Tasks held for an operator (policy hold): nothing runs until `leaseagent clear`.",
        &[("", states.held_for_operator)],
    );
    metric(
        &mut out,
        "leaseagent_db_commits_total",
        "counter",
        "Durable (fsync'd) transactions.",
        &[("", g(&c.commits))],
    );
    metric(
        &mut out,
        "leaseagent_db_committed_changes_total",
        "counter",
        "Changes (grants, releases, revokes, clears) in those transactions.",
        &[("", g(&c.committed_changes))],
    );
    let name = "leaseagent_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time from a fully read request to its answer.\n# TYPE {name} histogram"
    );
    let mut cum = 0;
    for (b, n) in BUCKETS_US.iter().zip(&latency.buckets) {
        cum += g(n);
        let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cum}", *b as f64 / 1e6);
    }
    let count = g(&latency.count);
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {}", g(&latency.sum_us) as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {count}");
    out
}
