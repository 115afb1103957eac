//! What a replica says about leadership, leading or not (the spec's
//! "Replicas"): `503 not_leader` naming the leader for a lease call to a
//! standby, `/healthz` answering `503` with `"standby": true`, the
//! leadership figures in `/metrics` (`leaseagent_leader`,
//! `leaseagent_failovers_total`, `leaseagent_leader_epoch`), and the
//! status page's leadership section (who leads, since when, the replicas
//! seen and the recent takeovers), or the whole page of a standby.
//!
//! The leader's URL comes from the store (what the leader advertised); it
//! is shown escaped, and a client follows it only if it was configured
//! with it (`authority/http.rs`).

use std::fmt::Write;

use super::http::{ConnStats, Response};
use super::replica::{NotLeader, Replica};
use super::status::{Status, esc};
use crate::engine::history::rfc3339;
use crate::protocol::v1::{ErrorBody, ErrorCode};
use crate::time::wall_ms;

fn body(nl: &NotLeader, message: &str, standby: bool) -> Response {
    let b = ErrorBody {
        leader: Some(nl.leader.clone()),
        standby: standby.then_some(true),
        ..ErrorBody::new(ErrorCode::NotLeader, message)
    };
    Response::json(
        ErrorCode::NotLeader.status(),
        serde_json::to_vec(&b).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// The answer to a lease call on a replica that does not lead.
pub fn not_leader(nl: &NotLeader) -> Response {
    let message = match &nl.leader {
        Some(l) => format!("this replica does not lead; {l} does"),
        None => "this replica does not lead, and knows of no leader now".into(),
    };
    body(nl, &message, false)
}

/// `/healthz` of a replica that does not lead.
pub fn health(nl: &NotLeader) -> Response {
    body(nl, "standing by: this replica does not lead", true)
}

/// `/metrics` of a standby: it grants nothing (`leaseagent_up 0`), and its
/// connections.
pub fn metrics(conns: &ConnStats) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = String::with_capacity(512);
    let _ = writeln!(
        out,
        "# HELP leaseagent_up 1 while the authority can grant.\n# TYPE leaseagent_up gauge\nleaseagent_up 0"
    );
    let _ = writeln!(
        out,
        "# HELP leaseagent_connections Open client connections.\n# TYPE leaseagent_connections gauge\nleaseagent_connections {}",
        conns.open.load(Relaxed)
    );
    out
}

/// The leadership families, for any replica.
pub fn replica_metrics(out: &mut String, r: &Replica) {
    use std::sync::atomic::Ordering::Relaxed;
    let roster = r.roster();
    let leads = u8::from(r.leading().is_ok());
    let _ = writeln!(
        out,
        "# HELP leaseagent_leader 1 while this replica leads (answers lease calls).\n\
         # TYPE leaseagent_leader gauge\nleaseagent_leader {leads}\n\
         # HELP leaseagent_failovers_total Takeovers by this replica of a leadership another replica held.\n\
         # TYPE leaseagent_failovers_total counter\nleaseagent_failovers_total {}\n\
         # HELP leaseagent_leader_epoch The leadership epoch as this replica last saw it (bumped by every takeover).\n\
         # TYPE leaseagent_leader_epoch gauge\nleaseagent_leader_epoch {}",
        r.failovers.load(Relaxed),
        roster.epoch
    );
}

/// The status page's leadership section (empty for a single `serve` on
/// SQLite).
pub fn section(r: &Replica) -> String {
    if !r.replicated {
        return String::new();
    }
    let roster = r.roster();
    let now = wall_ms();
    let mut h = String::new();
    let me = if r.leading().is_ok() {
        "leading"
    } else {
        "standing by"
    };
    let _ = write!(
        h,
        "<h2>Leadership</h2><p id=\"leadership\">this replica ({}): <b>{me}</b>; leader: <b id=\"leader\">{}</b>{} (epoch {})</p>",
        esc(&r.url),
        roster.leader.as_deref().map_or("none".to_string(), esc),
        roster
            .since_ms
            .map_or(String::new(), |s| format!(" since {}", rfc3339(s))),
        roster.epoch
    );
    h.push_str("<table id=\"replicas\"><tr><th>replica</th><th>last seen</th></tr>");
    for s in &roster.replicas {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{} s ago</td></tr>",
            esc(&s.url),
            now.saturating_sub(s.seen_ms) / 1000
        );
    }
    h.push_str("</table><table id=\"takeovers\"><tr><th>epoch</th><th>leader</th><th>took over from</th><th>at</th></tr>");
    for t in &roster.takeovers {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.epoch,
            esc(&t.url),
            t.previous.as_deref().map_or("-".into(), esc),
            rfc3339(t.at_ms)
        );
    }
    h.push_str("</table>");
    h
}

/// The status page: the leader's (with its leadership section), or a
/// standby's (the section alone).
pub fn status_page(
    r: &Replica,
    status: &Status,
    conns: &ConnStats,
    covers: &dyn Fn(&str) -> bool,
) -> Response {
    let section = section(r);
    match r.leading() {
        Ok(t) => status.page(&t.engine, conns, covers, &section),
        Err(_) => {
            let html = format!(
                "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
                 <meta http-equiv=\"refresh\" content=\"{}\"><title>leaseagent status</title></head>\
                 <body><h1>leaseagent serve</h1><p>as of {}: a standby (lease calls go to the leader)</p>{section}</body></html>",
                super::status::REFRESH_SECS,
                rfc3339(wall_ms())
            );
            status.wrap(html)
        }
    }
}

/// The handler of `--status-listen`: the page, for everyone, and nothing
/// else (the listener is loopback-only; see `status.rs`). Here, not in
/// `status.rs`: the page it shows is a replica's, leading or not.
pub struct StatusOnly {
    pub replica: std::sync::Arc<super::replica::Replica>,
    pub conns: std::sync::Arc<ConnStats>,
    pub status: std::sync::Arc<Status>,
}

impl super::http::Handler for StatusOnly {
    fn answer(self: std::sync::Arc<Self>, req: &super::http::Request) -> super::http::Answer {
        use super::http::Answer;
        if req.path != "/" {
            return Answer::Now(Response::error(
                404,
                "not_found",
                "the status listener serves only /",
            ));
        }
        if req.method != "GET" && req.method != "HEAD" {
            return Answer::Now(Response::error(
                405,
                "method_not_allowed",
                &format!("{} is not allowed on /", req.method),
            ));
        }
        Answer::Blocking(Box::new(move || {
            status_page(&self.replica, &self.status, &self.conns, &|_| true)
        }))
    }
}
