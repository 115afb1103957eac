//! The README is an entrance to `docs/`: every relative link in README.md
//! and docs/*.md must reach a file of the checkout, every `#anchor` a
//! heading of its target (as GitHub names them), and every docs page must
//! be linked from the README. Absolute URLs are not fetched (no network).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<PathBuf> {
    let mut v = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 10, "docs/ pages missing: {docs:?}");
    v.extend(docs);
    v
}

/// Lines outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` without its code spans (a link inside backticks is not a link).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut code = false;
    for c in line.chars() {
        if c == '`' {
            code = !code;
        } else if !code {
            out.push(c);
        }
    }
    out
}

/// Targets of the `[text](target)` links of a line.
fn links(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) => {
                out.push(after[..j].trim().to_string());
                rest = &after[j..];
            }
            None => break,
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case; letters, digits, `-`, `_`
/// and spaces kept (spaces become `-`), everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a page offers, duplicates numbered as GitHub does.
fn anchors(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = BTreeSet::new();
    for (_, line) in prose(&text) {
        let Some(h) = line.strip_prefix('#') else {
            continue;
        };
        let h = h.trim_start_matches('#');
        if !h.starts_with(' ') {
            continue;
        }
        let base = slug(h);
        let mut s = base.clone();
        let mut n = 0;
        while seen.contains(&s) {
            n += 1;
            s = format!("{base}-{n}");
        }
        seen.insert(s);
    }
    seen
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(slug(" Exit status"), "exit-status");
    assert_eq!(
        slug(" Files and directories: `leaseagent publish`"),
        "files-and-directories-leaseagent-publish"
    );
    assert_eq!(slug(" Offline validation (CI)"), "offline-validation-ci");
    assert_eq!(
        slug(" Two binaries, linked statically"),
        "two-binaries-linked-statically"
    );
    let text = "# A\n```\n# not a heading\n```\n## A\n";
    let dir = std::env::temp_dir().join(format!("docs-links-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.md");
    std::fs::write(&p, text).unwrap();
    let a = anchors(&p);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(a, BTreeSet::from(["a".to_string(), "a-1".to_string()]));
    assert_eq!(
        links("see [x](a.md#b) and `[y](not-a-link)` [z](c.md)"),
        ["a.md#b", "c.md"]
    );
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for (n, line) in prose(&text) {
            for target in links(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (file, anchor) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if file.is_empty() {
                    page.clone()
                } else {
                    dir.join(file)
                };
                let at = format!("{}:{n}: ({target})", page.display());
                if !dest.exists() {
                    broken.push(format!("{at}: no file {}", dest.display()));
                    continue;
                }
                if let Some(a) = anchor {
                    let offered = anchors(&dest);
                    if !offered.contains(a) {
                        broken.push(format!("{at}: no heading #{a} in {}", dest.display()));
                    }
                }
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_links_every_docs_page_and_stays_an_entrance() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let linked: BTreeSet<String> = prose(&readme)
        .into_iter()
        .flat_map(|(_, l)| links(l))
        .map(|t| t.split('#').next().unwrap_or_default().to_string())
        .collect();
    for page in pages().into_iter().skip(1) {
        let rel = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        assert!(linked.contains(&rel), "README.md does not link {rel}");
    }
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; move detail to docs/"
    );
}

/// Each docs page opens with a title and a short introduction.
#[test]
fn every_docs_page_has_a_title_and_an_introduction() {
    for page in pages().into_iter().skip(1) {
        let text = std::fs::read_to_string(&page).unwrap();
        let mut lines = text.lines();
        let title = lines.next().unwrap_or_default();
        assert!(title.starts_with("# "), "{}: no title", page.display());
        let intro: Vec<&str> = lines
            .skip_while(|l| l.trim().is_empty())
            .take_while(|l| !l.trim().is_empty())
            .collect();
        assert!(
            !intro.is_empty() && !intro[0].starts_with('#') && !intro[0].starts_with('|'),
            "{}: no introduction under the title",
            page.display()
        );
    }
}
