//! The table-format recipes, `examples/delta-fenced-write.py` (Delta Lake,
//! delta-rs) and `examples/iceberg-fenced-write.py` (Apache Iceberg,
//! pyiceberg's SQL catalog), run for real with the pinned packages of
//! `examples/requirements.txt`.
//!
//! For each format:
//! - the zombie end to end under real agents against `leaseagent serve`:
//!   attempt A passes its token check, freezes right before its commit (the
//!   recipe's test hook stops it), its agent is frozen past the lease, B gets
//!   a higher token and commits, A thaws first and its commit must be refused
//!   (exit 3, `superseded`), leaving only B's rows in the partition and no
//!   commit of A's token in the table's history;
//! - a race: writers with tokens 7 and 8 both pass their check, are held at
//!   the commit, and are released together, `RACE_TRIALS` times. Whichever
//!   commit the table takes first, a commit of 7 never follows one of 8 in
//!   the history, and the partition ends with 8's rows. Holding both at the
//!   commit (instead of just starting them together) makes every trial a real
//!   race of two commits from the same table version, which is what the
//!   table's optimistic concurrency must settle;
//! - refusals and bad input: lower and equal tokens exit 3 naming the token
//!   seen; missing or malformed `LEASE_TOKEN` and bad arguments exit 2; the
//!   table is unchanged by all of them.
//!
//! The Python interpreter is `LEASEAGENT_PY` (set by `scripts/test`, which
//! creates the virtual environment), else `target/py-venv/bin/python`. A
//! missing interpreter or package fails the tests; they never skip.

use crate::fence_zombie::{Serve, freeze_and_take_over, logs as agent_logs, start_serve};
use crate::support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::fence::*;
use support::stop::StopGuard;

/// Race trials per format; each is two writers started, held and released.
const RACE_TRIALS: usize = 20;
const SUPERSEDED: i32 = 3;
const USAGE: i32 = 2;

fn python() -> PathBuf {
    let py = std::env::var_os("LEASEAGENT_PY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/target/py-venv/bin/python"
            ))
        });
    let check = Command::new(&py)
        .args(["-c", "import deltalake, pyiceberg, pyarrow, sqlalchemy"])
        .output();
    match check {
        Ok(o) if o.status.success() => py,
        other => panic!(
            "the table-format tests need a Python with examples/requirements.txt installed \
             (scripts/test creates it: python3 -m venv target/py-venv && \
             target/py-venv/bin/pip install -r examples/requirements.txt; or set LEASEAGENT_PY); \
             {}: {other:?}",
            py.display()
        ),
    }
}

#[derive(Clone, Copy, Debug)]
enum Format {
    Delta,
    Iceberg,
}

/// One table of one format in a test directory.
struct Table {
    format: Format,
    /// The Delta table's directory, or the Iceberg warehouse.
    location: PathBuf,
}

const ICEBERG_TABLE: &str = "lake.events";

impl Table {
    fn new(format: Format, dir: &Path) -> Table {
        let location = dir.join(match format {
            Format::Delta => "delta-table",
            Format::Iceberg => "warehouse",
        });
        if let Format::Iceberg = format {
            std::fs::create_dir_all(&location).unwrap();
        }
        Table { format, location }
    }

