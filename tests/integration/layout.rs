//! The source layout's import rules (docs/design.md, "Source layout"),
//! checked on the source itself: each part of `src/` may name only the parts
//! below it, and no file imports itself through others (folder-internal
//! edges included), so no import cycle and no upward import can come back
//! unseen.

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

// The file-level import graph. Its nodes are the library's files; an edge
// is a path in code (a `use` item, an expression, a type, a test module's
// code alike) that names an item of another file, through `crate::`,
// `super::`, `self::` or a module the file declares. Doc comments, comments
// and strings are not imports (a low file may say who calls it), and
// declaring a module (`mod x;`) is not an import of it. A folder's `mod.rs`
// is a file like any other: a child that names its parent's items while
// the parent names the child is a circle.

/// A file of `src/` in the library crate, with its module path
/// (`src/engine/batched/mod.rs` is `engine::batched`; `lib.rs` is the root).
struct SrcFile {
    rel: String,
    module: Vec<String>,
    text: String,
}

/// The module path of the file at `rel` (relative to `src/`).
fn module_of(rel: &str) -> Vec<String> {
    let mut module: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
        module.pop();
    }
    module
}

/// Every file of the library crate (`main.rs` and `bin/` are crate roots of
/// their own and reach the library only as `leaseagent::`).
fn library_files(src: &Path) -> Vec<SrcFile> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap().to_string_lossy().into_owned();
        if rel == "main.rs" || rel.starts_with("bin/") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        out.push(SrcFile {
            module: module_of(&rel),
            rel,
            text,
        });
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

