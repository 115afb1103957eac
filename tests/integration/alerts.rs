//! The alert rules (`deploy/prometheus/leaseagent-alerts.yml`) against a
//! real `serve`: every metric a rule uses is one serve exports, with a
//! sample once the situation it watches exists (a task held for an
//! operator, a task that succeeded). `promtool check rules` and
//! `promtool test rules` run from `scripts/test`.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use support::authority::{Server, poll};

/// Every `leaseagent_*` name in the rules file.
fn names_in_rules() -> BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/prometheus/leaseagent-alerts.yml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| l.trim_start().starts_with("expr:")) {
        let mut rest = line;
        while let Some(i) = rest.find("leaseagent_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names
}

#[test]
fn every_metric_the_alert_rules_use_is_exported_by_serve() {
    let names = names_in_rules();
    assert!(names.len() >= 5, "{names:?}");
    let d = tempfile::tempdir().unwrap();
    let s = Server::start(&d.path().join("l.db"));
    let (st, g) = s.acquire("done", "h", 30_000);
    assert_eq!(st, 200);
    assert_eq!(s.release(&g).0, 200);
    let (st, _) = s.post(
        "/v1/acquire",
        &json!({"task": "stuck", "holder": "h", "ttl_ms": 1000, "on_expiry": "hold"}),
    );
    assert_eq!(st, 200);
    poll("the hold", Duration::from_secs(20), || {
        (s.state_of("stuck").as_deref() == Some("held_for_operator")).then_some(())
    });
    let (st, body) = s.get("/metrics");
    assert_eq!(st, 200);
    for name in &names {
        let sample = body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")));
        assert!(
            sample.is_some(),
            "{name} has no sample in /metrics:\n{body}"
        );
    }
    assert!(
        body.contains("leaseagent_task_held_for_operator_seconds{task=\"stuck\"}"),
        "{body}"
    );
    assert!(
        body.contains("leaseagent_task_last_success_timestamp_seconds{task=\"done\"}"),
        "{body}"
    );
}
