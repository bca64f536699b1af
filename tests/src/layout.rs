//! The workspace's layout rules, checked on its sources: no module imports
//! a module that imports it back (directly or through others), and no file
//! of `sampler-backend` outgrows a size a reader can hold (600 lines; a
//! file that is one kernel may be listed as an exception).
//!
//! An import is any `crate::` / `super::` / `self::` path in code (a `use`
//! line, with its braces expanded, or a path inside an expression), resolved
//! to the file of the deepest module it names. Comments are not code: a doc
//! link is no import, and inline modules (`mod tests { .. }`, whose `super`
//! is the file itself) are left out. A crate root's `pub use` lines are its public facade,
//! not imports (the root depends on nothing through them). Binaries
//! (`src/bin/`) are roots of their own and left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library crates' source folders, from the workspace root.
const CRATES: [&str; 7] = [
    "sampler-core/src",
    "sampler-cpu/src",
    "chain-config/src",
    "sampler-backend/src",
    "examples/src",
    "fuzz/src",
    "tests/src",
];

/// Lines a file of `sampler-backend` may have.
const MAX_LINES: usize = 600;

/// Files of `sampler-backend` that are one kernel each and may be longer
/// (none today: the longest kernel, the fused top_p draw, is 401 lines).
const ONE_KERNEL: [&str; 0] = [];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the conformance crate sits in the workspace")
        .to_path_buf()
}

