//! The engine's modules import one another in one direction: no cycle among the files of
//! `engine/src` (a file's `crate::a::b` and `super::x` paths, outside its tests, are its
//! imports). A cycle means two files can only be understood, and changed, together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn modules(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "tests" {
                modules(&p, &format!("{prefix}{name}::"), out);
            }
            continue;
        }
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        if stem == "tests" {
            continue;
        }
        let module = match stem {
            "lib" => String::new(),
            "mod" => prefix.trim_end_matches("::").to_string(),
            s => format!("{prefix}{s}"),
        };
        let text = std::fs::read_to_string(&p).unwrap();
        let code = match text.find("#[cfg(test)]\nmod tests") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        let code: String = code
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        out.insert(module, code);
    }
}

/// The module paths after each `marker` in `code`.
fn paths<'a>(code: &'a str, marker: &str) -> Vec<Vec<&'a str>> {
    code.match_indices(marker)
        .map(|(i, _)| {
            let rest = &code[i + marker.len()..];
            let end = rest
                .find(|c: char| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':')
                })
                .unwrap_or(rest.len());
            rest[..end].split("::").filter(|s| !s.is_empty()).collect()
        })
        .collect()
}

#[test]
fn no_import_cycle_between_engine_modules() {
    let mut files = BTreeMap::new();
    modules(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        "",
        &mut files,
    );
    assert!(files.contains_key("graph::run") && files.contains_key("exec"));
    let known: BTreeSet<String> = files.keys().cloned().collect();
    let longest = |parts: &[&str], base: &str| -> Option<String> {
        (1..=parts.len()).rev().find_map(|k| {
            let p = parts[..k].join("::");
            let m = if base.is_empty() {
                p
            } else {
                format!("{base}::{p}")
            };
            known.contains(&m).then_some(m)
        })
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, code) in &files {
        let parent = m.rsplit_once("::").map_or("", |x| x.0);
        let mut to = BTreeSet::new();
        for p in paths(code, "crate::") {
            to.extend(longest(&p, ""));
        }
        for p in paths(code, "super::") {
            to.extend(longest(&p, parent));
        }
        to.remove(m);
        edges.insert(m.clone(), to);
    }
    // Depth-first search for a back edge, reporting the cycle it closes.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for t in &edges[m] {
            match state.get(t).copied().unwrap_or(0) {
                1 => {
                    let i = stack.iter().position(|s| s == t).unwrap();
                    let mut c = stack[i..].to_vec();
                    c.push(t.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(t, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in files.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, &edges, &mut state, &mut Vec::new()) {
                panic!("import cycle in engine/src: {}", c.join(" -> "));
            }
        }
    }
}
