//! Shared by the engine's and the CLI's tests of the random-weight checkpoints.

/// The random checkpoint `name` under the model cache's `random/`, made by
/// scripts/make-random-checkpoints.sh when missing (once per test binary); a failure says what
/// is missing and how to get it.
pub fn random_checkpoint(name: &str) -> std::path::PathBuf {
    static MADE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let models = abi::settings::models_dir();
    let p = models.join("random").join(name);
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if !p.exists() && !*made {
        *made = true;
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scripts/make-random-checkpoints.sh");
        let o = std::process::Command::new(&script).output();
        if let Ok(o) = &o {
            if !o.status.success() {
                eprintln!("{}", String::from_utf8_lossy(&o.stderr));
            }
        }
    }
    assert!(
        p.exists(),
        "{} is missing and {} could not make it (it needs python3 with numpy and gguf==0.19.0 from PyPI, and the models of scripts/fetch-models.sh)",
        p.display(),
        "scripts/make-random-checkpoints.sh"
    );
    p
}