/// Every `.rs` file below `dir`, `src/bin/` left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's module path inside its crate (`a/b.rs` and `a/b/mod.rs`:
/// `[a, b]`; `lib.rs`, `main.rs`: `[]`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The code of a file: comments and string literals blanked.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
                out.push(' ');
            }
            // A char literal (`'"'`, `'\\''`, `'\\u{..}'`), not a lifetime.
            '\'' => {
                let ahead: String = chars.clone().take(12).collect();
                let len = if ahead.starts_with('\\') {
                    ahead.get(2..).and_then(|r| r.find('\'')).map(|e| e + 3)
                } else {
                    let mut it = ahead.chars();
                    let first = it.next().map_or(0, char::len_utf8);
                    (it.next() == Some('\'')).then_some(first + 1)
                };
                match len {
                    Some(n) => {
                        for _ in 0..ahead[..n].chars().count() {
                            chars.next();
                        }
                        out.push_str("' '");
                    }
                    None => out.push('\''),
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// `code` without the bodies of inline modules (`mod tests { .. }`),
/// whose `super` is the file's own module.
fn without_inline_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("mod ") {
        let word_start =
            at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let after = &rest[at + 4..];
        let name_len = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let body = after[name_len..].trim_start();
        if !(word_start && name_len > 0 && body.starts_with('{')) {
            out.push_str(&rest[..at + 4]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at]);
        let open = rest.len() - body.len();
        let mut depth = 0;
        let mut end = rest.len();
        for (i, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A `use` tree (`a::{b, c::{d, e as f}}`) expanded into paths.
fn expand(tree: &str) -> Vec<String> {
    // `x as y` names `x`.
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut plain = String::new();
    let mut i = 0;
    while i < words.len() {
        if words[i] == "as" {
            // Drop the alias, keep what follows it (`c},` -> `},`).
            if let Some(next) = words.get(i + 1) {
                plain.push_str(next.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_'));
            }
            i += 2;
            continue;
        }
        plain.push_str(words[i]);
        i += 1;
    }
    let tree = plain;
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// The `crate` / `super` / `self` paths a file's code names: its `use`
/// trees expanded, then the paths inside expressions and types. `root`: the
/// crate's root file, whose `pub use` lines make the public API (a facade,
/// not a dependency of the root) and are left out.
fn paths(code: &str, root: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest_code = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = &rest[..at];
        let word_start = !before.ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let tail = &rest[at + 4..];
        let end = tail.find(';').map_or(tail.len(), |e| e + 1);
        if word_start {
            let public = before.trim_end().ends_with("pub") || before.trim_end().ends_with(')');
            if !(root && public) {
                out.extend(expand(tail[..end].trim_end_matches(';')));
            }
            rest_code.push_str(before);
        } else {
            rest_code.push_str(&rest[..at + 4 + end]);
        }
        rest = &tail[end..];
    }
    rest_code.push_str(rest);
    let code = rest_code.as_str();
    let bytes = code.as_bytes();
    for prefix in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(prefix) {
            let at = from + i;
            from = at + prefix.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let len = code[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - at);
            out.push(code[at..at + len].trim_end_matches(':').to_string());
        }
    }
    out
}

/// The file a path names from module `from`: its deepest module with a file.
fn resolve(path: &str, from: &[String], files: &BTreeMap<Vec<String>, PathBuf>) -> Option<PathBuf> {
    let mut segs = path.split("::").filter(|s| !s.is_empty());
    let mut module: Vec<String> = match segs.next()? {
        "crate" => Vec::new(),
        "self" => from.to_vec(),
        "super" => from[..from.len().saturating_sub(1)].to_vec(),
        _ => return None,
    };
    let mut rest: Vec<&str> = segs.collect();
    while rest.first() == Some(&"super") {
        module.pop();
        rest.remove(0);
    }
    let mut best = files.get(&module).cloned();
    for s in rest {
        module.push(s.to_string());
        match files.get(&module) {
            Some(f) => best = Some(f.clone()),
            None => break,
        }
    }
    best
}

/// Strongly connected components of more than one file.
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    // Kosaraju: finish order on the graph, then components on the reverse.
    let nodes: Vec<&PathBuf> = edges.keys().collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for &n in &nodes {
        let mut stack = vec![(n, false)];
        while let Some((v, done)) = stack.pop() {
            if done {
                order.push(v);
                continue;
            }
            if !seen.insert(v) {
                continue;
            }
            stack.push((v, true));
            for w in edges.get(v).into_iter().flatten() {
                if !seen.contains(w) {
                    stack.push((w, false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
    for (v, ws) in edges {
        for w in ws {
            reverse.entry(w).or_default().push(v);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for &v in order.iter().rev() {
        if assigned.contains(v) {
            continue;
        }
        let mut comp = Vec::new();
        let mut stack = vec![v];
        assigned.insert(v);
        while let Some(x) = stack.pop() {
            comp.push(x.clone());
            for &w in reverse.get(x).into_iter().flatten() {
                if assigned.insert(w) {
                    stack.push(w);
                }
            }
        }
        if comp.len() > 1 {
            comp.sort();
            out.push(comp);
        }
    }
    out
}

/// Each crate's import graph between its files (paths from the workspace root).
fn import_graph() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let root = workspace();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for krate in CRATES {
        let src = root.join(krate);
        let mut files = Vec::new();
        sources(&src, &mut files);
        let by_module: BTreeMap<Vec<String>, PathBuf> = files
            .iter()
            .map(|f| {
                let rel = f.strip_prefix(&src).expect("below src");
                (module_of(rel), Path::new(krate).join(rel))
            })
            .collect();
        for f in &files {
            let rel = f.strip_prefix(&src).expect("below src");
            let me = Path::new(krate).join(rel);
            let text = std::fs::read_to_string(f).expect("a readable source file");
            let module = module_of(rel);
            let root = module.is_empty();
            let targets: BTreeSet<PathBuf> = paths(&without_inline_modules(&code(&text)), root)
                .iter()
                .filter_map(|p| resolve(p, &module, &by_module))
                .filter(|t| *t != me)
                .collect();
            edges.entry(me).or_default().extend(targets);
        }
    }
    edges
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let edges = import_graph();
    assert!(
        edges.len() > 100,
        "the scan found only {} files: is the workspace layout as CRATES says?",
        edges.len()
    );
    let found = circles(&edges);
    let show: Vec<String> = found
        .iter()
        .map(|c| {
            c.iter()
                .map(|f| {
                    let to: Vec<String> = edges[f]
                        .iter()
                        .filter(|t| c.contains(t))
                        .map(|t| t.display().to_string())
                        .collect();
                    format!("  {} -> {}", f.display(), to.join(", "))
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    assert!(
        found.is_empty(),
        "import circles:\n{}",
        show.join("\n  --\n")
    );
}

#[test]
fn the_scan_sees_imports_and_circles() {
    let mut files = BTreeMap::new();
    for (m, f) in [
        (vec![], "lib.rs"),
        (vec!["a".to_string()], "a.rs"),
        (vec!["b".into()], "b/mod.rs"),
    ] {
        files.insert(m, PathBuf::from(f));
    }
    let from_b = vec!["b".to_string()];
    let p = paths(
        &code(
            "use crate::{a::X, b as c};\n// use crate::c;\nfn f<'a>() { let q = '\"'; super::a::g(); let s = \"crate::z\"; }",
        ),
        false,
    );
    assert_eq!(p, vec!["crate::a::X", "crate::b", "super::a::g"]);
    let tests = without_inline_modules("use super::a;\nmod tests {\n use super::*;\n}\nmod b;");
    assert_eq!(paths(&tests, false), vec!["super::a"]);
    assert_eq!(
        resolve("super::a::g", &from_b, &files),
        Some(PathBuf::from("a.rs"))
    );
    assert_eq!(
        resolve("crate::b::Y", &[], &files),
        Some(PathBuf::from("b/mod.rs"))
    );
    let mut edges = BTreeMap::new();
    edges.insert(
        PathBuf::from("a.rs"),
        BTreeSet::from([PathBuf::from("b/mod.rs")]),
    );
    edges.insert(
        PathBuf::from("b/mod.rs"),
        BTreeSet::from([PathBuf::from("a.rs")]),
    );
    edges.insert(
        PathBuf::from("lib.rs"),
        BTreeSet::from([PathBuf::from("a.rs")]),
    );
    assert_eq!(
        circles(&edges),
        vec![vec![PathBuf::from("a.rs"), PathBuf::from("b/mod.rs")]]
    );
}

#[test]
fn sampler_backend_files_stay_readable() {
    let src = workspace().join("sampler-backend/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&src).expect("below src");
            let n = std::fs::read_to_string(f)
                .expect("readable")
                .lines()
                .count();
            let allowed = ONE_KERNEL.iter().any(|k| Path::new(k) == rel);
            (n > MAX_LINES && !allowed).then(|| format!("{} ({n} lines)", rel.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files of sampler-backend over {MAX_LINES} lines: {long:?}"
    );
}
