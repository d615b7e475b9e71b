//! One error type for everything the loader reads. Every message names the file it came from,
//! because the engine may load several models and a bare "truncated" is useless in a log.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened or mapped.
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid GGUF file (bad magic, truncation, absurd sizes, bad ids...).
    #[error("{file}: {msg}")]
    Format { file: String, msg: String },
    /// A metadata key is present but has the wrong type or an invalid value.
    #[error("{file}: metadata key '{key}': {msg}")]
    Metadata {
        file: String,
        key: String,
        msg: String,
    },
    /// The vocabulary cannot be turned into a tokenizer, or encoding failed.
    #[error("{file}: tokenizer: {msg}")]
    Tokenizer { file: String, msg: String },
    /// The chat template does not compile or failed to render.
    #[error("{file}: chat template: {msg}")]
    Template { file: String, msg: String },
}

pub(crate) fn file_label(path: &Path) -> String {
    path.display().to_string()
}