    fn script(&self) -> &'static str {
        match self.format {
            Format::Delta => concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/delta-fenced-write.py"
            ),
            Format::Iceberg => concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/iceberg-fenced-write.py"
            ),
        }
    }

    /// The recipe's arguments for partition `part`.
    fn args(&self, part: &str) -> Vec<OsString> {
        let mut a = vec![self.location.clone().into_os_string()];
        if let Format::Iceberg = self.format {
            a.push(ICEBERG_TABLE.into());
        }
        a.push(part.into());
        a
    }

    /// The recipe as a command, `LEASE_TASK`/`LEASE_TOKEN` as given.
    fn writer(&self, py: &Path, task: &str, token: Option<&str>, part: &str) -> Command {
        let mut c = Command::new(py);
        c.arg(self.script())
            .args(self.args(part))
            .env("LEASE_TASK", task)
            .env_remove("LEASE_TOKEN")
            .env_remove("LEASEAGENT_TEST_PAUSE_BEFORE_COMMIT")
            .stdin(Stdio::null());
        if let Some(t) = token {
            c.env("LEASE_TOKEN", t);
        }
        c
    }

    fn write(&self, py: &Path, task: &str, token: Option<&str>, part: &str) -> Output {
        self.writer(py, task, token, part)
            .output()
            .expect("run the recipe")
    }

    /// What the table holds for `task` and `part` (support/table_state.py).
    fn state(&self, py: &Path, task: &str, part: &str) -> State {
        let fmt = match self.format {
            Format::Delta => "delta",
            Format::Iceberg => "iceberg",
        };
        let mut c = Command::new(py);
        c.arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/integration/support/table_state.py"
        ))
        .arg(fmt)
        .arg(&self.location);
        if let Format::Iceberg = self.format {
            c.arg(ICEBERG_TABLE);
        }
        let out = c.args([task, part]).output().expect("run table_state.py");
        assert!(
            out.status.success(),
            "table_state.py {task} {part} exited {:?}: {} (stdout {:?})",
            out.status,
            stderr(&out),
            String::from_utf8_lossy(&out.stdout)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("table_state JSON");
        let tokens = |k: &str| -> Vec<u64> {
            v[k].as_array()
                .unwrap_or_else(|| panic!("{k} in {v}"))
                .iter()
                .map(|t| t.as_u64().expect("token"))
                .collect()
        };
        State {
            history: tokens("history"),
            rows: tokens("rows"),
        }
    }
}

/// Tokens recorded for a task in commit order, and the partition's rows.
#[derive(Debug, PartialEq, Eq, Clone)]
struct State {
    history: Vec<u64>,
    rows: Vec<u64>,
}

impl State {
    /// Never a commit with a lower token after a higher one. (An Iceberg
    /// overwrite adds two snapshots with the same token, hence not strict.)
    fn in_token_order(&self) -> bool {
        self.history.windows(2).all(|w| w[0] <= w[1])
    }
}

/// `s` in single quotes for `sh -c`.
fn sq(s: impl AsRef<std::ffi::OsStr>) -> String {
    let s = s.as_ref().to_str().expect("UTF-8 path");
    assert!(!s.contains('\''), "no quote in test paths: {s}");
    format!("'{s}'")
}

fn zombie(format: Format) {
    let py = python();
    let d = tempfile::tempdir().unwrap();
    let serve: Serve = start_serve(d.path());
    let table = Table::new(format, d.path());
    let work = d.path().join("work");
    let task = format!("zombie-{format:?}").to_lowercase();
    let part = "2026-12-01";
    let cmd = std::iter::once(sq(&py))
        .chain(std::iter::once(sq(table.script())))
        .chain(table.args(part).iter().map(sq))
        .collect::<Vec<_>>()
        .join(" ");
    // A: its recipe stops itself after the check, right before the commit.
    let job_a = format!(
        "echo \"$LEASE_TOKEN\" > \"$WORK/a.token\"\n\
         LEASEAGENT_TEST_PAUSE_BEFORE_COMMIT=\"$WORK/a.pid\" {cmd} 2> \"$WORK/a.err\"\n\
         echo $? > \"$WORK/a.rc.tmp\" && mv \"$WORK/a.rc.tmp\" \"$WORK/a.rc\"\n"
    );
    let job_b = format!("echo \"$LEASE_TOKEN\" > \"$WORK/b.token\"\n{cmd}\n");
    let t = freeze_and_take_over(&serve, &work, &task, &job_a, &job_b);

    let token = |f: &str| -> u64 {
        read_opt(&work.join(f))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("{f}"))
    };
    let (a, b) = (token("a.token"), token("b.token"));
    let a_err = read_opt(&work.join("a.err")).unwrap_or_default();
    let logs = agent_logs(&work);
    let state = table.state(&py, &task, part);
    eprintln!(
        "{format:?} zombie: A (token {a}) late commit exit {}: {a_err}",
        t.a_rc
    );
    assert!(b > a, "B's token {b} must be above A's {a}");
    assert_eq!(t.b_agent, 0, "B committed\n{logs}");
    assert_eq!(t.a_rc, SUPERSEDED, "A's late commit: {a_err}\n{logs}");
    assert!(
        a_err.contains(&format!("token {a} superseded by {b}")) && a_err.lines().count() == 1,
        "one line naming the token seen: {a_err:?}"
    );
    assert_eq!(t.a_agent, 124, "A's agent: lease lost\n{logs}");
    assert!(
        !state.history.contains(&a),
        "A's token never committed: {state:?}"
    );
    assert_eq!(state.history.last(), Some(&b), "{state:?}");
    assert_eq!(state.rows, vec![b; 3], "only B's rows in the partition");
}

