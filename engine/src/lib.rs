//! The mollm engine: backends behind the ABI, model graphs, KV cache, sampler, sessions.
//!
//! Data flow: `loader::GgufFile` (memory-mapped) -> [`model::HParams`] + a [`model::Graph`]
//! whose weights point into the map -> [`Session`] runs the graph through [`exec::Exec`], which
//! calls each op through a backend's ABI table -> logits -> [`sampler::Sampler`] -> token ids ->
//! `loader::Tokenizer` -> text.

pub mod backend;
pub mod error;
pub mod exec;
pub mod kv;
pub mod model;
pub mod pool;
pub mod registry;
pub mod sampler;
pub mod session;
pub mod tensor;

pub use error::{EngineError, Result};
pub use sampler::{Sampler, SamplerParams};
pub use session::{BackendChoice, Model, Session, SessionOptions, Timings};
