//! `leaseagent publish` as a job runs it: real processes, real files.

use crate::support;

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use support::fence::*;

fn o(p: &Path) -> &OsStr {
    p.as_os_str()
}

fn record(dir: &Path, name: &str) -> Option<String> {
    read_opt(&dir.join(format!(".{name}.leaseagent-fence")))
}

#[test]
fn equal_lower_and_higher_tokens() {
    let d = tempfile::tempdir().unwrap();
    let (src, dest) = (d.path().join("tmp"), d.path().join("out"));

    std::fs::write(&src, "five").unwrap();
    let r = publish(Some("5"), &[o(&src), o(&dest)]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert_eq!(read_opt(&dest).as_deref(), Some("five"));
    assert!(!src.exists());
    assert_eq!(record(d.path(), "out").as_deref(), Some("5\n"));

    // Equal: the same attempt may publish twice (--token wins over the env).
    std::fs::write(&src, "five again").unwrap();
    let r = publish(
        Some("1"),
        &[OsStr::new("--token"), OsStr::new("5"), o(&src), o(&dest)],
    );
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert_eq!(read_opt(&dest).as_deref(), Some("five again"));

    // Lower: refused, exit 1, `superseded`, DEST untouched, SRC kept.
    std::fs::write(&src, "four").unwrap();
    let r = publish(Some("4"), &[o(&src), o(&dest)]);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        stderr(&r).contains("token 4 superseded by 5"),
        "{}",
        stderr(&r)
    );
    assert_eq!(read_opt(&dest).as_deref(), Some("five again"));
    assert_eq!(read_opt(&src).as_deref(), Some("four"));
    assert_eq!(record(d.path(), "out").as_deref(), Some("5\n"));

    // Higher: accepted, recorded.
    let r = publish(Some("12"), &[o(&src), o(&dest)]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert_eq!(read_opt(&dest).as_deref(), Some("four"));
    assert_eq!(record(d.path(), "out").as_deref(), Some("12\n"));
}

#[test]
fn directories_are_replaced_whole() {
    let d = tempfile::tempdir().unwrap();
    let dest = d.path().join("tree");
    let a = d.path().join("a");
    make_tree(&a, "1", 5);
    assert!(publish(Some("1"), &[o(&a), o(&dest)]).status.success());
    let b = d.path().join("b");
    make_tree(&b, "2", 3);
    let r = publish(Some("2"), &[o(&b), o(&dest)]);
    assert!(r.status.success(), "{}", stderr(&r));
    let names: std::collections::BTreeSet<_> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "old files must not survive: {names:?}");
    assert_eq!(read_tree_at_once(&dest, 3).unwrap(), vec!["2"; 3]);
    assert!(!b.exists(), "the old tree is removed from SRC's path");
}

#[test]
fn usage_errors_are_clear() {
    let d = tempfile::tempdir().unwrap();
    let (src, dest) = (d.path().join("tmp"), d.path().join("out"));
    std::fs::write(&src, "x").unwrap();

    let r = publish(None, &[o(&src), o(&dest)]);
    assert_eq!(r.status.code(), Some(2));
    let e = stderr(&r);
    assert!(e.contains("--token") && e.contains("LEASE_TOKEN"), "{e}");

    let r = publish(Some("12abc"), &[o(&src), o(&dest)]);
    assert_eq!(r.status.code(), Some(2));
    assert!(stderr(&r).contains("LEASE_TOKEN `12abc`"), "{}", stderr(&r));

    let missing = d.path().join("missing");
    let r = publish(Some("3"), &[o(&missing), o(&dest)]);
    assert_eq!(r.status.code(), Some(2));
    assert!(stderr(&r).contains("no such file"), "{}", stderr(&r));
    assert!(record(d.path(), "out").is_none(), "nothing recorded");
    assert!(!dest.exists());
}

#[test]
fn different_filesystems_are_refused_before_recording() {
    let shm = Path::new("/dev/shm");
    let here = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let there = tempfile::tempdir_in(shm).expect("this test needs /dev/shm (tmpfs)");
    assert_ne!(
        std::fs::metadata(here.path()).unwrap().dev(),
        std::fs::metadata(there.path()).unwrap().dev(),
        "the test needs two filesystems"
    );
    let src = there.path().join("tmp");
    std::fs::write(&src, "x").unwrap();
    let dest = here.path().join("out");
    let r = publish(Some("3"), &[o(&src), o(&dest)]);
    assert_eq!(r.status.code(), Some(2));
    assert!(
        stderr(&r).contains("different filesystems"),
        "{}",
        stderr(&r)
    );
    assert!(record(here.path(), "out").is_none());
    assert!(!dest.exists() && src.exists());
}

