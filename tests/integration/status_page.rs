//! The status page in a real browser: headless chromium driven through
//! WebDriver (chromedriver), against a real `serve` with real agents
//! holding, losing their lease (revoked), dying under policy hold (held for
//! an operator, shown red) and finishing. Hostile holder names must show
//! as text and run nothing; the page must follow the leases as they
//! change. With LEASEAGENT_UPDATE_DOCS set, it saves the screenshot
//! docs/status-page.png.

use crate::support;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use support::authority::{bin, poll, post, spawn_serve};

const T: Duration = Duration::from_secs(90);

const SCRIPT_HOLDER: &str = "<script>window.__pwned = 'script'; document.title = 'pwned'</script>";
const IMG_HOLDER: &str = "<img src=x onerror=\"window.__pwned='img'\">";

/// A child process killed (and reaped) when dropped, with its whole process
/// group when it leads one (chromedriver: the browser it started must not
/// outlive a failed test).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn require(program: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{program} is missing: scripts/test installs it (Debian: chromium, chromium-driver)"
    );
}

/// An agent holding `task` as `holder` while `cmd` runs.
fn agent(url: &str, task: &str, holder: &str, extra: &[&str], cmd: &[&str]) -> Killed {
    let child = Command::new(bin())
        .args(["--authority", url, "--task", task, "--holder", holder])
        .args(extra)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Killed(child)
}

