//! The lease engine's storage, through real processes: an agent on the
//! embedded default waits out a peer holding the database's write lock;
//! corrupt rows and corrupt pages written into the SQLite file are errors
//! (exit 125, serve refuses to start), never a token restarted from 0;
//! `serve` keeps `held_for_operator` and its token sequence across a
//! restart, compacts released tasks, and hands out random lease ids.

use crate::support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use leaseagent::testing::{AcquireRequest, EmbeddedAuthority, ExpiryPolicy, LeaseClient};
use serde_json::{Value, json};
use support::authority::{Server, bin, poll};

const T: Duration = Duration::from_secs(10);

/// `leaseagent --task TASK -- sh -c SCRIPT` on the embedded default under `state`.
fn run_agent(state: &Path, task: &str, script: &str) -> Output {
    Command::new(bin())
        .args(["--task", task, "--ttl", "20s", "--", "sh", "-c", script])
        .env("LEASEAGENT_STATE_DIR", state)
        .env_remove("LEASEAGENT_AUTHORITY")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

fn hold_lease(db: &Path, task: &str) -> u64 {
    let mut a = EmbeddedAuthority::new(db.to_path_buf());
    a.acquire(
        &AcquireRequest {
            task: task.into(),
            holder: "holder".into(),
            ttl: Duration::from_secs(600),
            on_expiry: ExpiryPolicy::Redispatch,
            grace: Duration::ZERO,
        },
        T,
    )
    .unwrap()
    .token
}

#[test]
fn an_agent_waits_out_a_peer_holding_the_database_lock() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    // The database exists (a first run), then a peer takes the write lock.
    let first = run_agent(&state, "w", "true");
    assert!(first.status.success(), "{}", text(&first));
    let mut peer = rusqlite::Connection::open(state.join("leases.sqlite3")).unwrap();
    let tx = peer
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let state2 = state.clone();
    let started = Instant::now();
    let agent = std::thread::spawn(move || run_agent(&state2, "w", "echo ran-$LEASE_TOKEN"));
    // Hold the lock for 2 s, well inside the agent's acquire timeout (10 s).
    std::thread::sleep(Duration::from_secs(2));
    tx.commit().unwrap();
    let out = agent.join().unwrap();
    assert!(
        out.status.success(),
        "the agent must wait for the lock, not exit 125: {:?}\n{}",
        out.status,
        text(&out)
    );
    assert!(text(&out).contains("ran-2"), "{}", text(&out));
    assert!(started.elapsed() >= Duration::from_secs(2));
}

#[test]
fn a_corrupt_row_is_exit_125_and_the_job_never_runs() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    let db = state.join("leases.sqlite3");
    let token = hold_lease(&db, "c");
    assert_eq!(token, 1);
    let c = rusqlite::Connection::open(&db).unwrap();
    for (sql, column) in [
        ("UPDATE tasks SET token = -7", "token"),
        ("UPDATE tasks SET last_token = -1", "last_token"),
        ("UPDATE tasks SET policy = 'whenever'", "policy"),
    ] {
        c.execute_batch(&format!(
            "UPDATE tasks SET token = 1, last_token = 1, policy = 'redispatch', expires_ms = 0; {sql}"
        ))
        .unwrap();
        let out = run_agent(&state, "c", "echo JOB-RAN");
        assert_eq!(out.status.code(), Some(125), "{sql}: {}", text(&out));
        let t = text(&out);
        assert!(!t.contains("JOB-RAN"), "{sql}: {t}");
        assert!(t.contains("corrupt") && t.contains(column), "{sql}: {t}");
    }
    // A negative sequence is corrupt too: no grant restarts from 0 or 1.
    c.execute_batch(
        "UPDATE tasks SET token = 1, last_token = 1, policy = 'redispatch', expires_ms = 0;
         UPDATE seq SET last_token = -100",
    )
    .unwrap();
    let out = run_agent(&state, "other-task", "echo JOB-RAN");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(text(&out).contains("seq.last_token"), "{}", text(&out));
    // Repaired, the next grant is above every token ever issued.
    c.execute_batch("UPDATE seq SET last_token = 1").unwrap();
    let out = run_agent(&state, "c", "echo TOKEN=$LEASE_TOKEN");
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("TOKEN=2"), "{}", text(&out));
}