/// `text` with comments, strings and character literals blanked (same
/// length, newlines kept): what is left is the code's structure.
fn code_only(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (rest.starts_with(b"r\"") || rest.starts_with(b"r#") || rest.starts_with(b"br"))
            && (i == 0 || !is_ident(b[i - 1]))
            && raw_string_end(b, i).is_some()
        {
            let end = raw_string_end(b, i).unwrap();
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\'', '\u{..}'), not a
            // lifetime.
            let end = if rest.get(1) == Some(&b'\\') {
                rest.iter()
                    .skip(3)
                    .position(|&c| c == b'\'')
                    .map(|n| i + n + 4)
            } else {
                let ch = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + ch + 2)
            };
            match end {
                Some(e) => {
                    blank(&mut out, i, e);
                    i = e;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Where the raw string starting at `i` (`r"…"`, `r#"…"#`, `br"…"`) ends.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + if b[i] == b'b' { 2 } else { 1 };
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let n = b[j + 1..].windows(close.len()).position(|w| w == close)?;
    Some(j + 1 + n + close.len())
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The identifier starting at `i`, if one does.
fn ident_at(b: &[u8], i: usize) -> Option<&str> {
    if i >= b.len() || !(b[i].is_ascii_alphabetic() || b[i] == b'_') {
        return None;
    }
    let n = b[i..].iter().take_while(|&&c| is_ident(c)).count();
    std::str::from_utf8(&b[i..i + n]).ok()
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The inline modules of a file (`mod tests { … }`): name and byte span.
fn inline_modules(code: &[u8]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if code[i..].starts_with(b"mod") && (i == 0 || !is_ident(code[i - 1])) {
            let j = skip_ws(code, i + 3);
            if j > i + 3 {
                if let Some(name) = ident_at(code, j) {
                    let k = skip_ws(code, j + name.len());
                    if code.get(k) == Some(&b'{') {
                        let mut depth = 0;
                        let mut e = k;
                        while e < code.len() {
                            match code[e] {
                                b'{' => depth += 1,
                                b'}' => {
                                    depth -= 1;
                                    if depth == 0 {
                                        break;
                                    }
                                }
                                _ => {}
                            }
                            e += 1;
                        }
                        out.push((name.to_string(), k, e));
                    }
                }
            }
        }
        i += 1;
    }
    out
}

/// The file modules a file declares (`mod name;`).
fn child_modules(code: &[u8]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i + 3 < code.len() {
        if code[i..].starts_with(b"mod") && (i == 0 || !is_ident(code[i - 1])) {
            let j = skip_ws(code, i + 3);
            if let Some(name) = ident_at(code, j).filter(|_| j > i + 3) {
                if code.get(skip_ws(code, j + name.len())) == Some(&b';') {
                    out.insert(name.to_string());
                }
            }
        }
        i += 1;
    }
    out
}

/// The paths a `use` tree names, from just after `use` to its `;`:
/// `a::{b, c::{self, D}, e::*}` is `a::b`, `a::c`, `a::c::D`, `a::e::*`.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    fn parse(s: &[u8], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        loop {
            *i = skip_ws(s, *i);
            if s.get(*i) == Some(&b'{') {
                *i += 1;
                loop {
                    *i = skip_ws(s, *i);
                    match s.get(*i) {
                        Some(b'}') => {
                            *i += 1;
                            return;
                        }
                        Some(b',') => *i += 1,
                        None => return,
                        _ => parse(s, i, &path, out),
                    }
                }
            }
            if s.get(*i) == Some(&b'*') {
                // A glob names the module itself (shown as written).
                *i += 1;
                path.push("*".to_string());
                out.push(path);
                return;
            }
            let Some(name) = ident_at(s, *i) else {
                out.push(path);
                return;
            };
            *i += name.len();
            if name != "self" {
                path.push(name.to_string());
            }
            let j = skip_ws(s, *i);
            if s[j..].starts_with(b"::") {
                *i = j + 2;
                continue;
            }
            // `as alias`, then the end of this branch.
            *i = j;
            if ident_at(s, *i) == Some("as") {
                *i = skip_ws(s, *i + 2);
                *i += ident_at(s, *i).map_or(0, str::len);
            }
            out.push(path);
            return;
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    parse(tree.as_bytes(), &mut i, &[], &mut out);
    out
}

/// One import of one file: the line it is on and the path as written.
#[derive(Clone, Debug)]
struct Import {
    line: usize,
    path: String,
    to: usize,
}

/// The file-level import graph: for each file, its imports of other files
/// (see above), each resolved to the file that holds the item it names.
fn import_graph(files: &[SrcFile]) -> Vec<Vec<Import>> {
    let index: std::collections::HashMap<&[String], usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.as_slice(), i))
        .collect();
    let resolve = |abs: &[String]| -> usize {
        (0..=abs.len())
            .rev()
            .find_map(|n| index.get(&abs[..n]).copied())
            .expect("lib.rs is the root")
    };
    let mut graph = Vec::new();
    for f in files {
        let text = f.text.as_bytes();
        let code = code_only(&f.text);
        let inline = inline_modules(&code);
        let children = child_modules(&code);
        // The module a byte offset is in.
        let scope = |at: usize| -> Vec<String> {
            let mut m = f.module.clone();
            let mut spans: Vec<&(String, usize, usize)> = inline
                .iter()
                .filter(|(_, s, e)| (*s..*e).contains(&at))
                .collect();
            spans.sort_by_key(|(_, s, _)| *s);
            m.extend(spans.into_iter().map(|(n, _, _)| n.clone()));
            m
        };
        let line = |at: usize| text[..at].iter().filter(|&&c| c == b'\n').count() + 1;
        let absolute = |path: &[String], at: usize| -> Option<Vec<String>> {
            let first = path.first()?;
            let mut m = scope(at);
            let rest: &[String];
            match first.as_str() {
                "crate" => {
                    m.clear();
                    rest = &path[1..];
                }
                "self" | "super" => {
                    let path = &path[usize::from(first == "self")..];
                    let ups = path.iter().take_while(|s| *s == "super").count();
                    m.truncate(m.len().checked_sub(ups)?);
                    rest = &path[ups..];
                }
                c if children.contains(c) => {
                    m = f.module.clone();
                    rest = path;
                }
                _ => return None,
            }
            m.extend(rest.iter().cloned());
            Some(m)
        };
        let mut imports = Vec::new();
        let mut add = |path: &[String], at: usize| {
            if let Some(abs) = absolute(path, at) {
                let to = resolve(&abs);
                if files[to].rel != f.rel {
                    imports.push(Import {
                        line: line(at),
                        path: path.join("::"),
                        to,
                    });
                }
            }
        };
        // `use` items, their trees expanded.
        let mut uses = Vec::new();
        let mut i = 0;
        while i + 4 < code.len() {
            if code[i..].starts_with(b"use")
                && (i == 0 || !is_ident(code[i - 1]))
                && code[i + 3].is_ascii_whitespace()
            {
                let end = code[i..]
                    .iter()
                    .position(|&c| c == b';')
                    .map_or(code.len(), |n| i + n);
                let tree = String::from_utf8_lossy(&code[i + 3..end]).into_owned();
                for p in use_paths(&tree) {
                    add(&p, i);
                }
                uses.push((i, end));
                i = end;
            } else {
                i += 1;
            }
        }
        // Every other path, in code.
        let text = code.as_slice();
        let mut i = 0;
        while i < text.len() {
            if uses.iter().any(|(s, e)| (*s..*e).contains(&i))
                || (i > 0 && (is_ident(text[i - 1]) || text[..i].ends_with(b"::")))
            {
                i += 1;
                continue;
            }
            let Some(first) = ident_at(text, i) else {
                i += 1;
                continue;
            };
            let start = i;
            let mut path = vec![first.to_string()];
            i += first.len();
            while text[i..].starts_with(b"::") {
                match ident_at(text, i + 2) {
                    Some(n) => {
                        path.push(n.to_string());
                        i += 2 + n.len();
                    }
                    None => break,
                }
            }
            if path.len() > 1 || text[i..].starts_with(b"::") {
                add(&path, start);
            }
        }
        graph.push(imports);
    }
    graph
}