#[test]
fn delta_zombie_commit_is_refused() {
    zombie(Format::Delta);
}

#[test]
fn iceberg_zombie_commit_is_refused() {
    zombie(Format::Iceberg);
}

/// A writer held at its commit by the recipe's test hook (it stops
/// itself); killed on drop if the trial ends before it is resumed.
struct Held {
    child: Child,
    pid_file: PathBuf,
    stopped: StopGuard,
}

fn hold(table: &Table, py: &Path, task: &str, token: &str, part: &str, dir: &Path) -> Held {
    let pid_file = dir.join(format!("{task}-{token}.pid"));
    let child = table
        .writer(py, task, Some(token), part)
        .env("LEASEAGENT_TEST_PAUSE_BEFORE_COMMIT", &pid_file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the recipe");
    let mut stopped = StopGuard::new();
    stopped.watch(child.id() as i32);
    Held {
        child,
        pid_file,
        stopped,
    }
}

impl Held {
    /// Waits until the writer has stopped itself; returns its pid. A writer
    /// that exits first fails the test at once, with its stderr (a busy
    /// machine makes the imports slow, never a crash look like a timeout).
    fn stopped(&mut self) -> i32 {
        let (pid_file, child) = (&self.pid_file, &mut self.child);
        let pid: i32 = poll(
            "a writer to reach its commit",
            Duration::from_secs(180),
            || {
                if let Some(pid) = read_opt(pid_file).and_then(|s| s.trim().parse().ok()) {
                    return Some(pid);
                }
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "the writer exited ({status}) before its commit: {}",
                        support::stderr_of(child)
                    );
                }
                None
            },
        );
        self.stopped.watch(pid);
        poll("a writer to stop", Duration::from_secs(30), || {
            (proc_state(pid) == Some('T')).then_some(())
        });
        pid
    }

    fn resume(&self, pid: i32) {
        self.stopped.resume(pid);
    }

    fn finish(mut self) -> (i32, String) {
        let rc = wait_child(&mut self.child, "a racing writer", Duration::from_secs(180));
        (rc, support::stderr_of(&mut self.child))
    }
}