#[test]
fn garbage_bytes_over_the_database_file_are_exit_125_not_a_fresh_start() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    let db = state.join("leases.sqlite3");
    for t in ["g1", "g2", "g3"] {
        hold_lease(&db, t);
    }
    // Fold the WAL into the file, then overwrite every page after the first.
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    drop(c);
    let len = std::fs::metadata(&db).unwrap().len();
    assert!(len > 4096, "{len}");
    let mut bytes = std::fs::read(&db).unwrap();
    for (i, b) in bytes.iter_mut().enumerate().skip(4096) {
        *b = (i * 7 % 251) as u8;
    }
    std::fs::write(&db, &bytes).unwrap();
    let out = run_agent(&state, "g1", "echo JOB-RAN");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(!text(&out).contains("JOB-RAN"), "{}", text(&out));
}

fn acquire_hold(s: &Server, task: &str, ttl_ms: u64) -> Value {
    let (st, g) = s.post(
        "/v1/acquire",
        &json!({"task": task, "holder": "h", "ttl_ms": ttl_ms, "on_expiry": "hold"}),
    );
    assert_eq!(st, 200, "{g}");
    g
}

#[test]
fn serve_keeps_held_for_operator_across_a_restart() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Server::start(&d.path().join("serve.db"));
    let g = acquire_hold(&s, "h1", 1000);
    poll("the lease to be held", Duration::from_secs(10), || {
        (s.state_of("h1").as_deref() == Some("held_for_operator")).then_some(())
    });
    // Seen held: the record is written (without the request waiting for it).
    poll("the hold to be on disk", Duration::from_secs(10), || {
        let c = rusqlite::Connection::open(&s.db).ok()?;
        let held: i64 = c
            .query_row("SELECT held FROM tasks WHERE task = 'h1'", [], |r| r.get(0))
            .ok()?;
        (held == 1).then_some(())
    });
    s.crash_restart();
    assert_eq!(
        s.state_of("h1").as_deref(),
        Some("held_for_operator"),
        "held at once after the restart, not live for another ttl"
    );
    let (st, body) = s.renew(&g);
    assert_eq!(
        (st, body["error"].as_str()),
        (409, Some("expired")),
        "{body}"
    );
    let (st, body) = s.acquire("h1", "other", 1000);
    assert_eq!(
        (st, body["error"].as_str()),
        (409, Some("held_for_operator")),
        "{body}"
    );
    let (st, _) = s.post("/v1/clear", &json!({"task": "h1"}));
    assert_eq!(st, 200);
    let (st, g2) = s.acquire("h1", "other", 1000);
    assert_eq!(st, 200, "{g2}");
    assert!(g2["token"].as_u64() > g["token"].as_u64());
}

#[test]
fn serve_compacts_released_tasks_and_tokens_keep_rising_across_restarts() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Server::start(&d.path().join("serve.db"));
    let mut last = 0;
    let mut ids = Vec::new();
    for round in 0..3 {
        for i in 0..20 {
            let task = format!("c{i}");
            let (st, g) = s.acquire(&task, "h", 5000);
            assert_eq!(st, 200, "{g}");
            let token = g["token"].as_u64().unwrap();
            assert!(token > last, "round {round}: token {token} after {last}");
            last = token;
            let id = g["lease_id"].as_str().unwrap().to_string();
            let (key, rest) = id.split_once('.').unwrap();
            assert_eq!(rest, task);
            assert!(
                key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()),
                "{id}"
            );
            assert!(!id.contains(&format!(".{token}.")), "{id}");
            ids.push(key.to_string());
            let (st, body) = s.release(&g);
            assert_eq!(st, 200, "{body}");
        }
        // Releases are written without waiting: SIGTERM commits the queue.
        let status = s.terminate();
        assert!(status.success(), "{status:?}");
        let c = rusqlite::Connection::open(&s.db).unwrap();
        let rows: i64 = c
            .query_row("SELECT COUNT(*) FROM tasks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0, "released tasks are compacted");
        drop(c);
        s = Server::start(&s.db.clone());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 60, "every lease id is different");
}

#[test]
fn serve_refuses_to_start_on_a_corrupt_row() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("serve.db");
    let mut s = Server::start(&db);
    let g = acquire_hold(&s, "x", 60_000);
    assert_eq!(g["token"], 1);
    s.kill9();
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute("UPDATE tasks SET token = -1", []).unwrap();
    drop(c);
    let out = Command::new(bin())
        .args(["serve", "--no-auth", "--listen", "127.0.0.1:0", "--db"])
        .arg(&db)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("corrupt") && t.contains("token"), "{t}");
}

/// An ext4 image on a loop device, mounted `errors=remount-ro` (how Debian
/// mounts `/`); unmounted and detached when dropped.
struct Ext4 {
    _dir: tempfile::TempDir,
    loopdev: String,
    mnt: std::path::PathBuf,
    mounted: bool,
}