/// One knot of the import graph: files that all reach each other.
struct Knot {
    /// Its files, sorted.
    files: Vec<String>,
    /// A shortest cycle through its first file, with the import (file,
    /// line, path as written) that makes each step.
    cycle: String,
}

/// Every knot of the graph (Tarjan's strongly connected components of
/// more than one file).
fn knots(files: &[SrcFile], graph: &[Vec<Import>]) -> Vec<Knot> {
    struct Walk<'a> {
        graph: &'a [Vec<Import>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    fn visit(w: &mut Walk<'_>, v: usize) {
        w.index[v] = Some(w.next);
        w.low[v] = w.next;
        w.next += 1;
        w.stack.push(v);
        w.on_stack[v] = true;
        let targets: Vec<usize> = w.graph[v].iter().map(|e| e.to).collect();
        for t in targets {
            match w.index[t] {
                None => {
                    visit(w, t);
                    w.low[v] = w.low[v].min(w.low[t]);
                }
                Some(it) if w.on_stack[t] => w.low[v] = w.low[v].min(it),
                Some(_) => {}
            }
        }
        if Some(w.low[v]) == w.index[v] {
            let mut component = Vec::new();
            while let Some(t) = w.stack.pop() {
                w.on_stack[t] = false;
                component.push(t);
                if t == v {
                    break;
                }
            }
            if component.len() > 1 {
                w.found.push(component);
            }
        }
    }
    let n = files.len();
    let mut w = Walk {
        graph,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if w.index[v].is_none() {
            visit(&mut w, v);
        }
    }
    let mut out = Vec::new();
    for component in w.found {
        // A shortest cycle through the component's first file (breadth
        // first, inside the component).
        let start = *component.iter().min().unwrap();
        let mut came_from: Vec<Option<(usize, &Import)>> = vec![None; n];
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closing = None;
        'search: while let Some(v) = queue.pop_front() {
            for e in graph[v].iter().filter(|e| component.contains(&e.to)) {
                if e.to == start {
                    closing = Some((v, e));
                    break 'search;
                }
                if came_from[e.to].is_none() {
                    came_from[e.to] = Some((v, e));
                    queue.push_back(e.to);
                }
            }
        }
        let (mut v, last) = closing.expect("a component has a cycle");
        let mut steps = vec![(v, last)];
        while v != start {
            let (from, e) = came_from[v].unwrap();
            steps.push((from, e));
            v = from;
        }
        steps.reverse();
        let mut cycle = files[start].rel.clone();
        for (from, e) in steps {
            cycle.push_str(&format!(
                "\n    -> {}  ({}:{} names `{}`)",
                files[e.to].rel, files[from].rel, e.line, e.path
            ));
        }
        let mut names: Vec<String> = component.iter().map(|&i| files[i].rel.clone()).collect();
        names.sort();
        out.push(Knot {
            files: names,
            cycle,
        });
    }
    out.sort_by(|a, b| a.files.cmp(&b.files));
    out
}

