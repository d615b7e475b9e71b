//! # mollm loader
//!
//! Reads GGUF model files (bounds-checked, memory-mapped), builds the tokenizer llama.cpp would
//! build from the same vocabulary, and renders the model's chat template.

mod error;
pub mod gguf;

pub use error::LoadError;
pub use gguf::{Array, GgufFile, StrArray, TensorInfo, Value, ValueType};
pub mod tokenizer;

pub use tokenizer::{StreamDecoder, Tokenizer};
pub mod chat;

pub use chat::{ChatMessage, ChatTemplate};
