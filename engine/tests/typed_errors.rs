//! Errors in `engine` and `loader` are typed (a `thiserror` enum that says what and where),
//! never a bare `String`: a caller can match on them, and one error shape reaches the user.
//! Test code (`tests.rs`, `#[cfg(test)] mod tests`) is exempt.

use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests.rs") {
            out.push(p);
        }
    }
}

/// Does `code` name a `Result` whose error type is `String` (`Result<T, String>`, nested
/// generics in `T` included)?
fn string_error(code: &str) -> bool {
    let mut rest = code;
    while let Some(i) = rest.find("Result<") {
        let mut depth = 0;
        let mut last_comma = None;
        let body = &rest[i + "Result<".len()..];
        for (j, c) in body.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth > 0 => depth -= 1,
                '>' => {
                    if last_comma.is_some_and(|k: usize| body[k + 1..j].trim() == "String") {
                        return true;
                    }
                    break;
                }
                ',' if depth == 0 => last_comma = Some(j),
                _ => {}
            }
        }
        rest = body;
    }
    false
}

#[test]
fn no_string_errors_in_engine_and_loader() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in ["engine/src", "loader/src"] {
        walk(&root.join(krate), &mut files);
    }
    assert!(files.len() > 40, "walked only {} files", files.len());
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        // Whole items: a signature may span lines.
        let joined: String = code
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        let flat = joined.split_whitespace().collect::<Vec<_>>().join(" ");
        if string_error(&flat.replace("< ", "<").replace(" >", ">")) {
            found.push(f.strip_prefix(&root).unwrap().display().to_string());
        }
    }
    assert!(
        found.is_empty(),
        "a `Result<_, String>` in (give it a thiserror type):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_string_errors() {
    assert!(string_error("fn f() -> Result<u64, String> {"));
    assert!(string_error(
        "fn f() -> std::result::Result<Vec<(Op, String)>, String>"
    ));
    assert!(string_error("x: Result<HashMap<String, u32>, String>,"));
    assert!(!string_error(
        "fn f() -> Result<Vec<(Op, String)>, Unusable>"
    ));
    assert!(!string_error("fn f() -> Result<Option<String>, LoadError>"));
    assert!(!string_error("fn f() -> Result<String>"));
}