/// The message for the knots found, with how to untie one.
fn describe(knots: &[Knot]) -> String {
    let mut msg = String::from(
        "import cycles between files of src/ (each is a set of files that import each other; \
         move what both sides need into a file of its own that imports neither, as \
         engine/error.rs holds the engine's errors, or let a folder's mod.rs only re-export):",
    );
    for k in knots {
        msg.push_str(&format!(
            "\n  {}\n    (the knot: {})",
            k.cycle,
            k.files.join(", ")
        ));
    }
    msg
}

#[test]
fn no_file_of_src_imports_itself_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = library_files(&src);
    assert!(files.len() > 30, "src/ not found at {}", src.display());
    let found = knots(&files, &import_graph(&files));
    assert!(found.is_empty(), "{}", describe(&found));
}

/// A small tree in memory, as `library_files` would read it.
fn tree(files: &[(&str, &str)]) -> Vec<SrcFile> {
    files
        .iter()
        .map(|(rel, text)| SrcFile {
            rel: rel.to_string(),
            module: module_of(rel),
            text: text.to_string(),
        })
        .collect()
}

#[test]
fn the_cycle_check_finds_a_circle_between_two_files_and_names_it() {
    // The checker itself must be able to fail: `a` and `b` import each
    // other, one way through a `use` tree, the other in code.
    let files = tree(&[
        ("lib.rs", "mod engine;\n"),
        ("engine/mod.rs", "pub mod a;\npub mod b;\npub use a::A;\n"),
        ("engine/a.rs", "use super::{b::{self, B}};\npub struct A;\n"),
        (
            "engine/b.rs",
            "pub struct B;\n\nfn f() -> usize {\n    crate::engine::a::size()\n}\n",
        ),
    ]);
    let found = knots(&files, &import_graph(&files));
    assert_eq!(found.len(), 1, "{}", describe(&found));
    assert_eq!(found[0].files, ["engine/a.rs", "engine/b.rs"]);
    let msg = describe(&found);
    assert!(
        msg.contains("engine/a.rs\n    -> engine/b.rs  (engine/a.rs:1 names `super::b`)"),
        "{msg}"
    );
    assert!(
        msg.contains("-> engine/a.rs  (engine/b.rs:4 names `crate::engine::a::size`)"),
        "{msg}"
    );
}

#[test]
fn the_cycle_check_counts_code_not_docs_strings_or_a_files_own_tests() {
    // None of these is an import of `a` by `b`: a doc link, a comment, a
    // string, and `super::*` in `b`'s own test module (which is `b`).
    let files = tree(&[
        ("lib.rs", "mod engine;\n"),
        ("engine/mod.rs", "pub mod a;\npub mod b;\n"),
        ("engine/a.rs", "use super::b::B;\n"),
        (
            "engine/b.rs",
            "//! Used by [`super::a`].\n\
             pub struct B; // see super::a::A\n\
             const S: &str = \"crate::engine::a\";\n\
             const C: [char; 2] = ['{', '\\''];\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { let _ = self::super::B; }\n}\n",
        ),
    ]);
    let graph = import_graph(&files);
    assert!(knots(&files, &graph).is_empty());
    let b = files.iter().position(|f| f.rel == "engine/b.rs").unwrap();
    assert!(graph[b].is_empty(), "{:?}", graph[b]);
    // A child's glob import of its parent is an import of `mod.rs`, and
    // `mod.rs` naming that child closes a circle.
    let files = tree(&[
        ("lib.rs", "mod engine;\n"),
        (
            "engine/mod.rs",
            "pub mod a;\npub struct E;\nfn f() { a::g() }\n",
        ),
        ("engine/a.rs", "use super::*;\npub fn g() {}\n"),
    ]);
    let found = knots(&files, &import_graph(&files));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].files, ["engine/a.rs", "engine/mod.rs"]);
    assert!(
        found[0].cycle.contains("(engine/a.rs:1 names `super::*`)"),
        "{}",
        found[0].cycle
    );
}
