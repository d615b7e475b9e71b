//! Op attributes are read and written through their typed structs (`abi/src/attrs.rs`): no
//! code outside `abi` indexes `OpParams`' slots (`p.i[1]`, `params.f[0]`) itself.

use std::path::Path;

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "abi" {
            continue;
        }
        if p.is_dir() {
            walk(&p, out);
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_slot_indexes_outside_abi() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    walk(&root, &mut files);
    assert!(files.len() > 50, "walked only {} files", files.len());
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains(".i[") || code.contains(".f[") {
                found.push(format!(
                    "{}:{}: {}",
                    f.strip_prefix(&root).unwrap().display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "use the op's attribute struct (abi/src/attrs.rs) instead:\n{}",
        found.join("\n")
    );
}