fn must(c: &mut Command, what: &str) -> Output {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", text(&out));
    out
}

impl Ext4 {
    fn new() -> Ext4 {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&img)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        must(
            Command::new("mkfs.ext4").arg("-q").arg(&img),
            "mkfs.ext4 (e2fsprogs) is needed",
        );
        let out = must(
            Command::new("losetup").args(["--show", "-f"]).arg(&img),
            "losetup (util-linux, as root) is needed",
        );
        let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let mut fs = Ext4 {
            _dir: dir,
            loopdev,
            mnt,
            mounted: false,
        };
        fs.mount();
        fs
    }

    fn mount(&mut self) {
        must(
            Command::new("mount")
                .args(["-o", "errors=remount-ro", &self.loopdev])
                .arg(&self.mnt),
            "mount",
        );
        self.mounted = true;
    }

    /// An ext4 error, as a failing disk raises one: the journal is
    /// aborted, the filesystem goes read-only and its dirty pages are lost.
    fn error(&self) {
        let dev = self.loopdev.trim_start_matches("/dev/");
        std::fs::write(format!("/sys/fs/ext4/{dev}/trigger_fs_error"), "1")
            .expect("ext4's trigger_fs_error (Linux 5.x+) is needed");
        // (Linux 6.x keeps the mount `rw` and refuses writes: `emergency_ro`.)
        let probe = std::fs::write(self.mnt.join("probe"), "");
        assert_eq!(
            probe.map_err(|e| e.raw_os_error()),
            Err(Some(rustix::io::Errno::ROFS.raw_os_error())),
            "read-only after the error"
        );
    }

    /// What the administrator does next: unmount, fsck, mount again.
    fn repair(&mut self) {
        must(Command::new("umount").arg(&self.mnt), "umount");
        self.mounted = false;
        // The device may stay busy for a moment after `umount`: a mount
        // namespace that held a copy of this mount (every job's keeper has
        // one, in this test and in the tests running beside it) drops its
        // last reference when it dies, and the kernel releases it on a
        // workqueue, after the namespace's last process was reaped. e2fsck
        // then says "is in use": asked again until the device is free.
        let until = Instant::now() + Duration::from_secs(20);
        let fsck = loop {
            let out = Command::new("e2fsck")
                .args(["-f", "-y", &self.loopdev])
                .output()
                .expect("e2fsck");
            if !text(&out).contains("is in use") || Instant::now() > until {
                break out;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // 0: clean, 1: errors corrected.
        assert!(matches!(fsck.status.code(), Some(0 | 1)), "{}", text(&fsck));
        self.mount();
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).status();
    }
}

/// [`run_agent`] with `--on-expiry hold`, task `h`.
fn run_hold(state: &Path, script: &str) -> Output {
    Command::new(bin())
        .args(["--task", "h", "--on-expiry", "hold", "--ttl", "20s"])
        .args(["--", "sh", "-c", script])
        .env("LEASEAGENT_STATE_DIR", state)
        .env_remove("LEASEAGENT_AUTHORITY")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The token the job was given (it prints `LEASE_TOKEN`).
fn token_of(o: &Output) -> u64 {
    assert!(o.status.success(), "{}", text(o));
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("a token")
}

#[test]
fn an_fs_error_that_drops_the_page_cache_never_reissues_a_token() {
    // The review's case: four grants, only the first syncing the ceiling;
    // an ext4 error drops the dirty pages; after fsck and a new mount in
    // the same boot the next grant got token 2 again, and a lost release
    // came back as a live lease.
    let mut fs = Ext4::new();
    let state = fs.mnt.join("state");
    let print = "echo $LEASE_TOKEN";
    let mut answered = Vec::new();
    for _ in 0..3 {
        answered.push(token_of(&run_agent(&state, "t", print)));
    }
    // A `hold` run: its grant is synced (so 1 to 4 are on disk); its
    // release must be too, or it comes back as a live lease that then
    // waits for an operator.
    let hold = run_hold(&state, print);
    answered.push(token_of(&hold));
    answered.push(token_of(&run_agent(&state, "t", print)));
    assert_eq!(answered, [1, 2, 3, 4, 5], "one token after another");

    fs.error();
    fs.repair();

    let after = run_agent(&state, "t", print);
    let token = token_of(&after);
    assert!(
        token > 5,
        "token {token} after the error: answered before were {answered:?}"
    );
    assert!(text(&after).contains("lost writes"), "{}", text(&after));
    // The hold run's release survived: the task is free.
    let again = run_hold(&state, print);
    assert!(token_of(&again) > token, "{}", text(&again));
}