fn race(format: Format) {
    let py = python();
    let d = tempfile::tempdir().unwrap();
    let table = Table::new(format, d.path());
    let started = Instant::now();
    let (mut seven_first, mut seven_refused) = (0, 0);
    for i in 0..RACE_TRIALS {
        // A fresh task and partition per trial, in one table.
        let (task, part) = (format!("race-{i}"), format!("p{i}"));
        let mut w7 = hold(&table, &py, &task, "7", &part, d.path());
        let mut w8 = hold(&table, &py, &task, "8", &part, d.path());
        let (p7, p8) = (w7.stopped(), w8.stopped());
        // Both passed the check on the same table version. Release them in
        // alternating order, the second 0 to 200 ms after the first: a
        // spread of interleavings (commits racing; one commit landing while
        // the other is still writing its files), not a timing assertion.
        let (first, second) = if i % 2 == 0 {
            ((&w7, p7), (&w8, p8))
        } else {
            ((&w8, p8), (&w7, p7))
        };
        first.0.resume(first.1);
        std::thread::sleep(Duration::from_millis(50 * (i as u64 / 2 % 5)));
        second.0.resume(second.1);
        let ((rc7, err7), (rc8, err8)) = (w7.finish(), w8.finish());
        let state = table.state(&py, &task, &part);
        let what = format!("trial {i}: 7 -> {rc7} {err7:?}, 8 -> {rc8} {err8:?}, {state:?}");
        assert!(
            state.in_token_order(),
            "a lower token after a higher: {what}"
        );
        assert_eq!(rc8, 0, "8 always commits: {what}");
        assert_eq!(
            state.rows,
            vec![8; 3],
            "the partition holds 8's rows: {what}"
        );
        match rc7 {
            0 => {
                seven_first += 1;
                assert_eq!(state.history.first(), Some(&7), "{what}");
            }
            SUPERSEDED => {
                seven_refused += 1;
                assert!(err7.contains("token 7 superseded by 8"), "{what}");
                // 7 passed its check before 8 committed: what refused it
                // is the table's own commit, not the check.
                assert!(err7.contains("refused this attempt's commit"), "{what}");
                assert!(!state.history.contains(&7), "{what}");
            }
            _ => panic!("7 failed otherwise: {what}"),
        }
    }
    eprintln!(
        "{format:?} race: {RACE_TRIALS} trials, 7 committed first (then 8) {seven_first}, \
         7 refused after 8 {seven_refused}, never 7 after 8; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn delta_race_keeps_token_order() {
    race(Format::Delta);
}

#[test]
fn iceberg_race_keeps_token_order() {
    race(Format::Iceberg);
}

fn refusals(format: Format) {
    let py = python();
    let d = tempfile::tempdir().unwrap();
    let table = Table::new(format, d.path());
    let (task, part) = ("nightly", "2026-12-01");
    let ok = table.write(&py, task, Some("8"), part);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let before = table.state(&py, task, part);
    assert_eq!(before.rows, vec![8; 3]);

    for (token, seen) in [
        ("7", "token 7 superseded by 8"),
        ("8", "token 8 superseded by 8"),
    ] {
        let o = table.write(&py, task, Some(token), part);
        assert_eq!(o.status.code(), Some(SUPERSEDED), "{}", stderr(&o));
        assert!(stderr(&o).contains(seen), "{}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "one line: {}", stderr(&o));
    }
    for (token, said) in [
        (None, "LEASE_TOKEN is not set"),
        (Some("-1"), "is not a decimal token"),
        (Some("9x"), "is not a decimal token"),
        (Some("9223372036854775808"), "is not a decimal token"),
    ] {
        let o = table.write(&py, task, token, part);
        assert_eq!(o.status.code(), Some(USAGE), "{token:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(said), "{token:?}: {}", stderr(&o));
    }
    let bad_part = table.write(&py, task, Some("9"), "x' OR '1'='1");
    assert_eq!(bad_part.status.code(), Some(USAGE), "{}", stderr(&bad_part));
    assert!(stderr(&bad_part).contains("PARTITION_VALUE"));
    let no_task = table.write(&py, "", Some("9"), part);
    assert_eq!(no_task.status.code(), Some(USAGE), "{}", stderr(&no_task));
    assert!(stderr(&no_task).contains("LEASE_TASK"));
    if let Format::Iceberg = format {
        let o = Command::new(&py)
            .arg(table.script())
            .args([
                table.location.as_os_str(),
                "no_namespace".as_ref(),
                part.as_ref(),
            ])
            .env("LEASE_TASK", task)
            .env("LEASE_TOKEN", "9")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(USAGE), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("expected namespace.name"),
            "{}",
            stderr(&o)
        );
    }
    assert_eq!(
        table.state(&py, task, part),
        before,
        "the table is unchanged"
    );

    // Another task's tokens are its own: a lower token of task B commits.
    let other = table.write(&py, "other", Some("3"), "2026-12-02");
    assert_eq!(other.status.code(), Some(0), "{}", stderr(&other));
    let higher = table.write(&py, task, Some("9"), part);
    assert_eq!(higher.status.code(), Some(0), "{}", stderr(&higher));
    assert_eq!(table.state(&py, task, part).rows, vec![9; 3]);
}

#[test]
fn delta_refusals_and_bad_input() {
    refusals(Format::Delta);
}

#[test]
fn iceberg_refusals_and_bad_input() {
    refusals(Format::Iceberg);
}
