//! The shell example job, run as a job would run it.

use crate::support;

use support::fence::*;

fn run_job(token: &str, out: &std::path::Path) -> std::process::Output {
    std::process::Command::new("sh")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/publish-job.sh"
        ))
        .arg(out)
        .env("PATH", path_with_bin())
        .env("LEASE_TOKEN", token)
        .env_remove("LEASEAGENT_STATE_FILE")
        .output()
        .expect("sh")
}

#[test]
fn shell_example_publishes_and_a_zombie_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("report.csv");
    let a = run_job("8", &out);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert!(read_opt(&out).unwrap().contains("8,3"));
    let b = run_job("9", &out);
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    let zombie = run_job("8", &out);
    assert_eq!(zombie.status.code(), Some(1));
    assert!(
        stderr(&zombie).contains("token 8 superseded by 9"),
        "{}",
        stderr(&zombie)
    );
    assert!(read_opt(&out).unwrap().contains("9,3"), "B's output stays");
    let leftovers: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".report.csv.") && !n.contains("leaseagent-fence"))
        .collect();
    assert!(leftovers.is_empty(), "temp files cleaned: {leftovers:?}");
}
