//! The status page: `GET /` answers one self-contained HTML page for
//! people (no external assets, no script): tasks held for an operator
//! first (red past a threshold), the leases held now, the recent attempts
//! and how they ended, and the few figures an operator looks at (agents
//! connected, grants and refusals per minute). It refreshes itself every
//! few seconds (`<meta http-equiv="refresh">`).
//!
//! Read-only, and scoped like the listing: on the main listener it needs a
//! principal with the reader role and shows only the tasks in its scope.
//! `--status-listen` serves the same page, and nothing else, on a loopback
//! address without credentials (a browser on the host, or through an SSH
//! tunnel), showing every task: see docs/history.md for why.
//!
//! Everything that came from a client (task names, holders) is
//! HTML-escaped, attribute-safe, before it is written: a holder named
//! `<script>…` is shown as text and runs nothing.
//!
//! Per-minute figures are differences of the engine's counters between now
//! and a sample taken about a minute ago, kept in a short queue filled by
//! the page views themselves (no thread, no timer). While serve is younger
//! than a minute (or the page was not viewed for a while) they are the
//! counts since the oldest sample over one minute, never a few seconds
//! extrapolated.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::http::{ConnStats, Response};
use crate::engine::batched::BatchedEngine;
use crate::engine::history::rfc3339;
use crate::lease::{LeaseInfo, LeaseState};
use crate::time::duration::format as human;
use crate::time::{ms, wall_ms};

/// How often the page reloads itself.
pub const REFRESH_SECS: u64 = 2;
/// Most rows shown in the held-for-an-operator and the leases sections
/// (the rest counted).
const MAX_ROWS: usize = 200;
const RECENT: usize = 30;
/// Most history rows read to find the [`RECENT`] attempts in scope.
const RECENT_SCAN: usize = 10_000;

/// A counter sample: when, grants, renewal/release refusals, acquires refused.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    grants: u64,
    refused: u64,
    acquire_refused: u64,
}

/// The page's settings and its counter samples.
pub struct Status {
    /// A task held for an operator longer than this is shown red.
    pub held_alert: Duration,
    samples: Mutex<VecDeque<Sample>>,
}

fn sample(e: &BatchedEngine) -> Sample {
    let c = &e.counters;
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    Sample {
        at: Instant::now(),
        grants: l(&c.grants),
        refused: c.refused.iter().map(l).sum(),
        acquire_refused: l(&c.acquire_held) + l(&c.acquire_held_for_operator),
    }
}

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn ago(ms: u64) -> String {
    human(Duration::from_millis(ms))
}

impl Status {
    pub fn new(held_alert: Duration) -> Self {
        Status {
            held_alert,
            // The counters start at zero with the process (a replica's
            // go on across its terms as leader): the first sample.
            samples: Mutex::new(VecDeque::from([Sample {
                at: Instant::now(),
                grants: 0,
                refused: 0,
                acquire_refused: 0,
            }])),
        }
    }

    /// Per-minute rates (grants, refusals, acquires refused): the counts
    /// since the oldest kept sample (the newest one at least a minute old,
    /// if any), over that span but never less than a minute.
    fn rates(&self, now: Sample) -> (f64, f64, f64) {
        let mut q = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        while q.len() >= 2 && q[1].at + Duration::from_secs(60) <= now.at {
            q.pop_front();
        }
        let base = q.front().copied().unwrap_or(now);
        if q.len() < 64 {
            q.push_back(now);
        }
        // Over less than a minute of samples, the count so far (never
        // extrapolated from a few seconds).
        let span = now.at.duration_since(base.at).as_secs_f64().max(60.0);
        let per_min = |a: u64, b: u64| a.saturating_sub(b) as f64 * 60.0 / span;
        (
            per_min(now.grants, base.grants),
            per_min(now.refused, base.refused),
            per_min(now.acquire_refused, base.acquire_refused),
        )
    }

    /// The page, showing the tasks `covers` accepts, with `extra` (HTML:
    /// the leadership of replicas) after its figures.
    pub fn page(
        &self,
        engine: &BatchedEngine,
        conns: &ConnStats,
        covers: &dyn Fn(&str) -> bool,
        extra: &str,
    ) -> Response {
        self.wrap(self.render(engine, conns, covers, extra))
    }

