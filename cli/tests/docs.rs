//! The generated pages of the docs are current: each equals what `mollm __docs PAGE` prints
//! now (run scripts/gen-docs.sh after changing a flag, a setting or an op schema), and
//! `mollm env` lists the variables with their values.

mod common;

use common::{mollm, repo, stdout};

#[test]
fn generated_pages_are_current() {
    let mut stale = Vec::new();
    for page in ["cli", "settings", "ops"] {
        let o = mollm(&["__docs", page]);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let path = repo().join(format!("docs/src/reference/{page}.md"));
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != stdout(&o) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated docs (run scripts/gen-docs.sh): {}",
        stale.join(", ")
    );
}

#[test]
fn env_lists_the_settings_with_their_values() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(["env"])
        .env("MOLLM_PROFILE", "2")
        .env("MOLLM_API_KEY", "sk-secret")
        .env_remove("MOLLM_WARM")
        .output()
        .unwrap();
    assert!(o.status.success());
    let out = stdout(&o);
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{out}"))
            .to_string()
    };
    assert!(line("MOLLM_PROFILE ").ends_with("= 2"), "{out}");
    assert!(line("MOLLM_WARM ").contains("unset (default: 1)"), "{out}");
    assert!(line("MOLLM_API_KEY ").contains("set (hidden)"), "{out}");
    assert!(!out.contains("sk-secret"), "{out}");
    // Test variables only with --all.
    assert!(!out.contains("MOLLM_REQUIRE_MODELS"), "{out}");
    let all = stdout(&mollm(&["env", "--all"]));
    assert!(all.contains("MOLLM_REQUIRE_MODELS"), "{all}");
}
