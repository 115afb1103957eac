//! The source layout's import rule (docs/design.md, "Source layout"),
//! checked on the source itself: each part of `src/` may name only the parts
//! below it, so no import cycle and no upward import can come back unseen.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What each part may import (`crate::PART`). `cmd` and `lib` sit on top
/// and may import anything.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "agent",
        &[
            "authority",
            "escape",
            "exit",
            "keeper",
            "lease",
            "sys",
            "time",
        ],
    ),
    (
        "authority",
        &["engine", "escape", "lease", "protocol", "sys", "time"],
    ),
    ("engine", &["escape", "lease", "sys", "time"]),
    ("fence", &["lease", "sys", "time"]),
    ("keeper", &["escape", "exit", "sys", "time"]),
    ("protocol", &["lease"]),
    (
        "serve",
        &[
            "engine", "escape", "exit", "lease", "protocol", "sys", "time",
        ],
    ),
    ("lease", &[]),
    ("exit", &[]),
    ("escape", &[]),
    ("time", &[]),
    ("sys", &[]),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `crate::NAME` the text mentions (code, `use` lines and doc links).
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
        rest = after;
    }
    out
}

#[test]
fn every_part_imports_only_what_is_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 30, "src/ not found at {}", src.display());
    let mut broken = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let part = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        // `bin/` holds the binaries' roots, which reach the library only
        // through its doc-hidden entry points.
        if matches!(part.as_str(), "cmd" | "lib" | "main" | "bin") {
            continue;
        }
        let allowed = ALLOWED
            .iter()
            .find(|(p, _)| *p == part)
            .unwrap_or_else(|| panic!("{}: part `{part}` has no rule here", rel.display()))
            .1;
        let text = std::fs::read_to_string(f).unwrap();
        for name in crate_refs(&text) {
            if name != part && !allowed.contains(&name.as_str()) {
                broken.push(format!("{}: {part} -> {name}", rel.display()));
            }
            // The embedded authority is the one adapter onto the engine.
            if part == "authority" && name == "engine" && !rel.ends_with("authority/embedded.rs") {
                broken.push(format!(
                    "{}: only embedded.rs may use the engine",
                    rel.display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports against the layout:\n{}",
        broken.join("\n")
    );
}

#[test]
fn at_most_five_loose_files_at_the_top_of_src() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let loose: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(loose.len() <= 5, "{loose:?}");
}

#[test]
fn the_rule_finds_an_upward_import() {
    // The checker itself must be able to fail.
    assert!(crate_refs("use crate::agent::machine::Event;").contains("agent"));
    assert!(crate_refs("x = crate::time::clock::now()").contains("time"));
}

/// The binaries are linked with `link/code-groups.ld` (build.rs): SQLite,
/// TLS and the etcd client sit in `.text.grouped`, apart from the code
/// every run executes. Without it an agent keeps about 0.4 MiB more of the
/// program resident; nothing else would notice.
#[test]
fn the_binaries_group_their_code_by_part() {
    for bin in [
        env!("CARGO_BIN_EXE_leaseagent"),
        env!("CARGO_BIN_EXE_leaseagent-serve"),
    ] {
        let sections = std::process::Command::new("readelf")
            .args(["-S", "-W", bin])
            .output()
            .expect("readelf (binutils) is needed for this test");
        let sections = String::from_utf8_lossy(&sections.stdout);
        let range = |name: &str| -> (u64, u64) {
            let line = sections
                .lines()
                .find(|l| l.split_whitespace().any(|w| w == name))
                .unwrap_or_else(|| panic!("{bin} has no section {name}:\n{sections}"));
            let f: Vec<&str> = line.split(']').nth(1).unwrap().split_whitespace().collect();
            let addr = u64::from_str_radix(f[2], 16).unwrap();
            let size = u64::from_str_radix(f[4], 16).unwrap();
            (addr, addr + size)
        };
        let (lo, hi) = range(".text.grouped");
        assert!(
            hi - lo > 256 * 1024,
            "{bin}: .text.grouped is only {} bytes",
            hi - lo
        );
        let symbols = std::process::Command::new("nm")
            .arg(bin)
            .output()
            .expect("nm (binutils) is needed for this test");
        let symbols = String::from_utf8_lossy(&symbols.stdout);
        let address = |sym: &str| -> u64 {
            let line = symbols
                .lines()
                .find(|l| l.ends_with(&format!(" {sym}")))
                .unwrap_or_else(|| panic!("{bin}: no symbol {sym}"));
            u64::from_str_radix(line.split_whitespace().next().unwrap(), 16).unwrap()
        };
        for sym in ["sqlite3VdbeExec", "sqlite3_open_v2"] {
            let a = address(sym);
            assert!(
                (lo..hi).contains(&a),
                "{bin}: {sym} at {a:#x} is outside .text.grouped {lo:#x}..{hi:#x}"
            );
        }
    }
}
