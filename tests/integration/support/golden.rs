//! Golden files under `tests/integration/golden/`: what a generated text
//! must be, byte for byte. `LEASEAGENT_BLESS=1` rewrites them instead of
//! comparing (after a deliberate change to a flag table, then review the
//! diff with `git diff tests/integration/golden`):
//!
//! ```sh
//! LEASEAGENT_BLESS=1 cargo test --test integration -- cli_help:: cli_generated::
//! ```

use std::path::PathBuf;

pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/integration/golden")
}

pub fn blessing() -> bool {
    std::env::var_os("LEASEAGENT_BLESS").is_some_and(|v| v == "1")
}

/// `got` must be the golden file `name` (a path below `golden/`); with
/// `LEASEAGENT_BLESS=1` it becomes it.
pub fn check(name: &str, got: &str) {
    let path = dir().join(name);
    if blessing() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; create it with LEASEAGENT_BLESS=1 (see support/golden.rs)",
            path.display()
        )
    });
    if got != want {
        let line = got
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(got.lines().count().min(want.lines().count()));
        panic!(
            "{name} differs from the golden file, first at line {}:\n--- got\n{}\n--- want\n{}\n\
             If the change is meant: LEASEAGENT_BLESS=1 cargo test --test integration -- \
             cli_help:: cli_generated:: and review git diff",
            line + 1,
            got.lines().nth(line).unwrap_or("<end>"),
            want.lines().nth(line).unwrap_or("<end>")
        );
    }
}
