//! Model programs as data: a graph of ABI ops (plus a few graph-level ops the executor runs
//! itself), built once per model by the architecture builders or read from a `.mollm`
//! package, checked against the weights, planned into one activation arena and run by one
//! executor for steps that carry tokens of many sequences.

pub mod build;
pub mod dim;
pub mod error;
pub mod ir;
pub mod matmul;
pub mod moe;
pub mod plan;
pub mod program;
pub mod recurrent;
pub mod run;
pub mod rwkv;

pub use error::{AttrError, DimError, GraphError, NodeError};
pub use ir::{GraphFile, NodeDef, GRAPH_VERSION};
pub use program::{compile, Program};
pub use run::{Runner, SeqStep};

#[cfg(test)]
mod tests;