/// The listing of `serve` at `addr`, as (task, state) pairs.
fn leases(addr: &str) -> Vec<(String, String)> {
    let (st, b) = support::authority::request(addr, "GET", "/v1/leases", b"", T).unwrap();
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    v["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["task"].as_str().unwrap().to_string(),
                l["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn state_of(addr: &str, task: &str) -> Option<String> {
    leases(addr)
        .into_iter()
        .find(|(t, _)| t == task)
        .map(|(_, s)| s)
}

/// Polls `check` on the page's current DOM (the page reloads itself) until
/// it holds, or panics with the page at the deadline.
async fn until(c: &Client, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + T;
    loop {
        let html = c.source().await.unwrap();
        if check(&html) {
            return html;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the page to show {what}:\n{html}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The text of the table row of `task` in the table `#id` ("" if none).
async fn row_text(c: &Client, id: &str, task: &str) -> String {
    let Ok(rows) = c.find_all(Locator::Css(&format!("#{id} tr"))).await else {
        return String::new();
    };
    for r in rows {
        let text = r.text().await.unwrap_or_default();
        if text.starts_with(task) {
            return text;
        }
    }
    String::new()
}

#[test]
fn the_status_page_in_a_real_browser() {
    require("chromium");
    require("chromedriver");
    let dir = tempfile::tempdir().unwrap();
    let served = spawn_serve(
        &dir.path().join("leases.db"),
        &[
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--status-listen".into(),
            "127.0.0.1:0".into(),
            "--status-held-alert".into(),
            "1s".into(),
        ],
    );
    let addr = served.addr.clone();
    let url = format!("http://{addr}");
    let status_url = loop {
        let line = served.stderr.recv_timeout(T).expect("the status line");
        if let Some(u) = line.strip_prefix("leaseagent serve: status page on ") {
            break u.trim().to_string();
        }
    };
    let _serve = Killed(served.child);

    // Real agents: two hostile holders holding, one that will finish, one
    // that will be revoked, one that dies under policy hold.
    let stop = dir.path().join("stop");
    let wait_stop = format!("while [ ! -e {} ]; do sleep 0.1; done", stop.display());
    let _a = agent(
        &url,
        "nightly-export",
        SCRIPT_HOLDER,
        &[],
        &["sh", "-c", &wait_stop],
    );
    let _b = agent(&url, "etl/images", IMG_HOLDER, &[], &["sleep", "120"]);
    let _c = agent(&url, "reports", "worker-3/77", &[], &["sleep", "120"]);
    let mut dying = agent(
        &url,
        "billing",
        "worker-9/99",
        &["--ttl", "1s", "--on-expiry", "hold"],
        &["sleep", "3"],
    );
    poll("four leases", T, || {
        (leases(&addr).len() == 4).then_some(())
    });
    let _ = dying.0.kill();
    let _ = dying.0.wait();
    poll("billing held for an operator", T, || {
        (state_of(&addr, "billing").as_deref() == Some("held_for_operator")).then_some(())
    });
    let done = Command::new(bin())
        .args(["--authority", &url, "--task", "hourly", "--", "true"])
        .status()
        .unwrap();
    assert!(done.success());

    let port = free_port();
    let driver = Killed(
        Command::new("chromedriver")
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    poll("chromedriver to listen", T, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let profile = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(browse(port, profile.path(), &status_url, &addr, &stop));
    drop(driver);
}

async fn browse(port: u16, profile: &Path, status_url: &str, addr: &str, stop: &Path) {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ]
        }),
    );
    let c = ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to chromedriver");
    c.goto(status_url).await.unwrap();

    // Everything is listed; held for an operator comes first, red.
    let html = until(&c, "every lease", |h| {
        [
            "billing",
            "nightly-export",
            "etl/images",
            "reports",
            "hourly",
        ]
        .iter()
        .all(|t| h.contains(t))
    })
    .await;
    let held_at = html.find("id=\"held\"").expect("the held table");
    let leases_at = html.find("id=\"leases\"").expect("the leases table");
    assert!(held_at < leases_at, "held for an operator comes first");
    until(&c, "billing in red", |h| h.contains("class=\"alert\"")).await;
    let cell = c
        .find(Locator::Css("#held tr.alert td"))
        .await
        .expect("a red row");
    assert_eq!(cell.text().await.unwrap(), "billing");
    let bg = cell.css_value("background-color").await.unwrap();
    assert_eq!(bg, "rgba(255, 221, 221, 1)", "the held row is red");
    assert!(
        row_text(&c, "held", "billing")
            .await
            .contains("worker-9/99")
    );

    // Hostile holders are text: nothing ran, no element was made of them.
    let row = row_text(&c, "leases", "nightly-export").await;
    assert!(row.contains(SCRIPT_HOLDER), "{row}");
    let row = row_text(&c, "leases", "etl/images").await;
    assert!(row.contains(IMG_HOLDER), "{row}");
    assert!(c.find_all(Locator::Css("img")).await.unwrap().is_empty());
    assert_eq!(c.find_all(Locator::Css("script")).await.unwrap().len(), 0);
    assert_eq!(c.title().await.unwrap(), "leaseagent status");
    let pwned = c
        .execute("return typeof window.__pwned", vec![])
        .await
        .unwrap();
    assert_eq!(pwned, json!("undefined"));
    // The finished run is among the recent attempts, with its outcome.
    let recent = row_text(&c, "recent", "hourly").await;
    assert!(
        recent.contains("released") && recent.contains("succeeded"),
        "{recent}"
    );
    let figures = c.find(Locator::Id("connections")).await.unwrap();
    assert!(figures.text().await.unwrap().parse::<u64>().unwrap() >= 3);
    // Five grants so far: the figure counts those of the last minute, never
    // extrapolates a few seconds to a minute (that would show far more than
    // 5). On a slow machine the first grants may already be a minute old.
    let grants = c.find(Locator::Id("grants")).await.unwrap();
    let grants: f64 = grants.text().await.unwrap().parse().unwrap();
    assert!((1.0..=5.0).contains(&grants), "grants per minute: {grants}");

    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    // The README's screenshot is refreshed on request only: a test run
    // leaves the checkout as it found it.
    if std::env::var_os("LEASEAGENT_UPDATE_DOCS").is_some() {
        let shot = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/status-page.png"));
        std::fs::write(&shot, &png).unwrap();
    }

    // The page follows the leases: a revoked agent loses its lease, a job
    // finishes (released, succeeded), the held task is cleared.
    let (st, _) = post(
        addr,
        "/v1/revoke",
        &json!({"task": "reports", "force": true}),
    );
    assert_eq!(st, 200);
    std::fs::write(stop, b"").unwrap();
    let (st, _) = post(addr, "/v1/clear", &json!({"task": "billing"}));
    assert_eq!(st, 200);
    until(&c, "the changes", |h| h.contains("id=\"held-none\"")).await;
    let deadline = Instant::now() + T;
    loop {
        let nightly = row_text(&c, "recent", "nightly-export").await;
        let reports = row_text(&c, "recent", "reports").await;
        let billing = row_text(&c, "recent", "billing").await;
        let still_held = row_text(&c, "leases", "reports").await;
        if nightly.contains("released")
            && nightly.contains("succeeded")
            && reports.contains("revoked")
            && billing.contains("cleared")
            && still_held.is_empty()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the page did not follow: {nightly:?} {reports:?} {billing:?} {still_held:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.close().await.unwrap();
}
