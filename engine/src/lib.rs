//! The mollm engine: backends behind the ABI, model graphs, KV cache, sampler, sessions.
//!
//! Data flow: `loader::ModelFile` (memory-mapped) -> [`model::HParams`] and a graph
//! ([`graph::GraphFile`], from the architecture's builder or the package) -> a
//! [`graph::Program`] whose weights point into the map -> [`graph::Runner`] runs steps of one or
//! more sequences through [`exec::Exec`], which calls each op through a backend's ABI table ->
//! logits -> [`sampler::Sampler`] -> token ids -> `loader::Tokenizer` -> text.

pub mod backend;
pub mod constraint;
pub mod embed;
pub mod error;
pub mod exec;
pub mod experts;
pub mod graph;
pub mod kv;
pub mod model;
pub mod pool;
pub mod registry;
pub mod sampler;
pub mod sched;
pub mod session;
pub mod tensor;
pub mod trace;

pub use constraint::{Constraint, ConstraintError, TokenConstraint};
pub use error::{EngineError, Result};
pub use sampler::{ParamError, Sampler, SamplerParams};
pub use session::{BackendChoice, Model, Sequence, Session, SessionOptions, Timings, Work};