#[test]
fn crash_between_record_and_move() {
    let d = tempfile::tempdir().unwrap();
    let (src, dest) = (d.path().join("tmp"), d.path().join("out"));
    std::fs::write(&src, "old").unwrap();
    assert!(publish(Some("6"), &[o(&src), o(&dest)]).status.success());

    std::fs::write(&src, "new").unwrap();
    let crashed = std::process::Command::new(bin())
        .args([OsStr::new("publish"), o(&src), o(&dest)])
        .env("LEASE_TOKEN", "7")
        .env("LEASEAGENT_TEST_FAULT", "after-record")
        .output()
        .unwrap();
    assert!(!crashed.status.success(), "the fault must stop publish");
    assert_eq!(record(d.path(), "out").as_deref(), Some("7\n"));
    assert_eq!(read_opt(&dest).as_deref(), Some("old"), "not moved yet");

    let lower = publish(Some("6"), &[o(&src), o(&dest)]);
    assert_eq!(lower.status.code(), Some(1));
    assert!(stderr(&lower).contains("token 6 superseded by 7"));
    assert_eq!(read_opt(&dest).as_deref(), Some("old"));

    let again = publish(Some("7"), &[o(&src), o(&dest)]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(read_opt(&dest).as_deref(), Some("new"));
}

/// Publishers with different tokens race on one directory DEST while a
/// reader keeps reading it through one descriptor: only the highest token
/// ends visible, and no read ever sees files of two tokens.
#[test]
fn concurrent_publishers_highest_wins_never_mixed() {
    const FILES: usize = 16;
    const PUBLISHERS: u64 = 6;
    const ROUNDS: usize = 8;
    for round in 0..ROUNDS {
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("out");
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (dest, stop, samples) = (dest.clone(), stop.clone(), samples.clone());
            std::thread::spawn(move || {
                let mut mixed = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Some(v) = read_tree_at_once(&dest, FILES) {
                        samples.fetch_add(1, Ordering::Relaxed);
                        if v.iter().any(|x| x != &v[0]) {
                            mixed.push(v);
                        }
                    }
                }
                mixed
            })
        };
        // Shuffle the start order so lower tokens often come last.
        let mut order: Vec<u64> = (1..=PUBLISHERS).collect();
        order.rotate_left(round % PUBLISHERS as usize);
        if round % 2 == 1 {
            order.reverse();
        }
        let children: Vec<_> = order
            .iter()
            .map(|&t| {
                let src = d.path().join(format!("tmp{t}"));
                make_tree(&src, &t.to_string(), FILES);
                let child = std::process::Command::new(bin())
                    .args([OsStr::new("publish"), o(&src), o(&dest)])
                    .env("LEASE_TOKEN", t.to_string())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (t, child)
            })
            .collect();
        for (t, c) in children {
            let out = c.wait_with_output().unwrap();
            match out.status.code() {
                Some(0) => {}
                Some(1) => {
                    assert!(t < PUBLISHERS, "the highest token was refused");
                    assert!(stderr(&out).contains("superseded"), "{}", stderr(&out));
                }
                other => panic!("publisher {t} exited {other:?}: {}", stderr(&out)),
            }
        }
        // Let the reader see the final state at least once.
        let seen = samples.load(Ordering::Relaxed);
        poll(
            "a reader sample",
            std::time::Duration::from_secs(10),
            || (samples.load(Ordering::Relaxed) > seen).then_some(()),
        );
        stop.store(true, Ordering::Relaxed);
        let mixed = reader.join().unwrap();
        assert!(mixed.is_empty(), "round {round}: mixed views {mixed:?}");
        let last = PUBLISHERS.to_string();
        assert_eq!(
            read_tree_at_once(&dest, FILES).unwrap(),
            vec![last.as_str(); FILES]
        );
        assert_eq!(std::fs::read_dir(&dest).unwrap().count(), FILES);
        assert_eq!(record(d.path(), "out"), Some(format!("{PUBLISHERS}\n")));
    }
}

#[test]
fn a_stale_token_never_lands_over_a_newer_one_while_dests_directory_is_swapped() {
    // DEST reached through `cur`, a link a deploy flips between two
    // directories. D1 holds token 5's output; D2 nothing. A stale writer
    // (token 4) publishes to `cur/out` 300 times while `cur` flips: it may
    // land in D2 (whose record it passes) but never in D1. Resolving DEST
    // afresh at each step, 27 of 300 landed over token 5 in D1.
    let d = tempfile::tempdir().unwrap();
    let (d1, d2) = (d.path().join("d1"), d.path().join("d2"));
    std::fs::create_dir(&d1).unwrap();
    std::fs::create_dir(&d2).unwrap();
    let cur = d.path().join("cur");
    std::os::unix::fs::symlink(&d1, &cur).unwrap();
    let src = d.path().join("src");
    std::fs::write(&src, "t5").unwrap();
    let r = publish(Some("5"), &[o(&src), o(&cur.join("out"))]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));

    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (stop, d, d1, d2, cur) = (
            stop.clone(),
            d.path().to_owned(),
            d1.clone(),
            d2.clone(),
            cur.clone(),
        );
        std::thread::spawn(move || {
            let tmp = d.join("cur.new");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::remove_file(&tmp);
                let to = if i % 2 == 0 { &d2 } else { &d1 };
                std::os::unix::fs::symlink(to, &tmp).unwrap();
                std::fs::rename(&tmp, &cur).unwrap();
                i += 1;
            }
            i
        })
    };
    let (mut landed, mut refused) = (0, 0);
    for round in 0..300 {
        // D2 forgets the last stale write, so token 4 passes its record.
        let _ = std::fs::remove_file(d2.join("out"));
        let _ = std::fs::remove_file(d2.join(".out.leaseagent-fence"));
        std::fs::write(&src, "t4").unwrap();
        let r = publish(Some("4"), &[o(&src), o(&cur.join("out"))]);
        match r.status.code() {
            Some(0) => landed += 1,
            Some(1) => refused += 1,
            c => panic!("round {round}: exit {c:?}: {}", stderr(&r)),
        }
        assert_eq!(
            read_opt(&d1.join("out")).as_deref(),
            Some("t5"),
            "round {round}"
        );
        assert_eq!(record(&d1, "out").as_deref(), Some("5\n"), "round {round}");
        // Wherever it landed, its record says so.
        if read_opt(&d2.join("out")).as_deref() == Some("t4") {
            assert_eq!(record(&d2, "out").as_deref(), Some("4\n"), "round {round}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    // Both directories were hit: the race was run, not dodged.
    assert!(
        landed > 0 && refused > 0,
        "landed {landed}, refused {refused}, {flips} flips"
    );
}
