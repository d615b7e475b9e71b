//! Every `MOLLM_*` name in the repository's code and scripts is declared in
//! `abi::settings`, and no Rust code reads one from the environment past it.

use std::path::Path;

/// Names that look like variables but are not read from the environment.
const NOT_VARIABLES: &[&str] = &["MOLLM_GATE_VERDICT"];

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name != ".ci" || name == "target" || name == "fuzz" {
            continue;
        }
        if p.is_dir() {
            walk(&p, out);
        } else if ["rs", "sh", "py"]
            .iter()
            .any(|x| p.extension().is_some_and(|e| e == *x))
            || p.ends_with(".ci/run")
        {
            out.push(p);
        }
    }
}

#[test]
fn every_mollm_variable_is_declared_and_read_through_settings() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    walk(&root, &mut files);
    assert!(files.len() > 50, "walked only {} files", files.len());
    let mut undeclared = Vec::new();
    let mut raw_reads = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(i) = rest.find("MOLLM_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                rest = &rest[i + name.len()..];
                if name.len() > "MOLLM_".len()
                    && !name.ends_with('_')
                    && !NOT_VARIABLES.contains(&name.as_str())
                    && abi::settings::find(&name).is_none()
                {
                    undeclared.push(format!("{rel}:{}: {name}", n + 1));
                }
            }
            let reads = line.contains("env::var(\"MOLLM_") || line.contains("var_os(\"MOLLM_");
            if rel.ends_with(".rs") && reads && rel != "abi/src/settings.rs" {
                raw_reads.push(format!("{rel}:{}", n + 1));
            }
        }
    }
    assert!(
        undeclared.is_empty(),
        "declare these in abi/src/settings.rs:\n{}",
        undeclared.join("\n")
    );
    assert!(
        raw_reads.is_empty(),
        "read these through abi::settings:\n{}",
        raw_reads.join("\n")
    );
}
