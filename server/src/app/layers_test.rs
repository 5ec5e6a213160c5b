//! The layout's rule, checked on the sources: a module under `app/` imports
//! only from its own layer or the layers before it (in [`LAYERS`] order),
//! never from its parent, and no two modules import each other, directly or
//! through others. Imports are followed through `crate::app::…` paths, so
//! the others (`super::`, grouped imports, `app`'s re-exports) are refused. Test code
//! (`#[cfg(test)] mod …`) is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first.
const LAYERS: [&str; 6] = ["format", "metrics", "access", "runtime", "http", "routes"];

/// Every module file under `app/` (but `app/mod.rs`), by module path.
fn modules(root: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("app/ is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(root).expect("under app/").with_extension("");
            let mut segments: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if segments.last().is_some_and(|s| s == "mod") {
                segments.pop();
            }
            if !segments.is_empty() && path.extension().is_some_and(|e| e == "rs") {
                out.insert(segments, path);
            }
        }
    }
    out
}

/// The source without its test modules (from the first `#[cfg(test)]`
/// whose item, after any further attributes, is a `mod`).
fn without_tests(source: &str) -> &str {
    for (at, _) in source.match_indices("#[cfg(test)]") {
        let mut rest = source[at + "#[cfg(test)]".len()..].trim_start();
        while rest.starts_with("#[") {
            rest = rest.split_once('\n').map_or("", |(_, r)| r).trim_start();
        }
        if rest.starts_with("mod ") || rest.starts_with("pub mod ") {
            return &source[..at];
        }
    }
    source
}

/// The modules `source` names through `crate::app::…` paths, resolved to
/// the longest path that is a module file.
fn imports(source: &str, known: &BTreeMap<Vec<String>, PathBuf>) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for (i, _) in source.match_indices("crate::app::") {
        let tail = &source[i + "crate::app::".len()..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
        let segments: Vec<String> = tail[..end].split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
        if let Some(n) = (1..=segments.len()).rev().find(|&n| known.contains_key(&segments[..n])) {
            out.insert(segments[..n].to_vec());
        }
    }
    out
}

/// Paths the check could not follow, so the sources may not use them
/// outside tests: `super::` (relative to where the file sits), grouped
/// `crate::app::{…}` imports, and items re-exported by `app/mod.rs`.
fn unfollowable(source: &str) -> Vec<String> {
    let mut out: Vec<String> = source.match_indices("super::").map(|(i, _)| source[i..].chars().take(40).collect()).collect();
    for (i, _) in source.match_indices("crate::app::") {
        let next = source[i + "crate::app::".len()..].chars().next();
        if next.is_some_and(|c| c == '{' || c.is_ascii_uppercase()) {
            out.push(source[i..].chars().take(40).collect());
        }
    }
    out
}

fn layer(module: &[String]) -> usize {
    LAYERS.iter().position(|l| module.first().is_some_and(|m| m == l)).unwrap_or(usize::MAX)
}

#[test]
fn import_layers_point_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/app");
    let known = modules(&root);
    let mut graph = BTreeMap::new();
    for (module, path) in &known {
        // Test modules kept in files of their own.
        if module.last().is_some_and(|m| m == "tests" || m == "layers_test") {
            continue;
        }
        let source = std::fs::read_to_string(path).expect("a module file is readable");
        assert!(layer(module) != usize::MAX, "{module:?} is in no layer of {LAYERS:?}");
        let checked = without_tests(&source);
        let hidden = unfollowable(checked);
        assert!(hidden.is_empty(), "{} uses paths this check cannot follow: {hidden:?}", module.join("::"));
        let deps: BTreeSet<Vec<String>> = imports(checked, &known).into_iter().filter(|d| d != module).collect();
        for d in &deps {
            assert!(layer(d) <= layer(module), "{} imports {} from a later layer", module.join("::"), d.join("::"));
            // A parent module declares (and may re-export) its children, so
            // a child that imports its parent closes a cycle.
            assert!(!module.starts_with(d), "{} imports its parent {}", module.join("::"), d.join("::"));
        }
        graph.insert(module.clone(), deps);
    }
    // Depth-first search for a cycle: 1 = on the path, 2 = done.
    fn visit(m: &Vec<String>, graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>, state: &mut BTreeMap<Vec<String>, u8>, path: &mut Vec<String>) {
        match state.get(m) {
            Some(2) => return,
            Some(_) => panic!("import cycle: {} -> {}", path.join(" -> "), m.join("::")),
            None => {}
        }
        state.insert(m.clone(), 1);
        path.push(m.join("::"));
        for d in graph.get(m).into_iter().flatten() {
            visit(d, graph, state, path);
        }
        path.pop();
        state.insert(m.clone(), 2);
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        visit(m, &graph, &mut state, &mut Vec::new());
    }
    assert!(graph.len() > 40, "found only {} modules under {}", graph.len(), root.display());
}
