//! The default test model, or a skip (a failure under `MOLLM_REQUIRE_MODELS=1`).

use engine::Model;
use std::path::PathBuf;

pub fn smollm2() -> Option<Model> {
    let p: PathBuf = abi::settings::models_dir().join("smollm2-135m-instruct-q4_1.gguf");
    if !p.exists() {
        assert!(
            !abi::settings::REQUIRE_MODELS.on(false),
            "{} missing",
            p.display()
        );
        eprintln!("SKIP: {} not found", p.display());
        return None;
    }
    Some(Model::load(&p).unwrap())
}
