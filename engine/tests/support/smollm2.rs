//! The default test model, or a skip (a failure under `MOLLM_REQUIRE_MODELS=1`).

use engine::Model;
use std::path::PathBuf;

pub fn smollm2() -> Option<Model> {
    let dir = match std::env::var_os("MOLLM_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/mollm/models"),
    };
    let p = dir.join("smollm2-135m-instruct-q4_1.gguf");
    if !p.exists() {
        assert_ne!(
            std::env::var("MOLLM_REQUIRE_MODELS").as_deref(),
            Ok("1"),
            "{} missing",
            p.display()
        );
        eprintln!("SKIP: {} not found", p.display());
        return None;
    }
    Some(Model::load(&p).unwrap())
}
