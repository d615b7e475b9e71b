//! One module convention and one test-file convention across the workspace (see the
//! "Conventions" section of docs/src/testing.md):
//! - a module with children is a folder with `mod.rs` (never `foo.rs` beside `foo/`), and no
//!   `#[path]` attribute moves a module elsewhere, except integration tests reaching shared
//!   helpers;
//! - unit tests are the module's `#[cfg(test)] mod tests`, inline or in `tests.rs` beside
//!   `mod.rs`; integration tests are `<crate>/tests/<topic>.rs`, their shared helpers in
//!   `<crate>/tests/common/`.

use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "fixtures" {
            continue;
        }
        out.push(p.clone());
        if p.is_dir() {
            walk(&p, out);
        }
    }
}

fn has_rust(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .any(|e| e.path().extension().is_some_and(|x| x == "rs"))
}

/// Whether `p` lies under a crate's integration-test folder.
fn in_tests(p: &Path) -> bool {
    p.components().any(|c| c.as_os_str() == "tests")
}

#[test]
fn one_module_and_test_file_convention() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    assert!(paths.len() > 100, "walked only {} paths", paths.len());
    let rel = |p: &Path| p.strip_prefix(&root).unwrap().display().to_string();
    let mut found = Vec::new();
    for p in &paths {
        if p.is_dir() && has_rust(p) {
            if p.with_extension("rs").is_file() {
                found.push(format!(
                    "{}: a module with children is {}/mod.rs",
                    rel(&p.with_extension("rs")),
                    rel(p)
                ));
            }
            let parent_is_tests = p.parent().is_some_and(|d| d.ends_with("tests"));
            if parent_is_tests && !p.ends_with("common") {
                found.push(format!(
                    "{}: integration-test helpers live in tests/common/",
                    rel(p)
                ));
            }
        }
        if p.extension().is_some_and(|x| x == "rs") && !in_tests(p) {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            if text.lines().any(|l| l.trim_start().starts_with("#[path")) {
                found.push(format!("{}: a #[path] module outside tests/", rel(p)));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