    /// An HTML page as the answer, with the page's headers.
    pub fn wrap(&self, body: String) -> Response {
        Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            headers: vec![
                (
                    "content-security-policy",
                    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
                        .to_string(),
                ),
                // For browsers that predate frame-ancestors: no page may
                // frame this one (clickjacking, reading it through a frame).
                ("x-frame-options", "DENY".to_string()),
                ("x-content-type-options", "nosniff".to_string()),
                ("cache-control", "no-store".to_string()),
            ],
            body: body.into_bytes(),
        }
    }

    fn render(
        &self,
        engine: &BatchedEngine,
        conns: &ConnStats,
        covers: &dyn Fn(&str) -> bool,
        extra: &str,
    ) -> String {
        let now = wall_ms();
        let (grants, refused, acq_refused) = self.rates(sample(engine));
        let mut h = String::with_capacity(16 * 1024);
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
             <title>leaseagent status</title><style>\
             body{{font-family:sans-serif;margin:1.5em;color:#222}}\
             table{{border-collapse:collapse;margin-bottom:1.5em}}\
             th,td{{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:.9em}}\
             th{{background:#eee}} .alert td{{background:#fdd;color:#900;font-weight:bold}}\
             .figures span{{margin-right:2em}} .none{{color:#777}}\
             </style></head><body>\
             <h1>leaseagent serve</h1><p class=\"none\">as of {} (refreshes every {REFRESH_SECS}s)</p>",
            rfc3339(now)
        );
        let _ = write!(
            h,
            "<p class=\"figures\" id=\"figures\"><span>authority: <b>{}</b></span>\
             <span>agents connected: <b id=\"connections\">{}</b></span>\
             <span>grants/min: <b id=\"grants\">{grants:.1}</b></span>\
             <span>renewals refused/min: <b id=\"refusals\">{refused:.1}</b></span>\
             <span>acquires refused/min: <b>{acq_refused:.1}</b></span></p>",
            if engine.healthy() { "up" } else { "FAILED" },
            conns.open.load(Ordering::Relaxed),
        );
        h.push_str(extra);
        self.held_section(&mut h, engine, covers, now);
        leases_section(&mut h, engine, covers, now);
        recent_section(&mut h, engine, covers, now);
        h.push_str("</body></html>\n");
        h
    }

    fn held_section(
        &self,
        h: &mut String,
        engine: &BatchedEngine,
        covers: &dyn Fn(&str) -> bool,
        now: u64,
    ) {
        let mut held: Vec<_> = engine
            .held_for_operator()
            .into_iter()
            .filter(|(i, _)| covers(&i.task))
            .collect();
        h.push_str("<h2>Held for an operator</h2>");
        if held.is_empty() {
            h.push_str("<p class=\"none\" id=\"held-none\">none</p>");
            return;
        }
        let rest = held.len().saturating_sub(MAX_ROWS);
        held.truncate(MAX_ROWS);
        h.push_str(
            "<table id=\"held\"><tr><th>task</th><th>holder</th><th>token</th>\
             <th>held for</th><th>to free it</th></tr>",
        );
        let alert = ms(self.held_alert);
        for (i, since) in held {
            let for_ms = since.map(|s| now.saturating_sub(s));
            let class = if for_ms.is_some_and(|m| m >= alert) {
                " class=\"alert\""
            } else {
                ""
            };
            let _ = write!(
                h,
                "<tr{class}><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td><code>leaseagent clear {}</code></td></tr>",
                esc(&i.task),
                esc(&i.holder),
                i.token,
                for_ms.map_or_else(|| "unknown".to_string(), ago),
                esc(&i.task),
            );
        }
        h.push_str("</table>");
        more_rows(h, "held-more", rest, "leaseagent leases");
    }
}

/// "and N more" under a section cut at [`MAX_ROWS`].
fn more_rows(h: &mut String, id: &str, rest: usize, command: &str) {
    if rest > 0 {
        let _ = write!(
            h,
            "<p class=\"none\" id=\"{id}\">and {rest} more: see <code>{command}</code></p>"
        );
    }
}

/// The leases in scope, in task order, not held for an operator: the
/// first [`MAX_ROWS`] and how many more. Scope is applied before the cut
/// (a reader whose tasks sort late still sees them), reading the engine a
/// page at a time (its lock is let go between pages).
fn leases_in_scope(
    engine: &BatchedEngine,
    covers: &dyn Fn(&str) -> bool,
) -> (Vec<LeaseInfo>, usize) {
    let mut shown = Vec::new();
    let mut rest = 0usize;
    let mut after: Option<String> = None;
    loop {
        let page = engine.leases_page(after.as_deref(), crate::engine::MAX_PAGE);
        for l in page.leases {
            if l.state == LeaseState::HeldForOperator || !covers(&l.task) {
                continue;
            }
            if shown.len() < MAX_ROWS {
                shown.push(l);
            } else {
                rest += 1;
            }
        }
        match page.next_after {
            Some(next) if after.as_ref() != Some(&next) => after = Some(next),
            _ => return (shown, rest),
        }
    }
}

fn leases_section(h: &mut String, engine: &BatchedEngine, covers: &dyn Fn(&str) -> bool, now: u64) {
    let (leases, rest) = leases_in_scope(engine, covers);
    h.push_str("<h2>Held now</h2>");
    if leases.is_empty() {
        h.push_str("<p class=\"none\" id=\"leases-none\">no lease is held</p>");
        return;
    }
    h.push_str(
        "<table id=\"leases\"><tr><th>task</th><th>holder</th><th>token</th><th>state</th>\
         <th>held for</th><th>expires in</th></tr>",
    );
    for l in &leases {
        let held = engine
            .attempt_times(l.token)
            .map_or_else(|| "-".to_string(), |(a, _)| ago(now.saturating_sub(a)));
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{held}</td><td>{}</td></tr>",
            esc(&l.task),
            esc(&l.holder),
            l.token,
            l.state,
            l.expires_in_ms.map_or_else(|| "-".to_string(), ago),
        );
    }
    h.push_str("</table>");
    more_rows(h, "leases-more", rest, "leaseagent leases");
}

fn recent_section(h: &mut String, engine: &BatchedEngine, covers: &dyn Fn(&str) -> bool, now: u64) {
    h.push_str("<h2>Recent attempts</h2>");
    let pages = |t: Option<&str>, b: Option<u64>, n: usize| engine.history_page(t, b, n);
    let recent = match history_in_scope(&pages, (None, None), RECENT, RECENT_SCAN, covers) {
        Ok((r, _)) => r,
        Err(e) => {
            let _ = write!(h, "<p>history unavailable: {}</p>", esc(&e.to_string()));
            return;
        }
    };
    if recent.is_empty() {
        h.push_str("<p class=\"none\" id=\"recent-none\">none yet</p>");
        return;
    }
    h.push_str(
        "<table id=\"recent\"><tr><th>task</th><th>token</th><th>holder</th><th>started</th>\
         <th>held</th><th>ended</th><th>outcome</th><th>exit</th></tr>",
    );
    for r in &recent {
        let dash = || "-".to_string();
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td title=\"{}\">{} ago</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.task),
            r.token,
            esc(&r.holder),
            rfc3339(r.acquired_ms),
            ago(now.saturating_sub(r.acquired_ms)),
            r.held_ms.map_or_else(dash, ago),
            r.ended.map_or("running", |e| e.as_str()),
            r.outcome.map_or("-", |o| o.as_str()),
            r.exit_code.map_or_else(dash, |c| c.to_string()),
        );
    }
    h.push_str("</table>");
}

/// Where pages of history come from: the leading engine, or a standby's
/// reader of the store (`(task, before, limit)`, newest first).
pub type HistoryPages<'a> = dyn Fn(
        Option<&str>,
        Option<u64>,
        usize,
    ) -> Result<Vec<crate::engine::history::Record>, crate::engine::EngineError>
    + 'a;

/// Up to `limit` attempts that `covers` accepts, newest first, below
/// `before` (of `task`, or of all), reading at most `max_scan` rows; and
/// the token to resume below when more may remain (the last row read,
/// which may be out of scope: `/v1/history` only gives it out sealed).
/// Scope is applied before the cut: a page is never emptied by rows the
/// caller may not see. Used by the page and by `/v1/history`.
pub fn history_in_scope(
    pages: &HistoryPages,
    (task, mut before): (Option<&str>, Option<u64>),
    limit: usize,
    max_scan: usize,
    covers: &dyn Fn(&str) -> bool,
) -> Result<(Vec<crate::engine::history::Record>, Option<u64>), crate::engine::EngineError> {
    const CHUNK: usize = 500;
    let mut out = Vec::new();
    let mut scanned = 0;
    while scanned < max_scan {
        let want = CHUNK.min(max_scan - scanned);
        let rows = pages(task, before, want)?;
        let more = rows.len() == want;
        for r in rows {
            scanned += 1;
            before = Some(r.token);
            if covers(&r.task) {
                out.push(r);
                if out.len() == limit {
                    return Ok((out, before));
                }
            }
        }
        if !more {
            return Ok((out, None));
        }
    }
    Ok((out, before))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"<img src=x onerror=alert(1)>"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;&lt;img src=x onerror=alert(1)&gt;"
        );
    }
}
