//! # mollm loader
//!
//! Reads GGUF model files (bounds-checked, memory-mapped), builds the tokenizer llama.cpp would
//! build from the same vocabulary, and renders the model's chat template.

mod error;
pub mod gguf;
pub mod hf;
pub mod package;

pub use error::{printable, LoadError};
pub use gguf::{Array, ModelFile, StrArray, TensorInfo, Value, ValueType};
pub mod tokenizer;

pub use tokenizer::{StreamDecoder, Tokenizer};
pub mod chat;

pub use chat::{ChatMessage, ChatTemplate, RenderExtras};

/// Opens a model: a Hugging Face directory ([`hf`]), a `.mollm` package ([`package`]) or a
/// GGUF file.
pub fn open_model(path: impl AsRef<std::path::Path>) -> Result<ModelFile, LoadError> {
    let path = path.as_ref();
    // Only regular files and directories (symlinks followed, as the Hugging Face cache's
    // layout needs): opening a FIFO would block until a writer comes, a device never ends.
    if let Ok(md) = std::fs::metadata(path) {
        if !md.is_file() && !md.is_dir() {
            return Err(LoadError::Format {
                file: path.display().to_string(),
                msg: "not a regular file or a directory (a FIFO, socket or device): refusing to read it".into(),
            });
        }
    }
    if path.is_dir() {
        if !hf::is_hf_dir(path) {
            return Err(LoadError::Format {
                file: path.display().to_string(),
                msg: "a directory without config.json (expected a Hugging Face model directory or a GGUF file)".into(),
            });
        }
        return hf::open_dir(path);
    }
    if package::is_package(path) {
        return package::open(path);
    }
    ModelFile::open(path)
}
